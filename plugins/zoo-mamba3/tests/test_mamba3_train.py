"""The zoo's workflows on a Mamba-3 model: one epoch of `zoo train` on JapaneseVowels, `zoo eval`
with adaptive depth, `zoo stream` (step by step = the parallel forward), save/load."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from zoo_core.build import build_model
from zoo_core.cli.train import main
from zoo_core.cli.zoo import main as zoo_main
from zoo_core.factory import load_pretrained
from zoo_core.io.pretrained import save_pretrained

SPEC = {
    "schema_version": 1, "name": "mamba3-jv-smoke",
    "task": {"kind": "classification", "classes": 9}, "input": {"channels": 12},
    "model": {"d_model": 8, "depth": 2, "stacking": {"policy": "periodic", "period": 1},
              "block": {"norm": "rms", "prenorm": True, "activation": "identity", "output": "none", "residual": True,
                        "dropout": 0.0},
              "core": {"kind": "mamba3", "d_state": 4, "headdim": 4, "chunk_size": 8}},
    "training": {"dataset": "JapaneseVowels", "protocol": "seed-split", "epochs": 1, "batch_size": 64, "lr": 3e-3},
}


@pytest.mark.requires("aeon")
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
    streamed = capsys.readouterr().out
    assert "japanesevowels test sequence 3" in streamed and "agreement        : OK" in streamed


def test_save_load_round_trip(tmp_path):
    model = build_model({k: v for k, v in SPEC.items() if k != "training"}, seed=0)
    x = torch.randn(2, 13, 12)
    save_pretrained(model, tmp_path / "m")
    again = load_pretrained(tmp_path / "m")
    torch.testing.assert_close(again(x), model(x))
