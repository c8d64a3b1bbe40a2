"""MQAR's defining properties, checked by reading the sequences (not the generator's intermediates)."""

from __future__ import annotations

import numpy as np
import pytest

from zoo_synthetic._common import IGNORE, SyntheticParamError, rng_for
from zoo_synthetic.mqar import layout, load, multiquery_ar, power_law

V = 64


def _gen(n: int, length: int, pairs: int, seed: int = 0, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    return multiquery_ar(n, vocab_size=V, length=length, num_kv_pairs=pairs, rng=rng_for(seed, "mqar", "train", length, pairs), **kw)


def _queries(x: np.ndarray, y: np.ndarray) -> tuple[int, list[tuple[int, int, int]]]:
    """(N, [(query position, key position, answer)]) of one sequence, found from the tokens alone."""
    scored = np.flatnonzero(y != IGNORE)
    pairs = len(scored)
    found = []
    for t in scored.tolist():
        earlier = [k for k in range(0, 2 * pairs, 2) if x[k] == x[t]]
        assert len(earlier) == 1, f"query at {t}: its key {x[t]} is bound {len(earlier)} times in the pairs"
        found.append((t, earlier[0], int(y[t])))
    return pairs, found


def test_every_query_is_answered_by_the_value_bound_to_its_key_earlier():
    X, y = _gen(500, 64, 8)
    for x_i, y_i in zip(X, y, strict=True):
        pairs, found = _queries(x_i, y_i)
        assert pairs == 8
        for t, k, answer in found:
            assert t >= 2 * pairs and (t - 2 * pairs) % 2 == 0, "queries sit on the even slots after the pairs"
            assert answer == x_i[k + 1], "the target is the value that followed the key in the pairs"
            assert 1 <= x_i[t] < V // 2 <= answer < V, "keys are 1 .. V/2 - 1, values V/2 .. V - 1"


def test_keys_and_values_are_unique_within_a_sequence_and_each_key_is_queried_once():
    X, y = _gen(500, 64, 8)
    keys, values = X[:, 0:16:2], X[:, 1:16:2]
    assert all(len(set(r)) == 8 for r in keys.tolist()) and all(len(set(r)) == 8 for r in values.tolist())
    for x_i, y_i, k_i in zip(X, y, keys, strict=True):
        assert sorted(x_i[y_i != IGNORE].tolist()) == sorted(k_i.tolist())
    # across sequences the keys do vary (a uniformly random draw, not a fixed set)
    assert len({tuple(r) for r in keys.tolist()}) == 500


def _first_key_gaps(X: np.ndarray, y: np.ndarray, pairs: int) -> np.ndarray:
    """The gap of the first pair's key: its query sits at 2N + 2 g."""
    gaps = []
    for x_i, y_i in zip(X, y, strict=True):
        t = [p for p in np.flatnonzero(y_i != IGNORE).tolist() if x_i[p] == x_i[0]]
        gaps.append((t[0] - 2 * pairs) // 2)
    return np.array(gaps)


def test_query_gaps_follow_zoologys_power_law(chi2_fits):
    """The first key takes the first draw, so its gap is distributed exactly as P(g) ∝ a (g + 1)^(a - 1)."""
    length, pairs = 64, 4
    slots = (length - 2 * pairs) // 2
    X, y = _gen(6000, length, pairs, power_a=0.01)
    counts = np.bincount(_first_key_gaps(X, y, pairs), minlength=slots)
    fits, stat, crit = chi2_fits(counts, power_law(slots, 0.01))
    assert fits, f"chi-square {stat:.1f} > {crit:.1f}: the gaps do not follow the power law"
    uniform, stat_u, crit_u = chi2_fits(counts, np.full(slots, 1 / slots))
    assert not uniform, f"the test cannot tell the power law from uniform gaps ({stat_u:.1f} <= {crit_u:.1f})"
    assert counts[0] > 5 * counts[-1], "short gaps must be much likelier than long ones at a = 0.01"


def test_power_a_one_is_uniform(chi2_fits):
    length, pairs = 64, 4
    slots = (length - 2 * pairs) // 2
    X, y = _gen(6000, length, pairs, power_a=1.0)
    counts = np.bincount(_first_key_gaps(X, y, pairs), minlength=slots)
    fits, stat, crit = chi2_fits(counts, np.full(slots, 1 / slots))
    assert fits, f"chi-square {stat:.1f} > {crit:.1f}"


def test_filler_is_random_tokens_of_the_whole_vocabulary_or_blank(chi2_fits):
    X, y = _gen(400, 64, 4)
    filler = np.ones_like(X, dtype=bool)
    filler[:, :8] = False
    filler[y != IGNORE] = False
    fits, stat, crit = chi2_fits(np.bincount(X[filler], minlength=V), np.full(V, 1 / V))
    assert fits, f"filler is not uniform over the vocabulary: {stat:.1f} > {crit:.1f}"
    Xb, yb = _gen(50, 64, 4, random_non_queries=False)
    assert (Xb[:, 8:][yb[:, 8:] == IGNORE] == 0).all()


def test_deterministic_from_the_seed_and_splits_do_not_share_sequences():
    mix = {"train": [[32, 2, 300], [64, 4, 300]], "val": [[32, 2, 50]], "test": [[32, 2, 300], [128, 16, 50]]}
    a, b = load("train", vocab_size=V, mix=mix), load("train", vocab_size=V, mix=mix)
    assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y) and np.array_equal(a.lengths, b.lengths)
    other = load("train", vocab_size=V, mix=mix, seed=1)
    assert not np.array_equal(a.X, other.X)
    test = load("test", vocab_size=V, mix=mix)
    train_rows = {r.tobytes() for r in a.X[:300, :32]}
    assert not any(r.tobytes() in train_rows for r in test.X[:300, :32]), "a test sequence is also a training sequence"


def test_a_mix_is_padded_with_lengths_and_ignored_targets():
    mix = {"train": [[32, 2, 30], [64, 4, 20]], "test": [[128, 16, 10]]}
    d = load("train", vocab_size=V, mix=mix)
    assert d.X.shape == (50, 64) and d.X.dtype == np.int64 and d.y.shape == (50, 64)
    assert d.lengths.tolist() == [32] * 30 + [64] * 20
    assert (d.X[:30, 32:] == 0).all() and (d.y[:30, 32:] == IGNORE).all()
    assert ((d.y != IGNORE).sum(axis=1) == np.array([2] * 30 + [4] * 20)).all()
    assert layout(mix, "train") == [{"length": 32, "pairs": 2, "start": 0, "stop": 30}, {"length": 64, "pairs": 4, "start": 30, "stop": 50}]
    assert load("test", vocab_size=V, mix=mix).lengths is None  # one length: no padding


@pytest.mark.parametrize(("length", "pairs", "vocab", "match"), [
    (63, 4, 64, "must be even"),
    (32, 9, 64, "length >= 4 x num_kv_pairs"),
    (256, 40, 64, "use vocab_size >= 82"),
])
def test_impossible_settings_say_why(length, pairs, vocab, match):
    with pytest.raises(SyntheticParamError, match=match):
        multiquery_ar(2, vocab_size=vocab, length=length, num_kv_pairs=pairs, rng=np.random.default_rng(0))
