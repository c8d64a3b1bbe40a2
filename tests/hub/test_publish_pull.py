"""Publish and pull against the loopback Hub with the real client: push -> tag -> push again -> pull
by tag, branch and sha -> identical tensors; then the offline stage from the cache the client filled."""

from __future__ import annotations

import json

import pytest
import torch

from zoo_core.hub import HubError, create_model, pull, push_to_hub
from zoo_core.io.pretrained import read_folder, save_pretrained


def _same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def published(hub, make_model, tmp_path):
    """org/tiny with tag v1 (seed 0), main at v2 (seed 1), branch dev (seed 2)."""
    from huggingface_hub import HfApi

    models = {name: make_model(seed) for name, seed in (("v1", 0), ("v2", 1), ("dev", 2))}
    first = push_to_hub(models["v1"], "org/tiny", commit_message="first")
    HfApi().create_tag("org/tiny", tag="v1")
    second = push_to_hub(models["v2"], "org/tiny")
    dev = push_to_hub(models["dev"], "org/tiny", revision="dev")
    return models, {"v1": first.commit, "main": second.commit, "dev": dev.commit}


def test_push_tag_push_again_pull_by_tag_branch_and_sha(hub, published):
    models, commits = published
    assert hub.head("org/tiny") == commits["main"] and hub.repos["org/tiny"].tags["v1"] == commits["v1"]
    assert hub.head("org/tiny", "dev") == commits["dev"]
    for ref, expect, commit in [("hf-hub:org/tiny@v1", "v1", commits["v1"]), ("hf-hub:org/tiny", "v2", commits["main"]),
                                ("hf-hub:org/tiny@dev", "dev", commits["dev"]), (f"hf-hub:org/tiny@{commits['v1']}", "v1", commits["v1"])]:
        got = pull(ref)
        assert got.commit == commit, ref  # the revision was resolved to the commit that holds it
        assert sorted(got.files) == ["README.md", "config.json", "model.safetensors"]
        model = create_model(ref)
        assert _same(model, models[expect]), ref
        x = torch.randn(2, 7, 2)
        assert torch.equal(model(x), models[expect](x))
    assert not _same(models["v1"], models["v2"])  # the comparison can fail


def test_the_content_host_never_sees_the_token(hub, published):
    pull("hf-hub:org/tiny@v1")
    cdn = [r for r in hub.requests if r.host.startswith("localhost")]
    assert cdn and not any(r.authorized for r in cdn)  # the 302 to the second host name was followed without the token
    assert any(r.authorized for r in hub.requests if r.host.startswith("127.0.0.1"))


def test_pushed_repo_holds_weights_config_and_a_card(hub, published):
    from huggingface_hub import ModelCard

    got = pull("hf-hub:org/tiny")
    config = json.loads((got.path / "config.json").read_text())
    _, info = read_folder(got.path)
    assert config["spec"] == info["spec"] and config["zoo_format"] == "zoo.safetensors/1"
    assert {"zoo-core", "torch", "zoo-s4d"} <= set(config["versions"])
    card = ModelCard.load(got.path / "README.md")
    assert card.data.library_name == "ssm-zoo" and "s4d" in card.data.tags
    assert "create_model(\"hf-hub:org/tiny\"" in card.text


def test_second_identical_push_makes_no_new_commit(hub, make_model, tmp_path):
    save_pretrained(make_model(0), str(tmp_path / "m"))
    first = push_to_hub(tmp_path / "m", "org/same")
    before = hub.head("org/same")
    second = push_to_hub(tmp_path / "m", "org/same")
    assert hub.head("org/same") == before and first.files == second.files
    assert hub.count("PUT", "/lfs-upload/") == 1  # the weights were uploaded once


def test_create_pr_leaves_main_alone(hub, make_model):
    push_to_hub(make_model(0), "org/pr")
    main = hub.head("org/pr")
    res = push_to_hub(make_model(1), "org/pr", create_pr=True, commit_message="propose")
    assert hub.head("org/pr") == main and res.pr_url and res.pr_url.endswith("/discussions/1")
    assert hub.repos["org/pr"].pulls["refs/pr/1"] == res.commit


def test_offline_loads_by_tag_branch_and_sha_with_zero_requests(hub, published, monkeypatch):
    models, commits = published
    refs = ["hf-hub:org/tiny@v1", "hf-hub:org/tiny", "hf-hub:org/tiny@dev", f"hf-hub:org/tiny@{commits['dev']}"]
    for ref in refs:
        pull(ref)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.clear()
    for ref, expect in zip(refs, ["v1", "v2", "dev", "dev"]):
        assert _same(create_model(ref), models[expect]), ref
    assert hub.requests == []  # nothing reached the server


def test_pulled_by_sha_then_asked_for_main_offline(hub, published, monkeypatch):
    _, commits = published
    pull(f"hf-hub:org/tiny@{commits['main']}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as info:
        pull("hf-hub:org/tiny")
    msg = str(info.value)
    assert commits["main"] in msg and "pulled by commit sha" in msg and "offline" in msg
    assert pull(f"hf-hub:org/tiny@{commits['main']}").commit == commits["main"]  # by sha it works


def test_local_dir_pull_records_the_commit(hub, published, tmp_path):
    models, commits = published
    got = pull("hf-hub:org/tiny@v1", local_dir=tmp_path / "here")
    record = json.loads((tmp_path / "here" / "zoo-pull.json").read_text())
    assert record["commit"] == commits["v1"] == got.commit and record["files"] == got.files
    again = pull(f"local-dir:{tmp_path / 'here'}")
    assert again.commit == commits["v1"] and _same(create_model(f"local-dir:{tmp_path / 'here'}"), models["v1"])
    (tmp_path / "here" / "config.json").write_text("{}")
    with pytest.raises(Exception, match="changed since it was pulled"):
        pull(f"local-dir:{tmp_path / 'here'}")


def test_cli_pull_then_offline_in_a_fresh_process(hub, published, cli, hf_home):
    _, commits = published
    online = cli("pull", "hf-hub:org/tiny", "--revision", "v1", "--json")
    assert online.returncode == 0, online.stderr
    assert json.loads(online.stdout)["commit"] == commits["v1"]
    hub.clear()
    offline = cli("pull", "hf-hub:org/tiny@v1", "--json", env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["commit"] == commits["v1"] and hub.requests == []
    missing = cli("pull", "hf-hub:org/tiny@dev", env={"HF_HUB_OFFLINE": "1"})
    assert missing.returncode == 2 and "not in the cache" in missing.stderr


def test_strict_by_default_and_overrides(hub, published):
    models, _ = published
    with pytest.raises(Exception, match="head.weight"):
        create_model("hf-hub:org/tiny@v1", task={"classes": 5})
    loose = create_model("hf-hub:org/tiny@v1", task={"classes": 5}, strict=False)
    assert torch.equal(loose.encoder.weight, models["v1"].encoder.weight) and loose.head.weight.shape[0] == 5
