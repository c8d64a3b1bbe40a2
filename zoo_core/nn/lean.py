"""The lean streaming step: ``SequenceModel.step`` for inference, as a flat list of functional ops.

Why: at batch 1 a streaming step is tiny arithmetic (a few thousand multiply-adds for the classifiers
of ``specs/``) buried under Python: every ``nn.Module.__call__`` (hooks, dispatch), dropout modules
that do nothing in eval, the general streaming path's dictionaries of read depths and reshaping
buffers. Measured on ``specs/s4d-basicmotions.yaml``: 105 aten ops a token (the issue measured about
680 µs a token on its machine), almost all of it overhead. Here the model's structure is read once into a plan of plain functions
(``F.layer_norm``, ``F.linear``, ``F.gelu``, ``F.glu``, the cores' own ``step``), which reads the
weights live at every call (an optimizer's in-place update or ``load_state_dict`` is seen at once;
a core's discretised constants are cached by ``CoreBase.cached``).

When it is used: ``SequenceModel.step`` in eval mode with gradients off (``torch.no_grad`` or
``torch.inference_mode``), for a plain stream (``init_state``'s state: no input reshaping, no adaptive
depth). Training mode or gradients on take the general path (dropout draws, backpropagation through the
step). While ``torch.export`` traces (``zoo export --mode stream``), the plan is what is exported, each
block as separate ops (the fused kernel is opaque to export): an edge runtime then dispatches the plan's
few nodes rather than the general path's reshaping around every layer. The plan is rebuilt when the
module tree changes (a module replaced or added) and is not used while any of its modules has a forward
hook or is in training mode (a hook must run; the general path runs it). Anything the plan does not know
how to flatten is called as the module it is; so the plan equals the general path for every model, and
``tests/test_lean_step.py`` checks outputs and states against it for every spec.

The whole step in one call: where every part of the model is one the fused kernel computes (a Linear
or Embedding encoder, fused blocks, LayerNorm/RMSNorm/no final norm, a Linear head, a per-step, mean,
last or mean-of-logits pool), ``SequenceModel.step`` skips even the plan: ``stream_block.cpp``'s
``StepProgram`` holds the model's tensors and settings and runs encoder, blocks, damping, head and pool
in one C++ call (S4D's classifier: about 250 µs a token through the plan, 40–55 µs so,
``benchmarks/REPORT_STREAM.md``). Before each call it checks, in C++, that nothing it was built from
has changed: every module's ``__dict__`` (a module replaced, a setting or training flag set, a hook
added, a parameter reassigned; modules held weakly) and every parameter's and buffer's TensorImpl,
storage, layout and in-place version; a change drops it and the next call builds it again (unless that
happens within a few calls, again and again: then the plan stays). It declines a call it does not take
(autocast, a dispatch mode, another dtype or state form, a token out of range), which then takes the
plan. Plan and program are kept in the model (``_Kept``) and left out of its pickles and copies.

Letters: B batch, D raw input channels, H model width, O outputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F  # noqa: N812 (the field's name for it)
from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.utils import _python_dispatch

from ..kernels import cpp
from ..logs import log_once
from ..protocols import complex_dtype
from ..stream import BlockStream, DiagStream, DPLRStream, SelectiveStream
from .blocks import Block, ChannelBatchNorm, EMABatchNorm
from .model_state import ModelState
from .pools import LastPool, MeanLogitsPool, MeanPool, Pool, PoolState, RunningPool

if TYPE_CHECKING:
    from .model import SequenceModel

Fn = Callable[[Tensor], Tensor]
Position = Callable[[Tensor, dict[str, Tensor]], tuple[Tensor, dict[str, Tensor]]]
log = logging.getLogger("zoo_core.nn.lean")
KEPT = "_zoo_lean"  # where a model keeps its lean step, in its __dict__ (``_Kept``)
KERNEL = "stream_block"  # zoo_core/kernels/csrc/stream_block.cpp
_NORMS = {nn.Identity: 0, nn.LayerNorm: 1, nn.RMSNorm: 2}
_OUTS = {"none": 0, "linear": 1, "glu": 2}


def _act_code(act: nn.Module) -> int | None:
    """The kernel's code for an activation module of exactly these types (a subclass may compute otherwise)."""
    if type(act) is nn.GELU:
        return 1 if act.approximate == "none" else 2
    return {nn.Identity: 0, nn.SiLU: 3, nn.ReLU: 4}.get(type(act))


