"""What the three generators share: seeding, the IGNORE target, parameter errors, mixing splits.

Letters: n sequences, L length (steps the model reads), V vocabulary size.

Every split of every task is drawn from its own ``numpy.random.Generator`` seeded by a
``SeedSequence`` of (base seed, task, split, setting), so a split is the same array on every
machine and every call, the splits of one task never share a stream, and a setting's rows do not
change when another setting is added to the mix.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from zoo_core.datasets import SplitData
from zoo_core.errors import ZooError

# The lm target that is not scored: zoo_core.train.loop.IGNORE (PyTorch's and HF's ignore_index).
# Kept as a literal here so generating data never imports torch; a test holds the two equal.
IGNORE = -100

SPLITS = ("train", "val", "test")


class SyntheticParamError(ZooError, ValueError):
    """A generator was asked for a task that cannot be built (too short, too few tokens, ...)."""

    exit_code = 2


def require(ok: bool, message: str) -> None:
    """Raise SyntheticParamError(message) unless ``ok``: user-facing checks, never ``assert``."""
    if not ok:
        raise SyntheticParamError(message)


def rng_for(seed: int, task: str, split: str, *setting: int) -> np.random.Generator:
    """The generator of one (task, split, setting): independent of every other one.

    ``task`` enters as its CRC-32 so the streams stay fixed across Python runs (``hash`` of a str is
    salted per process); ``setting`` is e.g. (length, pairs), so a test set at a longer length is
    a new draw and the training split at the training length is the same in every variant.
    """
    require(split in SPLITS, f"unknown split {split!r}; the synthetic tasks have {', '.join(SPLITS)}")
    entropy = [int(seed), zlib.crc32(task.encode()), SPLITS.index(split), *map(int, setting)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def stack_parts(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> SplitData:
    """Concatenate (X (n_i, L_i), y (n_i, L_i)) parts into one split, zero-padding X at the end.

    Padded targets are IGNORE, so padding is never scored; ``lengths`` is given only when the
    parts differ in length (an equal-length split returns ``lengths=None``).
    """
    longest = max(x.shape[1] for x, _ in parts)
    n = sum(x.shape[0] for x, _ in parts)
    X = np.zeros((n, longest), dtype=np.int64)  # (n, L)
    y = np.full((n, longest), IGNORE, dtype=np.int64)  # (n, L)
    lengths = np.empty(n, dtype=np.int64)  # (n,)
    row = 0
    for x_i, y_i in parts:
        m, length = x_i.shape
        X[row : row + m, :length] = x_i
        y[row : row + m, :length] = y_i
        lengths[row : row + m] = length
        row += m
    same = all(x.shape[1] == longest for x, _ in parts)
    return SplitData(X, y, None if same else lengths)


def distinct_per_row(rng: np.random.Generator, n: int, low: int, high: int, k: int) -> np.ndarray:
    """(n, k) int64: in each row, k distinct integers from [low, high), a uniformly random ordered draw.

    Two exact ways to the same distribution (every ordered k-tuple of distinct tokens equally
    likely), chosen by size only, so a setting always takes the same path:

    * k^2 <= range (few of many: zoology's 64 of 4,095 keys): draw k uniform tokens per row and
      redraw every row that repeats one; a row is kept with probability >= e^(-1/2), and a
      rejected row is redrawn whole, so the kept rows are uniform over distinct tuples;
    * otherwise: the k smallest of ``range`` uniforms per row, in increasing order (a random
      permutation's first k), in row chunks so that no (n, range) array is built at once.
    """
    size = high - low
    require(0 <= k <= size, f"cannot draw {k} distinct tokens from the {size} in [{low}, {high})")
    if k * k <= size:
        out = rng.integers(low, high, size=(n, k), dtype=np.int64)  # (n, k)
        bad = _repeats(out)
        while bad.any():
            out[bad] = rng.integers(low, high, size=(int(bad.sum()), k), dtype=np.int64)
            bad[bad] = _repeats(out[bad])
        return out
    out = np.empty((n, k), dtype=np.int64)
    chunk = max(1, (1 << 22) // size)
    for start in range(0, n, chunk):
        u = rng.random((min(n, start + chunk) - start, size))  # (c, size)
        pick = np.argpartition(u, k - 1, axis=1)[:, :k] if k < size else np.broadcast_to(np.arange(size), u.shape)  # (c, k)
        order = np.argsort(np.take_along_axis(u, pick, axis=1), axis=1)  # (c, k)
        out[start : start + len(u)] = np.take_along_axis(pick, order, axis=1) + low
    return out


def _repeats(rows: np.ndarray) -> np.ndarray:
    """(n,) bool: which rows of (n, k) hold a token twice."""
    s = np.sort(rows, axis=1)
    return (s[:, 1:] == s[:, :-1]).any(axis=1)
