"""The ``stream/<spec>`` families: per-token latency of a model's streaming step at B = 1, the path an
edge device runs, token after token (issue 17's lean step; REPORT_STREAM.md).

Implementations, each timed over L = 100 consecutive tokens of the same input per call (the report
divides by L), all on one thread:

* ``general path``: ``SequenceModel.step``'s general streaming path (what ran before the lean plan; the peer);
* ``eager step``: ``model.step`` in eval under ``torch.no_grad``: the lean step (``zoo_core.nn.lean``),
  for the fused cores' models one ``StepProgram`` call for the whole step;
* ``eager plan``: the lean plan without that program (one fused kernel call per block, the rest in
  torch ops: what a model the program does not take runs, and what ``eager step`` was before it);
* ``compiled step``: ``torch.compile(model.step)`` (Inductor, static shapes), compiled before timing;
* ``onnxruntime``: the exported stream model (``zoo export --mode stream``) in onnxruntime's CPU
  provider, fed with numpy arrays through ``session.run`` as a Python caller would;
* ``onnxruntime io-binding``: the same file with its inputs and outputs bound to preallocated buffers
  (the new state written where the next step reads it), as a C/C++ deployment runs it.

The agreement check runs every implementation over the same 40 tokens from the zero state and holds
their outputs to the general path's. Random weights (``seed=0``): latency does not depend on them.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks.cases import Built, Family, Impl, Sizes
from benchmarks.harness import ROOT, Row

#: family name -> spec: the small classifiers of specs/ (issue 17's target set), then every other streaming
#: core's JapaneseVowels classifier (the pretrained tags' specs), so each core's step is timed
STREAM_SPECS = {
    **{name: f"specs/{name}.yaml" for name in
       ("s4d-basicmotions", "s5-basicmotions", "lru-jv", "linoss-basicmotions", "s4-basicmotions")},
    **{f"{core}-small.japanesevowels": f"pretrained/specs/{core}-small.japanesevowels.yaml" for core in
       ("mamba", "mamba2", "mamba3", "gdn", "rglru", "lrcssm", "attention")},
}
TOKENS = 100
CHECK_TOKENS = 40

Step = Callable[[Tensor, Any], tuple[Tensor, Any]]


@functools.cache
def _model(spec: str) -> Any:
    from zoo_core.build import build_model

    return build_model(str(ROOT / STREAM_SPECS[spec]), seed=0).eval()


def _tokens(spec: str, n: int) -> Tensor:
    from zoo_core.export_cli import example_input

    torch.manual_seed(0)
    return example_input(_model(spec), 1, n)


def _general(model: Any) -> Step:
    """The general streaming path (``model.step`` before the lean plan)."""
    def step(x_t: Tensor, state: Any) -> tuple[Tensor, Any]:
        outs, new = model._advance(x_t[:, None], state, stepwise=True, reads=[model.stack.depth])
        return model.pool.step_output(outs[0]), new
    return step


def _plan(model: Any) -> Step:
    """The lean plan alone (``model.step`` checks the same conditions first; the plan is built once)."""
    from zoo_core.nn.lean import lean_plan

    def step(x_t: Tensor, state: Any) -> tuple[Tensor, Any]:
        plan = lean_plan(model)
        assert plan is not None, "this model has no lean plan"
        return plan.step(model, x_t, state)
    return step


@functools.cache
def _compiled(spec: str) -> Step:
    model = _model(spec)
    return torch.compile(model.step, dynamic=False)


_EXPORT_DIR = tempfile.TemporaryDirectory(prefix="zoo-stream-bench-")


@functools.cache
def _exported(spec: str) -> Any:
    from zoo_core.export_cli import export_model

    model = _model(spec)
    return export_model(str(ROOT / STREAM_SPECS[spec]), model=model, fmt="onnx",
                        output=Path(_EXPORT_DIR.name) / f"{spec}.onnx")


@functools.cache
def _session(spec: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(str(_exported(spec).path), options, providers=["CPUExecutionProvider"])


def _torch_runner(spec: str, step: Step, n: int) -> Callable[[], list[Tensor]]:
    x, model = _tokens(spec, n), _model(spec)

    def run() -> list[Tensor]:
        with torch.no_grad():
            state, ys = model.init_state(1), []
            for t in range(n):
                y, state = step(x[:, t], state)
                ys.append(y)
        return ys
    return run


def _initial(spec: str) -> list[Any]:
    """``init_state(1)`` in the exported file's flat real layout (not zeros of the example: a KV cache starts
    empty, and a state need not start at zero)."""
    return [t.numpy().copy() for t in _exported(spec).module.flatten(_model(spec).init_state(1))]


def _ort_runner(spec: str, n: int) -> Callable[[], list[Tensor]]:
    exported, session = _exported(spec), _session(spec)
    xs = [x.numpy() for x in _tokens(spec, n).unbind(1)]
    zero = _initial(spec)

    def run() -> list[Tensor]:
        flat, ys = zero, []
        for x in xs:
            out = session.run(None, dict(zip(exported.inputs, [x, *flat], strict=True)))
            ys.append(torch.from_numpy(out[0]))
            flat = out[1:]
        return ys
    return run


def _bound_runner(spec: str, n: int) -> Callable[[], list[Tensor]]:
    """Inputs and outputs bound to buffers once; two bindings ping-pong the state between two sets."""
    import numpy as np
    import onnxruntime as ort

    exported, session = _exported(spec), _session(spec)
    outputs = [o.name for o in session.get_outputs()]
    xs = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x.numpy())) for x in _tokens(spec, n).unbind(1)]
    zero = _initial(spec)
    sets = [[ort.OrtValue.ortvalue_from_numpy(z.copy()) for z in zero] for _ in range(2)]
    y = ort.OrtValue.ortvalue_from_numpy(np.zeros(tuple(_model(spec).step(*_first(spec))[0].shape), np.float32))
    bindings = []
    for src, dst in ((sets[0], sets[1]), (sets[1], sets[0])):
        b = session.io_binding()
        for name, v in zip(exported.inputs[1:], src, strict=True):
            b.bind_ortvalue_input(name, v)
        b.bind_ortvalue_output(outputs[0], y)
        for name, v in zip(outputs[1:], dst, strict=True):
            b.bind_ortvalue_output(name, v)
        bindings.append(b)

    def run() -> list[Tensor]:
        for v, z in zip(sets[0], zero, strict=True):  # from the zero state
            v.update_inplace(z)
        ys = []
        for t, x in enumerate(xs):
            b = bindings[t % 2]
            b.bind_ortvalue_input(exported.inputs[0], x)
            session.run_with_iobinding(b)
            ys.append(torch.from_numpy(y.numpy().copy()))
        return ys
    return run


def _first(spec: str) -> tuple[Tensor, Any]:
    with torch.no_grad():
        return _tokens(spec, 1)[:, 0], _model(spec).init_state(1)


def _runner(spec: str, name: str, n: int) -> Callable[[], list[Tensor]]:
    model = _model(spec)
    if name == "general path":
        return _torch_runner(spec, _general(model), n)
    if name == "eager step":
        return _torch_runner(spec, model.step, n)
    if name == "eager plan":
        return _torch_runner(spec, _plan(model), n)
    if name == "compiled step":
        return _torch_runner(spec, _compiled(spec), n)
    if name == "onnxruntime":
        return _ort_runner(spec, n)
    return _bound_runner(spec, n)


IMPLS = ("general path", "eager step", "eager plan", "compiled step", "onnxruntime", "onnxruntime io-binding")
NEEDS = {"onnxruntime": ("onnxruntime", "onnxscript"), "onnxruntime io-binding": ("onnxruntime", "onnxscript")}


def _growing(spec: str) -> str | None:
    """Why a fixed-shape implementation cannot step this model (a KV cache grows every token), or None."""
    grows = sorted({type(c).__name__ for c in _model(spec).cores()
                    if (hp := getattr(c, "hparams", None)) is not None and hp.grows_state()})
    return f"{', '.join(grows)} keeps a KV cache that grows every token" if grows else None


SKIP_GROWING = {"compiled step": "a static graph would recompile at every token",
                "onnxruntime io-binding": "buffers bound once cannot grow"}


def stream_impls(spec: str) -> list[Impl]:
    def build(name: str) -> Callable[[Sizes, str], Built]:
        def make(s: Sizes, mode: str) -> Built:
            run = _runner(spec, name, s["L"])
            run()  # compiles (the compiled step), exports and loads (onnxruntime): not timed

            def call() -> None:
                run()

            def info() -> Row:
                if name.startswith("onnxruntime"):
                    return {"file_kib": round(_exported(spec).path.stat().st_size / 1024, 1)}
                return {}
            return Built(call, info=info)
        return make
    def skip(name: str) -> Callable[[Sizes, str], str | None] | None:
        if name not in SKIP_GROWING:
            return None

        def why(s: Sizes, mode: str) -> str | None:
            grows = _growing(spec)
            return f"{grows}: {SKIP_GROWING[name]}" if grows else None
        return why

    return [Impl(name, build(name), skip=skip(name), origin="peer" if name == "general path" else "zoo",
                 requires=NEEDS.get(name, ())) for name in IMPLS]


def check_stream(spec: str) -> Callable[[Family], Row]:
    def check(family: Family) -> Row:
        ref = torch.cat(_runner(spec, "general path", CHECK_TOKENS)())
        errors: dict[str, float] = {}
        for impl in family.impls():
            if impl.name == "general path" or impl.unavailable() or (impl.skip and impl.skip({}, "infer")):
                continue
            got = torch.cat(_runner(spec, impl.name, CHECK_TOKENS)())
            err = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
            assert err < 1e-4, f"{family.name}: {impl.name} departs from the general path (relative L2 {err:.1e})"
            errors[impl.name] = err
        return {"errors": errors}
    return check


def stream_families(cores: set[str] | None = None) -> list[Family]:
    """One family per spec of ``STREAM_SPECS`` whose core is registered (its name starts the family's)."""
    return [Family(f"stream/{spec}", "stream", "REPORT_STREAM.md", lambda spec=spec: stream_impls(spec),
                   lengths=(TOKENS,), sizes={"B": 1}, modes=("infer",), memory=False, reference="general path",
                   peer="general path", check=check_stream(spec), extra={"threads": 1},
                   doc=f"per-token latency of {path}'s streaming step at B=1: eager (lean step, plan), compiled, "
                       "onnxruntime, against the general path")
            for spec, path in STREAM_SPECS.items() if cores is None or spec.split("-")[0] in cores]
