"""Shared helpers for the training tests: tiny specs and a synthetic dataset plugin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from zoo_core.datasets import SplitData
from zoo_core.hookspecs import hookimpl
from zoo_core.testing.helpers import model_spec


def tiny_spec(tmp_path: Path, *, classes: int = 4, channels: int = 6, kind: str = "classification", training: dict | None = None,
              name: str = "spec.yaml") -> Path:
    task = {"kind": kind, "classes": classes} if kind == "classification" else {"kind": kind, "outputs": 1}
    spec = {**model_spec("lru", task=task, inp={"channels": channels}, d_model=8, depth=2), "name": "tiny", "training": training or {}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def synth_loader(split: str, *, n: int = 40, length: int = 12) -> SplitData:
    """Three well-separated classes of 2-channel sequences (deterministic per split)."""
    rng = np.random.default_rng({"train": 0, "test": 1}[split])
    y = np.arange(n) % 3
    X = rng.normal(size=(n, length, 2)).astype(np.float32) * 0.3 + y[:, None, None].astype(np.float32)
    return SplitData(X, y.astype(np.int64))


def synth_lm_loader(split: str) -> SplitData:
    """A cyclic token stream 0, 1, ..., 4, 0, 1, ...: the next token is always predictable."""
    n = {"train": 24, "val": 8, "test": 8}[split]
    start = np.arange(n)[:, None] % 5
    tokens = (start + np.arange(9)[None, :]) % 5
    return SplitData(tokens[:, :-1].astype(np.int64), tokens[:, 1:].astype(np.int64))


def synth_token_loader(split: str) -> SplitData:
    """Token classification: the class is the first token (0, 1 or 2), then 7 tokens of noise from 3..5."""
    rng = np.random.default_rng({"train": 0, "val": 1, "test": 2}[split])
    n = {"train": 30, "val": 9, "test": 9}[split]
    X = rng.integers(3, 6, size=(n, 8)).astype(np.int64)
    y = np.arange(n, dtype=np.int64) % 3
    X[:, 0] = y
    return SplitData(X, y)


class SynthPlugin:
    zoo_api = 1

    @staticmethod
    @hookimpl
    def zoo_register_datasets(register):
        register("Synth3", synth_loader, description="synthetic 3-class", task="classification", channels=2, classes=3,
                 length=12, sizes={"train": 40, "test": 40}, params={"n": 40, "length": 12})
        register("SynthTokens", synth_token_loader, description="token classification", task="classification", vocab_size=6,
                 classes=3, length=8, sizes={"train": 30, "val": 9, "test": 9})
        register("SynthLM", synth_lm_loader, description="synthetic cyclic tokens", task="lm", vocab_size=5, length=8,
                 sizes={"train": 24, "val": 8, "test": 8})


@pytest.fixture(scope="session")
def synth_registry():
    from zoo_core.plugins import entry_point_sources, inline_source, load_registry

    return load_registry([*entry_point_sources(), inline_source("synth", SynthPlugin)])
