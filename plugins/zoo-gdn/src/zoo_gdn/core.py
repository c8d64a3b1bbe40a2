"""The Gated DeltaNet mixer (Yang, Kautz & Hatamizadeh 2024), as fla's ``GatedDeltaNet`` layer.

Letters: B batch, L length, H model width (d_model), h heads, K key width and V value width per
head, W conv width, D = 2·h·K + h·V the width of the convolved q, k, v.

    q, k, v  = SiLU(causal depthwise conv(q_proj x, k_proj x, v_proj x))      each conv of width W
    q ← q / ‖q‖ · K^−½,   k ← k / ‖k‖                                         per head (L2, ε = 1e-6)
    β_t      = sigmoid(b_proj x_t)               (× 2 when allow_neg_eigval)  (B, L, h)
    g_t      = −exp(A_log) · softplus(a_proj x_t + dt_bias),   α_t = exp(g_t) ∈ (0, 1]
    S_t      = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t      S (K, V) per head
    y        = o_proj(RMSNorm(o) ⊙ SiLU(g_proj x))            (RMSNorm(o) alone without use_gate)

A_log and dt_bias are initialised as Mamba-2's (A ~ U[0, 16], Δ log-uniform in [1e-3, 1e-1]
through softplus⁻¹), as fla does; parameter names equal fla's, so its weights map by name.

State: ``conv`` (B, D, W−1), the last W−1 projected inputs of the three convolutions (q, k, v
stacked), and ``ssm`` (B, h, K, V) in float32 (float64 for a float64 core).

Packed documents (``forward_packed``): the short convolutions cut at every document start
(``causal_conv_packed``), the op's transition zeroed at starts (``reset``: the chunked form masks its
decays and WY system to one document) and each document's final state read where it ends (``ends``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.init.diag import softplus_inverse_dt
from zoo_core.kernels.short_conv import causal_conv, causal_conv_packed, causal_conv_step
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import OptimHint, State, require_state_keys

from .ops import gated_delta_step
from .params import GatedDeltaNetParams

_DT_MIN, _DT_MAX, _DT_FLOOR, _A_MAX = 1e-3, 1e-1, 1e-4, 16.0  # fla's hard-coded Mamba-2 init
_L2_EPS = 1e-6  # fla's l2norm: x / sqrt(Σx² + ε)


class GatedDeltaOp(Protocol):
    """Op ``scan`` for the structure ``"gated_delta"`` (``zoo_gdn.ops``): q, k (B, L, h, K), v (B, L, h, V),
    beta, g (B, L, h), h0 (B, h, K, V) | None -> o (B, L, h, V), final state (B, h, K, V); with ``reset``
    (B, L) bool the transition is zeroed at marked steps, with ``ends`` (B, L) bool the states after
    the marked steps are returned instead, (N, h, K, V) row-major."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, h0: Tensor | None = None,
                 *, chunk_size: int = 64, reset: Tensor | None = None,
                 ends: Tensor | None = None) -> tuple[Tensor, Tensor]: ...


class _GatedRMSNorm(nn.Module):
    """RMSNorm over each head's V values with a learned weight, then ⊙ SiLU(gate) when given
    (fla's ``FusedRMSNormGated`` / ``RMSNorm``; a module so the weight is named ``o_norm.weight``)."""

    def __init__(self, n: int, eps: float, **kw: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n, **kw))

    def forward(self, o: Tensor, gate: Tensor | None) -> Tensor:
        y = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + self.eps) * self.weight
        return y if gate is None else y * F.silu(gate)


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + _L2_EPS)


_STATE_PARTS = {"conv": "(B, 2·h·K + h·V, conv_size − 1)", "ssm": "(B, h, K, V)"}


