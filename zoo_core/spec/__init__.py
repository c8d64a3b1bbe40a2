"""Specs: YAML → envelope (stage 1) → each component's own params (stage 2) → ``Spec``.

Errors name the file, line, column and key path, and suggest close names. A spec can only name
registered components: nothing in it is ever imported or executed.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import PluginError, SpecError, ZooError
from ..plugin_registry import OPS, CoreEntry, Registry
from ..plugins import get_registry
from ..stacking_policies import pattern, schedule_period
from .errors import format_validation_error, spec_error
from .schema import DEFAULT_CORE, SCHEMA_VERSION, CoreSpec, ModelSpec, PlacementError, place_cores
from .yaml_loader import Positions, load_yaml, load_yaml_file

__all__ = ["SCHEMA_VERSION", "ModelSpec", "Spec", "load_spec", "load_yaml", "validate_spec"]


@dataclass(frozen=True)
class Spec:
    """A fully validated spec: the envelope plus the resolved components.

    ``core``/``core_params`` are the default core (``model.core``); ``named`` holds every core by
    the name ``model.pattern``/``model.positions`` use (the default as ``core``), and ``layout`` the
    name at each depth position — all ``core`` unless the stack is hybrid."""

    envelope: ModelSpec
    core: CoreEntry
    core_params: BaseModel
    policy: Any
    positions: Positions
    named: Mapping[str, tuple[CoreEntry, BaseModel]] = field(default_factory=dict)
    layout: tuple[str, ...] = ()

    @property
    def hybrid(self) -> bool:
        """Whether depth positions run cores of more than one name."""
        return len(set(self.layout)) > 1

    def core_at(self, name: str) -> tuple[CoreEntry, BaseModel]:
        """The registered core and validated params behind a placement name (``core``: the default)."""
        return self.named.get(name) or (self.core, self.core_params)

    def block_cores(self) -> list[str]:
        """The core name of each unique block of the schedule (validation checked they agree)."""
        schedule = self.policy.schedule(self.envelope.model.depth)
        out: dict[int, str] = {}
        for pos, block in enumerate(schedule):
            out.setdefault(block, self.layout[pos] if self.layout else DEFAULT_CORE)
        return [out[i] for i in range(len(out))]

    @property
    def filename(self) -> str:
        return self.positions.filename

    def resolved(self) -> dict[str, Any]:
        """The spec with presets merged and every default written out (what a saved model stores)."""
        out = self.envelope.model_dump(mode="json", exclude_none=True)
        out["model"]["pool"] = self.envelope.pool
        params = self.core_params.model_dump(mode="json", exclude={"d_model"})
        out["model"]["core"] = {"kind": self.core.name, **params}
        if "cores" in out["model"]:
            out["model"]["cores"] = {
                name: {"kind": entry.name, **p.model_dump(mode="json", exclude={"d_model"})}
                for name, (entry, p) in self.named.items() if name != DEFAULT_CORE
            }
        return copy.deepcopy(out)


def load_spec(source: str | os.PathLike[str] | Mapping[str, Any], *, registry: Registry | None = None) -> Spec:
    """Load and validate a spec from a YAML file path or a dict."""
    if isinstance(source, Mapping):
        data, positions = dict(source), Positions("<dict>", {})
    else:
        data, positions = load_yaml_file(source)
    return validate_spec(data, positions, registry=registry)


def validate_spec(data: Any, positions: Positions, *, registry: Registry | None = None) -> Spec:
    if registry is None:
        registry = get_registry()
    try:
        env = ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, positions, model=ModelSpec) from None
    try:
        layout = place_cores(env.model)
    except PlacementError as exc:
        raise spec_error(positions, exc.loc, str(exc)) from None
    named: dict[str, tuple[CoreEntry, BaseModel]] = {}
    for name, core in [(DEFAULT_CORE, env.model.core), *sorted((env.model.cores or {}).items())]:
        loc = ("model", "core") if name == DEFAULT_CORE else ("model", "cores", name)
        entry = _lookup(positions, loc + ("kind",), lambda core=core: registry.core(core.kind))
        named[name] = (entry, _core_params(env, core, entry, positions, loc))
    policy = _policy(env, registry, positions)
    _check_sharing(env, policy, layout, named, positions)
    _check_depth(env, policy, positions)
    _check_input(env, positions)
    for name, (entry, params) in named.items():
        _check_backend(params, entry, registry, positions,
                       ("model", "core") if name == DEFAULT_CORE else ("model", "cores", name))
    entry, params = named[DEFAULT_CORE]
    return Spec(env, entry, params, policy, positions, named, layout)


def _lookup(positions: Positions, loc: tuple[Any, ...], fn: Any) -> Any:
    try:
        return fn()
    except PluginError:
        raise  # e.g. two plugins claim the name: a plugin problem (exit 4), not a mistake in the spec
    except ZooError as exc:
        raise spec_error(positions, loc, str(exc)) from None


def _core_params(env: ModelSpec, core: CoreSpec, entry: CoreEntry, positions: Positions,
                 loc: tuple[str, ...] = ("model", "core")) -> BaseModel:
    """Stage 2 for one core (the default at ``model.core`` or a named one under ``model.cores``)."""
    merged: dict[str, Any] = {}
    if core.preset is not None:
        merged.update(_lookup(positions, loc + ("preset",), lambda: entry.preset(core.preset)))
    explicit = dict(core.model_extra or {})
    if "d_model" in explicit:
        raise spec_error(positions, loc + ("d_model",),
                         "d_model is set once for the whole model: move it to model.d_model")
    merged.update(explicit)
    merged["d_model"] = env.model.d_model
    try:
        return entry.params.model_validate(merged)
    except ValidationError as exc:
        raise format_validation_error(exc, positions, prefix=loc, model=entry.params) from None


def _check_sharing(env: ModelSpec, policy: Any, layout: tuple[str, ...],
                   named: Mapping[str, tuple[CoreEntry, BaseModel]], positions: Positions) -> None:
    """Positions that share one block (the stacking schedule) must place the same core there:
    a block holds one core, so ``[A B] [A B]`` shares with period 2 but not with period 1."""
    schedule = policy.schedule(env.model.depth)
    first: dict[int, int] = {}
    for pos, block in enumerate(schedule):
        at = first.setdefault(block, pos)
        if layout[at] != layout[pos]:
            a, b = layout[at], layout[pos]
            st = env.model.stacking
            how = f"policy {st.policy!r}" + (f", period {st.period}" if st.period is not None else "")
            ids = {name: i for i, name in enumerate(dict.fromkeys(layout))}
            cycle = schedule_period([ids[name] for name in layout])
            raise spec_error(positions, ("model", "stacking"),
                             f"depth positions {at + 1} and {pos + 1} share block {pattern([block])} (stacking {how}: "
                             f"{pattern(schedule)}) but run different cores: {a!r} ({named[a][0].name}) at {at + 1}, "
                             f"{b!r} ({named[b][0].name}) at {pos + 1}. A block holds one core, so the blocks must "
                             f"repeat with the core placement (it repeats every {cycle} position(s)): use a period "
                             f"that is a multiple of {cycle}, or policy independent")


def _policy(env: ModelSpec, registry: Registry, positions: Positions) -> Any:
    st = env.model.stacking
    cls = _lookup(positions, ("model", "stacking", "policy"), lambda: registry.stacking_policy(st.policy).load())
    kwargs = {} if st.period is None else {"period": st.period}
    try:
        policy = cls(**kwargs)
    except TypeError:
        if st.period is None:
            raise spec_error(positions, ("model", "stacking", "policy"),
                             f"stacking policy {st.policy!r} needs model.stacking.period (blocks per period: "
                             "1 for AAAAAA, 2 for ABABAB, ...)") from None
        raise spec_error(positions, ("model", "stacking", "period"),
                         f"stacking policy {st.policy!r} takes no period; remove model.stacking.period "
                         "or use policy: periodic") from None
    try:
        policy.num_blocks(env.model.depth)
    except SpecError as exc:
        raise spec_error(positions, ("model", "stacking", "period"), str(exc)) from None
    return policy


def _check_depth(env: ModelSpec, policy: Any, positions: Positions) -> None:
    """Damping, norms and adaptive settings against the depth and the schedule's period."""
    st, depth = env.model.stacking, env.model.depth
    loc = ("model", "stacking")
    if st.damping_init is not None and st.damping != "learned":
        raise spec_error(positions, loc + ("damping_init",),
                         "damping_init is the starting α of a learned damping; set damping: learned or remove damping_init")
    ad = st.adaptive
    if ad is None:
        return
    period = schedule_period(list(policy.schedule(depth)))
    max_depth = depth if ad.max_depth is None else ad.max_depth
    if ad.min_depth > max_depth:
        which = "max_depth" if ad.max_depth is not None else "min_depth"
        raise spec_error(positions, loc + ("adaptive", "min_depth"),
                         f"min_depth {ad.min_depth} exceeds the maximum depth {max_depth}"
                         + ("" if which == "max_depth" else " (max_depth defaults to the depth)")
                         + "; lower min_depth or raise max_depth")
    if ad.stop_at == "period" and max_depth % period:
        raise spec_error(positions, loc + ("adaptive", "max_depth"),
                         f"with stop_at: period, max_depth must be a multiple of the period {period} "
                         f"(e.g. {max(period, max_depth - max_depth % period)}); got {max_depth}, or use stop_at: block")
    if st.norms == "per_position" and max_depth > depth:
        raise spec_error(positions, loc + ("adaptive", "max_depth"),
                         f"norms: per_position keeps norms for the {depth} trained positions only, so max_depth "
                         f"{max_depth} > depth has none for the extra positions; use norms: shared or max_depth ≤ {depth}")


