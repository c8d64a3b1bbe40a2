"""The example specs build, fit the dataset they name (and its harder or permuted siblings) and run a
forward pass on that dataset's input shape; the plugin registers its sets as metadata only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo_core import build_model
from zoo_core.datasets import get_dataset
from zoo_core.spec import load_spec

SPECS = sorted((Path(__file__).resolve().parents[1] / "specs").glob("*.yaml"))
SIBLINGS = {"Pathfinder32-6": ["Pathfinder32-9", "Pathfinder32-14", "Pathfinder32-14-LRA"],
            "ListOps": ["ListOps-LRA"], "sMNIST": ["psMNIST"]}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_builds_fits_its_datasets_and_runs(path):
    spec = load_spec(path)
    name = spec.envelope.training.dataset
    for ds in [name, *SIBLINGS[name]]:
        get_dataset(ds).check_spec(spec.envelope, where=str(path))
    info = get_dataset(name).info
    model = build_model(path, seed=0).eval()
    x = torch.randint(1, info.vocab_size, (2, 50)) if info.vocab_size else torch.rand(2, 50, 1)
    assert model(x).shape == (2, info.classes)


def test_every_example_spec_is_covered():
    assert {p.stem for p in SPECS} == {f"{c}-{t}" for c in ("s4d", "lru") for t in ("listops", "pathfinder", "smnist")}
