"""Model folders: round trip, strict loading into a different architecture, corrupted files,
and failed saves that leave the old folder intact."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch
from safetensors import safe_open

from zoo_core.build import build_model
from zoo_core.errors import CheckpointError
from zoo_core.factory import load_pretrained
from zoo_core.io.pretrained import WEIGHTS, load_weights_file, save_pretrained
from zoo_core.testing.helpers import model_spec

SPEC = model_spec("s4d", inp={"channels": 2}, d_model=8, depth=4, stacking={"policy": "periodic", "period": 2})


def _snapshot(folder):
    return {p: (folder / p).read_bytes() for p in os.listdir(folder)}


def test_round_trip_is_exact_and_self_describing(tmp_path):
    model = build_model(SPEC, seed=0).eval()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    x = torch.randn(2, 13, 2)
    assert torch.equal(model(x), loaded(x))
    with safe_open(str(tmp_path / "m" / WEIGHTS), "pt") as f:
        meta = f.metadata()
        keys = set(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    assert json.loads(meta["spec"]) == model.spec
    assert json.loads(meta["versions"])["zoo-s4d"] == "0.1.0"
    assert not any(k.startswith("stack.blocks.2") for k in keys)  # ABAB: two blocks stored once each
    assert dtypes == {"F32"}  # complex parameters are stored as real views
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["spec"] == model.spec and config["model_type"] == "s4d"


def test_tied_weights_saved_once(tmp_path):
    spec = model_spec("s4d", task={"kind": "lm"}, inp={"vocab_size": 13}, d_model=8, depth=1, tie_embeddings=True)
    model = build_model(spec, seed=0).eval()
    save_pretrained(model, tmp_path / "lm")
    with safe_open(str(tmp_path / "lm" / WEIGHTS), "pt") as f:
        assert "head.weight" not in f.keys() and "encoder.weight" in f.keys()
    loaded = load_pretrained(tmp_path / "lm")
    assert loaded.head.weight is loaded.encoder.weight
    tokens = torch.randint(0, 13, (1, 9))
    assert torch.equal(model(tokens), loaded(tokens))


def test_loading_into_a_different_architecture_lists_every_mismatch(tmp_path):
    save_pretrained(build_model(SPEC, seed=0), tmp_path / "m")
    other = json.loads(json.dumps(SPEC))
    other["model"]["stacking"] = {"policy": "independent"}
    other["model"]["core"]["d_state"] = 16
    other["task"]["classes"] = 5
    with pytest.raises(CheckpointError) as info:
        load_weights_file(build_model(other, seed=0), tmp_path / "m")
    msg = str(info.value)
    assert "missing" in msg and "stack.blocks.3" in msg
    assert "shape" in msg and "head.weight" in msg


@pytest.mark.parametrize("damage", ["truncate", "flip_header", "append", "empty"])
def test_corrupted_weights_are_rejected_clearly(tmp_path, damage):
    save_pretrained(build_model(SPEC, seed=0), tmp_path / "m")
    path = tmp_path / "m" / WEIGHTS
    data = path.read_bytes()
    data = {"truncate": data[: len(data) - 100], "flip_header": data[:10] + b"\xff" + data[11:],
            "append": data + b"junk", "empty": b""}[damage]
    path.write_bytes(data)
    with pytest.raises(CheckpointError):
        load_pretrained(tmp_path / "m")


def test_edited_config_is_detected(tmp_path):
    save_pretrained(build_model(SPEC, seed=0), tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["spec"]["model"]["depth"] = 2
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="differs"):
        load_pretrained(tmp_path / "m")


def test_missing_plugin_on_load_names_it(tmp_path, monkeypatch):
    save_pretrained(build_model(SPEC, seed=0), tmp_path / "m")
    from zoo_core.plugins import load_registry

    monkeypatch.setenv("ZOO_LOAD_PLUGINS", "")
    with pytest.raises(CheckpointError, match="zoo-s4d"):
        load_pretrained(tmp_path / "m", registry=load_registry())


def test_failed_save_leaves_the_old_folder_intact(tmp_path, monkeypatch):
    model = build_model(SPEC, seed=0)
    save_pretrained(model, tmp_path / "m")
    before = _snapshot(tmp_path / "m")
    import zoo_core.io.pretrained as pretrained

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pretrained, "canonical_safetensors", boom)
    with torch.no_grad():
        model.head.weight.add_(1.0)
    with pytest.raises(CheckpointError):
        save_pretrained(model, tmp_path / "m")
    assert _snapshot(tmp_path / "m") == before
    assert sorted(os.listdir(tmp_path)) == ["m"]  # no staging litter


def test_saving_the_same_model_twice_gives_identical_bytes(tmp_path):
    """Registry pins and "no change, no new Hub commit" need byte-identical files (the safetensors
    writer alone emits its metadata in hash-map order, different from one save to the next)."""
    model = build_model(SPEC, seed=0)
    digests = set()
    for i in range(4):
        save_pretrained(model, tmp_path / f"m{i}")
        digests.add(hashlib.sha256((tmp_path / f"m{i}" / "model.safetensors").read_bytes()).hexdigest())
    assert len(digests) == 1
    loaded = load_pretrained(tmp_path / "m0")
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n


def test_unsaveable_model_without_spec():
    with pytest.raises(ValueError, match="no spec"):
        save_pretrained(torch.nn.Linear(2, 2), "/nonexistent")


def test_saving_never_deletes_foreign_files(tmp_path):
    target = tmp_path / "project"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="notes.txt"):
        save_pretrained(build_model(SPEC, seed=0), target)
    assert (target / "notes.txt").read_text() == "keep me" and sorted(os.listdir(target)) == ["notes.txt"]
    save_pretrained(build_model(SPEC, seed=0), tmp_path / "m")
    save_pretrained(build_model(SPEC, seed=1), tmp_path / "m")  # replacing our own folder is fine
