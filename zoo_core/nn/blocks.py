"""Blocks: norm → core → activation → dropout → output map (GLU / linear) → dropout → residual,
and the LrcSSM backbone's block (models.md §12.3).

Letters: B batch, L length, H model width. Every block has ``forward_with_state`` and ``step``,
with the same maths, so a stack of blocks streams exactly as it runs in parallel (in eval mode).

Norms can be handed in per call (``norms=``): a stack that reuses one block at several depth
positions with ``norms: per_position`` keeps one set of norms per position and passes it in; the
block then owns no norms of its own (``drop_norms``). Dropout draws a fresh mask at every call, so
a block applied at several depth positions gets independent masks per application.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..packing import Segments, run_packed
from ..protocols import State

if TYPE_CHECKING:  # annotations only: zoo_core.nn does not need the registry machinery corebase loads
    from ..corebase import CoreBase

NORMS = ("layer", "rms", "batch", "ema_batch", "none")
ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu", "identity")
OUTPUTS = ("glu", "linear", "none")
LAYOUTS = ("residual", "lrcssm")


class ChannelBatchNorm(nn.Module):
    """BatchNorm over channels for (B, L, H) or (B, H) inputs (statistics over batch and time)."""

    def __init__(self, d_model: int, **kw: Any) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(d_model, **kw)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2:  # (B, H): one time step
            return self.bn(x)
        return self.bn(x.transpose(1, 2)).transpose(1, 2)  # (B, L, H)


class EMABatchNorm(nn.Module):
    """Equinox's legacy ("ema") BatchNorm, as in the Log-NCDE/LinOSS backbone (models.md §12.1).

    Unlike PyTorch's, it normalises with the running statistics during training too: the first
    training call sets them to the batch statistics (biased variance over batch and time), later
    calls mix ``0.99·running + 0.01·batch`` and normalise with the mixed values; gradients flow
    only through the batch part. Eval uses the stored statistics. Shapes (B, L, H) or (B, H).
    """

    # registered by name in __init__: declared so the type checker sees tensors, not Tensor | Module
    running_mean: Tensor  # (H,)
    running_var: Tensor  # (H,)
    initialised: Tensor  # () bool
    weight: nn.Parameter | None  # (H,) when affine
    bias: nn.Parameter | None  # (H,) when affine

    def __init__(self, d_model: int, *, momentum: float = 0.99, eps: float = 1e-5, affine: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(d_model, **kw))
        self.register_buffer("running_var", torch.ones(d_model, **kw))
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool, device=device))
        self.weight = nn.Parameter(torch.ones(d_model, **kw)) if affine else None
        self.bias = nn.Parameter(torch.zeros(d_model, **kw)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        mean, var = self.running_mean, self.running_var  # (H,)
        if self.training:
            dims = tuple(range(x.dim() - 1))  # batch (and time)
            b_mean, b_var = x.mean(dims), x.var(dims, unbiased=False)  # (H,)
            if bool(self.initialised):
                m = self.momentum
                mean, var = m * mean + (1 - m) * b_mean, m * var + (1 - m) * b_var
            else:
                mean, var = b_mean, b_var
            with torch.no_grad():
                self.running_mean.copy_(mean)
                self.running_var.copy_(var)
                self.initialised.fill_(True)
        y = (x - mean) / torch.sqrt(var + self.eps)
        if self.weight is not None and self.bias is not None:  # affine: both or neither
            y = y * self.weight + self.bias
        return y


def make_norm(kind: str, d_model: int, *, affine: bool = True, eps: float = 1e-5, **kw: Any) -> nn.Module:
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps, elementwise_affine=affine, **kw)
    if kind == "rms":
        return nn.RMSNorm(d_model, eps=eps, elementwise_affine=affine, **kw)
    if kind == "batch":
        return ChannelBatchNorm(d_model, affine=affine, eps=eps, **kw)
    if kind == "ema_batch":
        return EMABatchNorm(d_model, affine=affine, eps=eps, **kw)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}; choose one of {NORMS}")


def make_activation(kind: str) -> nn.Module:
    table: dict[str, Callable[[], nn.Module]] = {
        "gelu": lambda: nn.GELU(),
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
        "silu": nn.SiLU,
        "relu": nn.ReLU,
        "identity": nn.Identity,
    }
    if kind not in table:
        raise ValueError(f"unknown activation {kind!r}; choose one of {ACTIVATIONS}")
    return table[kind]()


def make_output(kind: str, d_model: int, **kw: Any) -> nn.Module:
    if kind == "glu":  # Linear(H, 2H) then GLU: the same as (W1 x + b1) ⊙ σ(W2 x + b2)
        return nn.Sequential(nn.Linear(d_model, 2 * d_model, **kw), nn.GLU(dim=-1))
    if kind == "linear":
        return nn.Linear(d_model, d_model, **kw)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown block output {kind!r}; choose one of {OUTPUTS}")


def run_core(core: CoreBase, u: Tensor, state: State | None, segments: Segments | None) -> Tensor:
    """The core on a whole sequence (B, L, H). With ``segments`` (packed documents, or a right-padded
    batch a non-causal core must not see the padding of) every document runs from the zero state
    (``zoo_core.packing.run_packed``); a causal core on a right-padded batch needs nothing."""
    if segments is None or (segments.padded_only and "causal" in getattr(core, "capabilities", ())):
        return core(u, state)
    if state is not None:
        raise ValueError("a packed batch starts every document from the zero state; pass no state with seq_idx")
    return run_packed(core, u, segments)[0]


def core_with_state(core: CoreBase, u: Tensor, state: State | None, segments: Segments | None) -> tuple[Tensor, State]:
    """``core.forward_with_state``; with ``segments``, every document from zero and each one's final state."""
    if segments is None:
        return core.forward_with_state(u, state)
    if state is not None:
        raise ValueError("a packed batch starts every document from the zero state; pass no state with seq_idx")
    y, states = run_packed(core, u, segments, with_states=True)
    assert states is not None  # run_packed raises when a core cannot batch them
    return y, states


