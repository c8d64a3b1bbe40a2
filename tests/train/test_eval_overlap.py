"""``zoo eval`` refuses a split that holds sequences the model trained on (a pretrained tag trained on
the seed protocol's split, scored on the official test split, counted its own training sequences:
JapaneseVowels 0.981 instead of 0.9375), unless ``--allow-overlap``, which warns and records it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from zoo_core.cli.train import main
from zoo_core.hookspecs import hookimpl
from zoo_core.hub.catalogue import load_catalogue
from zoo_core.plugins import using_registry
from zoo_core.train.evaluate import SplitOverlapError, evaluate_model
from zoo_core.train.progress import Progress
from zoo_core.train.run import train

from .conftest import tiny_spec

ROOT = Path(__file__).resolve().parents[2]
TAG = "s4d-small.japanesevowels"
CARD = {m.metric: m.value for m in load_catalogue(ROOT / "registry.yaml").entries[TAG].metrics}


@pytest.mark.requires("aeon")
def test_the_official_split_of_a_seed_split_model_is_refused_with_the_reason_and_the_fix(capsys):
    assert main(["eval", TAG, "--protocol", "official", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "of the 370 sequences of the official test split" in err and "the model was trained on (protocol seed-split, seed 0)" in err
    assert "--protocol seed-split --seed 0" in err and "--allow-overlap" in err
    assert "Traceback" not in err


@pytest.mark.requires("aeon")
def test_another_seed_of_the_same_protocol_overlaps_too():
    with pytest.raises(SplitOverlapError, match="seed 1"):
        evaluate_model(TAG, seed=1, device="cpu")


@pytest.mark.requires("aeon")
def test_allow_overlap_scores_with_a_loud_warning_and_records_it(caplog, capsys):
    with caplog.at_level(logging.WARNING):
        assert main(["eval", TAG, "--protocol", "official", "--device", "cpu", "--allow-overlap"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["fixed_depth"]["accuracy"] == pytest.approx(0.981, abs=1e-3)  # inflated by its own training sequences
    assert got["overlap_with_training"]["of"] == 370 and got["overlap_with_training"]["sequences"] > 100
    assert any("NOT a held-out score" in r.getMessage() for r in caplog.records)


@pytest.mark.requires("aeon")
def test_the_models_own_protocol_and_the_train_split_are_not_refused():
    got = evaluate_model(TAG, device="cpu")
    assert got["fixed_depth"]["accuracy"] == pytest.approx(CARD["accuracy"], abs=1e-6) and "overlap_with_training" not in got
    assert evaluate_model(TAG, split="train", protocol="official", device="cpu")["split"] == "train"  # asked for explicitly


def test_a_run_folder_records_its_split_and_the_other_protocol_is_refused(tmp_path, synth_registry, monkeypatch):
    spec = tiny_spec(tmp_path, classes=3, channels=2,
                     training={"dataset": "Synth3", "batch_size": 8, "epochs": 1, "lr": 1e-2, "protocol": "seed-split"})
    train(spec, output=tmp_path / "run", registry=synth_registry, progress=Progress(quiet=True))
    best = tmp_path / "run" / "seed-0" / "lr-0.01" / "best"
    with using_registry(synth_registry):
        assert evaluate_model(best, device="cpu")["protocol"] == "seed-split"
        with pytest.raises(SplitOverlapError, match="of Synth3 are sequences the model was trained on"):
            evaluate_model(best, protocol="official", device="cpu")


class OtherPlugin:
    zoo_api = 1

    @staticmethod
    @hookimpl
    def zoo_register_datasets(register):
        from .conftest import synth_loader

        register("Other3", synth_loader, description="another 3-class set", task="classification", channels=2, classes=3,
                 length=10, sizes={"train": 30, "test": 30}, params={"n": 30, "length": 10})


def test_another_dataset_is_not_checked_against_the_training_datasets_split(tmp_path, synth_registry, monkeypatch):
    """The training split a run names is a split of its own dataset: on another dataset it names nothing."""
    from zoo_core.plugins import entry_point_sources, inline_source, load_registry

    from .conftest import SynthPlugin

    registry = load_registry([*entry_point_sources(), inline_source("synth", SynthPlugin), inline_source("other", OtherPlugin)])
    spec = tiny_spec(tmp_path, classes=3, channels=2,
                     training={"dataset": "Synth3", "batch_size": 8, "epochs": 1, "lr": 1e-2, "protocol": "seed-split"})
    train(spec, output=tmp_path / "run", registry=registry, progress=Progress(quiet=True))
    with using_registry(registry):
        got = evaluate_model(tmp_path / "run" / "seed-0" / "lr-0.01" / "best", dataset="Other3", protocol="official", device="cpu")
    assert got["dataset"] == "Other3" and "overlap_with_training" not in got