def _out_parts(out: nn.Module) -> tuple[int, nn.Linear | None] | None:
    """The block's output map as (kind, its Linear): none, linear (H → H), or GLU (Linear(H, 2H) then GLU
    on the last dim); exact module types only."""
    if type(out) is nn.Identity:
        return _OUTS["none"], None
    if type(out) is nn.Linear and out.in_features == out.out_features:
        return _OUTS["linear"], out
    if type(out) is nn.Sequential and len(out) == 2 and type(out[0]) is nn.Linear and type(out[1]) is nn.GLU \
            and out[1].dim in (-1, 1) and out[0].out_features == 2 * out[0].in_features:
        return _OUTS["glu"], out[0]
    return None


def _norm_stats(norm: nn.Module) -> nn.Module | None:
    """A batch norm that normalises with stored statistics in eval (the module holding them), else None."""
    if type(norm) is EMABatchNorm:
        return norm
    if type(norm) is ChannelBatchNorm and type(norm.bn) is nn.BatchNorm1d and norm.bn.track_running_stats \
            and norm.bn.running_mean is not None:
        return norm.bn
    return None


def _streams_by_its_stream(core: nn.Module) -> bool:
    """Whether the core's ``step`` is the one written beside its ``stream()`` (so stepping from ``stream()``
    is stepping the core): a subclass that overrides ``step`` alone (S5's bidirectional variant, which
    refuses to step) keeps its own."""
    owner = next((c for c in type(core).__mro__ if "stream" in c.__dict__), None)
    return owner is not None and owner.__dict__.get("step") is getattr(type(core), "step", None)


def _core_args(s: object) -> tuple[str, tuple[object, ...]] | None:
    """The fused kernel's entry and its core tensors for a stream form (``zoo_core.stream``), None for another
    (or a selective form whose tensors are of several dtypes: a half-precision Mamba)."""
    if isinstance(s, DiagStream):
        return "diag_block", (s.a_r, s.b, s.c, s.d, s.per_channel)
    if isinstance(s, DPLRStream):
        return "dplr_block", (*s.mats, s.d)
    if isinstance(s, BlockStream):
        return "osc_block", (s.a, s.b, s.c, s.d)
    if isinstance(s, SelectiveStream) and s.dtype is not None:
        return "selective_block", (s.tensors,)
    return None


def _form_dtype(s: object) -> torch.dtype | None:
    """The dtype the kernel computes a form in (its tensors')."""
    return s.dtype if isinstance(s, SelectiveStream) else cast(Tensor, s.d).dtype  # type: ignore[attr-defined]


class _Fused:
    """The parts of a block the fused kernel computes (see ``fused_block``), read once."""

    def __init__(self, block: Block, norm: nn.Module, norm_code: int, stats: nn.Module | None,
                 out_parts: tuple[int, nn.Linear | None], stream_of: Callable[[], Any], largest: int) -> None:
        self.block, self.norm_code, self.stream_of = block, norm_code, stream_of
        self.largest = largest  # the most weights in one of its matrices
        self.max_rows = max_rows(largest)  # the most rows the kernel takes (past them: BLAS)
        self.out_code, linear = out_parts
        self.affine = stats if stats is not None else norm  # the module holding the norm's weight, bias and eps
        # an EMA batch norm applies its affine map only when it has both weight and bias (blocks.EMABatchNorm)
        self.one_sided = type(self.affine) is EMABatchNorm and (self.affine.weight is None) != (self.affine.bias is None)
        # read at each call by dict lookups (nn.Module.__getattr__ costs about a microsecond a name on a token's path)
        self.norm_params, self.norm_buffers = self.affine._parameters, self.affine._buffers
        self.out_params = linear._parameters if linear is not None else {}

    def args(self, act: int, dtype: torch.dtype) -> tuple[object, ...]:
        """The kernel's block arguments after the core's (``ZOO_COMMON_ARGS``), read now."""
        eps = getattr(self.affine, "eps", None)
        if eps is None:  # RMSNorm's default: the input dtype's machine epsilon, as F.rms_norm takes it
            eps = torch.finfo(dtype).eps
        block, norm_params, norm_buffers, out_params = self.block, self.norm_params, self.norm_buffers, self.out_params
        return (self.norm_code, norm_params.get("weight"), norm_params.get("bias"), norm_buffers.get("running_mean"),
                norm_buffers.get("running_var"), float(eps), block.prenorm, act, self.out_code, out_params.get("weight"),
                out_params.get("bias"), block.residual)


