"""Bad input: each a clear error (and a non-zero exit from the CLI), never a traceback or a partial load."""

from __future__ import annotations

import pytest

from zoo_core.cli.hub import main
from zoo_core.errors import CheckpointError
from zoo_core.hub import HubError, MissingPluginError, create_model, pull, push_to_hub
from zoo_core.io.pretrained import save_pretrained
from zoo_core.testing.hub_server import WRITE_TOKEN


def test_repo_that_does_not_exist(hub, capsys):
    with pytest.raises(HubError, match="org/nothing was not found"):
        pull("hf-hub:org/nothing")
    assert main(["pull", "hf-hub:org/nothing"]) == 2
    assert "was not found" in capsys.readouterr().err


def test_revision_that_does_not_exist_lists_the_real_ones(hub, make_model, capsys):
    from huggingface_hub import HfApi

    push_to_hub(make_model(0), "org/r")
    HfApi().create_tag("org/r", tag="v1")
    with pytest.raises(HubError, match=r"revision 'v9' does not exist in org/r.*main, v1"):
        pull("hf-hub:org/r@v9")
    assert main(["pull", "hf-hub:org/r", "--revision", "0" * 40]) == 2


def test_offline_with_nothing_cached(hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="holds nothing of org/x"):
        pull("hf-hub:org/x")
    assert main(["pull", "hf-hub:org/x"]) == 2
    assert hub.requests == []


def test_weights_for_a_plugin_that_is_not_installed(hub, make_model, monkeypatch, capsys):
    from zoo_core.plugins import load_registry

    push_to_hub(make_model(0), "org/needs-s4d")
    monkeypatch.setenv("ZOO_LOAD_PLUGINS", "")
    bare = load_registry()
    with pytest.raises(MissingPluginError, match=r"pip install zoo-s4d==0\.1\.0") as info:
        create_model("hf-hub:org/needs-s4d", registry=bare)
    assert info.value.exit_code == 4 and "org/needs-s4d@" in str(info.value)


def test_push_without_a_token(hub, make_model, monkeypatch, cli, tmp_path):
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(HubError, match="needs a Hub token"):
        push_to_hub(make_model(0), "org/p")
    assert hub.requests == []  # refused before any request
    save_pretrained(make_model(0), str(tmp_path / "m"))
    done = cli("push", str(tmp_path / "m"), "org/p")
    assert done.returncode == 2 and "needs a Hub token" in done.stderr and "Traceback" not in done.stderr


def test_push_with_a_token_the_hub_refuses(hub, make_model):
    with pytest.raises(HubError, match="refused the token") as info:
        push_to_hub(make_model(0), "org/p", token="hf_not_a_valid_token")
    assert "hf_not_a_valid_token" not in str(info.value) and WRITE_TOKEN not in str(info.value)
    assert "org/p" not in hub.repos


def test_bare_org_name_is_refused_with_both_spellings(capsys):
    assert main(["pull", "org/name"]) == 2
    err = capsys.readouterr().err
    assert "hf-hub:org/name" in err and "local-dir:org/name" in err


def test_repo_without_weights(hub, tmp_path):
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo("org/empty")
    (tmp_path / "config.json").write_text("{}")
    api.upload_folder(repo_id="org/empty", folder_path=str(tmp_path))
    with pytest.raises(CheckpointError, match="holds no model.safetensors"):
        pull("hf-hub:org/empty")


def test_push_refuses_a_broken_folder(hub, make_model, tmp_path):
    save_pretrained(make_model(0), str(tmp_path / "m"))
    path = tmp_path / "m" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(CheckpointError):
        push_to_hub(tmp_path / "m", "org/broken")
    assert "org/broken" not in hub.repos


def test_the_server_enforces_the_protocol(hub):
    """The double is strict: a wrong LFS hash, a stale parent commit and a missing token are refused."""
    import base64
    import hashlib
    import json
    import urllib.error
    import urllib.request

    def post(path, body, token=WRITE_TOKEN, raw=None):
        req = urllib.request.Request(hub.url + path, data=raw if raw is not None else json.dumps(body).encode(), method="POST")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, e.headers

    assert post("/api/repos/create", {"name": "s", "organization": "org"}, token=None)[0] == 401
    assert post("/api/repos/create", {"name": "s", "organization": "org"})[0] == 200
    assert post("/api/repos/create", {"name": "s", "organization": "org"})[0] == 409
    data = b"weights"
    oid = hashlib.sha256(data).hexdigest()
    put = urllib.request.Request(f"{hub.cdn_url}/lfs-upload/{oid}/{len(data)}", data=b"weightz", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(put)
    assert info.value.code == 400  # sha256 mismatch refused
    lines = [{"key": "header", "value": {"summary": "x", "parentCommit": "f" * 40}},
             {"key": "file", "value": {"path": "a.txt", "content": base64.b64encode(b"a").decode(), "encoding": "base64"}}]
    ndjson = "\n".join(json.dumps(x) for x in lines).encode()
    assert post("/api/models/org/s/commit/main", None, raw=ndjson)[0] == 412  # stale parent
    lines[0]["value"].pop("parentCommit")
    lines.append({"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256", "oid": oid, "size": len(data)}})
    ndjson = "\n".join(json.dumps(x) for x in lines).encode()
    assert post("/api/models/org/s/commit/main", None, raw=ndjson)[0] == 400  # LFS object never uploaded


def test_a_file_with_neither_pin_nor_announced_hash_is_reported_unverified(tmp_path):
    """A --local-dir pull whose download metadata is gone cannot be checked: said, not silently passed."""
    from zoo_core.hub.pulling import _verify

    (tmp_path / "config.json").write_text("{}")
    verdict = _verify(tmp_path, ["config.json"], {}, local_dir=True, repo_id="org/x", commit=None, token=None, offline=True)
    assert verdict.bad == {} and verdict.unverified == ["config.json"] and verdict.verified == {}
