"""Packed and ragged batches: several documents per row, laid out by a ``seq_idx``.

Letters: B rows, L steps per row, N documents in the batch, H width, S any trailing state shape.

``seq_idx`` (B, L) integer holds, for every step, the index of its document *within its row*:
``0 0 0 1 1 2 2 2 -1 -1`` is a row packing three documents of lengths 3, 2 and 3, then two steps of
padding (``-1``, only at the end of a row). It is the layout of mamba_ssm's ``seq_idx``; transformers'
``cu_seqlens`` (cumulative document lengths over one flattened row) converts to it with
``Segments.from_cu_seqlens``. A right-padded batch with ``lengths`` is the special case of one
document per row (``Segments.from_lengths``).

``Segments`` computes the layout once (starts, ends, position within the document, the documents in
row-major order) and moves tensors between the packed layout and the documents:
``unpack`` (B, L, ·) → (N, L_max, ·) left-aligned; ``pack`` back; ``at_ends`` reads each document's last
step (its final state from a scan's every-step states); ``reverse`` reverses time inside each document,
leaving padding where it is (what a bidirectional block needs so padding never reaches valid steps).

A packed run starts every document from the zero state and returns each document's final state
(batch N, documents in row-major order), so any document can be continued with ``step``. A core runs
packed batches natively when it declares the capability ``packing`` and implements
``forward_packed(x, segments, *, with_states=True) -> (y, states or None)``: the state is reset at
every document start inside its parallel path (a scan's transition zeroed there, a short convolution's
window cut there, attention masked to the document). ``run_packed`` runs any core: natively, or else
each document on its own, grouped by length (exact, slower, announced once per core).

``pack_batch`` turns a right-padded batch into fewer packed rows (``zoo train --pack``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .logs import log_once
from .protocols import State

log = logging.getLogger(__name__)


def _check_seq_idx(seq_idx: Tensor) -> Tensor:
    if not isinstance(seq_idx, Tensor) or seq_idx.dim() != 2 or seq_idx.dtype not in (torch.int32, torch.int64):
        shape = tuple(seq_idx.shape) if isinstance(seq_idx, Tensor) else type(seq_idx).__name__
        raise ValueError(f"seq_idx must be an integer tensor (B, L) giving each step's document within its row, got {shape}"
                         f"{' ' + str(seq_idx.dtype) if isinstance(seq_idx, Tensor) else ''}")
    s = seq_idx.long()
    if s.shape[1] == 0:
        raise ValueError("seq_idx has no steps (L = 0)")
    pad = s < 0
    if bool((s < -1).any()):
        raise ValueError("seq_idx marks padding with -1; it holds smaller values")
    if bool((pad[:, :-1] & ~pad[:, 1:]).any()):
        row = int(torch.nonzero((pad[:, :-1] & ~pad[:, 1:]).any(1))[0])
        raise ValueError(f"seq_idx row {row}: padding (-1) comes before a document; padding belongs at the end of a row")
    if bool((s[:, 0] > 0).any()):
        row = int(torch.nonzero(s[:, 0] > 0)[0])
        raise ValueError(f"seq_idx row {row} starts at document {int(s[row, 0])}; number each row's documents 0, 1, 2, ...")
    both = ~pad[:, 1:]
    d = s[:, 1:] - s[:, :-1]
    bad = both & ((d < 0) | (d > 1))
    if bool(bad.any()):
        row, t = (int(v) for v in torch.nonzero(bad)[0])
        raise ValueError(f"seq_idx row {row} goes from document {int(s[row, t])} to {int(s[row, t + 1])} at step {t + 1}; "
                         "documents are contiguous runs numbered 0, 1, 2, ... (each step keeps its document or starts the next)")
    return s


@dataclass(frozen=True, eq=False)
class Segments:
    """The documents of a packed (or right-padded) batch. Build with ``from_seq_idx``,
    ``from_lengths`` or ``from_cu_seqlens``; every field is computed once, on seq_idx's device.

    Fields:
        seq_idx: (B, L) long, document within its row, -1 on padding.
        doc_id: (B, L) long, the document's index in the batch (row-major), -1 on padding.
        position: (B, L) long, the step's position inside its document (0 on padding).
        starts: (B, L) bool, True at every document's first step.
        doc_row, doc_start, doc_len: (N,) long, each document's row, first step and length.
    """

    seq_idx: Tensor
    doc_id: Tensor
    position: Tensor
    starts: Tensor
    doc_row: Tensor
    doc_start: Tensor
    doc_len: Tensor

    @classmethod
    def from_seq_idx(cls, seq_idx: Tensor) -> Segments:
        s = _check_seq_idx(seq_idx)
        B, L = s.shape
        valid = s >= 0
        prev = F.pad(s, (1, 0), value=-2)[:, :-1]
        starts = valid & (s != prev)
        nxt = F.pad(s, (0, 1), value=-2)[:, 1:]
        ends = valid & (s != nxt)
        first = torch.nonzero(starts)  # (N, 2), row-major
        last = torch.nonzero(ends)
        doc_row, doc_start = first[:, 0], first[:, 1]
        doc_len = last[:, 1] - doc_start + 1
        doc_id = torch.where(valid, torch.cumsum(starts.reshape(-1).long(), 0).reshape(B, L) - 1, -1)
        t = torch.arange(L, device=s.device).expand(B, L)
        position = torch.where(valid, t - doc_start[doc_id.clamp(min=0)] if len(doc_start) else t, 0)
        return cls(s, doc_id, position, starts, doc_row, doc_start, doc_len)

    @classmethod
    def from_lengths(cls, lengths: Tensor, steps: int) -> Segments:
        """One document per row: the first ``lengths[b]`` steps of row b, padding after."""
        t = torch.arange(steps, device=lengths.device)
        return cls.from_seq_idx(torch.where(t < lengths.long()[:, None], 0, -1))

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: Tensor) -> Segments:
        """One row of concatenated documents from cumulative lengths ``0, l0, l0+l1, ...`` (transformers/fla)."""
        cu = cu_seqlens.long()
        if cu.dim() != 1 or len(cu) < 2 or int(cu[0]) != 0 or bool((cu[1:] <= cu[:-1]).any()):
            raise ValueError(f"cu_seqlens must be 0 followed by strictly increasing cumulative lengths, got {cu.tolist()}")
        lens = cu[1:] - cu[:-1]
        return cls.from_seq_idx(torch.repeat_interleave(torch.arange(len(lens), device=cu.device), lens)[None])

    # sizes ---------------------------------------------------------------------------------
    @property
    def num_docs(self) -> int:
        return len(self.doc_len)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.seq_idx.shape[0]), int(self.seq_idx.shape[1]))

    @property
    def valid(self) -> Tensor:
        """(B, L) bool: steps that belong to a document."""
        return self.doc_id >= 0

    @cached_property  # one host sync per layout, not one per layer that asks
    def padded_only(self) -> bool:
        """Every row holds at most one document, from its first step (a right-padded batch): a causal
        core needs no packing then — end padding never reaches a valid step."""
        return bool((self.doc_start == 0).all()) and self.num_docs == int(self.valid[:, 0].sum())

    @property
    def doc_end(self) -> Tensor:
        """(N,) each document's last step."""
        return self.doc_start + self.doc_len - 1

    @cached_property
    def max_len(self) -> int:
        return int(self.doc_len.max()) if self.num_docs else 0

    def check(self, x: Tensor) -> None:
        """Refuse an input whose (B, L) is not this layout's."""
        if tuple(x.shape[:2]) != self.shape:
            raise ValueError(f"seq_idx lays out {self.shape[0]} rows of {self.shape[1]} steps, but the input is "
                             f"{tuple(x.shape)}; give seq_idx the input's (batch, length)")

    # moving tensors ----------------------------------------------------------------------------
    def _doc_steps(self, align: str, device: Any) -> tuple[Tensor, Tensor]:
        """(N, L_max) the packed step each document slot reads, and whether the slot holds a step."""
        if align not in ("left", "right"):
            raise ValueError(f"align must be 'left' or 'right', got {align!r}")
        j = torch.arange(self.max_len, device=device)
        off = j[None] if align == "left" else j[None] - (self.max_len - self.doc_len[:, None])  # step within the document
        return (self.doc_start[:, None] + off).clamp(0, self.shape[1] - 1), (off >= 0) & (off < self.doc_len[:, None])

    def unpack(self, x: Tensor, align: str = "left") -> Tensor:
        """(B, L, *F) packed → (N, L_max, *F), one document per row, zeros elsewhere: ``left``-aligned
        (zeros after its end) or ``right``-aligned (zeros before its start: a core whose zero state
        stays zero under zero input, as every LTI SSM, then ends each row in the document's own final state)."""
        t, keep = self._doc_steps(align, x.device)
        out = x[self.doc_row[:, None], t]
        keep = keep.reshape(*t.shape, *([1] * (x.dim() - 2)))
        return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))

    def pack(self, y: Tensor, align: str = "left") -> Tensor:
        """(N, L_max, *F) documents, aligned as ``unpack`` gave them → (B, L, *F); zeros on padding."""
        if align not in ("left", "right"):
            raise ValueError(f"align must be 'left' or 'right', got {align!r}")
        if not self.num_docs:
            return y.new_zeros(*self.shape, *y.shape[2:])
        d = self.doc_id.clamp(min=0)
        j = self.position if align == "left" else self.position + (self.max_len - self.doc_len[d])
        out = y[d, j]
        keep = self.valid.reshape(*self.shape, *([1] * (y.dim() - 2)))
        return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))

    def at_ends(self, h: Tensor) -> Tensor:
        """(B, L, *S) every step → (N, *S) each document's last step (its final state)."""
        return h[self.doc_row, self.doc_end]

    def reverse(self, x: Tensor) -> Tensor:
        """(B, L, *F) with time reversed inside each document; padding stays where it is. Its own inverse."""
        t = torch.arange(self.shape[1], device=x.device).expand(self.shape)
        if self.num_docs:
            d = self.doc_id.clamp(min=0)
            rev = self.doc_start[d] + self.doc_len[d] - 1 - self.position
            t = torch.where(self.valid, rev, t)
        return x[torch.arange(self.shape[0], device=x.device)[:, None], t]

    def same_document(self) -> Tensor:
        """(B, L, L) bool: step i and step j belong to the same document (padding to none)."""
        d = self.doc_id
        return (d[:, :, None] == d[:, None, :]) & (d >= 0)[:, :, None]

    def reset_mask(self, like: Tensor) -> Tensor:
        """(B, L, 1, ...) of ``like``'s dtype: 0 at a document's first step, 1 elsewhere — multiply a
        recurrence's transition a_t by it (broadcast over its trailing dims) to start every document from zero."""
        keep = (~self.starts).to(like.dtype if like.is_floating_point() or like.is_complex() else torch.float32)
        return keep.reshape(*self.shape, *([1] * (like.dim() - 2)))


