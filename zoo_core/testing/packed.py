"""Test helpers for a core's native packed path (``zoo_core.packing``), beyond the conformance check.

The conformance check ``packing`` runs a short float64 layout; a plugin's own tests add, with these:
that ``run_packed`` really takes the native path (``native_only``), the right-padded prefill of
transformers issue 48256 (padding holding large values must not reach any document's final state),
and a longer float32 layout crossing chunk boundaries (``long_layout``). Every comparison is against
each document run alone with ``forward_with_state`` (``assert_matches_solo``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

import zoo_core.packing
from zoo_core.packing import Segments, run_packed

from .checks import assert_close

# 7 documents over two rows of 300 steps: lengths 1 and 2, documents that cross chunk boundaries of
# 8, 32 and 64 steps, one ending exactly at the row's end and one followed by padding.
LONG_LAYOUT: tuple[tuple[int, ...], ...] = ((1, 97, 2, 130, 70), (251, 1))


def layout(rows: Sequence[Sequence[int]], L: int) -> Segments:
    """Segments from each row's document lengths, padding up to L steps."""
    seq_idx = torch.full((len(rows), L), -1, dtype=torch.long)
    for b, lens in enumerate(rows):
        seq_idx[b, : sum(lens)] = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(list(lens)))
    return Segments.from_seq_idx(seq_idx)


def long_layout(L: int = 300) -> Segments:
    """``LONG_LAYOUT`` in rows of L ≥ 300 steps."""
    return layout(LONG_LAYOUT, L)


def packed_input(seg: Segments, d_model: int, *, dtype: torch.dtype = torch.float64, seed: int = 1,
                 pad: float = 1.0) -> Tensor:
    """Random (B, L, d_model) for the layout, padding steps multiplied by ``pad`` (1e4: the 48256 case)."""
    x = torch.randn(*seg.shape, d_model, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return torch.where(seg.valid[..., None], x, x * pad)


@contextmanager
def native_only() -> Iterator[None]:
    """Within it, ``run_packed`` falling back to each document alone raises: the core's native path ran."""
    saved = zoo_core.packing.by_documents

    def refuse(core: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{type(core).__name__} ran packed documents one by one (by_documents), not natively")

    zoo_core.packing.by_documents = refuse
    try:
        yield
    finally:
        zoo_core.packing.by_documents = saved


def assert_matches_solo(core: Any, x: Tensor, seg: Segments, *, rtol: float, atol: float,
                        with_states: bool = True) -> tuple[Tensor, dict[str, Tensor] | None]:
    """``run_packed`` natively on x equals every document run alone from the zero state: outputs at its
    steps and (``with_states``) its final state; returns the packed outputs and states."""
    with native_only(), torch.no_grad():
        y, states = run_packed(core, x, seg, with_states=with_states)
        assert bool(torch.isfinite(y).all()), "packed outputs hold non-finite values (padding must stay finite)"
        for n, (b, s, ln) in enumerate(zip(seg.doc_row.tolist(), seg.doc_start.tolist(), seg.doc_len.tolist(), strict=True)):
            yd, sd = core.forward_with_state(x[b: b + 1, s: s + ln])
            assert_close(f"document {n} (length {ln}) outputs", yd[0], y[b, s: s + ln], rtol=rtol, atol=atol)
            if states is not None:
                assert set(states) == set(sd), f"state keys {sorted(states)} != {sorted(sd)}"
                for k in sd:
                    assert_close(f"document {n} (length {ln}) final state {k!r}", sd[k][0], states[k][n], rtol=rtol, atol=atol)
    return y, states


def assert_padded_prefill(core: Any, d_model: int, *, lengths: Sequence[int] = (7, 19, 1, 12), L: int = 20,
                          pad: float = 1e4, rtol: float = 1e-9, atol: float = 1e-10) -> None:
    """transformers issue 48256: a right-padded batch (``Segments.from_lengths``) whose padding holds
    large random values gives each sample's solo outputs and final state (nothing of the padding is
    carried); the core's parameters set the dtype."""
    dtype = next(core.parameters()).dtype
    seg = Segments.from_lengths(torch.tensor(list(lengths)), L)
    x = packed_input(seg, d_model, dtype=dtype, seed=4, pad=pad)
    assert_matches_solo(core, x, seg, rtol=rtol, atol=atol)