def _fused_parts(block: Block, norm: nn.Module) -> _Fused | None:
    """What the fused kernel needs of ``block`` with ``norm``, None where a part is not the kernel's."""
    core = block.core
    stats = _norm_stats(norm)
    norm_code = 3 if stats is not None else _NORMS.get(type(norm))
    out_parts = _out_parts(block.out)
    stream_of = getattr(core, "stream", None)
    if norm_code is None or _act_code(block.act) is None or out_parts is None or not callable(stream_of) \
            or not _streams_by_its_stream(core):
        return None
    form = stream_of()
    if _core_args(form) is None:
        return None
    mats = [out_parts[1].weight] if out_parts[1] is not None else []
    if isinstance(form, SelectiveStream):
        mats += [t for t in (form.w_in, form.w_x, form.w_out) if t is not None]
    largest = max((m.numel() for m in mats), default=0)
    return _Fused(block, norm, norm_code, stats, out_parts, stream_of, largest)


def _kernels() -> object | None:
    """The fused kernel's module, or None (said once, with the reason) where it cannot be built."""
    reason = cpp.unavailable_reason(KERNEL)
    if reason is not None:
        log_once(log, logging.WARNING, ("kernel", reason), "the lean streaming step runs each block as separate torch "
                 f"ops (several times slower per token) because the fused C++ block kernel is unavailable: {reason}")
        return None
    return cpp.load(KERNEL)