def reshape_error(d: int, c: int) -> str | None:
    """Why c does not fit d raw features (None when it does): the spec check and ``InputReshaper`` share it."""
    if c > d and c % d:
        lo = [k * d for k in range(2, 5)]
        return (f"c = {c} does not fit {d} input features: concatenating steps needs c to be a multiple of {d} "
                f"(c = {', '.join(map(str, lo))}, ...), or c < {d} to flatten and re-chunk")
    return None


def _check_input(env: ModelSpec, positions: Positions) -> None:
    """Reshaping, encoder and head against what the model reads and predicts."""
    inp, m = env.input, env.model
    if inp.reshape is not None:
        loc = ("input", "reshape", "c")
        if inp.channels is None:
            raise spec_error(positions, ("input", "reshape"), "input reshaping needs real features (input.channels), not tokens")
        if env.pool == "none":
            raise spec_error(positions, ("input", "reshape"),
                             f"input reshaping changes the number of steps, so task kind {env.task.kind!r} (one output "
                             "per step) cannot use it; it applies to pooled tasks (classification, regression)")
        d = inp.channels + int(inp.include_time)
        msg = reshape_error(d, inp.reshape.c)
        if msg:
            raise spec_error(positions, loc, msg + (" (d counts the time channel)" if inp.include_time else ""))
    if inp.vocab_size is not None and m.encoder.kind != "linear":
        raise spec_error(positions, ("model", "encoder", "kind"), "token inputs are embedded; model.encoder applies to real features only")
    if m.tie_embeddings and m.head.kind != "linear":
        raise spec_error(positions, ("model", "head", "kind"), "a tied head is the embedding matrix: use head kind linear")


