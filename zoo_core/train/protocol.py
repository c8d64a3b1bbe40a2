"""The data protocol: which sequences train, validate and test a run.

``seed-split`` is the seed paper's (the LinOSS / Log-NCDE ``process_uea.py`` + ``dataset_generator``
it builds on): the official train and test splits are merged, exact duplicates dropped, and a random
permutation per seed cut at ``int(0.70 n)`` and ``int(0.85 n)`` into train / validation / test. It is
not stratified, and the seed's code normalises nothing. The permutation here comes from numpy's
PCG64 seeded with the run seed, not from JAX's PRNG, so the splits are fixed and reproducible but
not the very same index sets as the JAX code's.

``official`` keeps the official test split and holds out ``val_fraction`` of the official train split
(a seeded permutation) for validation. A dataset that ships its own validation split uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..datasets import Dataset, SplitData
from ..errors import SpecError

TRAIN_FRACTION, VAL_END = 0.70, 0.85


@dataclass(frozen=True)
class Splits:
    train: SplitData
    val: SplitData
    test: SplitData
    info: dict[str, Any] = field(default_factory=dict)


def _pad_to(a: np.ndarray, length: int) -> np.ndarray:
    if a.shape[1] == length:
        return a
    pad = [(0, 0)] * a.ndim
    pad[1] = (0, length - a.shape[1])
    return np.pad(a, pad)


def merge(parts: list[SplitData]) -> SplitData:
    """Concatenate splits, zero-padding X to the longest; lengths kept (or made) explicit."""
    length = max(p.X.shape[1] for p in parts)
    uneven = any(p.lengths is not None for p in parts) or len({p.X.shape[1] for p in parts}) > 1
    X = np.concatenate([_pad_to(p.X, length) for p in parts])
    y = np.concatenate([p.y for p in parts])
    lengths = None
    if uneven:
        lengths = np.concatenate([p.lengths if p.lengths is not None else np.full(len(p), p.X.shape[1], np.int64) for p in parts])
    return SplitData(X, y, lengths)


def drop_duplicates(data: SplitData) -> tuple[SplitData, int]:
    """Keep the first of each group of exactly equal (X, length, y) rows; returns (data, dropped)."""
    seen: set[bytes] = set()
    keep = []
    for i in range(len(data)):
        length = b"" if data.lengths is None else int(data.lengths[i]).to_bytes(8, "little")
        key = np.ascontiguousarray(data.X[i]).tobytes() + length + np.ascontiguousarray(data.y[i]).tobytes()
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return data.subset(np.array(keep, dtype=np.int64)), len(data) - len(keep)


def permutation(n: int, seed: int) -> np.ndarray:
    return np.random.Generator(np.random.PCG64(seed)).permutation(n)


def seed_split(data: SplitData, seed: int) -> tuple[SplitData, SplitData, SplitData]:
    """70/15/15 of a random permutation (cut at int(0.7 n), int(0.85 n)), as the seed's code does."""
    n = len(data)
    idx = permutation(n, seed)
    a, b = int(n * TRAIN_FRACTION), int(n * VAL_END)
    if a == 0 or b == a or b == n:
        raise SpecError(f"{n} sequences are too few for a 70/15/15 split (train {a}, val {b - a}, test {n - b})")
    return data.subset(idx[:a]), data.subset(idx[a:b]), data.subset(idx[b:])


def make_splits(dataset: Dataset, *, protocol: str, seed: int, val_fraction: float, normalize: str = "none") -> Splits:
    """The train / validation / test sequences of one run."""
    splits = dataset.info.splits
    info: dict[str, Any] = {"protocol": protocol, "seed": seed}
    if protocol == "seed-split":
        if dataset.info.task == "lm":
            raise SpecError(f"dataset {dataset.info.name!r} is a token dataset with fixed splits (a text split by source, "
                            "or a task whose test split is longer than its training split), which seed-split would mix "
                            "into train and test; use training.protocol: official")
        merged, dropped = drop_duplicates(merge([dataset.load(s) for s in splits]))
        train, val, test = seed_split(merged, seed)
        info["duplicates_dropped"] = dropped
    elif protocol == "official":
        test = dataset.load("test")
        if "val" in splits:
            train, val = dataset.load("train"), dataset.load("val")
        else:
            full = dataset.load("train")
            idx = permutation(len(full), seed)
            cut = int(round(len(full) * val_fraction))
            if cut == 0 or cut == len(full):
                raise SpecError(f"val_fraction {val_fraction} of {len(full)} training sequences leaves an empty split")
            train, val = full.subset(np.sort(idx[cut:])), full.subset(np.sort(idx[:cut]))
    else:
        raise SpecError(f"unknown protocol {protocol!r}; choose seed-split or official")
    if normalize == "zscore":
        train, val, test = zscore(train, val, test)
    info["sizes"] = {"train": len(train), "val": len(val), "test": len(test)}
    info["normalize"] = normalize
    return Splits(train, val, test, info)


def _valid_mask(d: SplitData) -> np.ndarray:
    steps = np.arange(d.X.shape[1])
    lengths = d.lengths if d.lengths is not None else np.full(len(d), d.X.shape[1])
    return steps[None, :] < lengths[:, None]  # (n, L)


def zscore(train: SplitData, *rest: SplitData) -> tuple[SplitData, ...]:
    """Per-channel (x − μ) / σ with μ, σ over the training split's valid steps; padding stays 0."""
    mask = _valid_mask(train)
    values = train.X[mask].astype(np.float64)  # (steps, D)
    mu, sd = values.mean(axis=0), values.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    out = []
    for d in (train, *rest):
        X = ((d.X - mu) / sd).astype(np.float32) * _valid_mask(d)[..., None]
        out.append(SplitData(X, d.y, d.lengths))
    return tuple(out)
