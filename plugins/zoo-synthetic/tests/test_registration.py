"""The registered variants: loadable through zoo-core's checked loader, consistent metadata, specs that fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zoo_core.datasets import dataset_info, get_dataset
from zoo_core.plugins import get_registry
from zoo_core.spec import load_spec
from zoo_core.train.loop import IGNORE as CORE_IGNORE
from zoo_synthetic import _common, plugin

SPECS = sorted((Path(__file__).resolve().parents[1] / "specs").glob("*.yaml"))
QUICK = ["mqar-small", "mqar", "selective-copying", "selective-copying-L4096", "induction-heads", "induction-heads-L65536"]


def test_ignore_is_the_harness_ignore_index():
    assert _common.IGNORE == CORE_IGNORE


@pytest.mark.parametrize("name", QUICK)
def test_variant_loads_through_the_checked_loader_with_its_declared_sizes(name):
    ds = get_dataset(name)
    info = dataset_info(name)
    assert info.task == "lm" and set(info.sizes) == {"train", "val", "test"}
    longest = 0
    for split in ("train", "val", "test"):
        d = ds.load(split)  # zoo-core checks dtypes and shapes here
        assert len(d) == info.sizes[split] and d.X.max() < info.vocab_size and d.X.min() >= 0
        assert ((d.y == CORE_IGNORE) | ((d.y >= 0) & (d.y < info.vocab_size))).all()
        longest = max(longest, d.X.shape[1])
    assert longest == info.length


def test_length_variants_share_the_base_training_split():
    base, longer = get_dataset("induction-heads"), get_dataset("induction-heads-L1024")
    assert np.array_equal(base.load("train").X, longer.load("train").X)
    assert longer.load("test").X.shape[1] == 1024
    registered = set(get_registry().datasets)
    assert {f"induction-heads-L{length}" for length in plugin.IH_TESTS if length != 256} <= registered
    assert {f"selective-copying-L{length}" for length in plugin.SC_TESTS if length != 256} <= registered
    assert {f"induction-heads-short-L{length}" for length in plugin.IH_SHORT_TESTS if length != 64} <= registered
    assert {f"selective-copying-short-L{length}" for length in plugin.SC_SHORT_TESTS if length != 64} <= registered
    assert {"induction-heads-short", "selective-copying-short"} <= registered
    short, short_long = get_dataset("selective-copying-short"), get_dataset("selective-copying-short-L512")
    assert np.array_equal(short.load("val").X, short_long.load("val").X) and short.load("val").X.shape[1] == 64
    assert short_long.load("test").X.shape[1] == 512 and len(short.load("train")) == 16000


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_example_specs_fit_their_dataset(path):
    envelope = load_spec(path).envelope
    assert envelope.training is not None and envelope.training.protocol == "official" and envelope.training.metric == "accuracy"
    get_dataset(envelope.training.dataset).check_spec(envelope, where=str(path))
