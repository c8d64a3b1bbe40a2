"""Induction heads' defining properties, read from the sequences."""

from __future__ import annotations

import numpy as np
import pytest

from zoo_synthetic._common import IGNORE, SyntheticParamError, rng_for
from zoo_synthetic.induction_heads import induction_heads, load

V = 16
SPECIAL = V - 1


def _gen(n: int, length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return induction_heads(n, length=length, vocab_size=V, rng=rng_for(seed, "induction-heads", "train", length))


@pytest.mark.parametrize("length", [8, 256, 4096])
def test_the_target_is_the_token_after_the_first_special_token(length):
    X, y = _gen(200, length)
    assert (X[:, -1] == SPECIAL).all(), "the sequence ends with the special token"
    for x_i, y_i in zip(X, y, strict=True):
        at = np.flatnonzero(x_i == SPECIAL)
        assert len(at) == 2 and at[1] == length - 1, "the special token occurs once before the end"
        p = int(at[0])
        assert p <= length - 4, "a random step separates the copied token from the final special token"
        assert y_i[-1] == x_i[p + 1] and x_i[p + 1] < V - 2, "the answer is the content token after the trigger"
        assert (y_i[:-1] == IGNORE).all(), "only the last step is scored"
    assert not (X == V - 2).any(), "the no-op token is reserved"


def test_trigger_position_and_answers_are_uniform(chi2_fits):
    length = 64
    X, y = _gen(6000, length)
    first = np.argmax(X == SPECIAL, axis=1)
    fits, stat, crit = chi2_fits(np.bincount(first, minlength=length - 3), np.full(length - 3, 1 / (length - 3)))
    assert fits, f"trigger positions are not uniform over 0 .. L - 4: {stat:.1f} > {crit:.1f}"
    fits, stat, crit = chi2_fits(np.bincount(y[:, -1], minlength=V - 2), np.full(V - 2, 1 / (V - 2)))
    assert fits, f"answers are not uniform over the content tokens: {stat:.1f} > {crit:.1f}"


def test_length_variants_share_training_sequences_and_test_at_their_length():
    base = {"train": [256, 30], "val": [256, 10], "test": [256, 10]}
    longer = {**base, "test": [2048, 4]}
    assert np.array_equal(load("train", splits=base).X, load("train", splits=longer).X)
    t = load("test", splits=longer)
    assert t.X.shape == (4, 2048) and ((t.y != IGNORE).sum(axis=1) == 1).all()
    assert not np.array_equal(load("test", splits=base).X[:, :256], t.X[:, :256])


def test_too_short_says_why():
    with pytest.raises(SyntheticParamError, match="length >= 4"):
        induction_heads(1, length=3, vocab_size=V, rng=np.random.default_rng(0))
