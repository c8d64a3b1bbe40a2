"""``zoo train --pack``: unequal-length sequences packed several to a row, the padding saved reported,
and the same training as padded batches (a causal model with per-step norms scores each packed
sequence exactly as padded)."""

from __future__ import annotations

import json

import pytest

from zoo_core.cli.train import main
from zoo_core.errors import SpecError

from .conftest import tiny_spec


@pytest.mark.requires("aeon")
def test_train_pack_reports_the_padding_it_saved_and_matches_padded_training(tmp_path, capsys):
    runs = {}
    for pack in (False, True):
        spec = tiny_spec(tmp_path, classes=9, channels=12, name=f"spec{pack}.yaml",
                         training={"dataset": "JapaneseVowels", "epochs": 1, "batch_size": 32, "deterministic": True})
        out = tmp_path / f"run{pack}"
        assert main(["train", str(spec), "-o", str(out), "--plain", *(["--pack"] if pack else [])]) == 0
        runs[pack] = json.loads((out / "metrics.json").read_text())["seeds"][0]["runs"][0]
    printed = "".join(capsys.readouterr())  # the epoch lines go to stderr
    pad = runs[True]["history"][0]["padding"]
    assert 0 <= pad["packed"] < pad["padded"] and pad["steps_packed"] < pad["steps_padded"]
    assert "packed: padding" in printed
    assert "padding" not in runs[False]["history"][0]
    # the same sequences, the same maths: the epoch's loss and the scores agree to float32 rounding
    assert runs[True]["history"][0]["train_loss"] == pytest.approx(runs[False]["history"][0]["train_loss"], rel=1e-4)
    assert runs[True]["test"]["accuracy"] == pytest.approx(runs[False]["test"]["accuracy"], abs=0.02)


def test_pack_refuses_a_per_step_task(tmp_path):
    from zoo_core.datasets import get_dataset
    from zoo_core.spec import load_spec
    from zoo_core.testing.helpers import model_spec
    from zoo_core.train.run import check_model_fits, training_settings

    spec = load_spec({**model_spec("lru", task={"kind": "sequence", "outputs": 2}, pool="none"), "training": {"pack": True}})
    with pytest.raises(SpecError, match="training.pack packs whole sequences"):
        check_model_fits(spec, training_settings(spec), get_dataset("JapaneseVowels"))
