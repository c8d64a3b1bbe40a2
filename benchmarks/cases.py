"""Declarative benchmark cases: a family of implementations, its sizes and its modes.

Zoo implementations are generated from the plugin registry, never listed by hand: for every
registered core, each backend combination of each of its ``paths`` that the registry can serve for
the core's ``problem`` (``zoo_core.backends.all_choices``) is one implementation of the core's
``<core>/layer`` family, and for the kernel and scan ops each registered backend that supports the
core's problem is one implementation of ``<core>/kernel`` / ``<core>/scan-op``. Peers (a
straightforward layer, other libraries, variants) are added as extra implementations by
``benchmarks.peers``. A new core or backend is benchmarked without touching this package.

Letters: B batch, L length, H channels (d_model), N state size.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from benchmarks.harness import Call, Row

if TYPE_CHECKING:
    from torch import Tensor, nn

Sizes = dict[str, int]  # L, B, H, N and any family-specific size
PIP_NAMES = {"s5": "s5-pytorch", "fla": "fla-core"}  # an optional peer's module → the distribution that provides it


@dataclass
class Built:
    """One implementation made ready at one size: the timed call, and what the checks need."""

    call: Call
    module: nn.Module | None = None  # the layer (the agreement check runs it on x)
    x: Tensor | None = None  # its input (B, L, H)
    info: Callable[[], Row] = dict  # extra row fields read after timing (Newton sweeps, accuracy, ...)
    output: Callable[[], Tensor] | None = None  # a kernel family's (H, L) result (agreement check)


@dataclass(frozen=True)
class Impl:
    """One implementation of a family.

    build: (sizes, mode) → Built. skip: why not to run it at these sizes (None: run it).
    agrees: it has the family reference's parameters and semantics, so the agreement check holds
    it to the reference before anything is timed; a peer with other semantics sets False and is
    compared on time only (the report says so).
    """

    name: str
    build: Callable[[Sizes, str], Built]
    skip: Callable[[Sizes, str], str | None] | None = None
    agrees: bool = True
    origin: str = "zoo"  # "zoo" (from the registry) or "peer"
    requires: tuple[str, ...] = ()  # optional packages; without one its rows say so (skipped)

    def unavailable(self) -> str | None:
        """Why this implementation cannot run here (a missing optional package), or None."""
        import importlib.util

        for mod in self.requires:
            if importlib.util.find_spec(mod) is None:
                return f"package {mod!r} is not installed (optional: pip install {PIP_NAMES.get(mod, mod)})"
        return None


@dataclass(frozen=True)
class Family:
    """A set of implementations timed against each other in interleaved tables.

    kind: the rows' kind (layer, kernel, scanop, train, generate, adaptive, parts); report: the
    REPORT file it feeds; reference: the implementation the agreement check compares with; peer:
    the one the report's ratio column divides by (its time / this time, > 1: faster than it);
    floors: bytes any implementation must touch at these sizes, printed beside peak memory;
    defaults: the implementations run when ``--impls`` is not given (None: all).
    """

    name: str
    kind: str
    report: str
    impls: Callable[[], list[Impl]]
    lengths: tuple[int, ...]
    sizes: Mapping[str, int]
    modes: tuple[str, ...] = ("fwd", "fwdbwd")
    batches: tuple[int, ...] = ()  # empty: batch_for(L)
    batch_for: Callable[[int], int] | None = None
    reference: str | Callable[[], str] | None = None  # a callable is asked lazily (it may import the core)
    peer: str | Callable[[], str] | None = None
    check: Callable[[Family], Row] | None = None  # None: the generic layer check when kind == layer
    floors: Callable[[Sizes], dict[str, float]] | None = None
    memory: bool = True
    prime: bool = False  # the memory child runs the call once first (an optimiser's lazy state)
    warm_L: int = 64
    defaults: tuple[str, ...] | None = None
    doc: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def batch(self, L: int, override: list[int] | None = None) -> list[int]:
        """The batch sizes timed at length L."""
        if override:
            return list(override)
        if self.batches:
            return list(self.batches)
        return [self.batch_for(L) if self.batch_for else int(self.sizes.get("B", 1))]

    def ref(self) -> str | None:
        """The reference implementation's name."""
        return self.reference() if callable(self.reference) else self.reference

    def peer_name(self) -> str | None:
        """The implementation the ratio column divides by."""
        return self.peer() if callable(self.peer) else self.peer

    def chosen(self, patterns: list[str] | None) -> list[Impl]:
        """Implementations selected by glob patterns (default: the family's defaults, else all)."""
        impls = self.impls()
        if patterns:
            return [i for i in impls if any(fnmatch.fnmatchcase(i.name, p) for p in patterns)]
        if self.defaults is not None:
            return [i for i in impls if i.name in self.defaults]
        return impls


