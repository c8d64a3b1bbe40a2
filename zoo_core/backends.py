"""Backend resolution: turn a core's ``backend`` setting into one backend per op, at build time.

A core declares ``paths``: the ways it can compute a whole sequence, each a tuple of ops, e.g.
S4D has ``{"conv": ("kernel", "conv"), "recurrent": ("scan",)}``; ``prefer``, the order ``auto``
tries them in; and ``reference``, the all-naive choice every other backend is checked against.

A setting is ``"auto"``, ``"naive"`` (the core's reference), one backend name (used for the op it
serves, the rest of its path on auto) or a mapping ``{op: name}``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import BackendUnavailableError, UnknownNameError, did_you_mean
from .registry import BackendEntry, Problem, Registry

log = logging.getLogger("zoo_core.backends")
_LOGGED: set[str] = set()


@dataclass(frozen=True)
class BackendChoice:
    """The resolved backends of one core: a path and one backend per op of that path."""

    path: str
    entries: Mapping[str, BackendEntry]
    reason: str
    fns: dict[str, Callable[..., Any]] = field(default_factory=dict, compare=False)

    def fn(self, op: str) -> Callable[..., Any]:
        if op not in self.fns:
            self.fns[op] = self.entries[op].load()
        return self.fns[op]

    def label(self) -> str:
        return f"{self.path}: " + ", ".join(f"{op}={e.name}" for op, e in self.entries.items())

    def as_setting(self) -> dict[str, str]:
        return {op: e.name for op, e in self.entries.items()}


def _auto(reg: Registry, op: str, problem: Problem) -> tuple[BackendEntry | None, list[str]]:
    skipped = []
    for entry in reg.backends_for(op, problem.device):
        reason = entry.supports(problem)
        if reason is None:
            return entry, skipped
        skipped.append(f"{op}:{entry.name} ({reason})")
    return None, skipped


def _fill(reg: Registry, ops: Sequence[str], fixed: Mapping[str, str], problem: Problem, who: str) -> dict[str, BackendEntry]:
    out: dict[str, BackendEntry] = {}
    for op in ops:
        if op in fixed:
            entry = reg.backend(op, fixed[op])
            reason = entry.supports(problem)
            if reason is not None:
                raise BackendUnavailableError(f"{op} backend {entry.name!r} cannot serve {who}: {reason}.")
            out[op] = entry
        else:
            entry, skipped = _auto(reg, op, problem)
            if entry is None:
                raise BackendUnavailableError(f"no {op} backend can serve {who}; tried " + "; ".join(skipped))
            out[op] = entry
    return out


def _path_for_name(reg: Registry, paths: Mapping[str, tuple[str, ...]], prefer: Sequence[str], name: str, who: str) -> tuple[str, str]:
    for path in prefer:
        for op in paths[path]:
            if (op, name) in reg.backends:
                return path, op
    usable = sorted({n for (op, n) in reg.backends if any(op in ops for ops in paths.values())})
    raise UnknownNameError(
        f"unknown backend {name!r} for {who};{did_you_mean(name, usable + ['auto', 'naive'])} "
        f"backends this core can use: auto, naive, {', '.join(usable)}."
    )


def resolve(
    setting: str | Mapping[str, str],
    *,
    paths: Mapping[str, tuple[str, ...]],
    prefer: Sequence[str],
    reference: Mapping[str, str],
    problem: Problem,
    who: str,
    registry: Registry | None = None,
) -> BackendChoice:
    """Resolve a backend setting for one core; log an ``auto`` choice once with its reason."""
    if registry is None:
        from .plugins import get_registry

        registry = get_registry()
    if setting == "naive":
        setting = dict(reference)
    if isinstance(setting, str) and setting in paths and not any(n == setting for _, n in registry.backends):
        # a path's name (e.g. LrcSSM's "deer"): that computation, each of its ops on auto
        return BackendChoice(setting, _fill(registry, paths[setting], {}, problem, who), f"path {setting!r} requested")
    if isinstance(setting, str) and setting != "auto":
        path, op = _path_for_name(registry, paths, prefer, setting, who)
        return BackendChoice(path, _fill(registry, paths[path], {op: setting}, problem, who), f"{setting!r} requested")
    if isinstance(setting, Mapping):
        bad = [op for op in setting if not any(op in ops for ops in paths.values())]
        for path in prefer:
            if not bad and set(setting) <= set(paths[path]):
                return BackendChoice(path, _fill(registry, paths[path], setting, problem, who), "requested")
        layout = "; ".join(f"{p} uses {'+'.join(ops)}" for p, ops in paths.items())
        raise BackendUnavailableError(f"backend setting {dict(setting)} does not fit {who}: {layout}.")
    errors = []
    for path in prefer:
        try:
            entries = _fill(registry, paths[path], {}, problem, who)
        except BackendUnavailableError as exc:
            errors.append(str(exc))
            continue
        choice = BackendChoice(path, entries, f"auto: first path in {list(prefer)} whose ops all have a backend for a {_describe(problem)}; highest priority on {problem.device} wins")
        msg = f"{who}: backend auto -> {choice.label()} ({choice.reason})"
        if msg not in _LOGGED:
            _LOGGED.add(msg)
            log.info(msg)
        return choice
    raise BackendUnavailableError(" ".join(errors))


def _describe(p: Problem) -> str:
    return f"{p.structure}{' complex' if p.complex else ''} {'LTI' if p.lti else 'time-varying'} system on {p.device}"


def all_choices(
    *, paths: Mapping[str, tuple[str, ...]], problem: Problem, registry: Registry | None = None
) -> list[BackendChoice]:
    """Every combination of available backends that can serve ``problem``, path by path."""
    if registry is None:
        from .plugins import get_registry

        registry = get_registry()
    out = []
    for path, ops in paths.items():
        per_op = [[e for e in registry.backends_for(op) if e.supports(problem) is None] for op in ops]
        for combo in itertools.product(*per_op):
            out.append(BackendChoice(path, dict(zip(ops, combo)), "enumerated"))
    return out
