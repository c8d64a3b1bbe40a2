"""The split protocol: merge, exact-duplicate removal, 70/15/15 per seed, official, z-score."""

from __future__ import annotations

import numpy as np
import pytest

from zoo_core.datasets import Dataset, DatasetInfo, SplitData
from zoo_core.errors import SpecError
from zoo_core.train.protocol import drop_duplicates, make_splits, merge, seed_split, zscore


def _data(n=20, length=5, d=2, seed=0, lengths=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, length, d)).astype(np.float32)
    lens = rng.integers(1, length + 1, size=n) if lengths else None
    if lens is not None:
        for i, k in enumerate(lens):
            X[i, k:] = 0
    return SplitData(X, (np.arange(n) % 3).astype(np.int64), lens)


def test_merge_pads_and_keeps_lengths():
    a, b = _data(4, length=5), _data(3, length=7, seed=1)
    m = merge([a, b])
    assert m.X.shape == (7, 7, 2) and m.lengths.tolist() == [5] * 4 + [7] * 3
    assert (m.X[:4, 5:] == 0).all()


def test_drop_duplicates_only_exact_rows():
    d = _data(6)
    X = np.concatenate([d.X, d.X[[1, 2, 3]]])
    y = np.concatenate([d.y, d.y[[1, 2, 3]]])
    y[-1] = (y[-1] + 1) % 3  # same X, another label: not an exact duplicate
    X[-2, 0, 0] += 1e-6  # nearly equal: kept
    out, dropped = drop_duplicates(SplitData(X, y))
    assert dropped == 1 and len(out) == 8
    np.testing.assert_array_equal(out.X[:6], d.X)  # the first occurrence is kept, order preserved


def test_seed_split_sizes_disjoint_deterministic():
    d = SplitData(np.arange(103, dtype=np.float32).reshape(103, 1, 1), np.arange(103))
    tr, va, te = seed_split(d, 2345)
    assert (len(tr), len(va), len(te)) == (int(103 * 0.7), int(103 * 0.85) - int(103 * 0.7), 103 - int(103 * 0.85))
    ids = np.concatenate([tr.y, va.y, te.y])
    assert sorted(ids.tolist()) == list(range(103))
    again = seed_split(d, 2345)
    assert (again[2].y == te.y).all()
    assert not (seed_split(d, 3456)[2].y == te.y).all()


def _dataset(parts, task="classification", sizes=None):
    info = DatasetInfo(name="toy", task=task, channels=2, classes=3, sizes=sizes or {k: len(v) for k, v in parts.items()})
    return Dataset(info, lambda split: parts[split])


def test_make_splits_seed_split_and_official():
    tr, te = _data(30), _data(20, seed=1)
    dup = SplitData(np.concatenate([te.X, tr.X[:5]]), np.concatenate([te.y, tr.y[:5]]))
    ds = _dataset({"train": tr, "test": dup})
    s = make_splits(ds, protocol="seed-split", seed=2345, val_fraction=0.2)
    assert s.info["duplicates_dropped"] == 5 and sum(s.info["sizes"].values()) == 50
    o = make_splits(ds, protocol="official", seed=0, val_fraction=0.2)
    assert o.info["sizes"] == {"train": 24, "val": 6, "test": 25}
    np.testing.assert_array_equal(o.test.X, dup.X)
    rows = {x.tobytes() for x in np.concatenate([o.train.X, o.val.X])}
    assert rows == {x.tobytes() for x in tr.X}


def test_zscore_uses_training_statistics_and_keeps_padding_zero():
    tr, te = _data(30, lengths=True), _data(10, seed=1, lengths=True)
    ztr, zte = zscore(tr, te)
    mask = np.arange(5)[None, :] < tr.lengths[:, None]
    np.testing.assert_allclose(ztr.X[mask].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(ztr.X[mask].std(0), 1, atol=1e-4)
    tmask = np.arange(5)[None, :] < te.lengths[:, None]
    assert (zte.X[~tmask] == 0).all() and not np.allclose(zte.X[tmask].mean(0), 0, atol=1e-3)


def test_lm_refuses_seed_split():
    info = DatasetInfo(name="chars", task="lm", vocab_size=5, sizes={"train": 1, "val": 1, "test": 1})
    with pytest.raises(SpecError, match="protocol: official"):
        make_splits(Dataset(info, lambda s: None), protocol="seed-split", seed=0, val_fraction=0.2)
