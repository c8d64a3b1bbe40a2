"""The lean streaming step: ``SequenceModel.step`` for inference, as a flat list of functional ops.

Why: at batch 1 a streaming step is tiny arithmetic (a few thousand multiply-adds for the classifiers
of ``specs/``) buried under Python: every ``nn.Module.__call__`` (hooks, dispatch), dropout modules
that do nothing in eval, the general streaming path's dictionaries of read depths and reshaping
buffers. Measured on ``specs/s4d-basicmotions.yaml``: 105 aten ops, about 680 µs a token, almost all
of it overhead. Here the model's structure is read once into a plan of plain functions
(``F.layer_norm``, ``F.linear``, ``F.gelu``, ``F.glu``, the cores' own ``step``), which reads the
weights live at every call (an optimizer's in-place update or ``load_state_dict`` is seen at once;
a core's discretised constants are cached by ``CoreBase.cached``).

When it is used: ``SequenceModel.step`` in eval mode with gradients off (``torch.no_grad`` or
``torch.inference_mode``), for a plain stream (``init_state``'s state: no input reshaping, no adaptive
depth). Training mode or gradients on take the general path (dropout draws, backpropagation through
the step). The plan is rebuilt when the module tree changes (a module replaced or added) and is not
used while any of its modules has a forward hook or is in training mode (a hook must run; the general
path runs it). Anything the plan does not know how to flatten is called as the module it is; so the
plan equals the general path for every model, and ``tests/test_lean_step.py`` checks outputs and
states against it for every spec.

Letters: B batch, D raw input channels, H model width, O outputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812 (the field's name for it)
from torch import Tensor, nn
from torch.nn.modules import module as _module

from ..kernels import cpp
from ..logs import log_once
from ..protocols import complex_dtype
from ..stream import BlockStream, DiagStream, DPLRStream
from .blocks import Block, ChannelBatchNorm, EMABatchNorm
from .model_state import ModelState
from .pools import PoolState, RunningPool

if TYPE_CHECKING:
    from .model import SequenceModel

Fn = Callable[[Tensor], Tensor]
Position = Callable[[Tensor, dict[str, Tensor]], tuple[Tensor, dict[str, Tensor]]]
log = logging.getLogger("zoo_core.nn.lean")
KERNEL = "stream_block"  # zoo_core/kernels/csrc/stream_block.cpp
_NORMS = {nn.Identity: 0, nn.LayerNorm: 1, nn.RMSNorm: 2}
_OUTS = {"none": 0, "linear": 1, "glu": 2}


def _act_code(act: nn.Module) -> int | None:
    if isinstance(act, nn.GELU):
        return 1 if act.approximate == "none" else 2
    return {nn.Identity: 0, nn.SiLU: 3, nn.ReLU: 4}.get(type(act))


def _out_parts(out: nn.Module) -> tuple[int, nn.Linear | None] | None:
    """The block's output map as (kind, its Linear): none, linear, or GLU (Linear(H, 2H) then GLU on the last dim)."""
    if isinstance(out, nn.Identity):
        return _OUTS["none"], None
    if isinstance(out, nn.Linear):
        return _OUTS["linear"], out
    if isinstance(out, nn.Sequential) and len(out) == 2 and isinstance(out[0], nn.Linear) \
            and isinstance(out[1], nn.GLU) and out[1].dim in (-1, 1):
        return _OUTS["glu"], out[0]
    return None


def _norm_stats(norm: nn.Module) -> nn.Module | None:
    """A batch norm that normalises with stored statistics in eval (the module holding them), else None."""
    if isinstance(norm, EMABatchNorm):
        return norm
    if isinstance(norm, ChannelBatchNorm) and norm.bn.track_running_stats and norm.bn.running_mean is not None:
        return norm.bn
    return None


def _core_args(s: object) -> tuple[str, tuple[object, ...]] | None:
    """The fused kernel's entry and its core tensors for a stream form (``zoo_core.stream``), None for another."""
    if isinstance(s, DiagStream):
        return "diag_block", (s.a_r, s.b, s.c, s.d, s.per_channel)
    if isinstance(s, DPLRStream):
        return "dplr_block", (*s.mats, s.d)
    if isinstance(s, BlockStream):
        return "osc_block", (s.a, s.b, s.c, s.d)
    return None


