"""Multi-head softmax attention behind the SSM core contract (causal, and a bidirectional variant).

Letters: B batch, L length, H = d_model, Hq query heads, Hk key/value heads (Hq = G·Hk), D head_dim
= H / Hq, W window, S cached keys, p absolute position (tokens seen before, plus the index).

    q = RoPE(x W_q, p), k = RoPE(x W_k, p), v = x W_v          (B, Hq|Hk, L, D)
    y = concat_h softmax(q_h k_{h//G}ᵀ / √D + M) v_{h//G} · W_o
    M_ij = 0 if key j may be read by query i, else −∞:
        causal            p_j ≤ p_i          (and p_i − W < p_j with a window)
        bidirectional     all                (|p_i − p_j| < W with a window)
        padding           j < lengths[b]     (keys past a sample's length are never read)

Streaming state: ``{"k", "v"}`` (B, Hk, S, D) holding keys *after* RoPE, and ``"pos"`` (B,) the
number of tokens seen, so RoPE positions continue across chunks. Without a window the cache grows
(S = pos; ``growing_state``). With a window it is a ring buffer of S = W slots: the key of
position p lives in slot p mod W, so the buffer holds exactly the last W positions and streaming
memory is constant, as for the SSMs. Slots of positions < 0 (not seen yet) are masked.

Packed documents (``forward_packed``, ``zoo_core.packing``): p restarts at every document and M also
requires the same document, in one call over the packed rows; each document's cache is read from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.errors import NotCausalError  # re-exported: raised by this core's refusals
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State

from .params import AttentionBidirectionalParams, AttentionParams


def rope_tables(positions: Tensor, head_dim: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin (B, 1, L, D) of the angles p · base^(−2i/D), i < D/2, each repeated for both halves.

    Angles are formed in float64 and cast once, so a position's rotation is the same whether it is
    reached in one forward or token by token (positions up to 2⁵³ stay exact)."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)  # (D/2,)
    ang = positions.to(torch.float64)[..., None] * inv  # (B, L, D/2)
    ang = torch.cat([ang, ang], dim=-1)[:, None]  # (B, 1, L, D)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + D/2) of x (B, n, L, D) by the tables' angles (the rotate-half layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def ring_positions(pos: Tensor, window: int) -> Tensor:
    """(B, W): the position held by each ring slot after ``pos`` tokens: the latest p < pos with
    p ≡ slot (mod W); negative where no such token has been seen."""
    slots = torch.arange(window, device=pos.device)
    last = pos[:, None] - 1  # (B, 1)
    return last - torch.remainder(last - slots, window)


class Attention(CoreBase, params=AttentionParams):
    """Causal multi-head attention: RoPE, grouped-query heads, an optional sliding window, a KV cache."""

    paths = {"attention": ("attention",)}
    reference = {"attention": "naive"}
    problem = Problem(structure="softmax", lti=False)
    causal: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        n_kv_heads: int | None = None,
        window: int | None = None,
        rope: bool = True,
        rope_base: float = 10000.0,
        bias: bool = False,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        kw: dict[str, Any] = {"device": device, "dtype": dtype, "bias": bias}
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads or n_heads
        self.head_dim, self.window, self.rope, self.rope_base = d_model // n_heads, window, rope, float(rope_base)
        self.q_proj = nn.Linear(d_model, self.n_heads * self.head_dim, **kw)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.head_dim, **kw)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.head_dim, **kw)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d_model, **kw)

    # projections ----------------------------------------------------------------------------
    def _split(self, y: Tensor, heads: int) -> Tensor:
        """(B, L, heads·D) -> (B, heads, L, D)."""
        return y.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def _qkv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, Hq, L, D), keys and values (B, Hk, L, D), RoPE at ``positions`` (B, L)."""
        q, k = self._split(self.q_proj(x), self.n_heads), self._split(self.k_proj(x), self.n_kv_heads)
        v = self._split(self.v_proj(x), self.n_kv_heads)
        if self.rope:
            cos, sin = rope_tables(positions, self.head_dim, self.rope_base, x.dtype)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
        """The chosen backend, then the output projection: (B, Hq, L, D) -> (B, L, H)."""
        out = self.ops.attention(q, k, v, mask, causal=causal, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).flatten(2))

    # masks ----------------------------------------------------------------------------------
    def _mask(self, qpos: Tensor, kpos: Tensor, kvalid: Tensor | None) -> Tensor:
        """(B, 1, Lq, Lk) boolean from query and key positions (B, Lq), (B, Lk) and key validity (B, Lk)."""
        diff = qpos[:, :, None] - kpos[:, None, :]  # (B, Lq, Lk): p_i − p_j
        if self.causal:
            mask = diff >= 0
            if self.window is not None:
                mask = mask & (diff < self.window)
        else:
            mask = torch.ones_like(diff, dtype=torch.bool) if self.window is None else diff.abs() < self.window
        if kvalid is not None:
            mask = mask & kvalid[:, None, :]
        return mask[:, None]

    @staticmethod
    def _valid(lengths: Tensor | None, batch: int, steps: int, device: torch.device) -> Tensor | None:
        """(B, L) True for steps before each sample's length (None: every step is valid)."""
        if lengths is None:
            return None
        if lengths.shape != (batch,):
            raise ValueError(f"lengths must have shape ({batch},) (one length per sample), got {tuple(lengths.shape)}")
        return torch.arange(steps, device=device)[None] < lengths.to(device)[:, None]

    # sequence -------------------------------------------------------------------------------
    def forward(self, x: Tensor, state: State | None = None, *, lengths: Tensor | None = None) -> Tensor:
        return self.forward_with_state(x, state, lengths=lengths)[0]

    def forward_with_state(self, x: Tensor, state: State | None = None, *,
                           lengths: Tensor | None = None) -> tuple[Tensor, State]:
        """x (B, L, H) from ``state`` (None: nothing seen); ``lengths`` (B,) masks keys at or past each
        sample's length (right padding), which a causal query before the length never reads anyway.
        Returns y (B, L, H) and the state after all L tokens (padding included, as for every core)."""
        B, L, _ = x.shape
        pos = x.new_zeros(B, dtype=torch.long) if state is None else state["pos"].to(x.device, torch.long)
        qpos = pos[:, None] + torch.arange(L, device=x.device)  # (B, L)
        q, k, v = self._qkv(x, qpos)
        valid = self._valid(lengths, B, L, x.device)
        if state is None and self.window is None and valid is None:  # the plain causal square: flash-eligible
            return self._attend(q, k, v, None, causal=True), {"k": k, "v": v, "pos": pos + L}
        past = state if state is not None else self.init_state(B, device=x.device, dtype=x.dtype)
        keys, vals = torch.cat([past["k"].to(k.dtype), k], 2), torch.cat([past["v"].to(v.dtype), v], 2)  # (B, Hk, S + L, D)
        if state is None:  # nothing before the chunk: attend within it (a window masks the band)
            y = self._attend(q, k, v, self._mask(qpos, qpos, valid))
        else:
            y = self._attend_past(q, keys, vals, qpos, valid)
        if self.window is None:
            return y, {"k": keys, "v": vals, "pos": pos + L}
        return y, self._roll_ring(keys, vals, pos, L)

    def _attend_past(self, q: Tensor, keys: Tensor, vals: Tensor, qpos: Tensor, valid: Tensor | None) -> Tensor:
        """The chunk's queries (B, Hq, L, D) over [cached keys, chunk keys] (B, Hk, S + L, D)."""
        B, L = q.shape[0], q.shape[2]
        S = keys.shape[2] - L
        pos = qpos[:, 0]
        if self.window is None:  # growing cache: the past holds positions 0 … S−1 (S = pos)
            kpos_past, valid_past = torch.arange(S, device=q.device).expand(B, S), None
        else:  # ring buffer: slot j holds the latest position ≡ j (mod W) before pos
            kpos_past = ring_positions(pos, self.window)
            valid_past = kpos_past >= 0
        kvalid = _cat_valid(valid_past, valid, B, S, L, q.device)
        return self._attend(q, keys, vals, self._mask(qpos, torch.cat([kpos_past, qpos], 1), kvalid))

    def _roll_ring(self, keys: Tensor, vals: Tensor, pos: Tensor, L: int) -> State:
        """The ring after L more tokens, gathered from [ring (W), chunk (L)]: slot j takes the chunk
        token of the latest position ≡ j (mod W) if the chunk has one, else keeps its own entry."""
        W = self.window
        assert W is not None  # only windowed cores keep a ring
        target = ring_positions(pos + L, W)  # (B, W)
        idx = torch.where(target >= pos[:, None], W + target - pos[:, None], torch.arange(W, device=pos.device))
        idx = idx[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])  # (B, Hk, W, D)
        return {"k": keys.gather(2, idx), "v": vals.gather(2, idx), "pos": pos + L}

    # streaming ------------------------------------------------------------------------------
    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One token (B, H): the chunk path at L = 1 (one cache write, one attention row)."""
        y, new = self.forward_with_state(x_t[:, None], state)
        return y[:, 0], new

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        """Nothing seen: an empty cache (no window) or a ring of W masked slots, and pos = 0."""
        ref = self.q_proj.weight
        device, dtype = device or ref.device, dtype or ref.dtype
        slots = 0 if self.window is None else self.window
        empty = torch.zeros(batch_size, self.n_kv_heads, slots, self.head_dim, device=device, dtype=dtype)
        return {"k": empty, "v": empty.clone(), "pos": torch.zeros(batch_size, dtype=torch.long, device=device)}

    # packed documents ---------------------------------------------------------------------
    def forward_packed(self, x: Tensor, segments: Segments, *,
                       with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents (``zoo_core.packing``) in one attention call over the whole (B, L) batch,
        each document from nothing seen: RoPE positions restart at every document
        (``segments.position``, transformers' restarting ``position_ids``) and a block-diagonal mask
        keeps each query inside its document (what flash-attn's varlen ``cu_seqlens`` does, written
        as the boolean mask sdpa and the naive backend take). Returns (B, L, H) outputs (finite on
        padding) and, with ``with_states``, each document's final state (``_packed_states``)."""
        segments.check(x)
        q, k, v = self._qkv(x, segments.position)
        y = self._attend(q, k, v, self._packed_mask(segments))
        return y, (self._packed_states(k, v, segments) if with_states else None)

    def _packed_mask(self, segments: Segments) -> Tensor:
        """(B, 1, L, L): the core's own causal / window mask on positions within the document, and
        the same document. A padding query reads its own (padding) key only: every row keeps one
        readable key, so no backend meets an all-masked row (a fused GPU kernel may give NaN there,
        and a NaN at padding reaches valid steps of the next layer through 0 · NaN)."""
        pos = segments.position
        mask = self._mask(pos, pos, None)  # same document: p_i − p_j is the distance in steps
        own = segments.same_document()
        eye = torch.eye(pos.shape[1], dtype=torch.bool, device=pos.device)
        return mask & (own | (eye & ~segments.valid[:, :, None]))[:, None]

    def _packed_states(self, k: Tensor, v: Tensor, segments: Segments) -> State | None:
        """Each document's final state as ``forward_with_state(document)`` returns it, from the
        packed keys and values (B, Hk, L, D) (after RoPE at in-document positions, so the same).

        With a window: the ring of W slots, slot j holding the key of the document's latest position
        ≡ j (mod W), zeros where the document is shorter (init_state's empty slots); fixed size,
        so batched for any lengths. Without: the whole cache, as long as its document; batched when
        every document has the same length, else None (``run_packed`` then refuses with_states)."""
        lens = segments.doc_len
        if self.window is None:
            if segments.num_docs and bool((lens != lens[0]).any()):
                return None
            kd, vd = (segments.unpack(t.transpose(1, 2)).transpose(1, 2) for t in (k, v))  # (N, Hk, ℓ, D)
            return {"k": kd, "v": vd, "pos": lens.clone()}
        target = ring_positions(lens, self.window)  # (N, W): position within the document held by each slot
        steps = segments.doc_start[:, None] + target.clamp(min=0)  # (N, W) packed step
        seen = (target >= 0)[:, None, :, None]  # (N, 1, W, 1)

        def ring(t: Tensor) -> Tensor:
            slots = t.transpose(1, 2)[segments.doc_row[:, None], steps].transpose(1, 2)  # (N, Hk, W, D)
            return torch.where(seen, slots, torch.zeros((), dtype=t.dtype, device=t.device))

        return {"k": ring(k), "v": ring(v), "pos": lens.clone()}

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, window={self.window}, "
                f"rope={self.rope} (base {self.rope_base:g}), backend={self.backend_choice.label()}")


