"""``zoo train`` / ``zoo eval`` end to end, and bad input: clear errors before any training, exit 2."""

from __future__ import annotations

import json
import urllib.error

import pytest

from zoo_core.cli.train import main

from .conftest import tiny_spec


def test_unknown_dataset_suggests_and_exits_2(tmp_path, capsys):
    spec = tiny_spec(tmp_path)
    assert main(["train", str(spec), "--dataset", "BasicMotion", "-o", str(tmp_path / "out"), "-q"]) == 2
    assert "did you mean 'BasicMotions'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.requires("aeon")
def test_regression_spec_on_classification_set_fails_before_training(tmp_path, capsys):
    spec = tiny_spec(tmp_path, kind="regression")
    assert main(["train", str(spec), "--dataset", "BasicMotions", "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "task.kind is 'regression' but 'BasicMotions' is a classification dataset" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.requires("aeon")
def test_network_dataset_offline_fails_before_training(tmp_path, capsys, monkeypatch):
    import aeon.datasets._data_loaders as loaders

    from zoo_core.defaults import datasets as defaults

    def no_network(*a, **k):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(loaders, "urlopen", no_network)
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path / "cache"))
    defaults._aeon_raw.cache_clear()
    spec = tiny_spec(tmp_path, classes=2, channels=61)
    assert main(["train", str(spec), "--dataset", "Heartbeat", "-o", str(tmp_path / "out"), "-q"]) == 2
    assert "'Heartbeat' needs a network" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_training_option_names_the_key(tmp_path, capsys):
    spec = tiny_spec(tmp_path, training={"dataset": "BasicMotions", "lr": [1e-3, -1.0]})
    assert main(["train", str(spec), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert "training.lr" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.requires("aeon")
def test_train_then_eval_with_adaptive_depth(tmp_path, capsys):
    spec = tiny_spec(tmp_path, training={"dataset": "BasicMotions", "epochs": 2, "batch_size": 16, "lr": 1e-2, "loss": "blockwise"})
    spec.write_text(spec.read_text().replace("depth: 2", "depth: 2\n  stacking: {policy: periodic, period: 1}"))
    out = tmp_path / "run"
    assert main(["train", str(spec), "-o", str(out), "--plain"]) == 0
    printed = capsys.readouterr()
    assert "BasicMotions: test accuracy" in printed.out and "epoch 2/2" in printed.err
    metrics = json.loads((out / "metrics.json").read_text())
    model_dir = metrics["seeds"][0]["model_dir"]
    assert main(["eval", model_dir, "--adaptive", "--max-depth", "4", "--epsilon", "0.05"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["protocol"] == "seed-split" and shown["seed"] == 0 and shown["sequences"] == 12
    assert shown["fixed_depth"]["accuracy"] == metrics["seeds"][0]["test"]["accuracy"]  # the same test split
    ad = shown["adaptive"]
    assert 1 <= ad["min_depth"] <= ad["mean_depth"] <= ad["max_depth"] <= 4 and ad["flops_ratio"] > 0
    assert json.loads(open(shown["written_to"]).read())["adaptive"] == ad


def test_summary_line_of_a_resumed_run_gives_its_wall_in_all(capsys):
    from zoo_core.cli.train import _print_summary

    t = {"mean": 0.5, "std": 0.0, "values": [0.5]}
    metrics = {"metric": "accuracy", "seeds": [{"seed": 0, "lr": 0.01, "best_epoch": 1, "val": {"accuracy": 0.5},
                                                "test": {"accuracy": 0.5}}],
               "summary": {"test_accuracy": t}, "dataset": {"name": "D"}, "params": 10, "wall_time_s": 12.0}
    _print_summary({**metrics, "earlier_wall_s": 30.0}, "out")
    _print_summary(metrics, "out")
    resumed, fresh = [line for line in capsys.readouterr().out.splitlines() if line.startswith("D:")]
    assert resumed.endswith("10 parameters; 12.0 s here, 42.0 s in all") and fresh.endswith("10 parameters; 12.0 s")