class GatedDeltaNet(CoreBase, params=GatedDeltaNetParams):
    paths = {"delta": ("scan",)}
    reference = {"scan": "gdn-sequential"}
    problem = Problem(structure="gated_delta", lti=False)

    def __init__(
        self,
        d_model: int,
        num_heads: int = 4,
        head_dim: str | int = 16,
        expand_k: float | None = None,
        expand_v: float = 2.0,
        conv_size: int = 4,
        conv_bias: bool = False,
        use_gate: bool = True,
        allow_neg_eigval: bool = False,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        hp = cast(GatedDeltaNetParams, self.hparams)
        real = dtype or torch.get_default_dtype()
        kw = {"device": device, "dtype": real}
        fp32 = {"device": device, "dtype": torch.promote_types(real, torch.float32)}  # A_log, dt_bias: never half
        h, K, V, W = num_heads, hp.key_head_dim, hp.value_head_dim, conv_size
        self.d_model, self.num_heads, self.head_k_dim, self.head_v_dim, self.conv_size = d_model, h, K, V, W
        self.use_gate, self.allow_neg_eigval, self.chunk_size = use_gate, allow_neg_eigval, chunk_size
        self.widths = [h * K, h * K, h * V]  # q, k, v
        self.q_proj = nn.Linear(d_model, h * K, bias=False, **kw)
        self.k_proj = nn.Linear(d_model, h * K, bias=False, **kw)
        self.v_proj = nn.Linear(d_model, h * V, bias=False, **kw)
        self.a_proj = nn.Linear(d_model, h, bias=False, **kw)
        self.b_proj = nn.Linear(d_model, h, bias=False, **kw)
        self.A_log = nn.Parameter(torch.log(torch.empty(h, dtype=torch.float32).uniform_(0, _A_MAX)).to(**fp32))  # (h,)
        self.dt_bias = nn.Parameter(softplus_inverse_dt(h, _DT_MIN, _DT_MAX, _DT_FLOOR).to(**fp32))  # (h,)
        self.q_conv1d = nn.Conv1d(h * K, h * K, W, groups=h * K, bias=conv_bias, **kw)  # weight (hK, 1, W)
        self.k_conv1d = nn.Conv1d(h * K, h * K, W, groups=h * K, bias=conv_bias, **kw)
        self.v_conv1d = nn.Conv1d(h * V, h * V, W, groups=h * V, bias=conv_bias, **kw)
        self.g_proj = nn.Linear(d_model, h * V, bias=False, **kw) if use_gate else None
        self.o_norm = _GatedRMSNorm(V, norm_eps, **kw)
        self.o_proj = nn.Linear(h * V, d_model, bias=False, **kw)

    # pieces ------------------------------------------------------------------------------
    def _conv_params(self) -> tuple[Tensor, Tensor | None]:
        """The three depthwise convolutions as one: weight (D, 1, W), bias (D,) or None."""
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        weight = torch.cat([c.weight for c in convs])
        biases = [c.bias for c in convs if c.bias is not None]
        return weight, (torch.cat(biases) if biases else None)

    def _projected(self, x: Tensor) -> Tensor:
        """q_proj, k_proj, v_proj stacked: (..., D)."""
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)

    def _heads(self, qkv: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Convolved qkv (..., D) and the input x (..., H) -> q, k (..., h, K), v (..., h, V), beta, g (..., h)."""
        q, k, v = F.silu(qkv).split(self.widths, -1)
        q = _l2norm(q.unflatten(-1, (self.num_heads, self.head_k_dim))) * self.head_k_dim**-0.5
        k = _l2norm(k.unflatten(-1, (self.num_heads, self.head_k_dim)))
        v = v.unflatten(-1, (self.num_heads, self.head_v_dim))
        beta = torch.sigmoid(self.b_proj(x))
        if self.allow_neg_eigval:
            beta = beta * 2.0
        g = -torch.exp(self.A_log) * F.softplus(self.a_proj(x).to(self.dt_bias.dtype) + self.dt_bias)
        return q, k, v, beta, g

    def _output(self, o: Tensor, x: Tensor) -> Tensor:
        """o (..., h, V) -> o_proj(RMSNorm(o) ⊙ SiLU(g_proj x)): (..., H)."""
        gate = None if self.g_proj is None else self.g_proj(x).unflatten(-1, (self.num_heads, self.head_v_dim))
        return self.o_proj(self.o_norm(o.to(x.dtype), gate).flatten(-2))

    # sequence ----------------------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """x (B, L, H) -> y (B, L, H) and the state after the last step."""
        if state is not None:
            require_state_keys("GatedDeltaNet", state, _STATE_PARTS)
        weight, bias = self._conv_params()
        conv, past = causal_conv(self._projected(x), weight, bias, None if state is None else state["conv"])  # (B, L, D)
        q, k, v, beta, g = self._heads(conv, x)
        h0 = None if state is None else state["ssm"]
        op = cast(GatedDeltaOp, self.ops.scan)
        o, S = op(q, k, v, beta, g, h0, chunk_size=self.chunk_size)  # (B, L, h, V), (B, h, K, V)
        return self._output(o, x), {"conv": past, "ssm": S}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents x (B, L, H) laid out by ``segments``, each from the zero state, in one call:
        y (B, L, H) and each document's final state (``conv`` (N, D, W−1), ``ssm`` (N, h, K, V))."""
        segments.check(x)
        weight, bias = self._conv_params()
        conv, pasts = causal_conv_packed(self._projected(x), weight, bias, segments)  # (B, L, D), (N, D, W−1)
        q, k, v, beta, g = self._heads(conv, x)
        ends = None
        if with_states:
            ends = torch.zeros(segments.shape, dtype=torch.bool, device=x.device)
            ends[segments.doc_row, segments.doc_end] = True  # (B, L)
        op = cast(GatedDeltaOp, self.ops.scan)
        o, S = op(q, k, v, beta, g, None, chunk_size=self.chunk_size, reset=segments.starts, ends=ends)
        return self._output(o, x), ({"conv": pasts, "ssm": S} if with_states else None)

    # streaming ---------------------------------------------------------------------------
    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """x_t (B, H) -> y_t (B, H); a constant-size state."""
        require_state_keys("GatedDeltaNet", state, _STATE_PARTS)
        weight, bias = self._conv_params()
        conv, past = causal_conv_step(self._projected(x_t), weight, bias, state["conv"])  # (B, D)
        q, k, v, beta, g = self._heads(conv, x_t)
        S = state["ssm"]
        dt = S.dtype
        o, S = gated_delta_step(q.to(dt), k.to(dt), v.to(dt), beta.to(dt), g.to(dt), S)  # (B, h, V), (B, h, K, V)
        return self._output(o, x_t), {"conv": past, "ssm": S}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        w = self.q_proj.weight
        dtype, device = dtype or w.dtype, device or w.device
        D = sum(self.widths)
        return {
            "conv": torch.zeros(batch_size, D, self.conv_size - 1, device=device, dtype=dtype),
            "ssm": torch.zeros(batch_size, self.num_heads, self.head_k_dim, self.head_v_dim, device=device,
                               dtype=torch.promote_types(dtype, torch.float32)),
        }

    def optim_hints(self) -> Mapping[str, OptimHint]:
        """No weight decay on A_log and dt_bias (fla marks both ``_no_weight_decay``)."""
        hint = OptimHint(weight_decay=0.0)
        return {"A_log": hint, "dt_bias": hint}

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_k_dim={self.head_k_dim}, "
                f"head_v_dim={self.head_v_dim}, conv_size={self.conv_size}, use_gate={self.use_gate}, "
                f"allow_neg_eigval={self.allow_neg_eigval}, chunk_size={self.chunk_size}, "
                f"backend={self.backend_choice.label()}")
