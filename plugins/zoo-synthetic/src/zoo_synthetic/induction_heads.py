"""Induction heads (Olsson et al. 2022; Gu & Dao 2023, "Mamba", §4.1.2), as H3's safari code generates it.

Letters: n sequences, L length (steps the model reads), V vocabulary.

The Mamba paper's induction-heads task is the synthetic of the H3/Hyena code base (HazyResearch/safari
``src/dataloaders/synthetics.py``, ``generate_induction_head`` with one trigger and
``induction_len`` 1; read and rewritten here):

* V tokens: V - 2 content tokens (0 .. V - 3), a reserved no-op token V - 2 that never appears,
  and the special "copy prefix" token V - 1;
* every step is a uniformly random content token, except that the special token is put at one
  position p, uniform over 0 .. L - 4 (safari's ``integers(input_seq_len - 2)``), and again at the
  very end, step L - 1;
* the target at the last step is the token X that followed the first special token (X = x[p + 1]):
  the model must recall what came after the trigger. Only that step is scored (IGNORE elsewhere),
  as safari scores its test sets; safari's training also scored next-token prediction on the
  random content, which holds no signal, so it is left out here.

Safari's ``input_seq_len`` counts the content before the final special token, so its model reads
input_seq_len + 1 steps; ``length`` here is the number of steps the model reads. The paper's setting:
V = 16, trained at length 256, tested at 2^6 .. 2^20.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from zoo_core.datasets import SplitData

from ._common import IGNORE, require, rng_for, stack_parts

TASK = "induction-heads"


def check_setting(length: int, vocab_size: int) -> None:
    require(vocab_size >= 3, f"induction heads needs a content token, the no-op and the special token: vocab_size >= 3, got {vocab_size}")
    require(length >= 4, f"induction heads needs length >= 4 (trigger, its token, one more step, the final trigger), got {length}")


def induction_heads(n: int, *, length: int, vocab_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n induction-heads sequences.

    Args:
        n: sequences.
        length: L, every step the model reads (the final special token included).
        vocab_size: V (content 0 .. V - 3, no-op V - 2, special V - 1).
        rng: the stream (``rng_for``).

    Returns:
        X (n, L) int64, y (n, L) int64: at step L - 1 the token that followed the first special token,
        IGNORE elsewhere.
    """
    check_setting(length, vocab_size)
    special = vocab_size - 1
    X = rng.integers(0, vocab_size - 2, size=(n, length), dtype=np.int64)  # (n, L) content
    trigger = rng.integers(0, length - 3, size=n)  # (n,) p in 0 .. L - 4
    rows = np.arange(n)
    X[rows, trigger] = special
    X[:, -1] = special
    y = np.full((n, length), IGNORE, dtype=np.int64)  # (n, L)
    y[:, -1] = X[rows, trigger + 1]
    return X, y


def load(split: str, *, splits: Mapping[str, Sequence[int]], vocab_size: int = 16, seed: int = 0) -> SplitData:
    """The registered loader: ``splits[split]`` is [length, count].

    Each (split, length) has its own stream, so every length variant shares the base variant's
    training and validation sequences exactly and differs only in its test split.
    """
    require(split in splits, f"this induction-heads variant has no split {split!r}; its splits: {', '.join(splits)}")
    length, count = (int(v) for v in splits[split])
    rng = rng_for(seed, TASK, split, length, vocab_size)
    return stack_parts([induction_heads(count, length=length, vocab_size=vocab_size, rng=rng)])
