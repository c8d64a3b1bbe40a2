"""Selective copying's defining properties, read from the sequences."""

from __future__ import annotations

import numpy as np
import pytest

from zoo_synthetic._common import IGNORE, SyntheticParamError, rng_for
from zoo_synthetic.selective_copying import load, selective_copying

L, M, A = 128, 16, 16


def _gen(n: int, length: int = L, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return selective_copying(n, length=length, num_tokens=M, vocab_size=A, rng=rng_for(seed, "selective-copying", "train", length))


def test_targets_are_the_data_tokens_in_order_at_the_markers():
    X, y = _gen(300)
    for x_i, y_i in zip(X, y, strict=True):
        prefix = x_i[: L - M]
        data = prefix[(prefix != 0) & (prefix != A - 1)]
        assert len(data) == M and ((data >= 1) & (data <= A - 2)).all(), "M data tokens from 1 .. A - 2 among the noise"
        assert (prefix == 0).sum() == L - 2 * M, "everything else before the markers is noise"
        assert (x_i[L - M :] == A - 1).all(), "the last M steps are markers"
        assert y_i[L - M :].tolist() == data.tolist(), "the targets are the data tokens in order of appearance"
        assert (y_i[: L - M] == IGNORE).all()


def test_data_positions_are_random_not_fixed(chi2_fits):
    """The selective part: where the data sits changes from sequence to sequence, uniformly over the region."""
    X, _ = _gen(2000)
    data = (X[:, : L - M] != 0)  # (n, L - M)
    assert len({row.tobytes() for row in data}) == 2000, "two sequences share their data positions"
    assert (data[:, :M].all(axis=1)).sum() == 0, "the data sits in the first M steps (the classic copying task)"
    fits, stat, crit = chi2_fits(data.sum(axis=0), np.full(L - M, 1 / (L - M)))
    assert fits, f"positions are not uniform over the first L - M steps: {stat:.1f} > {crit:.1f}"


def test_length_variants_share_training_sequences_and_test_at_their_length():
    base = {"train": [64, 40], "val": [64, 10], "test": [64, 10]}
    longer = {**base, "test": [512, 5]}
    assert np.array_equal(load("train", splits=base).X, load("train", splits=longer).X)
    assert np.array_equal(load("val", splits=base).y, load("val", splits=longer).y)
    t = load("test", splits=longer)
    assert t.X.shape == (5, 512) and t.lengths is None and ((t.y != IGNORE).sum(axis=1) == M).all()
    assert not np.array_equal(load("train", splits=base).X, load("train", splits=base, seed=1).X)


def test_too_short_says_why():
    with pytest.raises(SyntheticParamError, match="use length >= 32"):
        selective_copying(1, length=31, num_tokens=16, vocab_size=16, rng=np.random.default_rng(0))
