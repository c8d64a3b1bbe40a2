"""Backend resolution: turn a core's ``backend`` setting into one backend per op, at build time.

A core declares ``paths``: the ways it can compute a whole sequence, each a tuple of ops, e.g.
S4D has ``{"conv": ("kernel", "conv"), "recurrent": ("scan",)}``; ``prefer``, the order ``auto``
tries them in; and ``reference``, the all-naive choice every other backend is checked against.

A setting is ``"auto"``, ``"naive"`` (the core's reference), a path's name (that path, its ops on
auto), one backend name or alias (used for the op it serves, the rest of its path on auto) or a
mapping ``{op: name}`` (the path whose ops it names exactly, else the first that contains them).
``pinned`` ({op: name}, a core's per-device preference) replaces ``auto`` for the ops it names.

``BoundOps`` is what a core calls: the chosen implementations, loaded once, typed by the op
Protocols of ``zoo_core.protocols``, with the problem's structure bound.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import BackendUnavailableError, UnknownNameError, did_you_mean
from .logs import log_once
from .plugin_registry import BackendEntry, Problem, Registry
from .plugins import get_registry  # the registry in use; a module import would be a cycle
from .protocols import AttentionOp, ConvOp, KernelOp, ScanOp, SelectiveScanOp

log = logging.getLogger("zoo_core.backends")


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
        ops = ", ".join(f"{op}={e.name}" for op, e in self.entries.items())
        return f"{self.path}: {ops or 'no backend ops (the core computes it itself)'}"

    def as_setting(self) -> dict[str, str]:
        return {op: e.name for op, e in self.entries.items()}


def _bind_structure(fn: Callable[..., Any], structure: str) -> Callable[..., Any]:
    """``fn`` with ``structure=`` bound when it takes that keyword (one implementation, several structures)."""
    try:
        takes = "structure" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    return functools.partial(fn, structure=structure) if takes else fn


class BoundOps:
    """The ops of a chosen path, loaded once at build time with the structure bound.

    A core calls ``self.ops.scan(a, b, h0)``, ``self.ops.kernel(system, L)``, ``self.ops.conv(u, k)``
    or ``self.ops.selective_scan(...)``; asking for an op its chosen path does not run is an
    AttributeError naming the path.
    """

    def __init__(self, choice: BackendChoice, structure: str) -> None:
        self.path = choice.path
        self._fns = {op: _bind_structure(choice.fn(op), structure) for op in choice.entries}

    def _get(self, op: str) -> Any:
        if op not in self._fns:
            raise AttributeError(f"the chosen path {self.path!r} runs no {op!r} op (it runs {sorted(self._fns) or 'none'})")
        return self._fns[op]

    @property
    def kernel(self) -> KernelOp:
        return self._get("kernel")  # no typing.cast: torch.compile loses the function's source through it (a graph break)

    @property
    def conv(self) -> ConvOp:
        return self._get("conv")

    @property
    def scan(self) -> ScanOp:
        return self._get("scan")

    @property
    def selective_scan(self) -> SelectiveScanOp:
        return self._get("scan")

    @property
    def attention(self) -> AttentionOp:
        return self._get("attention")


@dataclass(frozen=True)
class Skip:
    """A backend ``auto`` passed over, ranked above the one it took: why, and whether that is a fallback."""

    entry: BackendEntry
    reason: str
    unavailable: bool  # it would serve the problem but cannot run here (see BackendEntry.check)

    def __str__(self) -> str:
        return f"{self.entry.op}:{self.entry.name} ({self.reason})"


def _auto(reg: Registry, op: str, problem: Problem) -> tuple[BackendEntry | None, list[Skip]]:
    skipped: list[Skip] = []
    for entry in reg.backends_for(op, problem.device):
        reason, unavailable = entry.check(problem)
        if reason is None:
            return entry, skipped
        skipped.append(Skip(entry, reason, unavailable))
    return None, skipped


def _announce(who: str, skipped: Sequence[Skip], chosen: Mapping[str, BackendEntry]) -> None:
    """Log once per process each faster backend that would serve but cannot run here, with its reason.

    This is the one place a fallback is announced: a backend's probe only returns its reason."""
    for s in skipped:
        if s.unavailable:
            taken = chosen[s.entry.op].name
            log_once(log, logging.WARNING, ("fallback", s.entry.op, s.entry.name, s.reason, taken),
                     "%s: the faster %s backend %r is unavailable here, so auto takes the slower %r (first for %s): %s",
                     s.entry.op, s.entry.op, s.entry.name, taken, who, s.reason)