def _check_backend(params: BaseModel, entry: CoreEntry, registry: Registry, positions: Positions,
                   at: tuple[str, ...] = ("model", "core")) -> None:
    """Discretizer and backend names must exist and fit the core (this imports the core class)."""
    setting = getattr(params, "backend", "auto")
    loc = at + ("backend",)
    if isinstance(setting, dict):
        for op, name in setting.items():
            if op not in OPS:
                raise spec_error(positions, loc + (op,), f"unknown op {op!r}; ops are {', '.join(OPS)}")
            _lookup(positions, loc + (op,), lambda op=op, name=name: registry.backend(op, name))
    cls = entry.load()
    disc = getattr(params, "discretizer", None)
    if isinstance(disc, str):
        found = _lookup(positions, at + ("discretizer",), lambda: registry.discretizer(disc))
        structure = getattr(getattr(cls, "problem", None), "structure", None)
        if structure is not None and structure not in found.structures:
            raise spec_error(positions, at + ("discretizer",),
                             f"discretizer {disc!r} handles {sorted(found.structures)} systems, not {structure!r}")
    if not hasattr(cls, "paths"):
        return  # a core with a single fixed computation declares no backend paths
    from ..backends import resolve  # lazy: keeps torch out of spec

    _lookup(positions, loc, lambda: resolve(
        setting, paths=cls.paths, prefer=cls.prefer, reference=cls.reference,
        problem=cls.problem, who=f"core {entry.name!r}", registry=registry))