def check_step_mask(mask: Tensor | None, shape: tuple[int, ...], *, name: str, who: str) -> Tensor | None:
    """Refuse a per-step mask of a packed layout — ``reset``/``starts`` (each document's first step) or
    ``ends`` (each document's last step) — that is not a bool (B, L) tensor of the input's batch and
    length; the one message every op taking such a mask gives. Returns the mask (None passes)."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != tuple(shape):
        got = f"{tuple(mask.shape)} {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
        marks = "each document's last step" if name == "ends" else "each document's first step (segments.starts)"
        raise ValueError(f"{who}: {name} must be a bool (B, L) mask of shape {tuple(shape)} marking {marks}, got {got}; "
                         "build it from zoo_core.packing.Segments")
    return mask


def stack_states(parts: list[tuple[Tensor, State]], n: int, who: str) -> State:
    """Per-document states from groups: ``parts`` holds (document indices, their states, batch first)."""
    if not parts:
        return {}
    keys = parts[0][1].keys()
    order = torch.cat([idx for idx, _ in parts])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    out: State = {}
    for k in keys:
        shapes = {tuple(s[k].shape[1:]) for _, s in parts}
        if len(shapes) > 1:
            raise ValueError(f"{who}: the documents' final states have different shapes for {k!r} ({sorted(shapes)}: "
                             "a cache that grows with length), so they cannot be batched; ask for outputs only "
                             "(with_states=False), or run documents of equal length together")
        out[k] = torch.cat([s[k] for _, s in parts])[inverse]
    assert len(order) == n
    return out


def by_documents(core: Any, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
    """The reference packed run of any core: every document alone, from the zero state, documents of
    equal length together. Returns outputs (B, L, H_out) (zeros on padding) and per-document states."""
    docs = segments.unpack(x)  # (N, L_max, H)
    lens = segments.doc_len
    ys: list[Tensor] = []
    parts: list[tuple[Tensor, State]] = []
    idxs: list[Tensor] = []
    for length in torch.unique(lens).tolist():
        idx = torch.nonzero(lens == length)[:, 0]
        y, s = core.forward_with_state(docs[idx, :length])
        ys.append(F.pad(y, (0, 0, 0, segments.max_len - length)))
        idxs.append(idx)
        if with_states:
            parts.append((idx, s))
    if not ys:
        return x.new_zeros(x.shape), ({} if with_states else None)
    order = torch.cat(idxs)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    y_docs = torch.cat(ys)[inverse]
    states = stack_states(parts, segments.num_docs, type(core).__name__) if with_states else None
    return segments.pack(y_docs), states


def run_packed(core: Any, x: Tensor, segments: Segments, *, with_states: bool = False) -> tuple[Tensor, State | None]:
    """Run ``core`` on a packed batch x (B, L, H): every document from the zero state.

    Natively (``core.forward_packed``) when the core declares ``packing``; otherwise each document
    alone, grouped by length (``by_documents``: exact, one call per distinct length), announced once.
    Returns (B, L, H) outputs (padding steps: unspecified but finite) and, with ``with_states``, each
    document's final state (batch N, row-major)."""
    segments.check(x)
    if "packing" in getattr(core, "capabilities", ()):
        y, states = core.forward_packed(x, segments, with_states=with_states)
        if with_states and states is None:
            raise ValueError(f"{type(core).__name__} cannot batch these documents' final states (a cache that grows "
                             "with length); ask for outputs only, or pack documents of equal length")
        return y, (states if with_states else None)
    name = type(core).__name__
    log_once(log, logging.INFO, ("by_documents", name),
             "%s has no native packed path (capability 'packing'): each packed document runs on its own, "
             "grouped by length (exact, one call per distinct length)", name)
    return by_documents(core, x, segments, with_states=with_states)


