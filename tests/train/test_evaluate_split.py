"""Scoring arrays a user holds: ``load_uea_bundled`` returns the lengths, and ``evaluate_split`` masks
the padding with them (padded JapaneseVowels scored without lengths fell from 0.981 to 0.638)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from zoo_core.datasets import get_dataset, load_uea_bundled
from zoo_core.hub import create_model
from zoo_core.hub.catalogue import load_catalogue
from zoo_core.train.evaluate import evaluate_split
from zoo_core.train.protocol import make_splits

pytestmark = pytest.mark.requires("aeon")  # every test scores a bundled UEA set

ROOT = Path(__file__).resolve().parents[2]
TAG = "s4d-small.japanesevowels"
ENTRY = load_catalogue(ROOT / "registry.yaml").entries[TAG]


def test_load_uea_bundled_returns_the_lengths_of_every_sequence():
    X, y, lengths = load_uea_bundled("japanesevowels", split="test")
    raw = get_dataset("JapaneseVowels").load("test")
    assert np.array_equal(lengths, raw.lengths) and X.shape[1] == lengths.max() > lengths.min()
    _, _, full = load_uea_bundled("basicmotions")  # an equal-length set: every sequence is full length
    assert (full == load_uea_bundled("basicmotions").X.shape[1]).all()


def test_the_public_path_gives_the_cards_accuracy_on_the_cards_split():
    model = create_model(TAG, pretrained=True)
    t = ENTRY.spec["training"]
    test = make_splits(get_dataset(t["dataset"]), protocol=t.get("protocol", "seed-split"), seed=t.get("seed", 0),
                       val_fraction=t.get("val_fraction", 0.15 / 0.85), normalize=t.get("normalize", "none")).test
    card = {m.metric: m.value for m in ENTRY.metrics}
    assert evaluate_split(model, test)["accuracy"] == pytest.approx(card["accuracy"], abs=1e-6)
    assert evaluate_split(model, (test.X, test.y, test.lengths))["accuracy"] == pytest.approx(card["accuracy"], abs=1e-6)


def test_bundled_arrays_are_scored_with_their_lengths_and_missing_lengths_are_announced(caplog):
    model = create_model(TAG, pretrained=True)
    data = load_uea_bundled("japanesevowels", split="test")
    assert evaluate_split(model, data)["accuracy"] == pytest.approx(363 / 370)  # what the padding-free forward gives
    with caplog.at_level(logging.WARNING):
        without = evaluate_split(model, (data.X, data.y))["accuracy"]
    assert without < 0.7 and any("looks like end padding" in r.getMessage() for r in caplog.records)
