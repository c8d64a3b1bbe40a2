"""The Hawk recurrent block around the RG-LRU (De et al. 2024), as transformers'
``RecurrentGemmaRecurrentBlock`` computes it.

Letters: B batch, L length, H model width (d_model), W recurrence width (lru_width), Hh heads,
Wh = W / Hh channels per head, K conv width.

    y_br  = GeLU(linear_y(u))                                   (B, L, W)
    x     = causal depthwise conv1d_K(linear_x(u))             (B, L, W), K−1 past inputs carried
    r_t   = σ(x_t W_a + b_a),  i_t = σ(x_t W_x + b_x)           block-diagonal W_a, W_x: (Hh, Wh, Wh)
    log a_t = −c · softplus(−Λ) · r_t = c · r_t · log σ(Λ)      (log space: a_t ∈ (0, 1] always)
    h_t   = a_t ⊙ h_{t−1} + sqrt(1 − a_t²) ⊙ (i_t ⊙ x_t)       sqrt(1 − a²) = sqrt(−expm1(2 log a))
    out   = linear_out(h ⊙ y_br)                                (B, L, H)

Document start (the reference's reset at position 0): the first token of a document has a_0 = 0
and multiplier 1, h_0 = i_0 ⊙ x_0. The state carries ``start`` (B,): 1 where the next token begins
a document (``init_state`` and ``state=None``), 0 once a token has been seen, so splitting a
sequence and carrying the state equals one forward. Padding in the zoo is at the end of a
sequence and a causal core never sees it at valid positions, so ``lengths`` needs no reset.

State: ``conv`` (B, W, K−1) the last K−1 inputs of the convolution, ``h`` (B, W) in float32
(float64 for a float64 core), ``start`` (B,).

Packed documents (``forward_packed``, ``zoo_core.packing``): the same document-start reset at every
document's first step inside the row (the gates' ``reset`` is per step: a_t = 0, multiplier 1), the
convolution cut there (``causal_conv_packed``), and each document's final h read at its last step.
Zeroing a_t also cuts the adjoint scan's backward, g_t = dL/dh_t + a_{t+1} ⊙ g_{t+1}, at the start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init
from torch.utils.checkpoint import checkpoint

from zoo_core.corebase import CoreBase, runs_path
from zoo_core.kernels.short_conv import causal_conv, causal_conv_packed, causal_conv_step
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State, require_state_keys

from .params import RGLRUParams

F64 = torch.float64
MAX_SQRT_GRADIENT = 1000.0  # the reference's bound on d sqrt(x)/dx (NaN-free training near a = 1)


class _BoundedSqrt(torch.autograd.Function):
    """sqrt(x) whose derivative 1/(2 sqrt x) is capped at ``MAX_SQRT_GRADIENT``: at a_t → 1 the
    multiplier sqrt(1 − a_t²) has an unbounded derivative (the reference caps it the same way)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return torch.sqrt(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad / torch.sqrt(torch.clamp(4.0 * x, min=1.0 / MAX_SQRT_GRADIENT**2))


def bounded_sqrt(x: Tensor) -> Tensor:
    out: Tensor = _BoundedSqrt.apply(x)
    return out


class _Gates(torch.autograd.Function):
    """a_t, b_t from the gate pre-activations in one node that saves only its three (B, L, W) inputs.

    As a chain of torch ops the gate maths saved ten (B, L, W) tensors (r, i, c·r, expm1, the sqrt's
    argument, exp, i ⊙ x, the multiplier, ...); they peaked the backward (+88 MiB at B 8, L 4096,
    W 64). Here backward recomputes them elementwise, a piece of time steps at a time (``GATE_PIECE``),
    so its temporaries stay small. The derivative of sqrt(1 − a²) is capped as
    ``_BoundedSqrt`` caps it."""

    @staticmethod
    def forward(ctx: Any, zr: Tensor, zi: Tensor, x: Tensor, sp: Tensor, reset: Tensor, c: float) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(zr, zi, x, sp, reset)
        ctx.c = c
        log_a = torch.sigmoid(zr) * sp * -c  # (B, L, W)
        keep = 1 - reset  # (B, L, 1)
        b = (reset + keep * torch.sqrt(-torch.expm1(2 * log_a))) * torch.sigmoid(zi) * x  # (B, L, W)
        return torch.exp(log_a) * keep, b

    @staticmethod
    def backward(ctx: Any, ga: Tensor | None, gb: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, None]:
        zr, zi, x, sp, reset = ctx.saved_tensors
        ga = torch.zeros_like(x) if ga is None else ga
        gb = torch.zeros_like(x) if gb is None else gb
        g_zr, g_zi, g_x, g_reset = (torch.empty_like(t) for t in (zr, zi, x, reset))
        g_sp = torch.zeros_like(sp)
        # pieces of GATE_PIECE steps: the dozen elementwise temporaries are a piece's size, not (B, L, W)
        for t0 in range(0, x.shape[1], GATE_PIECE):
            ts = slice(t0, t0 + GATE_PIECE)
            g_zr[:, ts], g_zi[:, ts], g_x[:, ts], g_reset[:, ts], g_sp_piece = _gates_grad(
                zr[:, ts], zi[:, ts], x[:, ts], sp, reset[:, ts], ga[:, ts], gb[:, ts], ctx.c)
            g_sp += g_sp_piece
        return g_zr, g_zi, g_x, g_sp, g_reset, None


GATE_PIECE = 256  # time steps per piece of the gates' backward


def _gates_grad(zr: Tensor, zi: Tensor, x: Tensor, sp: Tensor, reset: Tensor, ga: Tensor, gb: Tensor,
                c: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``_Gates``' backward on a piece of time steps: grads into zr, zi, x, reset (summed over W), sp (W,)."""
    r, i = torch.sigmoid(zr), torch.sigmoid(zi)  # (B, T, W)
    log_a = r * sp * -c
    e = torch.exp(log_a)  # a before the reset
    s = -torch.expm1(2 * log_a)  # 1 − a²
    mult = torch.sqrt(s)
    keep = 1 - reset  # (B, T, 1)
    ix = i * x
    # d log_a: through a = e ⊙ keep, and through mult = sqrt(s), ds/dlog_a = −2 e², capped d sqrt
    d_log_a = ga * e * keep - gb * ix * keep * 2 * e * e / torch.sqrt(torch.clamp(4.0 * s, min=1.0 / MAX_SQRT_GRADIENT**2))
    g_reset = (gb * ix * (1 - mult) - ga * e).sum(-1, keepdim=True)  # (B, T, 1)
    m = reset + keep * mult  # (B, T, W) the multiplier
    g_x = gb * m * i
    g_zi = gb * m * x * i * (1 - i)
    g_sp = (d_log_a * r).flatten(0, -2).sum(0) * -c  # (W,)
    g_zr = d_log_a * sp * -c * r * (1 - r)
    return g_zr, g_zi, g_x, g_reset, g_sp


class _AdjointScan(torch.autograd.Function):
    """h_t = a_t ⊙ h_{t−1} + b_t through any registered diagonal scan, with a hand-written backward.

    Autograd through the parallel scan keeps every doubling level's (B, L, W) pair and allocates as
    many gradients again (+185 MiB fwd+bwd for one (8, 4096, 64) scan). The adjoint of a diagonal
    linear recurrence is the same recurrence run backwards, g_t = dL/dh_t + a_{t+1} ⊙ g_{t+1}, so the
    backward runs the same scan op on the reversed sequence and saves only a, h and h0:
    db_t = g_t, da_t = g_t ⊙ h_{t−1} (h_{−1} = h0), dh0 = a_0 ⊙ g_0. Real decays only (this core's)."""

    @staticmethod
    def forward(ctx: Any, scan: Any, a: Tensor, b: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
        h, h_last = scan(a, b, h0)  # (B, L, W), (B, W)
        ctx.scan, ctx.b_dtype = scan, b.dtype
        ctx.save_for_backward(a, h, h0)
        return h, h_last

    @staticmethod
    def backward(ctx: Any, gh: Tensor | None, g_last: Tensor | None) -> tuple[None, Tensor, Tensor, Tensor]:
        a, h, h0 = ctx.saved_tensors
        dt = h.dtype
        # reversed time: g'_s = a_{L−s} ⊙ g'_{s−1} + gh_{L−1−s}, started from g'_{−1} = dL/dh_last
        # (transition 1 at s = 0). Each (B, L, W) temporary is dropped as soon as it is used: the
        # backward's peak is what this function holds at once.
        gh_rev = torch.zeros_like(h) if gh is None else gh.to(dt).flip(1)  # (B, L, W)
        del gh
        a_rev = torch.cat([a.new_ones(a.shape[0], 1, *a.shape[2:]), a[:, 1:].flip(1)], 1).to(dt)  # (B, L, W)
        g_start = torch.zeros_like(h[:, 0]) if g_last is None else g_last.to(dt)  # (B, W)
        g_rev = ctx.scan(a_rev, gh_rev, g_start)[0]  # (B, L, W)
        del a_rev, gh_rev
        g = g_rev.flip(1)  # (B, L, W) dL/db_t
        del g_rev
        da = torch.cat([h0.to(dt)[:, None], h[:, :-1]], 1)  # (B, L, W) h_{t−1}
        da *= g  # dL/da_t = g_t ⊙ h_{t−1}
        dh0 = a[:, 0].to(dt) * g[:, 0]  # (B, W)
        return None, da.to(a.dtype), g.to(ctx.b_dtype), dh0.to(h0.dtype)


def adjoint_scan(scan: Any, a: Tensor, b: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """``scan(a, b, h0)`` (a, b (B, L, W), h0 (B, W)) with the O(1)-intermediates backward above."""
    h: Tensor
    h_last: Tensor
    h, h_last = _AdjointScan.apply(scan, a, b, h0)
    return h, h_last


def lambda_init(width: int, c: float, a_min: float, a_max: float, how: str) -> Tensor:
    """Λ (W,) float64. 'paper': σ(Λ)^c ~ U[a_min, a_max]; 'recurrentgemma': σ(Λ)² ~ U[a_min², a_max²]."""
    u = torch.rand(width, dtype=F64)  # (W,)
    if how == "paper":
        log_a = torch.log(a_min + u * (a_max - a_min)) / c  # (W,) log σ(Λ)
    else:
        log_a = 0.5 * torch.log(a_min**2 + u * (a_max**2 - a_min**2))  # (W,)
    return log_a - torch.log(-torch.expm1(log_a))  # logit(a) = log a − log(1 − a)


_STATE_PARTS = {"conv": "(B, W, K−1)", "h": "(B, W)", "start": "(B,; 1 where a document begins)"}


class RGLRU(CoreBase, params=RGLRUParams):
    # "sequential": step() unrolled, the reference. "recurrent": gates for all steps at once, then
    # the registered diagonal scan on (a_t, b_t); "auto" picks it.
    paths = {"recurrent": ("scan",), "sequential": ()}
    reference = {}
    problem = Problem(structure="diag", lti=False, complex=False)
    # On CPU the registry's generic preference is the loop; for this core's real (B, L, W) decays the
    # parallel scan measured 20× faster forward and 3× forward+backward (B 8, W 64, L 1024; REPORT in the card).
    # The C++ cpu-scan measured level with it for the whole layer (the scan is a small part of it), and its
    # fixed-length ONNX form is lost there (the C++ op has no ONNX translation), so it is not pinned;
    # backend {scan: cpu-scan} takes it, and with it an exported forward of dynamic length.
    auto_backends = {"cpu": {"scan": "scan"}}

    def __init__(
        self,
        d_model: int,
        lru_width: int | None = None,
        num_heads: int = 1,
        conv_width: int = 4,
        c: float = 8.0,
        a_min: float = 0.9,
        a_max: float = 0.999,
        a_init: str = "paper",
        gelu_approximate: str = "tanh",
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        W = lru_width if lru_width is not None else d_model
        Hh, K = num_heads, conv_width
        self.d_model, self.lru_width, self.num_heads, self.conv_width = d_model, W, Hh, K
        self.c, self.gelu_approximate = float(c), gelu_approximate
        kw: dict[str, Any] = {"device": torch.empty(0, device=device).device, "dtype": dtype or torch.get_default_dtype()}
        # skip_init: torch's own draws depend on the dtype; every value is drawn in _init_weights
        self.linear_y = skip_init(nn.Linear, d_model, W, **kw)
        self.linear_x = skip_init(nn.Linear, d_model, W, **kw)
        self.linear_out = skip_init(nn.Linear, W, d_model, **kw)
        self.conv_1d = skip_init(nn.Conv1d, W, W, K, groups=W, **kw)  # weight (W, 1, K), bias (W,)
        self.input_gate_weight = nn.Parameter(torch.empty(Hh, W // Hh, W // Hh, **kw))  # (Hh, Wh, Wh), in × out
        self.input_gate_bias = nn.Parameter(torch.empty(Hh, W // Hh, **kw))  # (Hh, Wh)
        self.recurrent_gate_weight = nn.Parameter(torch.empty(Hh, W // Hh, W // Hh, **kw))
        self.recurrent_gate_bias = nn.Parameter(torch.empty(Hh, W // Hh, **kw))
        self.Lambda = nn.Parameter(torch.empty(W, **kw))  # (W,) σ(Λ) = a, the decay at r_t = 1/c
        self._init_weights(a_min, a_max, a_init)

    def _init_weights(self, a_min: float, a_max: float, a_init: str) -> None:
        """Variance-preserving normals, zero biases, Λ from the decay range. Drawn in float64 and
        cast, so float32 and float64 builds with one seed agree."""
        fan_in = {"linear_y": self.d_model, "linear_x": self.d_model, "linear_out": self.lru_width,
                  "conv_1d": self.conv_width, "input_gate": self.lru_width // self.num_heads,
                  "recurrent_gate": self.lru_width // self.num_heads}
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name == "Lambda":
                    p.copy_(lambda_init(self.lru_width, self.c, a_min, a_max, a_init))
                elif "bias" in name:
                    p.zero_()
                else:
                    std = 1.0 / math.sqrt(fan_in[name.removesuffix(".weight").removesuffix("_weight")])
                    p.copy_(torch.randn(p.shape, dtype=F64) * std)

    # the RG-LRU ------------------------------------------------------------------------------
    def _block_diag(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """x (..., W) through one (Wh × Wh) matrix per head: (..., W).

        One bmm over heads with every position as a row: (Hh, N, Wh) @ (Hh, Wh, Wh). Broadcasting the
        weight against (..., Hh, 1, Wh) instead made autograd expand its gradient to (B, L, Hh, Wh, Wh)
        before summing (+545 MiB and 28× slower fwd+bwd per gate at B 8, L 4096, W 64); einsum costs 5×
        at one step."""
        xh = x.reshape(-1, self.num_heads, weight.shape[-1]).transpose(0, 1)  # (Hh, N, Wh), N = prod(...)
        y = (xh @ weight).transpose(0, 1)  # (N, Hh, Wh)
        return (y + bias).reshape(x.shape)  # (..., W)

    def _reset(self, x: Tensor, start: Tensor) -> Tensor:
        """(B, L, 1): ``start`` at t = 0, else 0 (the document start resets a_0 = 0, multiplier 1)."""
        s0 = start.to(x.dtype)[:, None, None]  # (B, 1, 1)
        first = torch.arange(x.shape[1], device=x.device) == 0  # (L,): no (L − 1)-long piece, which export would guard
        return s0 * first.to(x.dtype)[None, :, None]

    def transition(self, x: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        """The recurrence's a_t and b_t for conv outputs x (B, L, W); ``start`` (B,) resets step 0.
        The plain autograd chain: ``step`` (the reference) runs it; ``fused_transition`` must equal it.

        Returns:
            a: (B, L, W) decays in (0, 1]; b: (B, L, W) = multiplier ⊙ i_t ⊙ x_t.
        """
        r = torch.sigmoid(self._block_diag(x, self.recurrent_gate_weight, self.recurrent_gate_bias))  # (B, L, W)
        i = torch.sigmoid(self._block_diag(x, self.input_gate_weight, self.input_gate_bias))  # (B, L, W)
        log_a = -self.c * r * F.softplus(-self.Lambda)  # (B, L, W) ≤ 0 (F.logsigmoid: 100× slower on CPU)
        mult = bounded_sqrt(-torch.expm1(2 * log_a))  # (B, L, W) sqrt(1 − a²), no cancellation near a = 1
        reset = self._reset(x, start)  # (B, L, 1)
        a = torch.exp(log_a) * (1 - reset)  # (B, L, W)
        b = (reset + (1 - reset) * mult) * (i * x)  # (B, L, W)
        return a, b

    def fused_transition(self, x: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        """``transition`` with the elementwise gate maths in one node (``_Gates``): the parallel path's."""
        return self._fused_gates(x, self._reset(x, start))

    def _fused_gates(self, x: Tensor, reset: Tensor) -> tuple[Tensor, Tensor]:
        """``_Gates`` on conv outputs x (B, L, W) with ``reset`` (B, L, 1): 1 at a document's first step."""
        zr = self._block_diag(x, self.recurrent_gate_weight, self.recurrent_gate_bias)  # (B, L, W) r = σ(zr)
        zi = self._block_diag(x, self.input_gate_weight, self.input_gate_bias)  # (B, L, W) i = σ(zi)
        a: Tensor
        b: Tensor
        a, b = _Gates.apply(zr, zi, x, F.softplus(-self.Lambda), reset, self.c)  # (B, L, W) each
        return a, b

    # pieces of the block -----------------------------------------------------------------------
    @property
    def conv_bias(self) -> Tensor:
        bias = self.conv_1d.bias
        assert bias is not None  # built with bias=True, as the reference
        return bias

    def _y_branch(self, u: Tensor) -> Tensor:
        return F.gelu(self.linear_y(u), approximate=self.gelu_approximate)  # (..., W)

    # sequence ----------------------------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """u (B, L, H) -> out (B, L, H) and the state after the last step."""
        if state is None:
            state = self.init_state(x.shape[0], device=x.device, dtype=x.dtype)
        require_state_keys("RGLRU", state, _STATE_PARTS)
        y: Tensor
        new: State
        y, new = self.run_path(x, state)
        return y, new

    @runs_path("recurrent")
    def _recurrent(self, u: Tensor, state: State) -> tuple[Tensor, State]:
        xc, past = causal_conv(self.linear_x(u), self.conv_1d.weight, self.conv_bias, state["conv"])  # (B, L, W)
        a, b = checkpoint(self.fused_transition, xc, state["start"], use_reentrant=False)  # (B, L, W); holds xc, not zr and zi
        h, h_last = adjoint_scan(self.ops.scan, a, b, state["h"])  # (B, L, W), (B, W)
        out = self.linear_out(h.to(u.dtype) * self._y_branch(u))  # (B, L, H)
        return out, {"conv": past, "h": h_last, "start": torch.zeros_like(state["start"])}

    @runs_path("sequential")
    def _sequential(self, u: Tensor, state: State) -> tuple[Tensor, State]:
        ys = []
        for u_t in u.unbind(1):  # unbind: one backward node, not L slices
            y_t, state = self.step(u_t, state)
            ys.append(y_t)
        return torch.stack(ys, 1), state

    # packed documents ----------------------------------------------------------------------------
    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents u (B, L, H) laid out by ``segments``, each from the zero state, in one call
        on the bound path: out (B, L, H) and each document's final state (``conv`` (N, W, K−1), ``h`` (N, W),
        ``start`` (N,) zeros, as after any run)."""
        segments.check(x)
        xc, pasts = causal_conv_packed(self.linear_x(x), self.conv_1d.weight, self.conv_bias, segments)  # (B, L, W)
        h0 = xc.new_zeros(x.shape[0], self.lru_width, dtype=torch.promote_types(x.dtype, torch.float32))  # (B, W)
        if self.backend_choice.path == "recurrent":
            reset = segments.starts[..., None].to(xc.dtype)  # (B, L, 1) per step, where _reset has step 0 only
            a, b = checkpoint(self._fused_gates, xc, reset, use_reentrant=False)  # (B, L, W)
            h, _ = adjoint_scan(self.ops.scan, a, b, h0)  # (B, L, W)
        else:  # sequential: the reference's transition one step at a time, its reset from the layout
            hs, h_t = [], h0
            for t, x_t in enumerate(xc.unbind(1)):
                a_t, b_t = self.transition(x_t[:, None], segments.starts[:, t])  # (B, 1, W) each
                h_t = a_t[:, 0] * h_t + b_t[:, 0]  # (B, W)
                hs.append(h_t)
            h = torch.stack(hs, 1)  # (B, L, W)
        out = self.linear_out(h.to(x.dtype) * self._y_branch(x))  # (B, L, H)
        if not with_states:
            return out, None
        return out, {"conv": pasts, "h": segments.at_ends(h), "start": x.new_zeros(segments.num_docs)}

    # streaming ---------------------------------------------------------------------------------
    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """u_t (B, H) -> out_t (B, H); a constant-size state."""
        xc, past = causal_conv_step(self.linear_x(x_t), self.conv_1d.weight, self.conv_bias, state["conv"])  # (B, W)
        a, b = self.transition(xc[:, None], state["start"])  # (B, 1, W) each
        h = a[:, 0] * state["h"] + b[:, 0]  # (B, W)
        out = self.linear_out(h.to(x_t.dtype) * self._y_branch(x_t))  # (B, H)
        return out, {"conv": past, "h": h, "start": torch.zeros_like(state["start"])}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        w = self.Lambda
        dtype, device = dtype or w.dtype, device or w.device
        return {
            "conv": torch.zeros(batch_size, self.lru_width, self.conv_width - 1, device=device, dtype=dtype),
            "h": torch.zeros(batch_size, self.lru_width, device=device, dtype=torch.promote_types(dtype, torch.float32)),
            "start": torch.ones(batch_size, device=device, dtype=dtype),
        }

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, lru_width={self.lru_width}, num_heads={self.num_heads}, "
                f"conv_width={self.conv_width}, c={self.c}, backend={self.backend_choice.label()}")