def pack_batch(x: Tensor, lengths: Tensor, capacity: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Pack a right-padded batch into fewer rows: first-fit decreasing (the longest sequence first, each
    into the first row with room).

    Args:
        x: (B, T, ...) right-padded sequences (features or tokens).
        lengths: (B,) valid steps of each.
        capacity: the steps per packed row (default T; at least the longest sequence).

    Returns:
        packed: (R, capacity, ...) with R ≤ B rows, zeros on the padding left over;
        seq_idx: (R, capacity) each step's document within its row, -1 on padding;
        order: (B,) the sample each document is, documents in row-major order (``Segments``' order),
        so ``model(packed, seq_idx=seq_idx)`` is ``model(x, lengths)[order]`` for a pooled task.
    """
    B, T = x.shape[:2]
    cap = capacity or T
    lens = [int(v) for v in lengths.tolist()]
    if lens and max(lens) > cap:
        raise ValueError(f"a sequence of {max(lens)} steps does not fit a packed row of {cap}; raise the capacity")
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(B), key=lambda i: (-lens[i], i)):
        r = next((r for r, f in enumerate(free) if lens[i] <= f), None)
        if r is None:
            rows.append([i])
            free.append(cap - lens[i])
        else:
            rows[r].append(i)
            free[r] -= lens[i]
    src_b = torch.zeros(len(rows), cap, dtype=torch.long)
    src_t = torch.zeros(len(rows), cap, dtype=torch.long)
    seq_idx = torch.full((len(rows), cap), -1, dtype=torch.long)
    for r, members in enumerate(rows):
        t = 0
        for d, i in enumerate(members):
            src_b[r, t : t + lens[i]] = i
            src_t[r, t : t + lens[i]] = torch.arange(lens[i])
            seq_idx[r, t : t + lens[i]] = d
            t += lens[i]
    src_b, src_t, seq_idx = (v.to(x.device) for v in (src_b, src_t, seq_idx))
    packed = x[src_b, src_t]
    keep = (seq_idx >= 0).reshape(*seq_idx.shape, *([1] * (x.dim() - 2)))
    packed = torch.where(keep, packed, torch.zeros((), dtype=x.dtype, device=x.device))
    order = torch.tensor([i for members in rows for i in members], dtype=torch.long, device=x.device)
    return packed, seq_idx, order
