"""Conformance checks as plain functions of a ``CoreCase`` (usable without pytest).

Letters: B batch, L length, H width. References run in float64. Each check raises
``ConformanceError`` with the check's name and what differed, or ``Skip`` when the core does not
declare the capability the check needs.
"""

from __future__ import annotations

import inspect
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import ValidationError

from ..backends import all_choices
from ..build import build_model
from ..corebase import CoreBase
from ..packing import Segments, run_packed
from ..params import CoreParams
from ..plugin_registry import Registry
from ..plugins import get_registry, using_registry
from ..protocols import CAPABILITIES, SSMCore

F64 = torch.float64


class ConformanceError(AssertionError):
    """A core broke the protocol; the message names the check and the difference."""


class Skip(Exception):
    """The check does not apply to this core (a capability it does not declare)."""


@dataclass
class CoreCase:
    """A core under test: its class, params (the ``tiny`` preset), params model and capabilities."""

    name: str
    cls: type[CoreBase]
    params: dict[str, Any]
    params_model: type[CoreParams]
    capabilities: frozenset[str]
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    registry: Registry | None = None
    rtol: float = 1e-7
    atol: float = 1e-9

    @property
    def d_model(self) -> int:
        return int(self.params["d_model"])

    def make(self, *, dtype: torch.dtype = F64, seed: int = 0, backend: Any = None) -> Any:
        torch.manual_seed(seed)
        params = dict(self.params)
        if backend is not None:
            params["backend"] = backend
        with using_registry(self.registry):
            return self.cls(**params, dtype=dtype)

    def needs(self, capability: str) -> None:
        if capability not in self.capabilities:
            raise Skip(f"core {self.name!r} does not declare {capability!r}")


def case_from_registry(name: str, *, preset: str = "tiny", d_model: int = 5, registry: Registry | None = None) -> CoreCase:
    if registry is None:
        registry = get_registry()
    entry = registry.core(name)
    params = entry.params.model_validate({**entry.preset(preset), "d_model": d_model}).model_dump()
    return CoreCase(name, entry.load(), params, entry.params, entry.capabilities, entry.presets, registry)


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, *, rtol: float, atol: float) -> None:
    """fla-style comparison that reports max-abs and relative RMS error with the tensor's name."""
    if ref.shape != out.shape:
        raise ConformanceError(f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    out = out.detach().to(ref.dtype if not ref.is_complex() else torch.complex128)  # in the reference's own precision
    ref = ref.detach().to(torch.complex128 if ref.is_complex() else F64)
    err = (ref - out).abs()
    bound = atol + rtol * ref.abs()
    if not bool(torch.isfinite(out).all()) or bool((err > bound).any()):
        rms = (err.pow(2).mean().sqrt() / ref.abs().pow(2).mean().sqrt().clamp(min=1e-300)).item()
        raise ConformanceError(f"{name}: max |diff| {err.max().item():.3e}, relative RMS {rms:.3e} (rtol {rtol}, atol {atol})")


def assert_rel_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float) -> None:
    """fla's metric: relative error in the 2-norm, ||out − ref|| / ||ref|| ≤ ratio; same shape and dtype."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, f"{name}: {out.shape} {out.dtype} vs {ref.shape} {ref.dtype}"
    err = ((out - ref).abs().norm() / ref.abs().norm().clamp_min(1e-30)).item()
    assert err <= ratio, f"{name}: relative error {err:.2e} > {ratio:.0e}"


def _x(case: CoreCase, B: int, L: int, dtype: torch.dtype = F64, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, case.d_model, generator=g, dtype=dtype)


def _states_close(name: str, ref: Mapping[str, torch.Tensor], out: Mapping[str, torch.Tensor], case: CoreCase) -> None:
    if set(ref) != set(out):
        raise ConformanceError(f"{name}: state keys {sorted(out)} != {sorted(ref)}")
    for k in ref:
        assert_close(f"{name}[{k!r}]", ref[k], out[k], rtol=case.rtol, atol=case.atol)


# the checks -------------------------------------------------------------------------------
def check_protocol(case: CoreCase) -> None:
    """The class satisfies SSMCore, declares known capabilities, and the registration agrees."""
    core = case.make()
    if not isinstance(core, SSMCore):
        raise ConformanceError(f"{case.cls.__name__} lacks SSMCore methods (forward, forward_with_state, step, init_state, optim_hints)")
    unknown = set(case.cls.capabilities) - CAPABILITIES
    if unknown:
        raise ConformanceError(f"unknown capabilities {sorted(unknown)}; known: {sorted(CAPABILITIES)}")
    if frozenset(case.cls.capabilities) != case.capabilities:
        raise ConformanceError(f"registered capabilities {sorted(case.capabilities)} != class capabilities {sorted(case.cls.capabilities)}")
    if "step" in case.capabilities and "causal" not in case.capabilities:
        raise ConformanceError("capabilities: 'step' without 'causal' (streaming one token at a time is causal by "
                               "construction); declare 'causal' too")


def check_shapes(case: CoreCase) -> None:
    """(B, L, H) -> (B, L, H) for odd and even lengths, float32 in and out, finite."""
    core = case.make(dtype=torch.float32)
    for B in (1, 3):
        for L in (1, 7, 64, 65):
            y = core(_x(case, B, L, torch.float32))
            if tuple(y.shape) != (B, L, case.d_model) or y.dtype != torch.float32:
                raise ConformanceError(f"shape/dtype: input (B={B}, L={L}, H={case.d_model}) float32 gave {tuple(y.shape)} {y.dtype}")
            if not bool(torch.isfinite(y).all()):
                raise ConformanceError(f"shape: non-finite output at B={B}, L={L}")


def check_causality(case: CoreCase) -> None:
    """Changing x[:, t:] leaves y[:, :t] unchanged (cores that declare ``causal``)."""
    case.needs("causal")
    core = case.make()
    x = _x(case, 2, 33)
    x2 = x.clone()
    x2[:, 20:] += torch.randn_like(x2[:, 20:]) * 10
    y, y2 = core(x), core(x2)
    if not torch.allclose(y[:, :20], y2[:, :20], rtol=0, atol=1e-9 * (1 + y.abs().max().item())):
        leak = (y[:, :20] - y2[:, :20]).abs().amax(dim=(0, 2))
        first = int(torch.nonzero(leak > 1e-9)[0])
        raise ConformanceError(f"causality: outputs before t=20 changed when only inputs from t=20 on did (first affected step {first})")


def check_batch_independence(case: CoreCase) -> None:
    """Sample i's output does not depend on sample j."""
    core = case.make()
    x = _x(case, 3, 17)
    together = core(x)
    for i in range(3):
        assert_close(f"batch independence (sample {i})", core(x[i : i + 1])[0], together[i], rtol=case.rtol, atol=case.atol)


