"""MQAR, multi-query associative recall (Arora, Eyuboglu et al. 2023, "Zoology"), as zoology generates it.

Letters: n sequences, L length, N key-value pairs, V vocabulary, S = (L - 2N) / 2 query slots.

One sequence (zoology's ``multiquery_ar``, read from HazyResearch/zoology and rewritten here):

* the vocabulary is split in two: keys are tokens 1 .. V/2 - 1, values V/2 .. V - 1 (token 0 is
  the blank);
* positions 0 .. 2N - 1 hold N pairs ``k_1 v_1 k_2 v_2 ...``: N distinct keys and N distinct
  values, each a uniformly random ordered draw;
* every key is queried once after the pairs: key j sits at position 2N + 2 g_j, where the gaps
  g_1, g_2, ... are drawn one after another *without replacement* from {0, ..., S - 1} with
  P(g) ∝ a (g + 1)^(a - 1) (``power_a`` = a; 0.01 in zoology: short gaps much likelier, the
  power law of repeated bigrams in text; a = 1 is uniform). Key j takes the j-th draw, so the
  first key's gap follows the power law exactly and later keys' gaps are conditioned on it;
* the target at a query position is the value bound to that key earlier (next-token prediction:
  after ``k`` comes its ``v``); every other target is IGNORE;
* every remaining position is filled with a uniformly random token of the whole vocabulary
  (``random_non_queries``, zoology's default), or left blank (0).

Zoology trains on a mix of (L, N) settings and tests on a mix that adds more pairs and longer
sequences; a split here is such a mix, each setting drawn from its own seeded stream, zero-padded
at the end with ``lengths`` (padding targets are IGNORE, so never scored).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from zoo_core.datasets import SplitData

from ._common import IGNORE, distinct_per_row, require, rng_for, stack_parts

TASK = "mqar"


def power_law(slots: int, power_a: float) -> np.ndarray:
    """(S,) float64: zoology's query-gap distribution P(g) ∝ a (g + 1)^(a - 1), g = 0 .. S - 1."""
    require(slots >= 1, f"MQAR needs at least one query slot, got {slots}")
    require(power_a > 0, f"power_a must be > 0 (zoology uses 0.01; 1.0 is uniform), got {power_a}")
    p = power_a * np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1)  # (S,)
    return p / p.sum()


def draw_gaps(rng: np.random.Generator, n: int, p: np.ndarray, k: int) -> np.ndarray:
    """(n, k) int64: k distinct gaps per row drawn one after another from ``p`` without replacement.

    Gumbel top-k: sorting log p + Gumbel noise in decreasing order gives exactly the successive
    draws without replacement (the Plackett-Luce order), which is also what numpy's
    ``choice(replace=False, p=p)`` in zoology produces: column j is the j-th draw.
    """
    require(k <= p.size, f"cannot place {k} queries in {p.size} slots")
    scores = np.log(p)[None, :] + rng.gumbel(size=(n, p.size))  # (n, S)
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.int64)


def check_setting(vocab_size: int, length: int, num_kv_pairs: int) -> None:
    """zoology's preconditions, with the fix in each message."""
    require(length % 2 == 0, f"MQAR length must be even (key-value pairs and query slots are two steps), got {length}")
    require(num_kv_pairs >= 1, f"num_kv_pairs must be >= 1, got {num_kv_pairs}")
    require(4 * num_kv_pairs <= length,
            f"MQAR needs length >= 4 x num_kv_pairs ({num_kv_pairs} pairs need {4 * num_kv_pairs} steps), got {length}")
    keys = vocab_size // 2 - 1
    require(num_kv_pairs <= keys,
            f"vocab_size {vocab_size} has {keys} key tokens (1 .. V/2 - 1), fewer than {num_kv_pairs} pairs; "
            f"use vocab_size >= {2 * (num_kv_pairs + 1)}")


def multiquery_ar(n: int, *, vocab_size: int, length: int, num_kv_pairs: int, rng: np.random.Generator,
                  power_a: float = 0.01, random_non_queries: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """n MQAR sequences of one setting.

    Args:
        n: sequences.
        vocab_size: V, keys 1 .. V/2 - 1, values V/2 .. V - 1.
        length: L, even.
        num_kv_pairs: N, with 4N <= L.
        rng: the stream (``rng_for``).
        power_a: the query-gap power law's a.
        random_non_queries: fill the other positions with random tokens (zoology's default).

    Returns:
        X (n, L) int64 tokens, y (n, L) int64: the bound value at each query position, IGNORE elsewhere.
    """
    check_setting(vocab_size, length, num_kv_pairs)
    half, pairs = vocab_size // 2, num_kv_pairs
    keys = distinct_per_row(rng, n, 1, half, pairs)  # (n, N)
    values = distinct_per_row(rng, n, half, vocab_size, pairs)  # (n, N)
    gaps = draw_gaps(rng, n, power_law((length - 2 * pairs) // 2, power_a), pairs)  # (n, N)
    X = np.zeros((n, length), dtype=np.int64)  # (n, L)
    X[:, 0 : 2 * pairs : 2], X[:, 1 : 2 * pairs : 2] = keys, values
    y = np.full((n, length), IGNORE, dtype=np.int64)  # (n, L)
    where = 2 * pairs + 2 * gaps  # (n, N) query positions
    np.put_along_axis(X, where, keys, axis=1)
    np.put_along_axis(y, where, values, axis=1)
    if random_non_queries:
        blank = X == 0  # keys and values are never 0, so these are exactly the filler positions
        X[blank] = rng.integers(0, vocab_size, size=int(blank.sum()))
    return X, y


def load(split: str, *, vocab_size: int, mix: Mapping[str, Sequence[Sequence[int]]], power_a: float = 0.01,
         random_non_queries: bool = True, seed: int = 0) -> SplitData:
    """The registered loader: ``split``'s mix of [length, pairs, count] settings, in the listed order.

    Settings are stacked (not shuffled: training shuffles its batches; ``layout`` names each
    setting's rows, for per-setting accuracy as zoology reports it); lengths are given when the
    mix holds more than one length.
    """
    settings = _settings(mix, split)
    parts = [multiquery_ar(count, vocab_size=vocab_size, length=length, num_kv_pairs=pairs, power_a=power_a,
                           random_non_queries=random_non_queries, rng=rng_for(seed, TASK, split, length, pairs))
             for length, pairs, count in settings]
    return stack_parts(parts)


def layout(mix: Mapping[str, Sequence[Sequence[int]]], split: str) -> list[dict[str, int]]:
    """Which rows of ``load(split, ...)`` hold which setting: [{length, pairs, start, stop}, ...]."""
    out, row = [], 0
    for length, pairs, count in _settings(mix, split):
        out.append({"length": length, "pairs": pairs, "start": row, "stop": row + count})
        row += count
    return out


def _settings(mix: Mapping[str, Sequence[Sequence[int]]], split: str) -> list[tuple[int, int, int]]:
    require(split in mix, f"this MQAR variant has no split {split!r}; its splits: {', '.join(mix)}")
    settings = [tuple(int(v) for v in s) for s in mix[split]]
    require(bool(settings) and all(len(s) == 3 for s in settings),
            f"MQAR split {split!r} must list [length, pairs, count] settings, got {mix[split]!r}")
    return [(s[0], s[1], s[2]) for s in settings]