# ---------------------------------------------------------------------------------------
# what the registry knows
# ---------------------------------------------------------------------------------------
def registry() -> Any:
    from zoo_core.plugins import get_registry

    return get_registry()


def core_class(core: str) -> Any:
    return registry().core(core).load()


def plan_of(cls: Any) -> tuple[Mapping[str, tuple[str, ...]], Any, Mapping[str, str]]:
    """A core's compute plan (paths, problem, reference), read with getattr so that class
    attributes declared either way (plain or typed ClassVar on CoreBase) both work."""
    return getattr(cls, "paths", {}), getattr(cls, "problem", None), getattr(cls, "reference", {})


def choice_name(path: str, setting: Mapping[str, str]) -> str:
    """An implementation's name from its backend setting: "kernel=vandermonde conv=fft";
    a path without ops (LrcSSM's sequential loop) is named after the path."""
    return " ".join(f"{op}={name}" for op, name in setting.items()) or path


def layer_choices(core: str) -> list[tuple[str, Any]]:
    """(name, backend setting) for every backend combination the registry can serve for the core,
    path by path, plus "auto" (what a user gets)."""
    from zoo_core.backends import all_choices

    paths, problem, _ = plan_of(core_class(core))
    out: list[tuple[str, Any]] = []
    for choice in all_choices(paths=paths, problem=problem, registry=registry()):
        setting = choice.as_setting()
        out.append((choice_name(choice.path, setting), dict(setting) if setting else choice.path))
    return out + [("auto", "auto")]


def reference_name(core: str) -> str:
    """The name of the core's reference (all-naive) implementation within its layer family."""
    paths, _, reference = plan_of(core_class(core))
    if reference:
        return choice_name("", reference)
    return next((p for p, ops in paths.items() if not ops), "auto")


def op_backends(core: str, op: str) -> list[tuple[str, Any]]:
    """(name, entry) of every registered backend of one op that serves the core's problem, and of
    those refused only because their optional package is missing (kept, so that their rows say
    why they were not timed instead of vanishing from the table)."""
    _, problem, _ = plan_of(core_class(core))
    out = []
    for (o, name), entry in sorted(registry().backends.items()):
        if o != op:
            continue
        reason = entry.supports_fn(problem) if entry.supports_fn is not None else None
        missing = entry.requires and entry.unavailable_reason() is not None
        if reason is None or (missing and any(pkg in reason for pkg in entry.requires)):
            out.append((name, entry))
    return out


def constructor_kwargs(core: str, s: Sizes, backend: Any) -> dict[str, Any]:
    """What to build one core with: d_model, backend, and d_state and l_max when the params model has them
    (a core without a d_state, e.g. Gated DeltaNet's per-head K × V state, keeps its own defaults)."""
    fields = getattr(registry().core(core).params, "model_fields", {})
    kw: dict[str, Any] = {"d_model": s["H"], "backend": backend}
    if "d_state" in fields or not fields:
        kw["d_state"] = s["N"]
    if "l_max" in fields:
        kw["l_max"] = s["L"]
    return kw


def layer_call(layer: nn.Module, x: Tensor, mode: str) -> Call:
    """One timed call of a layer on x (B, L, H): forward under no_grad, or forward + backward of a
    fixed random cotangent into every parameter and the input."""
    import torch

    torch.manual_seed(1)
    grad_y = torch.randn_like(x)  # (B, L, H)

    def fwd() -> None:
        with torch.no_grad():
            layer(x)

    def fwdbwd() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(grad_y)

    if mode == "fwdbwd":
        x.requires_grad_(True)
    return fwd if mode == "fwd" else fwdbwd