def check_step_vs_forward(case: CoreCase) -> None:
    """Unrolling step() from init_state equals forward()."""
    case.needs("step")
    core = case.make().eval()
    x = _x(case, 2, 23)
    state = core.init_state(2, dtype=F64)
    ys = []
    for t in range(x.shape[1]):
        y_t, state = core.step(x[:, t], state)
        ys.append(y_t)
    assert_close("step vs forward", core(x), torch.stack(ys, 1), rtol=case.rtol, atol=case.atol)


def check_state_carry(case: CoreCase) -> None:
    """forward_with_state on two halves, carrying the state, equals one forward (outputs and state)."""
    case.needs("initial_state")
    core = case.make().eval()
    x = _x(case, 2, 31)
    y_full, s_full = core.forward_with_state(x)
    y1, s1 = core.forward_with_state(x[:, :12])
    y2, s2 = core.forward_with_state(x[:, 12:], s1)
    assert_close("state carry (outputs)", y_full, torch.cat([y1, y2], 1), rtol=case.rtol, atol=case.atol)
    _states_close("state carry (final state)", s_full, s2, case)
    assert_close("forward(x, state)", y2, core(x[:, 12:], s1), rtol=case.rtol, atol=case.atol)


def _run_with_grads(core: Any, x: torch.Tensor, carry: bool) -> dict[str, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    state = None
    if carry:
        _, state = core.forward_with_state(x[:, :5].detach())
    y, final = core.forward_with_state(x, state) if carry else (core(x), {})
    g = torch.Generator().manual_seed(7)
    dy = torch.randn(y.shape, generator=g, dtype=y.dtype)
    names = [n for n, p in core.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad((y * dy).sum(), [x, *[p for _, p in core.named_parameters() if p.requires_grad]], allow_unused=True)
    out = {"output": y, "grad input": grads[0]}
    out.update({f"final state {k!r}": v for k, v in final.items()})
    out.update({f"grad {n}": (gr if gr is not None else torch.zeros(1)) for n, gr in zip(names, grads[1:], strict=True)})
    return out


def check_backends(case: CoreCase) -> None:
    """Every backend combination that can serve the core equals the naive reference (outputs,
    final state, gradients of the input and every parameter), in float64."""
    if not getattr(case.cls, "paths", None):
        raise Skip(f"core {case.name!r} declares no backend paths")

    carry = "initial_state" in case.capabilities
    x = _x(case, 2, 37)
    ref = _run_with_grads(case.make(backend=dict(case.cls.reference)), x, carry)
    choices = all_choices(paths=case.cls.paths, problem=case.cls.problem, registry=case.registry)
    if len(choices) < 2:
        raise ConformanceError(f"backends: only {len(choices)} backend combination serves {case.name!r}; nothing is compared")
    for choice in choices:
        out = _run_with_grads(case.make(backend=choice.as_setting()), x, carry)
        for key, value in ref.items():
            assert_close(f"backend {choice.label()}: {key}", value, out[key], rtol=case.rtol * 100, atol=case.atol * 100)


def check_dtypes(case: CoreCase) -> None:
    """A float64 core maps float64 to float64, and .to(float64) keeps every parameter real float64."""
    for dtype in (torch.float32, F64):
        core = case.make(dtype=dtype)
        y = core(_x(case, 2, 9, dtype))
        if y.dtype != dtype:
            raise ConformanceError(f"dtype: {dtype} input to a {dtype} core gave {y.dtype} output")
    core = case.make(dtype=torch.float32).to(F64)
    bad = [n for n, p in core.named_parameters() if p.dtype != F64]
    if bad:
        raise ConformanceError(f"dtype: after .to(float64) these parameters are not float64: {bad} "
                               "(store complex parameters as real views)")
    core(_x(case, 1, 5))


def check_gradients(case: CoreCase) -> None:
    """Every parameter gets a finite, non-None gradient, and an optimiser can update it in place
    (float32 and float64: no parameter is an expanded view sharing memory)."""
    for dtype in (torch.float32, F64):
        core = case.make(dtype=dtype)
        x = _x(case, 2, 19, dtype)
        (core(x) * torch.randn(2, 19, case.d_model, dtype=dtype)).sum().backward()
        for n, p in core.named_parameters():
            if p.grad is None:
                raise ConformanceError(f"gradients: parameter {n!r} received no gradient (detached or unused)")
            if not bool(torch.isfinite(p.grad).all()):
                raise ConformanceError(f"gradients: parameter {n!r} has a non-finite gradient")
            try:
                with torch.no_grad():
                    p.add_(p.grad, alpha=-1e-3)
            except RuntimeError as exc:
                raise ConformanceError(f"gradients: parameter {n!r} ({dtype}) cannot be updated in place: {exc}") from None


def check_stability(case: CoreCase) -> None:
    """No NaN or Inf at L = 4096 (float32, default init), in outputs or gradients."""
    core = case.make(dtype=torch.float32)
    x = _x(case, 1, 4096, torch.float32)
    y = core(x)
    if not bool(torch.isfinite(y).all()):
        raise ConformanceError(f"stability: {int((~torch.isfinite(y)).sum())} non-finite outputs at L=4096")
    y.square().mean().backward()
    bad = [n for n, p in core.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    if bad:
        raise ConformanceError(f"stability: non-finite gradients at L=4096 for {bad}")


def check_determinism(case: CoreCase) -> None:
    """Same seed, same parameters; same input, same output."""
    a, b = case.make(seed=3), case.make(seed=3)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        if not torch.equal(p, q):
            raise ConformanceError(f"determinism: parameter {n!r} differs between two builds with the same seed")
    a.eval()
    x = _x(case, 2, 15)
    if not torch.equal(a(x), a(x)):
        raise ConformanceError("determinism: the same input gave different outputs in eval mode")


def check_params_schema(case: CoreCase) -> None:
    """The params model's fields equal the constructor's keyword arguments; extras are forbidden;
    every preset validates."""
    sig = inspect.signature(case.cls)
    ctor = {n for n, p in sig.parameters.items() if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"device", "dtype"}
    fields = set(case.params_model.model_fields)
    if ctor != fields:
        raise ConformanceError(f"params schema: constructor-only {sorted(ctor - fields)}, params-only {sorted(fields - ctor)}")
    if case.params_model.model_config.get("extra") != "forbid":
        raise ConformanceError("params schema: the params model must set extra='forbid'")
    try:
        case.params_model.model_validate({**case.params, "not_a_param": 1})
    except ValidationError:
        pass
    else:
        raise ConformanceError("params schema: an unknown key was accepted")
    for preset, values in case.presets.items():
        try:
            case.params_model.model_validate({**values, "d_model": case.d_model})
        except ValidationError as exc:
            raise ConformanceError(f"params schema: preset {preset!r} does not validate: {exc}") from None


def check_optim_hints(case: CoreCase) -> None:
    """Every name in optim_hints() is a real parameter."""
    core = case.make()
    names = {n for n, _ in core.named_parameters()}
    bad = set(core.optim_hints()) - names
    if bad:
        raise ConformanceError(f"optim hints name no parameter: {sorted(bad)}")


#: norm-wise relative error of half-precision input against the float32 core on the same (rounded) input,
#: and of a float32 input under bfloat16 autocast: a core computing at its compute precision is off by
#: the output's rounding alone (bfloat16 2^-9, float16 2^-12 per element); the bounds leave 5-10x of that.
HALF_RTOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref64 = ref.detach().to(F64)
    return float((out.detach().to(F64) - ref64).norm() / ref64.norm().clamp_min(1e-30))


def half_precision_errors(core: Any, x: torch.Tensor, *, with_step: bool) -> dict[str, float]:
    """Relative errors (``_rel``) of ``core`` (float32) on half-precision input and under bfloat16 autocast,
    each against the float32 run on the same rounded input: ``{"bfloat16 forward": ..., ...}``.
    Raises ``ConformanceError`` where an output is not in the input's dtype, is not finite, or a state
    is not kept in the core's dtype (what the card's per-core figures and ``check_half_precision`` read)."""
    out: dict[str, float] = {}

    def judge(what: str, dtype: torch.dtype, y: torch.Tensor, state: Mapping[str, torch.Tensor],
              ref_y: torch.Tensor, ref_state: Mapping[str, torch.Tensor]) -> None:
        if y.dtype != dtype:
            raise ConformanceError(f"half precision: {what} gave {y.dtype} output; y must come back in the input's dtype "
                                   "(zoo_core.precision.at_compute_precision)")
        if not torch.isfinite(y).all():
            raise ConformanceError(f"half precision: {what} gave non-finite output")
        bad = {k: str(v.dtype) for k, v in state.items() if k in ref_state and v.dtype != ref_state[k].dtype}
        if bad:
            raise ConformanceError(f"half precision: {what} returned its state in {bad}, not the core's own dtype: "
                                   "a carried state rounded to half precision at every step drifts")
        out[what] = _rel(y, ref_y)

    for half in (torch.bfloat16, torch.float16):
        xh = x.to(half)
        name = str(half).removeprefix("torch.")
        with torch.no_grad():
            ref_y, ref_s = core.forward_with_state(xh.float())
            y, s = core.forward_with_state(xh)
            judge(f"{name} forward", half, y, s, ref_y, ref_s)
            if with_step:
                state0 = core.init_state(x.shape[0])
                ref_y, ref_s = core.step(xh[:, 0].float(), state0)
                y, s = core.step(xh[:, 0], state0)
                judge(f"{name} step", half, y, s, ref_y, ref_s)
    with torch.no_grad():
        ref_y, ref_s = core.forward_with_state(x)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            y, s = core.forward_with_state(x)
    judge("bfloat16 autocast", x.dtype, y, s, ref_y, ref_s)
    return out


def check_half_precision(case: CoreCase) -> None:
    """bfloat16 and float16 input, and float32 input under bfloat16 autocast, run at the core's compute
    precision (its parameters' dtype): ``y`` comes back in the input's dtype, finite, within ``HALF_RTOL``
    of the float32 core on the same rounded input; the state stays in the core's dtype; and a backward
    pass under autocast gives every parameter a finite gradient."""
    core = case.make(dtype=torch.float32)
    x = _x(case, 2, 16, torch.float32)
    try:
        errors = half_precision_errors(core, x, with_step="step" in case.capabilities)
    except ConformanceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure on half input is what this check is about
        raise ConformanceError(f"half precision: half-precision input raised {type(exc).__name__} ({exc}); "
                               "a CoreBase core computes at its parameters' dtype (zoo_core.precision)") from None
    for what, err in errors.items():
        tol = HALF_RTOL[torch.float16 if what.startswith("float16") else torch.bfloat16]
        if not err <= tol:
            raise ConformanceError(f"half precision: {what} is off the float32 core by {err:.2e} (relative; bound {tol:.0e}): "
                                   "the core computes in half precision somewhere; cast up on entry (zoo_core.precision)")
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = core(x.requires_grad_(True))
    y.float().square().mean().backward()
    bad = [n for n, p in core.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    if bad or x.grad is None or not torch.isfinite(x.grad).all():
        raise ConformanceError(f"half precision: a backward pass under bfloat16 autocast gave non-finite gradients "
                               f"({bad or 'the input'})")


def check_backendless(case: CoreCase) -> None:
    """The core is usable without the spec system: built from ``d_model`` alone (every other argument,
    ``backend``, ``device`` and ``dtype`` included, at its default), it runs a float32 sequence."""
    torch.manual_seed(0)
    try:
        with using_registry(case.registry):
            core = case.cls(d_model=case.d_model)
    except TypeError as exc:
        raise ConformanceError(f"backend-less constructor: {case.cls.__name__}(d_model={case.d_model}) failed: {exc}; every "
                               "argument but d_model needs a default (backend='auto', device=None, dtype=None)") from None
    y = core(_x(case, 2, 9, torch.float32))
    if tuple(y.shape) != (2, 9, case.d_model) or not bool(torch.isfinite(y).all()):
        raise ConformanceError(f"backend-less constructor: a default-built core gave {tuple(y.shape)} output (finite: "
                               f"{bool(torch.isfinite(y).all())})")


def check_save_load(case: CoreCase) -> None:
    """A model with this core shared across depth saves and loads back identically, storing the
    shared block once."""
    from ..factory import load_pretrained  # lazy: keeps safetensors out of checks
    from ..io.pretrained import read_folder, save_pretrained  # lazy: keeps safetensors out of checks

    spec = {
        "schema_version": 1,
        "task": {"kind": "sequence", "outputs": 3},
        "input": {"channels": 4},
        "model": {"d_model": case.d_model, "depth": 4, "stacking": {"policy": "periodic", "period": 2},
                  "core": {"kind": case.name, **{k: v for k, v in case.params.items() if k != "d_model"}}},
    }
    model = build_model(spec, registry=case.registry, seed=0).eval()
    x = torch.randn(2, 11, 4)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(model, tmp + "/m")
        tensors, info = read_folder(tmp + "/m")
        if any(k.startswith("stack.blocks.2.") for k in tensors) or not any(k.startswith("stack.blocks.1.") for k in tensors):
            raise ConformanceError("save/load: the two shared blocks should be stored once each")
        loaded = load_pretrained(tmp + "/m", registry=case.registry)
        with torch.no_grad():
            assert_close("save/load output", model(x), loaded(x), rtol=0, atol=0)
        if loaded.spec != model.spec:
            raise ConformanceError("save/load: the reloaded model's spec differs")


def check_long_step(case: CoreCase) -> None:
    """Streaming 2048 steps keeps a finite state that still equals the parallel output (float32)."""
    case.needs("step")
    core = case.make(dtype=torch.float32).eval()
    x = _x(case, 1, 2048, torch.float32)
    with torch.no_grad():
        state = core.init_state(1)
        for t in range(x.shape[1]):
            y_t, state = core.step(x[:, t], state)
        y = core(x)[:, -1]
    if not all(bool(torch.isfinite(v).all()) for v in state.values()):
        raise ConformanceError("long step: non-finite state after 2048 steps")
    assert_close("long step (last output)", y, y_t, rtol=1e-3, atol=1e-4 * (1 + y.abs().max().item()))


def check_shared_depth(case: CoreCase) -> None:
    """One instance reused at several depth positions (ABAB sharing, damped updates) streams
    exactly: step() from init_state equals forward() of the whole model, and each position keeps
    its own state (a core that keeps state on itself fails here)."""
    case.needs("step")
    params = {k: v for k, v in case.params.items() if k != "d_model"}
    spec = {"schema_version": 1, "task": {"kind": "sequence", "outputs": 2}, "input": {"channels": 3},
            "model": {"d_model": case.d_model, "depth": 4, "block": {"norm": "layer", "dropout": 0.0},
                      "stacking": {"policy": "periodic", "period": 2, "damping": 0.7},
                      "core": {"kind": case.name, **params}}}
    torch.manual_seed(0)
    with using_registry(case.registry):
        model = build_model(spec, registry=case.registry, dtype=F64).eval()
    x = torch.randn(2, 17, 3, dtype=F64)
    state = model.init_state(2, dtype=F64)
    ys = []
    for t in range(x.shape[1]):
        y_t, state = model.step(x[:, t], state)
        ys.append(y_t)
    assert_close("shared depth: step vs forward", model(x), torch.stack(ys, 1), rtol=case.rtol, atol=case.atol)


def _shapes(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


def check_state_size(case: CoreCase) -> None:
    """Streaming memory is what the configuration declares (``CoreParams.grows_state``): a constant
    state keeps init_state's keys and shapes over 40 steps (as every SSM); a growing one (a KV cache,
    capability ``growing_state``) gets larger. Stepping and one forward_with_state end with equal shapes."""
    case.needs("step")
    core = case.make().eval()
    hp = getattr(core, "hparams", None)
    grows = hp.grows_state() if isinstance(hp, CoreParams) else "growing_state" in case.capabilities
    if grows and "growing_state" not in case.capabilities:
        raise ConformanceError("state size: the params say the state grows but the core does not declare 'growing_state'")
    x = _x(case, 2, 40)
    with torch.no_grad():
        state = start = core.init_state(2, dtype=F64)
        for t in range(x.shape[1]):
            _, state = core.step(x[:, t], state)
        _, whole = core.forward_with_state(x)
    if _shapes(state) != _shapes(whole):
        raise ConformanceError(f"state size: 40 steps give {_shapes(state)}, one forward_with_state gives {_shapes(whole)}")
    size0, size = (sum(v.numel() for v in s.values()) for s in (start, state))
    if grows and not size > size0:
        raise ConformanceError(f"state size: declared growing, but 40 steps left it at {size} elements (from {size0})")
    if not grows and _shapes(state) != _shapes(start):
        raise ConformanceError(f"state size: the state grew from {_shapes(start)} to {_shapes(state)} in 40 steps; "
                               "keep it constant, or declare 'growing_state' (and grows_state() on the params model)")


# two rows of documents of lengths 5, 1, 7 | 9, 3 and one step of padding: every document starts
# from zero, a length-1 document, documents of equal length in different rows
PACKED_LAYOUT = ((5, 1, 7), (9, 3))


def _packed_case(case: CoreCase, layout: tuple[tuple[int, ...], ...] = PACKED_LAYOUT, seed: int = 3
                 ) -> tuple[torch.Tensor, Segments, list[torch.Tensor]]:
    L = max(sum(row) for row in layout) + 1
    seq_idx = torch.full((len(layout), L), -1, dtype=torch.long)
    for b, row in enumerate(layout):
        seq_idx[b, : sum(row)] = torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row))
    seg = Segments.from_seq_idx(seq_idx)
    x = _x(case, len(layout), L, seed=seed)
    docs = [x[int(b), int(s): int(s) + int(n)] for b, s, n in zip(seg.doc_row, seg.doc_start, seg.doc_len, strict=True)]
    return x, seg, docs


def check_packing(case: CoreCase) -> None:
    """Packed documents (``zoo_core.packing``: a ``seq_idx`` layout, every document from the zero
    state) give what each document gives run alone: outputs at every valid step, each document's
    final state, and the gradients of the input and every parameter; for every backend combination.
    A core declaring ``packing`` is checked on its native ``forward_packed``, any other on the
    by-documents path every core gets."""
    has_paths = bool(getattr(case.cls, "paths", None))
    choices = all_choices(paths=case.cls.paths, problem=case.cls.problem, registry=case.registry) if has_paths else []
    settings: list[Any] = [c.as_setting() for c in choices] or [None]
    grows = "growing_state" in case.capabilities
    for setting in settings:
        core = case.make(backend=setting).eval()
        if "packing" in case.capabilities and not callable(getattr(core, "forward_packed", None)):
            raise ConformanceError("packing: declared, but the core has no forward_packed(x, segments)")
        label = f"packing (backend {setting})" if setting is not None else "packing"
        x, seg, docs = _packed_case(case)
        xg = x.clone().requires_grad_(True)
        y, states = run_packed(core, xg, seg, with_states=not grows)
        if tuple(y.shape) != tuple(x.shape[:2]) + (case.d_model,):
            raise ConformanceError(f"{label}: output shape {tuple(y.shape)} for input {tuple(x.shape)}")
        if not bool(torch.isfinite(y).all()):
            raise ConformanceError(f"{label}: non-finite outputs (padding steps must stay finite)")
        params = [p for p in core.parameters() if p.requires_grad]
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=y.dtype) * seg.valid[..., None]
        grads = torch.autograd.grad((y * dy).sum(), [xg, *params], allow_unused=True)
        solo_y, solo_s = [], []
        for d in docs:
            yd, sd = core.forward_with_state(d[None])
            solo_y.append(yd[0])
            solo_s.append(sd)
        ref = seg.pack(torch.nn.utils.rnn.pad_sequence(solo_y, batch_first=True))
        valid = seg.valid
        assert_close(f"{label}: outputs vs each document alone", ref[valid], y[valid], rtol=case.rtol, atol=case.atol)
        dref = seg.pack(torch.nn.utils.rnn.pad_sequence([dy[int(b), int(s): int(s) + int(n)] for b, s, n in
                                                         zip(seg.doc_row, seg.doc_start, seg.doc_len, strict=True)], batch_first=True))
        xs = [d.detach().clone().requires_grad_(True) for d in docs]
        tot = sum((core(xd[None])[0] * dref[int(b), int(s): int(s) + int(n)]).sum()
                  for xd, b, s, n in zip(xs, seg.doc_row, seg.doc_start, seg.doc_len, strict=True))
        rgrads = torch.autograd.grad(tot, [*xs, *params], allow_unused=True)
        gx_ref = seg.pack(torch.nn.utils.rnn.pad_sequence(list(rgrads[: len(xs)]), batch_first=True))
        assert_close(f"{label}: grad input", gx_ref[valid], grads[0][valid], rtol=case.rtol * 10, atol=case.atol * 10)
        names = [n for n, p in core.named_parameters() if p.requires_grad]
        for n, gr, rg in zip(names, grads[1:], rgrads[len(xs):], strict=True):
            if (gr is None) != (rg is None):
                raise ConformanceError(f"{label}: grad {n}: packed {'none' if gr is None else 'some'}, "
                                       f"alone {'none' if rg is None else 'some'}")
            if gr is not None and rg is not None:
                assert_close(f"{label}: grad {n}", rg, gr, rtol=case.rtol * 10, atol=case.atol * 10)
        if states is None:
            continue
        if set(states) != set(solo_s[0]):
            raise ConformanceError(f"{label}: state keys {sorted(states)} != {sorted(solo_s[0])}")
        for k in solo_s[0]:
            if states[k].shape[0] != seg.num_docs:
                raise ConformanceError(f"{label}: state {k!r} holds {states[k].shape[0]} documents; the batch has {seg.num_docs}")
            for i, s in enumerate(solo_s):
                assert_close(f"{label}: final state {k!r} of document {i}", s[k][0], states[k][i], rtol=case.rtol, atol=case.atol)


CHECKS: dict[str, Callable[[CoreCase], None]] = {
    "protocol": check_protocol,
    "shapes": check_shapes,
    "causality": check_causality,
    "batch_independence": check_batch_independence,
    "step_vs_forward": check_step_vs_forward,
    "state_carry": check_state_carry,
    "backends": check_backends,
    "dtypes": check_dtypes,
    "gradients": check_gradients,
    "stability": check_stability,
    "determinism": check_determinism,
    "params_schema": check_params_schema,
    "optim_hints": check_optim_hints,
    "half_precision": check_half_precision,
    "backendless": check_backendless,
    "save_load": check_save_load,
    "long_step": check_long_step,
    "shared_depth": check_shared_depth,
    "state_size": check_state_size,
    "packing": check_packing,
}


def run_all(case: CoreCase) -> dict[str, str]:
    """Run every check; returns check -> 'ok' | 'skipped: …' | 'FAILED: …'."""
    out = {}
    for name, check in CHECKS.items():
        try:
            check(case)
            out[name] = "ok"
        except Skip as exc:
            out[name] = f"skipped: {exc}"
        except Exception as exc:  # report, do not stop the other checks
            out[name] = f"FAILED: {type(exc).__name__}: {exc}"
    return out