class _NormsMixin:
    """Norm handling shared by the block layouts: own norms, or norms handed in per call."""

    _norm_names: tuple[str, ...] = ()
    _norm_factory: Callable[[], nn.Module]  # a fresh norm of the block's kind (set by each layout)

    def norm_modules(self) -> list[nn.Module]:
        """The block's own norms, in the order ``norms=`` expects them."""
        mods = [getattr(self, n) for n in self._norm_names]
        if any(m is None for m in mods):
            raise RuntimeError("this block's norms live in its stack (norms: per_position); pass norms=")
        return mods

    def make_norms(self) -> list[nn.Module]:
        """Fresh norms of the same kind, as freshly initialised (one set per depth position)."""
        return [self._norm_factory() for _ in self._norm_names]

    def drop_norms(self) -> None:
        """Remove the block's own norms: every call must then pass ``norms=`` (per-position norms)."""
        for n in self._norm_names:
            setattr(self, n, None)

    def _resolve(self, norms: list[nn.Module] | None) -> list[nn.Module]:
        return list(norms) if norms is not None else self.norm_modules()


class Block(_NormsMixin, nn.Module):
    """One residual block around an SSM core."""

    _norm_names = ("norm",)
    core: CoreBase  # registered by name in __init__: declared so the type checker sees the core, not Tensor | Module

    def __init__(
        self,
        core: CoreBase,
        d_model: int,
        *,
        norm: str = "layer",
        norm_affine: bool = True,
        norm_eps: float = 1e-5,
        prenorm: bool = True,
        activation: str = "gelu",
        output: str = "glu",
        dropout: float = 0.0,
        residual: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self._norm_factory = lambda: make_norm(norm, d_model, affine=norm_affine, eps=norm_eps, **kw)
        self.norm = self._norm_factory()
        self.core = core
        self.act = make_activation(activation)
        self.out = make_output(output, d_model, **kw)
        self.drop = nn.Dropout(dropout)
        self.prenorm = prenorm
        self.residual = residual

    def _pre(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x) if self.prenorm else x

    def _post(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        y = self.drop(self.out(self.drop(self.act(y))))
        z = x + y if self.residual else y
        return z if self.prenorm else norm(z)

    def forward(self, x: Tensor, state: State | None = None, *, norms: list[nn.Module] | None = None,
                segments: Segments | None = None) -> Tensor:
        (n,) = self._resolve(norms)
        return self._post(x, run_core(self.core, self._pre(x, n), state, segments), n)  # (B, L, H)

    def forward_with_state(self, x: Tensor, state: State | None = None, *, norms: list[nn.Module] | None = None,
                           segments: Segments | None = None) -> tuple[Tensor, State]:
        """Outputs and the final state; with ``segments`` (packed documents, from zero) each document's."""
        (n,) = self._resolve(norms)
        y, new_state = core_with_state(self.core, self._pre(x, n), state, segments)  # (B, L, H)
        return self._post(x, y, n), new_state

    def step(self, x_t: Tensor, state: State, *, norms: list[nn.Module] | None = None) -> tuple[Tensor, State]:
        (n,) = self._resolve(norms)
        y_t, new_state = self.core.step(self._pre(x_t, n), state)  # (B, H)
        return self._post(x_t, y_t, n), new_state

    def init_state(self, batch_size: int, **kw: Any) -> State:
        return self.core.init_state(batch_size, **kw)


class LrcBlock(_NormsMixin, nn.Module):
    """The LrcSSM backbone's block (MoniFarsang/LrcSSM ``SingleScaleGRU``, models.md §12.3)::

        u = norm_in(x)            LayerNorm without weight/bias, eps 1e-5 (the preset's defaults)
        s = core(u)
        v = norm_out(s + u)       the residual adds the *normalised* input
        y = v + MLP(v)            MLP = Linear(H, H) → activation (ReLU) → Linear(H, H)

    Dropout (p = 0 in the preset, as the reference never calls its dropout) follows the MLP.
    """

    _norm_names = ("norm_in", "norm_out")
    core: CoreBase  # registered by name in __init__: declared so the type checker sees the core, not Tensor | Module

    def __init__(
        self,
        core: CoreBase,
        d_model: int,
        *,
        norm: str = "layer",
        norm_affine: bool = False,
        norm_eps: float = 1e-5,
        activation: str = "relu",
        dropout: float = 0.0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self._norm_factory = lambda: make_norm(norm, d_model, affine=norm_affine, eps=norm_eps, **kw)
        self.norm_in, self.norm_out = self._norm_factory(), self._norm_factory()
        self.core = core
        self.mlp = nn.Sequential(nn.Linear(d_model, d_model, **kw), make_activation(activation), nn.Linear(d_model, d_model, **kw))
        self.drop = nn.Dropout(dropout)

    def _post(self, u: Tensor, s: Tensor, norm_out: nn.Module) -> Tensor:
        v = norm_out(s + u)  # (B, L, H) or (B, H)
        return v + self.drop(self.mlp(v))

    def forward(self, x: Tensor, state: State | None = None, *, norms: list[nn.Module] | None = None,
                segments: Segments | None = None) -> Tensor:
        n_in, n_out = self._resolve(norms)
        u = n_in(x)
        return self._post(u, run_core(self.core, u, state, segments), n_out)

    def forward_with_state(self, x: Tensor, state: State | None = None, *, norms: list[nn.Module] | None = None,
                           segments: Segments | None = None) -> tuple[Tensor, State]:
        n_in, n_out = self._resolve(norms)
        u = n_in(x)
        s, new_state = core_with_state(self.core, u, state, segments)
        return self._post(u, s, n_out), new_state

    def step(self, x_t: Tensor, state: State, *, norms: list[nn.Module] | None = None) -> tuple[Tensor, State]:
        n_in, n_out = self._resolve(norms)
        u = n_in(x_t)
        s, new_state = self.core.step(u, state)
        return self._post(u, s, n_out), new_state

    def init_state(self, batch_size: int, **kw: Any) -> State:
        return self.core.init_state(batch_size, **kw)


def make_block(layout: str, core: CoreBase, d_model: int, **recipe: Any) -> Block | LrcBlock:
    """The block of a layout (``residual`` or ``lrcssm``) around ``core``."""
    if layout == "residual":
        return Block(core, d_model, **recipe)
    if layout == "lrcssm":
        return LrcBlock(core, d_model, **recipe)
    raise ValueError(f"unknown block layout {layout!r}; choose one of {LAYOUTS}")


def make_mlp_or_linear(kind: str, d_in: int, d_out: int, *, hidden: int | None = None, bias: bool = True, **kw: Any) -> nn.Module:
    """``linear``: Linear(d_in, d_out); ``mlp``: Linear(d_in, hidden) → ReLU → Linear(hidden, d_out)."""
    if kind == "linear":
        return nn.Linear(d_in, d_out, bias=bias, **kw)
    if kind == "mlp":
        width = hidden or d_out
        return nn.Sequential(nn.Linear(d_in, width, **kw), nn.ReLU(), nn.Linear(width, d_out, bias=bias, **kw))
    raise ValueError(f"unknown encoder/head kind {kind!r}; choose linear or mlp")


def count_params(module: nn.Module) -> int:
    """Parameters counted once each (shared tensors once), complex entries counted as two reals."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * (2 if torch.is_complex(p) else 1)
    return total
