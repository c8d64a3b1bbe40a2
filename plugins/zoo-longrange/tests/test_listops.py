"""ListOps: every label equals the expression's value as an independent parser computes it from the
tokens alone; lengths, depth and argument counts within LRA's bounds; labels spread over the classes;
splits distinct and deterministic; the registered dataset loads through zoo-core's checks."""

from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np
import pytest

from zoo_core.datasets import Dataset, get_dataset
from zoo_longrange import listops

# The token ids as the card documents them, written out here rather than read from the generator.
SYMBOLS = {i + 1: str(i) for i in range(10)} | {11: "MIN", 12: "MAX", 13: "MED", 14: "SM", 15: "]"}


def parse(ids: list[int]) -> tuple[int, int, int]:
    """(value, depth, most arguments of one operator) of one expression; AssertionError if malformed.

    Depth counts the root operator as 1 and a digit one below its operator, as LRA does."""
    pos = 0

    def node(depth: int) -> tuple[int, int, int]:
        nonlocal pos
        sym = SYMBOLS[ids[pos]]
        pos += 1
        if sym.isdigit():
            return int(sym), depth, 0
        assert sym != "]", f"a ']' where an expression starts, at {pos - 1}"
        values, deepest, widest = [], depth, 0
        while SYMBOLS[ids[pos]] != "]":
            v, d, w = node(depth + 1)
            values.append(v)
            deepest, widest = max(deepest, d), max(widest, w)
        pos += 1
        assert len(values) >= 2, f"{sym} with {len(values)} argument(s)"
        value = {"MIN": min, "MAX": max, "SM": lambda v: sum(v) % 10,
                 "MED": lambda v: int(statistics.median(v))}[sym](values)
        return value, deepest, max(widest, len(values))

    out = node(1)
    assert pos == len(ids), f"{len(ids) - pos} token(s) after the expression"
    return out


def _check(parts, lo: int, hi: int, max_depth: int, max_args: int) -> None:
    seen = set()
    for X, y, lengths in parts:
        assert X.dtype == np.int64 and y.dtype == np.int64 and X.shape == (len(y), hi - 1)
        depths = []
        for row, label, n in zip(X, y, lengths, strict=True):
            assert lo < n < hi
            assert (row[n:] == 0).all() and (row[:n] != 0).all()
            value, depth, widest = parse(row[:n].tolist())
            assert value == label
            assert depth <= max_depth and 2 <= widest <= max_args
            depths.append(depth)
            seen.add(row[:n].tobytes())
        assert max(depths) == max_depth  # the bound is reached, not just respected
    assert len(seen) == sum(len(p[1]) for p in parts)  # distinct across splits, as LRA's set


def test_labels_are_the_values_and_bounds_hold_cpu_size():
    parts = listops.generate(3, (300, 40, 40), 100, 300, 10, 10)
    _check(parts, 100, 300, 10, 10)
    counts = np.bincount(np.concatenate([p[1] for p in parts]), minlength=10)
    assert (counts > 0).all() and counts.max() < 0.35 * counts.sum()  # all ten classes, none dominating


def test_labels_are_the_values_at_lra_lengths_and_tight_bounds():
    _check(listops.generate(4, (40,), 500, 2000, 10, 10), 500, 2000, 10, 10)
    _check(listops.generate(5, (150,), 10, 60, 4, 3), 10, 60, 4, 3)
    _check(listops.generate(6, (250, 50), 3, 6, 2, 3), 3, 6, 2, 3)  # 4,400 expressions: repeats are drawn, and dropped


def test_med_truncates_the_mean_of_the_middle_pair_and_sum_is_mod_10():
    assert listops.apply(listops.MED, [1, 2]) == 1 and listops.apply(listops.MED, [3, 4, 9, 9]) == 6
    assert listops.apply(listops.MED, [7, 0, 5]) == 5 and listops.apply(listops.SUM_MOD, [9, 9, 5]) == 3
    assert listops.decode(listops.encode(["[MAX", "2", "9", "]"])) == ["[MAX", "2", "9", "]"]


def test_deterministic_from_the_seed():
    a, b = listops.generate(7, (20,), 20, 80, 6, 5), listops.generate.__wrapped__(7, (20,), 20, 80, 6, 5)
    assert all((x == y).all() for x, y in zip(a[0], b[0], strict=True))
    assert not np.array_equal(a[0][0], listops.generate(8, (20,), 20, 80, 6, 5)[0][0])


def test_bounds_that_leave_no_length_are_refused():
    with pytest.raises(ValueError, match="min_length < max_length - 1"):
        listops.generate(0, (1,), 10, 11, 10, 10)


def test_registered_cpu_set_and_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path))
    info = get_dataset("ListOps").info
    assert (info.task, info.classes, info.vocab_size, info.channels, info.length) == ("classification", 10, 16, None, 299)
    assert get_dataset("ListOps-LRA").info.length == 1999
    sizes = {"train": 12, "val": 3, "test": 3}
    first = listops.load("val", sizes=sizes, min_length=20, max_length=80)
    assert len(list((tmp_path / "zoo-longrange").glob("listops-*.npz"))) == 1
    (path,) = (tmp_path / "zoo-longrange").glob("listops-*.npz")
    real = listops.generate
    monkeypatch.setattr(listops, "generate", lambda *a: pytest.fail("generated again instead of reading the cache"))
    again = listops.load("val", sizes=sizes, min_length=20, max_length=80)
    assert np.array_equal(first.X, again.X) and np.array_equal(first.y, again.y) and np.array_equal(first.lengths, again.lengths)
    # the registered entry's loader and parameters, at a small size, through zoo-core's split checks
    ds = get_dataset("ListOps")
    small = Dataset(replace(ds.info, sizes=sizes), listops.load, {**ds._params, "sizes": sizes, "min_length": 20, "max_length": 80})
    assert np.array_equal(small.load("val").X, first.X)
    path.write_bytes(path.read_bytes()[:100])  # a truncated file (a killed writer of another tool): generated again
    monkeypatch.setattr(listops, "generate", real)
    assert np.array_equal(listops.load("val", sizes=sizes, min_length=20, max_length=80).X, first.X)
