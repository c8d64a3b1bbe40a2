"""Selective copying (Gu & Dao 2023, "Mamba", §4.1.1 and appendix E.1), as the S4 repository generates it.

Letters: n sequences, L length (steps the model reads), M data tokens, A vocabulary.

The Mamba paper's selective copying is the S4 repository's copying task with ``variable=True``
(state-spaces/s4 ``src/dataloaders/datasets/copying.py``, read and rewritten here):

* token 0 is the noise ("white") token, A - 1 the marker, 1 .. A - 2 the data tokens;
* M data tokens, each uniform over 1 .. A - 2 (repeats allowed), are placed in order at M
  distinct positions chosen uniformly at random among the first L - M steps (the "selective"
  part: unlike the classic copying task the positions change from sequence to sequence, so an
  LTI model cannot solve it with a fixed delay);
* every other of those L - M steps is noise; the last M steps are markers;
* the model must output the data tokens in order at the marker steps: the target at the j-th
  marker is the j-th data token (the S4 code scores the last M outputs), IGNORE elsewhere.

The S4 code's ``L`` counts the noise tokens only; here ``length`` counts every step the model
reads (noise + data + markers = L_s4 + 2M). The paper's setting: length 4096, M = 16, A = 16.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from zoo_core.datasets import SplitData

from ._common import IGNORE, require, rng_for, stack_parts

TASK = "selective-copying"


def check_setting(length: int, num_tokens: int, vocab_size: int) -> None:
    require(vocab_size >= 3, f"selective copying needs noise, marker and at least one data token: vocab_size >= 3, got {vocab_size}")
    require(num_tokens >= 1, f"num_tokens must be >= 1, got {num_tokens}")
    require(length >= 2 * num_tokens,
            f"length {length} cannot hold {num_tokens} data tokens and {num_tokens} markers; use length >= {2 * num_tokens}")


def selective_copying(n: int, *, length: int, num_tokens: int, vocab_size: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n selective-copying sequences.

    Args:
        n: sequences.
        length: L, every step the model reads.
        num_tokens: M data tokens to copy.
        vocab_size: A (noise 0, marker A - 1, data 1 .. A - 2).
        rng: the stream (``rng_for``).

    Returns:
        X (n, L) int64, y (n, L) int64: the data tokens in order at the last M steps, IGNORE elsewhere.
    """
    check_setting(length, num_tokens, vocab_size)
    m, region = num_tokens, length - num_tokens
    tokens = rng.integers(1, vocab_size - 1, size=(n, m), dtype=np.int64)  # (n, M), 1 .. A - 2
    where = np.sort(np.argsort(rng.random((n, region)), axis=1)[:, :m], axis=1)  # (n, M) distinct, increasing
    X = np.zeros((n, length), dtype=np.int64)  # (n, L)
    np.put_along_axis(X, where, tokens, axis=1)
    X[:, region:] = vocab_size - 1
    y = np.full((n, length), IGNORE, dtype=np.int64)  # (n, L)
    y[:, region:] = tokens
    return X, y


def load(split: str, *, splits: Mapping[str, Sequence[int]], num_tokens: int = 16, vocab_size: int = 16,
         seed: int = 0) -> SplitData:
    """The registered loader: ``splits[split]`` is [length, count].

    Each (split, length) has its own stream, so every length variant shares the base variant's
    training and validation sequences exactly and differs only in its test split.
    """
    require(split in splits, f"this selective-copying variant has no split {split!r}; its splits: {', '.join(splits)}")
    length, count = (int(v) for v in splits[split])
    rng = rng_for(seed, TASK, split, length, num_tokens, vocab_size)
    return stack_parts([selective_copying(count, length=length, num_tokens=num_tokens, vocab_size=vocab_size, rng=rng)])
