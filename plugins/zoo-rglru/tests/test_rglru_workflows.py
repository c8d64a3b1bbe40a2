"""The zoo's workflows on an RG-LRU model: one epoch of `zoo train` on JapaneseVowels, `zoo eval`
with adaptive depth, `zoo stream` (step by step = the parallel forward), and every example spec builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from zoo_core.build import build_model
from zoo_core.cli.train import main
from zoo_core.cli.zoo import main as zoo_main

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


def test_train_eval_and_stream_on_japanese_vowels(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "run"
    assert main(["train", str(spec), "-o", str(out), "--plain"]) == 0
    assert "JapaneseVowels: test accuracy" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    model_dir = metrics["seeds"][0]["model_dir"]
    assert main(["eval", model_dir, "--adaptive", "--max-depth", "3", "--epsilon", "0.05"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["fixed_depth"]["accuracy"] == metrics["seeds"][0]["test"]["accuracy"]
    assert 1 <= shown["adaptive"]["min_depth"] <= shown["adaptive"]["max_depth"] <= 3
    assert zoo_main(["stream", str(spec), "--dataset", "japanesevowels", "--index", "3"]) == 0
    assert capsys.readouterr().out.strip()


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
