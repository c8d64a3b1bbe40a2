"""ListOps (Nangia & Bowman 2018) generated as Long Range Arena generates it (Tay et al. 2020).

An expression is a tree of list operators over the digits 0-9, written in prefix form with a
closing bracket: ``[MAX 2 9 [MIN 4 7 ] 0 ]`` evaluates to 9. The label is the value of the whole
expression (10 classes).

The tree is drawn exactly as LRA's ``lra_benchmarks/data/listops.py`` draws it (read, not copied):

* a node at depth ``d < max_depth`` is an operator with probability ``VALUE_P = 0.25`` and a digit
  otherwise; a node at ``max_depth`` is always a digit (the root has depth 1);
* an operator takes ``randint(2, max_args)`` arguments (both ends included), drawn first, and then
  its operator uniformly from MIN, MAX, MED, SM (LRA leaves FIRST and LAST out);
* MED is ``int(median)`` (the mean of the two middle values, truncated, for an even count) and SM the
  sum modulo 10;
* the length is the number of tokens without parentheses (an operator and its ``]`` count 1 each,
  a digit 1), and a tree is kept when ``min_length < length < max_length`` (strict, as LRA) and
  it was not drawn before (LRA collects a set of distinct trees before splitting it).

Tokenisation follows LRA's released data as the S4 pipeline reads it: LRA's TSV writes the left-
nested tuples with parentheses, which carry no information and are dropped; ``]`` is kept (LRA's
own tfds tokenizer dropped every non-alphanumeric token, ``]`` included, which makes expressions
ambiguous; S4 renamed it ``X`` to keep it). Ids: 0 padding, then the 15 symbols of ``VOCAB``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

import numpy as np

from zoo_core.datasets import SplitData

from .cache import cached

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
DIGITS = tuple(str(d) for d in range(10))
VALUE_P = 0.25  # LRA: the probability of an operator node below max_depth
PAD = "<pad>"
VOCAB = (PAD, *DIGITS, *OPERATORS, END)  # id = position; 0 is padding
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
VOCAB_SIZE = len(VOCAB)
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Op:
    """An operator node: its symbol and its arguments (digits or operator nodes)."""

    op: str
    args: tuple[Tree, ...]


Tree = Union[Op, int]


class TooLong(Exception):
    """Raised by ``generate_tree`` once a tree has used its token budget (it would be rejected)."""


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int, budget: int | None = None) -> tuple[Tree, int]:
    """One random tree and its token count; the draws in LRA's order (node kind, arguments, operator).

    With ``budget``, raise ``TooLong`` as soon as the tree reaches ``budget`` tokens: the length
    filter would reject it anyway, so the kept trees have exactly the distribution of LRA's
    draw-then-filter, without drawing the (very large) rejected trees to the end.
    """
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return rng.choice(range(10)), 1
    n_args = rng.randint(2, max_args)
    args, length = [], 2  # the operator and its closing bracket
    for _ in range(n_args):
        sub, sub_len = generate_tree(rng, depth + 1, max_depth, max_args, None if budget is None else budget - length)
        args.append(sub)
        length += sub_len
        if budget is not None and length >= budget:
            raise TooLong
    return Op(rng.choice(OPERATORS), tuple(args)), length


def apply(op: str, values: Sequence[int]) -> int:
    """The value of one operator over its argument values."""
    if op == MIN:
        return min(values)
    if op == MAX:
        return max(values)
    if op == MED:
        s, n = sorted(values), len(values)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2  # int(np.median): truncated mean
    if op == SUM_MOD:
        return sum(values) % 10
    raise ValueError(f"unknown ListOps operator {op!r}; the operators are {', '.join(OPERATORS)}")


def evaluate(tree: Tree) -> int:
    """The value of a tree (the label)."""
    if isinstance(tree, int):
        return tree
    return apply(tree.op, [evaluate(a) for a in tree.args])


def tokens(tree: Tree) -> list[str]:
    """Prefix form without parentheses: ``[MAX 2 9 ]``."""
    if isinstance(tree, int):
        return [str(tree)]
    out = [tree.op]
    for a in tree.args:
        out += tokens(a)
    out.append(END)
    return out


def encode(symbols: Sequence[str]) -> list[int]:
    """Symbols -> token ids (0 is padding)."""
    return [TOKEN_ID[s] for s in symbols]


def decode(ids: Sequence[int]) -> list[str]:
    """Token ids -> symbols, padding dropped."""
    return [VOCAB[i] for i in ids if i != 0]


@functools.lru_cache(maxsize=2)
def generate(seed: int, sizes: tuple[int, ...], min_length: int, max_length: int, max_depth: int,
             max_args: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Every split at once, distinct trees across all of them (as LRA), deterministic from ``seed``.

    Returns one ``(X, y, lengths)`` per size: X int64 (n, max_length - 1) zero-padded, y int64 (n,).
    """
    if not 0 < min_length < max_length - 1:
        raise ValueError(f"ListOps needs 0 < min_length < max_length - 1 (lengths are strictly between them); "
                         f"got min_length={min_length}, max_length={max_length}")
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    kept: list[tuple[tuple[str, ...], int]] = []
    while len(kept) < sum(sizes):
        try:
            tree, length = generate_tree(rng, 1, max_depth, max_args, budget=max_length)
        except TooLong:
            continue
        if not min_length < length < max_length:
            continue
        sym = tuple(tokens(tree))
        if sym not in seen:
            seen.add(sym)
            kept.append((sym, evaluate(tree)))
    out, start = [], 0
    for n in sizes:
        part = kept[start:start + n]
        start += n
        X = np.zeros((n, max_length - 1), dtype=np.int64)  # (n, L)
        for i, (sym, _) in enumerate(part):
            X[i, : len(sym)] = encode(sym)
        y = np.array([v for _, v in part], dtype=np.int64)  # (n,)
        lengths = np.array([len(s) for s, _ in part], dtype=np.int64)  # (n,)
        out.append((X, y, lengths))
    return tuple(out)


VERSION = 1  # bump when the generator changes what a seed draws (the disk cache keys on it)


def load(split: str, *, sizes: dict[str, int], seed: int = 0, min_length: int = 500, max_length: int = 2000,
         max_depth: int = 10, max_args: int = 10) -> SplitData:
    """The loader ``zoo_register_datasets`` names: one split of a ListOps set (LRA's defaults)."""
    order = tuple(s for s in SPLITS if s in sizes)
    counts = tuple(sizes[s] for s in order)

    def make() -> dict[str, np.ndarray]:
        parts = generate(seed, counts, min_length, max_length, max_depth, max_args)
        return {f"{s}_{k}": a for s, part in zip(order, parts, strict=True) for k, a in zip("XyL", part, strict=True)}

    params = {"seed": seed, "sizes": counts, "min_length": min_length, "max_length": max_length,
              "max_depth": max_depth, "max_args": max_args}
    arrays = cached("listops", VERSION, params, make, want=[f"{split}_{k}" for k in "XyL"])
    return SplitData(arrays[f"{split}_X"], arrays[f"{split}_y"], arrays[f"{split}_L"])