def _cat_valid(past: Tensor | None, now: Tensor | None, B: int, S: int, L: int, device: torch.device) -> Tensor | None:
    """Key validity (B, S + L) of [past, chunk] (None when every key is valid)."""
    if past is None and now is None:
        return None
    ones = torch.ones(B, S + L, dtype=torch.bool, device=device)
    past = ones[:, :S] if past is None else past
    now = ones[:, S:] if now is None else now
    return torch.cat([past, now], 1)


class AttentionBidirectional(Attention, params=AttentionBidirectionalParams):
    """Every query reads every (valid) key, before and after it: for classification.

    No causal streaming mode: ``step`` and ``init_state`` raise ``NotCausalError``, and
    ``forward_with_state`` accepts no incoming state (it returns an empty one)."""

    causal: ClassVar[bool] = False

    def _refuse(self, what: str) -> NotCausalError:
        return NotCausalError(
            f"attention-bidirectional cannot {what}: every query reads keys after it, so there is no "
            "causal step or carried state; run whole sequences with forward(), or use the causal core "
            "'attention' (with a window for constant streaming memory)")

    def forward_with_state(self, x: Tensor, state: State | None = None, *,
                           lengths: Tensor | None = None) -> tuple[Tensor, State]:
        """x (B, L, H) whole; ``lengths`` (B,) masks the padded keys, so valid steps never read padding."""
        if state is not None:
            raise self._refuse("continue from a carried state")
        B, L, _ = x.shape
        positions = torch.arange(L, device=x.device).expand(B, L)
        q, k, v = self._qkv(x, positions)
        valid = self._valid(lengths, B, L, x.device)
        if self.window is None and valid is None:
            return self._attend(q, k, v, None), {}
        return self._attend(q, k, v, self._mask(positions, positions, valid)), {}

    def _packed_states(self, k: Tensor, v: Tensor, segments: Segments) -> State | None:
        """No carried state: ``forward_with_state`` returns {} for every document, so stacked {}."""
        return {}

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        raise self._refuse("step one token at a time")

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        raise self._refuse("stream (init_state)")
