"""The zoo's workflows on an RG-LRU model: one epoch of `zoo train` on JapaneseVowels, `zoo eval`
with adaptive depth, `zoo stream` (step by step = the parallel forward) and save/load
(zoo_core.testing.workflows), reshaped input streaming, and every example spec builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo_core.build import build_model
from zoo_core.cli.zoo import main as zoo_main
from zoo_core.testing.workflows import check_workflows

ROOT = Path(__file__).resolve().parents[3]
SPEC = {
    "schema_version": 1, "name": "rglru-jv-smoke",
    "task": {"kind": "classification", "classes": 9}, "input": {"channels": 12},
    "model": {"d_model": 8, "depth": 2, "stacking": {"policy": "periodic", "period": 1},
              "block": {"norm": "rms", "prenorm": True, "activation": "identity", "output": "none", "residual": True,
                        "dropout": 0.0},
              "core": {"kind": "rglru", "lru_width": 12, "num_heads": 3}},
    "training": {"dataset": "JapaneseVowels", "protocol": "seed-split", "epochs": 1, "batch_size": 64, "lr": 3e-3},
}


@pytest.mark.requires("aeon")
def test_train_eval_stream_and_save_load_on_japanese_vowels(tmp_path):
    check_workflows(SPEC["model"]["core"], tmp_path)


def test_reshaped_input_streams_like_the_parallel_forward():
    spec = {k: v for k, v in SPEC.items() if k != "training"}
    spec = {**spec, "input": {"channels": 12, "reshape": {"c": 24}}}
    model = build_model(spec, seed=0, dtype=torch.float64).eval()
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    state = model.init_state(2, dtype=torch.float64)
    with torch.no_grad():
        for t in range(x.shape[1]):
            y, state = model.step(x[:, t], state)
        torch.testing.assert_close(y, model(x), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("path", sorted((ROOT / "plugins/zoo-rglru/specs").glob("*.yaml")) + [
    ROOT / "benchmarks/repro/specs/rglru-japanesevowels.yaml", ROOT / "pretrained/specs/rglru-small.japanesevowels.yaml"],
    ids=lambda p: p.name)
def test_example_specs_build(path):
    assert zoo_main(["build", str(path)]) == 0