def fused_block(block: Block, norm: nn.Module, aten: Position) -> Position | None:
    """The block's step as one call of the fused C++ kernel (``stream_block.cpp``), where its parts are
    the kernel's (a core whose cached ``stream()`` is one of ``zoo_core.stream``'s forms: S4D, S5, LRU,
    S4, LinOSS; LayerNorm, RMSNorm, a batch norm in eval or none; the usual activations; GLU, linear
    or no output map); None where they are not. At each call, input or state the kernel does not take
    (another dtype or device, a state of another precision) goes to ``aten``, the same maths in separate
    ops. Without a C++ toolchain it is None, said once."""
    core = block.core
    stats = _norm_stats(norm)
    norm_code = 3 if stats is not None else _NORMS.get(type(norm))
    act_code, out_parts = _act_code(block.act), _out_parts(block.out)
    stream_of = getattr(core, "stream", None)
    if norm_code is None or act_code is None or out_parts is None or not callable(stream_of):
        return None
    if _core_args(stream_of()) is None:
        return None
    reason = cpp.unavailable_reason(KERNEL)
    if reason is not None:
        log_once(log, logging.WARNING, ("kernel", reason), "the lean streaming step runs each block as separate torch "
                 f"ops (several times slower per token) because the fused C++ block kernel is unavailable: {reason}")
        return None
    kernels = cpp.load(KERNEL)
    out_code, linear = out_parts
    prenorm, residual = block.prenorm, block.residual
    affine = stats if stats is not None else norm  # the module holding the norm's weight, bias and eps
    eps = float(getattr(affine, "eps", None) or 0.0)
    if isinstance(norm, nn.RMSNorm) and norm.eps is None:
        eps = torch.finfo(torch.get_default_dtype()).eps  # RMSNorm's default: the dtype's machine epsilon

    def step(h: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        s = stream_of()
        hs = state.get("h")
        got = _core_args(s)
        dtype = s.d.dtype
        if got is None or hs is None or len(state) != 1 or h.dtype != dtype or h.device.type != "cpu" \
                or hs.dtype != (complex_dtype(dtype) if hs.is_complex() else dtype):
            return aten(h, state)
        entry, args = got
        z, new = getattr(kernels, entry)(
            h, hs, *args, norm_code, getattr(affine, "weight", None), getattr(affine, "bias", None),
            getattr(affine, "running_mean", None), getattr(affine, "running_var", None), eps, prenorm, act_code,
            out_code, None if linear is None else linear.weight, None if linear is None else linear.bias, residual)
        return z, {"h": new}
    return step


def _walk_plain(root: nn.Module, out: list[nn.Module]) -> bool:
    """Append every module under ``root`` to ``out``; False as soon as one is training or has a forward hook."""
    if root.training or root._forward_hooks or root._forward_pre_hooks:
        return False
    out.append(root)
    for child in root._modules.values():
        if child is not None and not _walk_plain(child, out):
            return False
    return True


def function_of(module: nn.Module | None) -> Fn | None:
    """``module``'s forward as a plain function of its input (weights read at each call), None for an identity.

    LayerNorm, RMSNorm, Linear, GELU, SiLU, ReLU, GLU, Dropout (in eval: identity) and Sequentials of
    them are flattened; any other module is called as itself."""
    if module is None or isinstance(module, (nn.Identity, nn.Dropout)):
        return None
    if isinstance(module, nn.Linear):
        m = module
        return lambda x: F.linear(x, m.weight, m.bias)
    if isinstance(module, nn.LayerNorm):
        ln = module
        return lambda x: F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
    if isinstance(module, nn.RMSNorm):
        rms = module
        return lambda x: F.rms_norm(x, rms.normalized_shape, rms.weight, rms.eps)
    if isinstance(module, nn.GELU):
        approximate = module.approximate
        return lambda x: F.gelu(x, approximate=approximate)
    if isinstance(module, nn.SiLU):
        return F.silu
    if isinstance(module, nn.ReLU):
        return F.relu
    if isinstance(module, nn.GLU):
        dim = module.dim
        return lambda x: F.glu(x, dim)
    if isinstance(module, nn.Sequential):
        fns = [f for f in (function_of(m) for m in module) if f is not None]
        if not fns:
            return None
        if len(fns) == 1:
            return fns[0]
        if len(fns) == 2:
            f, g = fns
            return lambda x: g(f(x))

        def chain(x: Tensor) -> Tensor:
            for fn in fns:
                x = fn(x)
            return x
        return chain
    return module  # called as the module it is (its hooks, if any, make the plan step aside)


def _apply(fn: Fn | None, x: Tensor) -> Tensor:
    return x if fn is None else fn(x)


class LeanStep:
    """``model.step`` as a plan of plain functions (see the module docstring); ``lean_plan`` builds and
    keeps it, ``step`` is ``model.step`` for a plain stream."""

    def __init__(self, model: SequenceModel, tree: list[nn.Module]) -> None:
        self.model = model
        self.tree = tree  # the module tree it was built from (rebuilt when it changes)
        self.time_length = model.time_length
        self.encoder = function_of(model.encoder)
        self.final_norm = function_of(model.final_norm)
        self.head: Fn = function_of(model.head) or (lambda x: x)
        self.pool = model.pool
        self.positions: list[Position] = [self._position(pos) for pos in range(model.stack.depth)]

    def _position(self, pos: int) -> Position:
        """Depth position ``pos``: (h_t (B, H), its core state) -> (output, new state)."""
        stack = self.model.stack
        block = stack.block(stack.block_index(pos))
        norms = stack._norms(pos)
        damped = stack.damping_logit is not None or stack.alpha_fixed != 1.0

        def damp(h: Tensor, y: Tensor) -> Tensor:
            return stack._damp(pos, h, y) if damped else y

        if not isinstance(block, Block):  # another layout (LrcSSM's): its own step, damping as the stack does
            def other(h: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
                y, new = block.step(h, state, norms=norms)
                return damp(h, y), new
            return other
        (norm,) = norms if norms is not None else block.norm_modules()
        norm_fn, act, out = function_of(norm), function_of(block.act), function_of(block.out)
        core, prenorm, residual = block.core, block.prenorm, block.residual

        def residual_block(h: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            y, new = core.step(_apply(norm_fn, h) if prenorm else h, state)
            y = _apply(out, _apply(act, y))
            z = h + y if residual else y
            return damp(h, z if prenorm else _apply(norm_fn, z)), new

        fused = fused_block(block, norm, residual_block)
        if fused is None:
            return residual_block

        def fused_residual_block(h: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            z, new = fused(h, state)
            return damp(h, z), new
        return fused_residual_block

    def step(self, x_t: Tensor, state: ModelState) -> tuple[Tensor, ModelState]:
        """One raw step of a plain stream: x_t (B, D) or tokens (B,) -> ((B, O), the new state)."""
        x = x_t
        if self.time_length is not None:  # the time channel t_i = i / length, as _with_time prepends it
            x = torch.cat([(state.t.to(x.dtype) / self.time_length)[:, None], x], dim=-1)
        h = _apply(self.encoder, x)  # (B, H)
        layers = []
        for position, layer in zip(self.positions, state.layers, strict=True):
            h, new = position(h, layer)
            layers.append(new)
        hn = _apply(self.final_norm, h)
        pool = self.pool
        if not isinstance(pool, RunningPool):  # a per-step readout keeps nothing
            return self.head(hn), ModelState(state.t + 1, layers, {})
        depth = len(layers)
        old = state.pools[depth]
        kept = PoolState(old.total + pool.summand(hn, self.head), old.count + 1, hn)
        mean = kept.total / kept.count.clamp(min=1).to(kept.total.dtype)[:, None]
        return pool.finish(mean, hn, self.head), ModelState(state.t + 1, layers, {depth: kept})


def lean_plan(model: SequenceModel) -> LeanStep | None:
    """The model's lean step plan (built once, rebuilt when its module tree changes), or None where it
    may not stand in for the general path now: input reshaping (raw steps are buffered into model
    steps), a module in training mode or with a forward hook, a global forward hook."""
    if model.reshaper is not None or _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return None
    tree: list[nn.Module] = []
    if not _walk_plain(model, tree):
        return None
    plan: LeanStep | None = model.__dict__.get("_zoo_lean")
    if plan is None or plan.tree != tree:
        plan = LeanStep(model, tree)
        model.__dict__["_zoo_lean"] = plan
    return plan