def _fill(reg: Registry, ops: Sequence[str], fixed: Mapping[str, str], problem: Problem, who: str,
          skipped: list[Skip] | None = None) -> dict[str, BackendEntry]:
    """One backend per op: the named one where ``fixed`` names it, else ``auto``'s (its passes appended to ``skipped``)."""
    out: dict[str, BackendEntry] = {}
    for op in ops:
        if op in fixed:
            entry = reg.backend(op, fixed[op], problem)
            reason = entry.supports(problem)
            if reason is not None:
                raise BackendUnavailableError(f"{op} backend {entry.name!r} cannot serve {who}: {reason}.")
            out[op] = entry
        else:
            found, passed = _auto(reg, op, problem)
            if found is None:
                raise BackendUnavailableError(f"no {op} backend can serve {who}; tried " + "; ".join(map(str, passed)))
            out[op] = found
            if skipped is not None:
                skipped.extend(passed)
    return out


def _path_for_name(reg: Registry, paths: Mapping[str, tuple[str, ...]], prefer: Sequence[str], name: str, who: str) -> tuple[str, str]:
    for path in prefer:
        for op in paths[path]:
            if reg.named_backends(op, name):
                return path, op
    usable = sorted({n for (op, n), e in reg.backends.items() for n in (n, *e.aliases) if any(op in ops for ops in paths.values())})
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
    pinned: Mapping[str, str] | None = None,
) -> BackendChoice:
    """Resolve a backend setting for one core; log an ``auto`` choice once with its reason."""
    if registry is None:
        registry = get_registry()
    pinned = dict(pinned or {})
    if setting == "naive":
        setting = dict(reference)
    skipped: list[Skip] = []  # auto's passes over faster backends, for the ops left to it
    if isinstance(setting, str) and setting in paths and not any(n == setting for _, n in registry.backends):
        # a path's name (e.g. LrcSSM's "deer"): that computation, each of its ops on auto (or pinned)
        fixed = {op: pinned[op] for op in paths[setting] if op in pinned}
        choice = BackendChoice(setting, _fill(registry, paths[setting], fixed, problem, who, skipped),
                               f"path {setting!r} requested")
    elif isinstance(setting, str) and setting != "auto":
        path, op = _path_for_name(registry, paths, prefer, setting, who)
        choice = BackendChoice(path, _fill(registry, paths[path], {op: setting}, problem, who, skipped),
                               f"{setting!r} requested")
    elif isinstance(setting, Mapping):
        bad = [op for op in setting if not any(op in ops for ops in paths.values())]
        exact = [p for p in prefer if set(setting) == set(paths[p])]
        for path in exact + list(prefer):
            if not bad and set(setting) <= set(paths[path]):
                choice = BackendChoice(path, _fill(registry, paths[path], setting, problem, who, skipped), "requested")
                break
        else:
            layout = "; ".join(f"{p} uses {'+'.join(ops)}" for p, ops in paths.items())
            raise BackendUnavailableError(f"backend setting {dict(setting)} does not fit {who}: {layout}.")
    else:
        choice = _auto_path(registry, paths, prefer, problem, who, pinned, skipped)
    _announce(who, skipped, choice.entries)
    return choice


def _auto_path(reg: Registry, paths: Mapping[str, tuple[str, ...]], prefer: Sequence[str], problem: Problem, who: str,
               pinned: Mapping[str, str], skipped: list[Skip]) -> BackendChoice:
    """``auto``: the first path in ``prefer`` whose ops all have a backend; logged once with its reason."""
    errors = []
    for path in prefer:
        fixed = {op: pinned[op] for op in paths[path] if op in pinned}
        passed: list[Skip] = []
        try:
            entries = _fill(reg, paths[path], fixed, problem, who, passed)
        except BackendUnavailableError as exc:
            errors.append(str(exc))
            continue
        skipped.extend(passed)
        how = (f"the core pins {fixed} on {problem.device} (measured fastest there)" if fixed
               else f"highest priority on {problem.device} wins")
        choice = BackendChoice(path, entries,
                               f"auto: first path in {list(prefer)} whose ops all have a backend for a {_describe(problem)}; {how}")
        msg = f"{who}: backend auto -> {choice.label()} ({choice.reason})"
        log_once(log, logging.INFO, msg, "%s", msg)
        return choice
    raise BackendUnavailableError(" ".join(errors))


def _describe(p: Problem) -> str:
    return f"{p.structure}{' complex' if p.complex else ''} {'LTI' if p.lti else 'time-varying'} system on {p.device}"


def all_choices(
    *, paths: Mapping[str, tuple[str, ...]], problem: Problem, registry: Registry | None = None
) -> list[BackendChoice]:
    """Every combination of available backends that can serve ``problem``, path by path."""
    if registry is None:
        registry = get_registry()
    out = []
    for path, ops in paths.items():
        per_op = [[e for e in registry.backends_for(op) if e.supports(problem) is None] for op in ops]
        for combo in itertools.product(*per_op):
            out.append(BackendChoice(path, dict(zip(ops, combo, strict=True)), "enumerated"))
    return out