def layer_built(layer: nn.Module, s: Sizes, mode: str, seed: int = 2) -> Built:
    """A layer's Built on a fixed random input (B, L, H)."""
    import torch

    torch.manual_seed(seed)
    x = torch.randn(s["B"], s["L"], s["H"])  # (B, L, H)
    return Built(layer_call(layer, x, mode), layer, x)


def zoo_layer(core: str, name: str, backend: Any, *, origin: str = "zoo",
              skip: Callable[[Sizes, str], str | None] | None = None,
              state_scale: int = 1, compiled: bool = False) -> Impl:
    """A registry core built with one backend setting; every such layer of a core is built from
    seed 0, so they all hold the same parameters. state_scale multiplies d_state (equal-work rows);
    compiled: the layer under ``torch.compile(fullgraph=True)`` (Inductor; the harness's untimed
    warm-up call compiles it)."""
    def build(s: Sizes, mode: str) -> Built:
        import torch

        torch.manual_seed(0)
        kw = constructor_kwargs(core, {**s, "N": s["N"] * state_scale}, backend)
        layer = registry().core(core).instantiate(**kw)
        if compiled:
            # every instance of a core shares its forward's code object, and each compiles anew (guards on the
            # module): a run's sizes, modes and agreement checks pass dynamo's default limit of 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
            torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
        return layer_built(torch.compile(layer, fullgraph=True) if compiled else layer, s, mode)

    return Impl(name, build, skip=skip, agrees=state_scale == 1, origin=origin)


# ---------------------------------------------------------------------------------------
# the generic agreement check
# ---------------------------------------------------------------------------------------
CHECK_SIZES: Sizes = {"B": 2, "H": 16, "N": 16}
CHECK_LENGTHS = (37, 200)  # an odd length on purpose


def check_layers(family: Family, tol: float = 1e-4) -> Row:
    """Every agreeing implementation against the family's reference, float32, small sizes:
    the output, the input gradient and (same parameter layout) every parameter gradient.

    Raises AssertionError naming the implementations beyond ``tol`` relative L2 error: timing an
    implementation that computes something else would be meaningless.
    """
    from benchmarks.harness import rel

    impls = [i for i in family.impls() if i.agrees and i.unavailable() is None]
    ref = next((i for i in impls if i.name == family.ref()), None)
    if ref is None:
        return {"errors": {}, "note": f"no reference implementation {family.ref()!r}: nothing checked"}
    sizes = {**family.sizes, **CHECK_SIZES, **family.extra.get("check_sizes", {})}
    errors: dict[str, float] = {}
    for L in CHECK_LENGTHS:
        want = _grads(ref, {**sizes, "L": L})
        for impl in impls:
            if impl is ref or (impl.skip and impl.skip({**sizes, "L": L}, "fwdbwd")):
                continue
            got = _grads(impl, {**sizes, "L": L})
            pairs = list(zip(got, want)) if [g.shape for g in got] == [w.shape for w in want] else list(zip(got[:2], want[:2]))
            errors[f"{impl.name} L={L}"] = max(rel(a, b) for a, b in pairs)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, (f"{family.name}: implementations disagree with {family.ref()} beyond {tol} relative "
                     f"(output or a gradient): {bad}; fix them or leave them out with --impls")
    return {"errors": errors}


def _grads(impl: Impl, s: Sizes) -> list[Tensor]:
    """Output, input gradient and parameter gradients of one fwdbwd call."""
    import torch

    b = impl.build(s, "fwdbwd")
    assert b.module is not None and b.x is not None, f"{impl.name}: a layer family's Built needs module and x"
    x = b.x.detach().clone().requires_grad_(True)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))  # before forward: it may draw
    y = b.module(x)
    y.backward(g)
    params = [p.grad if p.grad is not None else torch.zeros_like(p) for p in b.module.parameters()]
    return [y.detach(), x.grad, *params]  # type: ignore[list-item]


def with_impls(family: Family, more: Callable[[], list[Impl]]) -> Family:
    """The family with extra implementations (peers) after its generated ones."""
    base = family.impls
    return replace(family, impls=lambda: [*base(), *more()])