def fused_block(block: Block, norm: nn.Module, aten: Position) -> Position | None:
    """The block's step as one call of the fused C++ kernel (``stream_block.cpp``), where its parts are
    the kernel's (a core whose cached ``stream()`` is one of ``zoo_core.stream``'s forms and whose
    ``step`` is the one written beside it: S4D, S5, LRU, S4, LinOSS, Mamba; LayerNorm, RMSNorm, a batch norm in
    eval or none; the usual activations; GLU, linear or no output map, all of exactly these module
    types); None where they are not. At each call, what the kernel does not take (another dtype or
    device, a state of another precision, an activation changed since, an export's trace) goes to
    ``aten``, the same maths in separate ops (the block before the stack's damping, as the kernel).
    Without a C++ toolchain it is None, said once."""
    parts = _fused_parts(block, norm)
    kernels = _kernels() if parts is not None else None
    if parts is None or kernels is None:
        return None
    stream_of = parts.stream_of

    def step(h: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        s = stream_of()
        got = _core_args(s)
        act = _act_code(block.act)
        dtype = _form_dtype(s)
        keys = SelectiveStream.state_keys if isinstance(s, SelectiveStream) else ("h",)
        states = [state.get(k) for k in keys]
        # the linear forms' state may be complex; the selective form's two are real
        ok = [t is not None and dtype is not None
              and t.dtype == (complex_dtype(dtype) if t.is_complex() and len(keys) == 1 else dtype) for t in states]
        if got is None or act is None or parts.one_sided or not all(ok) or len(state) != len(keys) or h.dtype != dtype \
                or torch.compiler.is_exporting() or h.device.type != "cpu" or h.shape[0] > parts.max_rows:
            return aten(h, state)
        entry, args = got
        z, *new = getattr(kernels, entry)(h, *states, *args, *parts.args(act, h.dtype))
        return z, dict(zip(keys, new, strict=True))
    return step


_SHORT = 4  # a program stale within this many calls, this many times: none for the plan (``program_step``)
# How many rows (streams in a batch) the kernel takes before the separate ops (BLAS) are faster. Its matrix
# products read each weight row once for the batch and take a SIMD dot per row: bandwidth-bound at few rows,
# where they beat BLAS (no dispatch, nothing allocated), but without BLAS's register blocking, which wins
# once a batch makes the product compute-bound. Measured by `python -m benchmarks.fused_rows` (2 threads,
# limit lifted; general path ÷ fused): a width-256 Mamba LM (largest matrix 262,144 weights) 5.9× at B = 1,
# 2.0× at 8, 1.26× at 16, 0.92× at 32; with a 32k-token head 2.6×, 2.0×, 0.91× at 1, 8, 32; width-32 S4D
# and LRU classifiers (largest 2,048) 3.1× and 3.6× at 64, 1.14× and 1.22× at 256, 1.05× and 0.74× at 512.
# So: up to 16 rows always, more while rows × largest matrix ≤ 2^19.
_ROWS_ALWAYS = 16
_ROWS_X_WEIGHTS = 1 << 19


def max_rows(largest: int) -> int:
    """The most rows the fused kernel and program take for a model whose largest matrix has ``largest``
    weights (see ``_ROWS_ALWAYS``)."""
    return max(_ROWS_ALWAYS, _ROWS_X_WEIGHTS // max(largest, 1))


_CORE_KINDS = {"diag_block": 0, "dplr_block": 1, "osc_block": 2, "selective_block": 3}
_FINAL_NORMS = {nn.Identity: 0, nn.LayerNorm: 1, nn.RMSNorm: 2}


def _pool_kind(pool: object) -> int | None:
    """The program's code for a pool of exactly these types: per-step, mean, last, mean of the logits."""
    kinds: dict[type, int] = {Pool: 0, MeanPool: 1, LastPool: 2, MeanLogitsPool: 3}
    return kinds.get(type(pool))


def _program_parts(model: SequenceModel) -> tuple[object, ...] | str:
    """The ``StepProgram``'s arguments for ``model`` (before its watch lists), or why a part is not the
    program's: a time channel or input reshaping, an encoder other than a Linear or an Embedding (without
    ``max_norm``, which renormalises rows in place), a block the fused kernel does not compute, a final
    norm other than LayerNorm/RMSNorm/none, a head other than a Linear, another pool."""
    stack, enc, fn, head = model.stack, model.encoder, model.final_norm, model.head
    pool = _pool_kind(model.pool)
    for why, bad in (("a time channel", model.time_length is not None), ("input reshaping", model.reshaper is not None),
                     (f"the pool {type(model.pool).__name__}", pool is None),
                     (f"the head {type(head).__name__} (a Linear is)", type(head) is not nn.Linear),
                     (f"the final norm {type(fn).__name__}", type(fn) not in _FINAL_NORMS)):
        if bad:
            return why
    dtype = cast(nn.Linear, head).weight.dtype
    largest = max(cast(nn.Linear, head).weight.numel(), enc.weight.numel() if isinstance(enc, nn.Linear) else 0)
    if enc is None or type(enc) is nn.Identity:
        encoder: tuple[object, ...] = (0, None, None)
    elif type(enc) is nn.Linear:
        encoder = (1, enc.weight, enc.bias)
    elif type(enc) is nn.Embedding and enc.max_norm is None:
        encoder = (2, enc.weight, None)
    else:
        return f"the encoder {type(enc).__name__} (a Linear or an Embedding without max_norm is)"
    if type(fn) is not nn.Identity and tuple(cast(nn.LayerNorm, fn).normalized_shape) != (model.d_model,):
        return "a final norm over more than the model width"
    fn_eps = getattr(fn, "eps", 0.0)
    final = (_FINAL_NORMS[type(fn)], getattr(fn, "weight", None), getattr(fn, "bias", None),
             float(torch.finfo(dtype).eps if fn_eps is None else fn_eps))
    parts = []
    for pos in range(stack.depth):
        block = stack.block(stack.block_index(pos))
        if type(block) is not Block:
            return f"the block {type(block).__name__} at depth position {pos}"
        norms = stack._norms(pos)
        (norm,) = norms if norms is not None else block.norm_modules()
        fused = _fused_parts(block, norm)
        act = _act_code(block.act)
        got = _core_args(fused.stream_of()) if fused is not None else None
        if fused is None or got is None or act is None or fused.one_sided:
            return f"the block at depth position {pos} (its {type(block.core).__name__} core or a part around it)"
        entry, args = got
        if entry == "diag_block":
            tensors, per_channel = list(args[:4]), bool(args[4])
        else:  # the selective form's one argument is its list of tensors
            tensors, per_channel = (list(cast("list[Tensor]", args[0])) if entry == "selective_block" else list(args)), False
        # the damping, fixed or learned (read by the program at each call: an edit through .data is seen)
        alpha = float(stack.alpha_fixed) if stack.damping_logit is None else (stack.damping_logit, stack.block_index(pos))
        parts.append((_CORE_KINDS[entry], tensors, per_channel, *fused.args(act, dtype), alpha))
        largest = max(largest, fused.largest)
    return encoder, parts, final, (head.weight, head.bias), pool, max_rows(largest)


def _program(model: SequenceModel, plan: LeanStep, tree: list[nn.Module]) -> object | None:
    """``model``'s whole step as one ``StepProgram`` call (``stream_block.cpp``), built from its parts and
    watching what they came from: every module's ``__dict__`` (a module replaced, a setting or training
    flag set, a hook added; modules held weakly) and every parameter's and buffer's TensorImpl, storage,
    layout and in-place version.

    Where a part of the model is not the program's (``_program_parts``; said once where every block is
    fused), False: the plan runs, and a program is tried again when the plan is rebuilt (the module tree
    changed). Where only the tensors as they are stand in the way (an inference tensor among the weights,
    another dtype or device), a program that declines every call until something it watches changes. None
    without the kernel (said once by ``_kernels``)."""
    kernels = _kernels()
    if kernels is None:
        return None
    tensors: dict[int, Tensor] = {}
    for m in tree:
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None:
                tensors.setdefault(id(t), t)
    # an inference tensor has no version counter: a program could not see it change, so it only watches the rest
    inference = any(t.is_inference() for t in tensors.values())
    watched = [t for t in tensors.values() if not t.is_inference()]
    objects: list[object] = [*tree, model.pool]
    parts = _program_parts(model)
    if not isinstance(parts, str) and not inference:
        try:
            return kernels.StepProgram(*parts, watched, objects, KEPT,  # type: ignore[attr-defined]
                                       [_module._global_forward_hooks, _module._global_forward_pre_hooks],
                                       ModelState, PoolState, model.stack.depth)
        except RuntimeError as e:  # another dtype or device, a shape the kernel does not take
            why = f"its tensors as they are ({str(e).splitlines()[0]})"
    elif isinstance(parts, str):
        why = parts
    else:
        why = "an inference tensor among its weights (no version counter to see it change)"
    if all(p.__name__ == "fused_residual_block" for p in plan.positions):  # every block fused, but not the whole step
        log_once(log, logging.INFO, ("program", why), "the lean streaming step calls the fused kernel once per block "
                 f"(slower per token than one call for the whole step) because the whole-step program does not take {why}")
    if isinstance(parts, str):
        return False
    try:
        return kernels.StepProgram(watched, objects, KEPT)  # type: ignore[attr-defined]
    except RuntimeError as e:  # a tensor it cannot watch: no program until the plan is rebuilt
        log.debug("no whole-step program watcher for this model: %s", e)
        return False


def program_step(model: SequenceModel, x_t: Tensor, state: ModelState) -> tuple[Tensor, ModelState] | None:
    """``model.step`` as one call of its ``StepProgram`` where it has one that takes this call (the caller
    has checked: eval mode, gradients off), else None. A program whose model changed is dropped (the
    next ``lean_plan`` builds it again)."""
    if torch.compiler.is_compiling():
        return None
    kept: _Kept | None = model.__dict__.get(KEPT)
    program: Any = kept.program if kept is not None else None
    if kept is None or not program:  # None: not built; False: none for this plan (``_program``)
        return None
    done = program.run(x_t, state)
    if done.__class__ is tuple:
        return cast("tuple[Tensor, ModelState]", done)
    if done:  # STALE: built again by the next lean_plan, unless its weights change at nearly every step
        kept.short_lived += program.calls < _SHORT
        kept.program = None
        if kept.short_lived >= _SHORT:  # building one costs more than the calls it would save
            kept.program = False
            log_once(log, logging.INFO, "short-lived", "the lean streaming step stops building its whole-step program for "
                     f"this model: {_SHORT} programs went stale within {_SHORT} calls (its weights or settings change "
                     "between steps); each block stays one fused call")
    return None


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
    """``module``'s forward as a plain function of its input (weights and settings read at each call), None
    for an identity.

    LayerNorm, RMSNorm, Linear, GELU, SiLU, ReLU, GLU, Dropout (in eval: identity) and Sequentials of
    them, of exactly these types, are flattened; any other module (a subclass too: it may compute
    otherwise) is called as itself."""
    kind = type(module)
    if module is None or kind in (nn.Identity, nn.Dropout):
        return None
    if kind is nn.Linear:
        m = cast(nn.Linear, module)
        return lambda x: F.linear(x, m.weight, m.bias)
    if kind is nn.LayerNorm:
        ln = cast(nn.LayerNorm, module)
        return lambda x: F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
    if kind is nn.RMSNorm:
        rms = cast(nn.RMSNorm, module)
        return lambda x: F.rms_norm(x, rms.normalized_shape, rms.weight, rms.eps)
    if kind is nn.GELU:
        gelu = cast(nn.GELU, module)
        return lambda x: F.gelu(x, approximate=gelu.approximate)
    if kind is nn.SiLU:
        return F.silu
    if kind is nn.ReLU:
        return F.relu
    if kind is nn.GLU:
        glu = cast(nn.GLU, module)
        return lambda x: F.glu(x, glu.dim)
    if kind is nn.Sequential:
        fns = [f for f in (function_of(m) for m in cast(nn.Sequential, module)) if f is not None]
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


class _Kept:
    """A model's lean step: its plan and its whole-step program (None: not built yet; False: none for this
    plan, ``_program``). Kept in the model's ``__dict__`` under ``KEPT``, so it dies with the model (a
    hook that refers to the model makes a cycle the collector frees; a table beside the model would keep
    it alive), and left out of pickles and deep copies (``SequenceModel.__getstate__``): a copy builds its
    own over its own modules (the original's plan would step the original's weights)."""

    __slots__ = ("plan", "program", "short_lived")

    def __init__(self, plan: LeanStep) -> None:
        self.plan = plan
        self.program: object = None
        self.short_lived = 0  # programs that went stale within a few calls (weights changed between steps)


def plan_of(model: nn.Module) -> LeanStep | None:
    """The lean plan ``model`` keeps (None before its first lean step)."""
    kept = model.__dict__.get(KEPT)
    return kept.plan if kept is not None else None


def program_of(model: nn.Module) -> object:
    """The whole-step program ``model`` keeps: a ``StepProgram``, False (none for its plan) or None (not built)."""
    kept = model.__dict__.get(KEPT)
    return kept.program if kept is not None else None


class LeanStep:
    """``model.step`` as a plan of plain functions (see the module docstring); ``lean_plan`` builds and
    keeps it, ``step`` is ``model.step`` for a plain stream."""

    def __init__(self, model: SequenceModel, tree: list[nn.Module]) -> None:
        # no reference to the model itself, only to its parts (the model keeps the plan: ``_Kept``)
        self.tree = tree[1:]  # the module tree below the model it was built from (rebuilt when it changes)
        self.encoder = function_of(model.encoder)
        self.final_norm = function_of(model.final_norm)
        self.head: Fn = function_of(model.head) or (lambda x: x)
        self.positions: list[Position] = [self._position(model, pos) for pos in range(model.stack.depth)]

    def _position(self, model: SequenceModel, pos: int) -> Position:
        """Depth position ``pos``: (h_t (B, H), its core state) -> (output, new state)."""
        stack = model.stack
        block = stack.block(stack.block_index(pos))
        norms = stack._norms(pos)

        def damp(h: Tensor, y: Tensor) -> Tensor:  # read live: the stack's damping may be set after the plan
            return stack._damp(pos, h, y)

        if type(block) is not Block:  # another layout (LrcSSM's) or a subclass: its own step, damped as the stack does
            def other(h: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
                y, new = block.step(h, state, norms=norms)
                return damp(h, y), new
            return other
        (norm,) = norms if norms is not None else block.norm_modules()
        norm_fn, act, out = function_of(norm), function_of(block.act), function_of(block.out)
        core = block.core

        def undamped(h: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            """The block in separate ops, before the stack's damping (what the fused kernel computes)."""
            prenorm = block.prenorm
            y, new = core.step(_apply(norm_fn, h) if prenorm else h, state)
            y = _apply(out, _apply(act, y))
            z = h + y if block.residual else y
            return (z if prenorm else _apply(norm_fn, z)), new

        # the kernel, or where it declines the separate ops, then the damping: once either way
        block_step = fused_block(block, norm, undamped) or undamped

        def residual_block(h: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            z, new = block_step(h, state)
            return damp(h, z), new
        if block_step is not undamped:  # named for what it runs (tests and a debugger read it)
            residual_block.__name__ = "fused_residual_block"
        return residual_block

    def step(self, model: SequenceModel, x_t: Tensor, state: ModelState) -> tuple[Tensor, ModelState]:
        """``model``'s raw step of a plain stream: x_t (B, D) or tokens (B,) -> ((B, O), the new state)."""
        x = x_t
        if model.time_length is not None:  # the time channel t_i = i / length, as _with_time prepends it
            x = torch.cat([(state.t.to(x.dtype) / model.time_length)[:, None], x], dim=-1)
        h = _apply(self.encoder, x)  # (B, H)
        layers = []
        for position, layer in zip(self.positions, state.layers, strict=True):
            h, new = position(h, layer)
            layers.append(new)
        hn = _apply(self.final_norm, h)
        pool = model.pool
        if not isinstance(pool, RunningPool):  # a per-step readout keeps nothing
            return self.head(hn), ModelState(state.t + 1, layers, {})
        depth = len(layers)
        old = state.pools[depth]
        kept = PoolState(old.total + pool.summand(hn, self.head), old.count + 1, hn)
        mean = kept.total / kept.count[:, None]  # count ≥ 1 after this step; the division promotes it
        return pool.finish(mean, hn, self.head), ModelState(state.t + 1, layers, {depth: kept})


def lean_applies(model: SequenceModel, x_t: Tensor, state: ModelState, *, exporting: bool = False) -> bool:
    """Whether a step may go to the plan at all: a plain stream (no reshaping buffer, no adaptive depth,
    one state per position, the pool's state present), no autocast (its casts are the general path's),
    no dispatch mode (FLOP counting, fake tensors: they must see every op, and the kernel is opaque),
    except while ``torch.export`` traces (its fake tensors see the plan's separate ops: ``fused_block``
    steps aside)."""
    return state.reshape is None and state.adaptive is None and len(state.layers) == model.stack.depth \
        and (model.pool.per_step or model.stack.depth in state.pools) \
        and not torch.is_autocast_enabled(x_t.device.type) \
        and (exporting or _python_dispatch._get_current_dispatch_mode() is None)


def lean_plan(model: SequenceModel) -> LeanStep | None:
    """The model's lean step plan (built once, rebuilt when its module tree changes), or None where it
    may not stand in for the general path now: input reshaping (raw steps are buffered into model
    steps), a module in training mode or with a forward hook, a global forward hook."""
    if model.reshaper is not None or _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return None
    tree: list[nn.Module] = []
    if not _walk_plain(model, tree):
        return None
    kept = model.__dict__.get(KEPT)
    if kept is None or kept.plan.tree != tree[1:]:
        kept = _Kept(LeanStep(model, tree))
        model.__dict__[KEPT] = kept
    if kept.program is None and not (torch.compiler.is_compiling() or torch.compiler.is_exporting()):
        kept.program = _program(model, kept.plan, tree)
    return kept.plan
