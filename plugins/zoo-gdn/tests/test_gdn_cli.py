"""The zoo's commands on a Gated DeltaNet model: `zoo train` one epoch on JapaneseVowels then
`zoo eval` of the saved model, and `zoo stream` (step by step = the parallel prediction)."""

from __future__ import annotations

import json
import os

import pytest

from zoo_core.cli import main

SPEC = os.path.join(os.path.dirname(__file__), "..", "specs", "gdn-classifier.yaml")


@pytest.mark.requires("aeon")
def test_train_one_epoch_then_eval(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", SPEC, "--dataset", "JapaneseVowels", "--epochs", "1", "--batch-size", "64", "--lr", "3e-3",
                 "-o", str(out), "--plain"]) == 0
    assert "JapaneseVowels: test accuracy" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    model_dir = metrics["seeds"][0]["model_dir"]
    assert main(["eval", model_dir]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["fixed_depth"]["accuracy"] == metrics["seeds"][0]["test"]["accuracy"]


@pytest.mark.requires("aeon")
def test_stream_agrees_with_the_parallel_forward(capsys):
    assert main(["stream", SPEC, "--dataset", "japanesevowels", "--index", "2"]) == 0
    assert "agreement        : OK" in capsys.readouterr().out
