"""registry.yaml's pretrained section (loader and checker), bundled copies, pinned pulls, and cards."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml

from zoo_core.cli.hub import info_pretrained, list_pretrained_rows
from zoo_core.errors import CheckpointError, SpecError, UnknownNameError
from zoo_core.hub import create_model, pull, push_to_hub, render_card
from zoo_core.hub.catalogue import check_catalogue, load_catalogue
from zoo_core.io.pretrained import save_pretrained

ROOT = Path(__file__).resolve().parents[2]
METRICS = [{"dataset": "basicmotions", "split": "test", "metric": "accuracy", "value": 0.925}]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def zoo(tmp_path, make_model, hub):
    """A checkout-like folder: a bundled model, its card, pushed to the loopback Hub, catalogued with pins."""
    from zoo_core.io.pretrained import read_folder

    model = make_model(0)
    bundled = tmp_path / "weights" / "tiny-s4d.test"
    save_pretrained(model, str(bundled))
    _, info = read_folder(bundled)
    card = render_card(name="tiny-s4d.test", spec=info["spec"], metrics=METRICS, versions=info["versions"],
                       repo_id="org/tiny-s4d", training_command="zoo train specs/tiny.yaml --seed 0",
                       num_params=sum(p.numel() for p in model.parameters()))
    (bundled / "README.md").write_text(card)
    (tmp_path / "model_cards").mkdir()
    (tmp_path / "model_cards" / "tiny-s4d.test.md").write_text(card)
    commit = push_to_hub(bundled, "org/tiny-s4d").commit
    entry = {
        "default": True, "spec": info["spec"], "license": "apache-2.0", "datasets": ["basicmotions"],
        "source": {"hub": "org/tiny-s4d", "revision": commit, "bundled": "weights/tiny-s4d.test"},
        "files": {n: _sha(bundled / n) for n in ("model.safetensors", "config.json", "README.md")},
        "metrics": METRICS, "card": "model_cards/tiny-s4d.test.md",
    }
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "pretrained": {"tiny-s4d.test": entry}}))
    return path, model, entry


def _rewrite(path: Path, fn) -> None:
    data = yaml.safe_load(path.read_text())
    fn(data["pretrained"]["tiny-s4d.test"])
    path.write_text(yaml.safe_dump(data))


def test_the_shipped_registry_parses_and_checks():
    cat = load_catalogue(ROOT / "registry.yaml")
    assert check_catalogue(cat) == []


def test_bundled_and_hub_copies_load_and_match_the_pins(zoo, hub, monkeypatch):
    path, model, entry = zoo
    cat = load_catalogue(path)
    assert check_catalogue(cat) == []
    x = torch.randn(2, 5, 2)
    bundled = pull("tiny-s4d.test", catalogue=cat)
    assert bundled.source == "bundled" and bundled.pinned
    hub.clear()
    assert torch.equal(create_model("tiny-s4d", catalogue=cat)(x), model(x))  # arch -> its default tag
    assert hub.requests == []  # the bundled copy needs no network
    remote = pull("tiny-s4d.test", catalogue=cat, source="hub")
    assert remote.source == "hub" and remote.pinned and remote.commit == entry["source"]["revision"]
    assert torch.equal(create_model("tiny-s4d.test", catalogue=cat, source="hub")(x), model(x))
    fresh = create_model("tiny-s4d.test", pretrained=False, catalogue=cat)
    assert {k: v.shape for k, v in fresh.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


def test_pin_mismatch_is_refused_and_removed_from_the_cache(zoo, hub, hf_home, check_cache):
    path, _, _ = zoo
    _rewrite(path, lambda e: e["files"].update({"model.safetensors": "0" * 64}))
    cat = load_catalogue(path)
    assert any("does not match its sha256 pin" in p for p in check_catalogue(cat))
    with pytest.raises(CheckpointError, match="registry.yaml pins"):
        pull("tiny-s4d.test", catalogue=cat, source="hub")
    assert not list((hf_home / "hub").glob("models--org--tiny-s4d/snapshots/*/model.safetensors"))
    assert check_cache(hf_home / "hub") == []
    with pytest.raises(CheckpointError, match="bundled copy"):
        pull("tiny-s4d.test", catalogue=cat)


@pytest.mark.parametrize("edit, message", [
    (lambda e: e.update(bogus=1), "unknown key 'bogus'"),
    (lambda e: e["source"].update(revision="main"), "40-hex-digit commit sha"),
    (lambda e: e["files"].update({"config.json": "abc"}), "64 lowercase hex"),
    (lambda e: e["metrics"][0].pop("split"), "needs dataset, split"),
    (lambda e: e.update(source={}), "give a Hub repo"),
])
def test_malformed_entries_are_named(zoo, edit, message):
    path, _, _ = zoo
    _rewrite(path, edit)
    with pytest.raises(SpecError, match=message) as info:
        load_catalogue(path)
    assert "tiny-s4d.test" in str(info.value)


def test_checker_finds_card_drift_and_unknown_cores(zoo):
    path, _, _ = zoo
    card = path.parent / "model_cards" / "tiny-s4d.test.md"
    card.write_text(card.read_text().replace("0.925", "0.99"))  # a hand-edited number
    _rewrite(path, lambda e: e["spec"]["model"]["core"].update(kind="nosuchcore"))
    problems = check_catalogue(load_catalogue(path))
    assert any("differs from the pinned README.md" in p for p in problems)
    assert any("spec does not validate" in p and "nosuchcore" in p for p in problems)


def test_list_and_info(zoo):
    path, _, _ = zoo
    rows = list_pretrained_rows(path=str(path))
    assert [r["name"] for r in rows] == ["tiny-s4d.test"] and rows[0]["core"] == "s4d"
    info = info_pretrained("tiny-s4d", path=str(path))
    assert info["name"] == "tiny-s4d.test" and info["metrics"][0]["value"] == 0.925
    with pytest.raises(UnknownNameError, match="tiny-s4d.test"):
        info_pretrained("tiny-s4d.tset", path=str(path))


def test_card_front_matter_is_what_the_hub_reads(zoo):
    from huggingface_hub import ModelCard

    path, _, entry = zoo
    text = (path.parent / "model_cards" / "tiny-s4d.test.md").read_text()
    card = ModelCard(text)
    assert card.data.library_name == "ssm-zoo" and card.data.license == "apache-2.0"
    assert card.data.datasets == ["basicmotions"] and "state-space-model" in card.data.tags
    (result,) = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_type, result.dataset_split) == ("accuracy", 0.925, "basicmotions", "test")
    assert "zoo train specs/tiny.yaml --seed 0" in card.text and "| basicmotions | test | accuracy | 0.925 |" in card.text
    again = render_card(name="tiny-s4d.test", spec=entry["spec"], metrics=METRICS, repo_id="org/tiny-s4d")
    assert again == render_card(name="tiny-s4d.test", spec=entry["spec"], metrics=METRICS, repo_id="org/tiny-s4d")


def test_pushed_card_is_the_catalogued_card(zoo, hub):
    path, _, _ = zoo
    got = pull("tiny-s4d.test", catalogue=load_catalogue(path), source="hub")
    assert (got.path / "README.md").read_bytes() == (path.parent / "model_cards" / "tiny-s4d.test.md").read_bytes()
