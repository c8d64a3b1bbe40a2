"""The registry: what the installed plugins registered, with provenance.

Entries are metadata; code named by a ``"module:attr"`` target is imported on ``load()``, so
listing the registry never imports torch or model code.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import BackendUnavailableError, NameConflictError, PluginLoadError, UnknownNameError, did_you_mean
from .logs import log_once
from .plugin_catalogue import plugin_owners

if TYPE_CHECKING:  # for annotations only: corebase imports this module (Problem) and loads torch, which listing must not
    from .corebase import CoreBase
    from .params import CoreParams

OPS = ("kernel", "conv", "scan", "attention")


@dataclass(frozen=True)
class Provider:
    """Where a registration came from."""

    plugin: str
    dist: str
    version: str

    def __str__(self) -> str:
        return f"{self.dist} {self.version} (plugin {self.plugin!r})"


def _resolve(target: Any, provider: Provider | None = None) -> Any:
    """Import a plugin's ``"module:attr"`` target; failures name the plugin that registered it."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
    except (Exception, SystemExit) as exc:  # model code exiting at import is the plugin's failure too
        who = f" registered by {provider}" if provider is not None else ""
        raise PluginLoadError(
            f"cannot import {target!r}{who}: {type(exc).__name__}: {exc}. The plugin's model code is "
            "broken or a dependency is missing; reinstall the plugin"
        ) from exc
    return obj


@dataclass(frozen=True)
class CoreEntry:
    name: str
    target: Any
    params: type[CoreParams]
    presets: Mapping[str, Mapping[str, Any]]
    capabilities: frozenset[str]
    card: str
    provider: Provider

    def load(self) -> type[CoreBase]:
        """The core class (imports the plugin's model code), refused with the plugin named when its
        constructor cannot take what every build passes (its params fields, device, dtype)."""
        cls = _resolve(self.target, self.provider)
        problem = constructor_problem(cls, self.params)
        if problem:
            raise PluginLoadError(self._broken(problem))
        return cls

    def instantiate(self, **kwargs: Any) -> Any:
        """Build one core from keyword arguments; a signature mismatch names the plugin (exit 4)
        instead of a TypeError traceback from deep inside the model assembly."""
        cls = self.load()
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as exc:
            raise PluginLoadError(self._broken(f"its constructor refuses {sorted(kwargs)}: {exc}")) from None
        except ValueError:
            pass  # no introspectable signature (a C type): let the call speak
        return cls(**kwargs)

    def _broken(self, problem: str) -> str:
        return (f"core {self.name!r} registered by {self.provider} cannot be built: {problem}. A core's constructor "
                "must accept every field of its params model (d_model, backend, ...) plus device and dtype as "
                "keyword arguments; fix or upgrade the plugin (or uninstall it)")

    def preset(self, name: str) -> dict[str, Any]:
        if name not in self.presets:
            raise UnknownNameError(
                f"core {self.name!r} has no preset {name!r};"
                f"{did_you_mean(name, self.presets)} presets: {', '.join(sorted(self.presets))}"
            )
        return dict(self.presets[name])


@dataclass(frozen=True)
class Problem:
    """What a core asks of a backend, in torch-free terms.

    structure: "diag", "dplr", "dense" or "block2x2"; lti: time-invariant system;
    complex: complex-valued state; device: "cpu", "cuda", ...; dtype: "float32", ...
    """

    structure: str = "diag"
    lti: bool = True
    complex: bool = False
    device: str = "cpu"
    dtype: str = "float32"


@dataclass(frozen=True)
class BackendEntry:
    name: str
    op: str
    target: Any
    priority: int
    supports_fn: Callable[[Problem], str | None] | None
    requires: tuple[str, ...]
    description: str
    provider: Provider
    device_priority: Mapping[str, int] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # other names a spec may use for it (where no backend of the op has that name and serves the core)
    probe_fn: Callable[[Problem], str | None] | None = None  # run-time check, asked only once the problem fits

    def rank(self, device: str) -> int:
        """``auto``'s preference on a device type ("cpu", "cuda", ...): higher wins."""
        return self.device_priority.get(device, self.priority)

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run at all here (a missing package), or None."""
        for mod in self.requires:
            if importlib.util.find_spec(mod) is None:
                return f"package {mod!r} is not installed"
        return None

    def check(self, problem: Problem) -> tuple[str | None, bool]:
        """(reason, unavailable): None if this backend can serve ``problem``, else why not.

        ``unavailable`` tells the two kinds of "no" apart. False: the problem is not one it serves
        (another device, structure or dtype), nothing the user can change. True: it would serve it
        but cannot run in this process (a required package is missing, its run-time probe failed:
        a kernel that does not compile, a library that fails its self-test), a fallback that
        ``auto`` announces. The problem is asked first, so a GPU-only backend whose package is
        missing is simply "not for a CPU" on a CPU.
        """
        if self.supports_fn is not None:
            try:
                reason = self.supports_fn(problem)
            except Exception as exc:  # noqa: BLE001 - a broken plugin's check costs only its own backend
                missing = self.unavailable_reason()  # e.g. it imported its own required package, absent here
                return missing or self._raised("supports", exc), missing is not None
            if reason is not None:
                return reason, False
        reason = self.unavailable_reason()
        if reason is None and self.probe_fn is not None:
            try:
                reason = self.probe_fn(problem)
            except Exception as exc:  # noqa: BLE001 - a probe should return its reason; one that raises still says no
                reason = self._raised("probe", exc)
        return reason, reason is not None

    def _raised(self, what: str, exc: Exception) -> str:
        """The reason for a check that raised, logged once (WARNING): a plugin bug its author should hear of."""
        reason = f"its {what} check raised {type(exc).__name__}: {exc} (a bug in {self.provider})"
        log_once(logging.getLogger(__name__), logging.WARNING, ("raised", self.op, self.name, what, str(exc)),
                 "backend %s:%s: %s; the backend is passed over", self.op, self.name, reason)
        return reason

    def supports(self, problem: Problem) -> str | None:
        """None if this backend can serve ``problem`` here, else the reason it cannot."""
        return self.check(problem)[0]

    def load(self) -> Callable[..., Any]:
        return _resolve(self.target, self.provider)


@dataclass(frozen=True)
class DiscretizerEntry:
    name: str
    target: Any
    structures: frozenset[str]
    description: str
    provider: Provider

    def load(self) -> Callable[..., Any]:
        return _resolve(self.target, self.provider)


@dataclass(frozen=True)
class SimpleEntry:
    """Stacking policies, datasets, converters: a name, a target and a description."""

    name: str
    target: Any
    description: str
    provider: Provider
    extra: Mapping[str, Any] = field(default_factory=dict)

    def load(self) -> Any:
        return _resolve(self.target, self.provider)


KINDS = ("cores", "backends", "discretizers", "stacking_policies", "datasets", "converters")


@dataclass
class Registry:
    """Everything registered, by kind. Build one with ``zoo_core.plugins.load_registry``."""

    cores: dict[str, CoreEntry] = field(default_factory=dict)
    backends: dict[tuple[str, str], BackendEntry] = field(default_factory=dict)
    discretizers: dict[str, DiscretizerEntry] = field(default_factory=dict)
    stacking_policies: dict[str, SimpleEntry] = field(default_factory=dict)
    datasets: dict[str, SimpleEntry] = field(default_factory=dict)
    converters: dict[str, SimpleEntry] = field(default_factory=dict)
    plugins: list[Any] = field(default_factory=list)  # PluginInfo, in load order
    conflicts: dict[tuple[str, Any], Conflict] = field(default_factory=dict)  # (kind, key) claimed twice

    # conflicts and provenance ------------------------------------------------------------
    def conflict(self, kind: str, key: Any) -> Conflict | None:
        """The record of ``key`` being claimed by several plugins (resolved or not), or None."""
        return self.conflicts.get((kind, key))

    def in_conflict(self, name: Any, kind: str = "cores") -> bool:
        """True when several plugins claim ``name`` and none keeps it: every use of it fails (exit 4)."""
        found = self.conflict(kind, name)
        return found is not None and found.owner is None

    def provider_of(self, kind: str, key: Any) -> Provider | None:
        """Who provides ``key`` now (None: unregistered, or claimed twice with no owner)."""
        entry = getattr(self, kind).get(key)
        return None if entry is None else entry.provider

    def core_provider(self, name: str) -> Provider | None:
        """The plugin whose code builds core ``name`` (compare with a weights file's ``versions``)."""
        return self.provider_of("cores", name)

    def refuse_conflict(self, kind: str, key: Any) -> None:
        """Raise NameConflictError (exit 4, both plugins named) when ``key`` is claimed twice and
        nobody keeps it; call before reporting a name as unknown or not installed."""
        if self.in_conflict(key, kind):
            raise NameConflictError(self.conflicts[(kind, key)].message())

    # lookups -----------------------------------------------------------------------------
    def core(self, name: str) -> CoreEntry:
        if name in self.cores:
            return self.cores[name]
        self.refuse_conflict("cores", name)
        msg = f"unknown core {name!r};{did_you_mean(name, self.cores)}"
        known = plugin_owners()
        dist = known.owners.get(name) or known.owners.get(name.split("-")[0])
        if dist is not None:
            if dist in known.planned:
                msg += f" it will be provided by the plugin {dist!r}, which is planned but not released yet."
            else:
                msg += (f" it is provided by the plugin {dist!r}, which is not installed: pip install -e plugins/{dist} "
                        f"(from a checkout) or pip install {dist}.")
        failed = [p for p in self.plugins if p.status == "failed"]
        if failed:
            msg += " Plugins that failed to load: " + "; ".join(f"{p.dist} {p.version}: {p.error}" for p in failed) + "."
        msg += f" Registered cores: {', '.join(sorted(self.cores)) or '(none)'}."
        return _raise_unknown(msg)

    def named_backends(self, op: str, name: str) -> list[BackendEntry]:
        """The ``op`` backend registered as ``name``, then those registered with ``name`` as an alias."""
        exact = [self.backends[(op, name)]] if (op, name) in self.backends else []
        return exact + [e for (o, _), e in sorted(self.backends.items()) if o == op and name in e.aliases]

    def backend(self, op: str, name: str, problem: Problem | None = None) -> BackendEntry:
        """The ``op`` backend called ``name`` (its name or an alias); with ``problem``, the first of
        those that can serve it (a name and an alias may coincide: "scan" is zoo-core's parallel scan
        and Mamba's chunked selective scan), else one that fits the problem but cannot run here, else the
        first; its ``supports`` gives the reason."""
        found = self.named_backends(op, name)
        if found:
            if problem is None:
                return found[0]
            checks = [(e, *e.check(problem)) for e in found]
            serving = [e for e, reason, _ in checks if reason is None]
            # none serves: the one that fits the problem but cannot run here (its probe's reason is the true
            # one: Mamba's 'cpu' without a compiler), else the first
            fitting = [e for e, reason, unavailable in checks if unavailable]
            return (serving or fitting or found)[0]
        self.refuse_conflict("backends", (op, name))
        names = [n for (o, _), e in self.backends.items() if o == op for n in (e.name, *e.aliases)]
        return _raise_unknown(
            f"unknown {op} backend {name!r};{did_you_mean(name, names)} {op} backends: {', '.join(sorted(set(names)))}."
        )

    def backends_for(self, op: str, device: str = "cpu") -> list[BackendEntry]:
        """Backends of one op, best first (highest priority on ``device``)."""
        found = [b for (o, _), b in self.backends.items() if o == op]
        return sorted(found, key=lambda b: (-b.rank(device), b.name))

    def discretizer(self, name: str) -> DiscretizerEntry:
        if name in self.discretizers:
            return self.discretizers[name]
        self.refuse_conflict("discretizers", name)
        return _raise_unknown(
            f"unknown discretizer {name!r};{did_you_mean(name, self.discretizers)} discretizers: {', '.join(sorted(self.discretizers))}."
        )

    def stacking_policy(self, name: str) -> SimpleEntry:
        if name in self.stacking_policies:
            return self.stacking_policies[name]
        self.refuse_conflict("stacking_policies", name)
        return _raise_unknown(
            f"unknown stacking policy {name!r};{did_you_mean(name, self.stacking_policies)} "
            f"policies: {', '.join(sorted(self.stacking_policies))}."
        )

    def presets(self) -> dict[str, tuple[CoreEntry, str]]:
        """All presets as ``core-preset`` names."""
        return {f"{c.name}-{p}": (c, p) for c in self.cores.values() for p in c.presets}

    def names(self, kind: str) -> list[str]:
        if kind == "backends":
            return sorted(f"{op}:{name}" for (op, name) in self.backends)
        if kind == "presets":
            return sorted(self.presets())
        return sorted(getattr(self, kind))


def _raise_unknown(msg: str) -> Any:
    raise UnknownNameError(msg)


def constructor_problem(cls: Any, params: Any) -> str | None:
    """Why ``cls(**params fields, device=, dtype=)`` cannot work, or None. Checked on the signature
    alone, so a broken plugin is named before any model is assembled."""
    if not callable(cls):
        return f"its target is a {type(cls).__name__}, not a class"
    fields = getattr(params, "model_fields", None)
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return None  # not introspectable: instantiate() reports what the call does
    ps = sig.parameters.values()
    if fields is None or any(p.kind is p.VAR_KEYWORD for p in ps):
        return None
    keywords = {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [n for n in [*fields, "device", "dtype"] if n not in keywords]
    if missing:
        return f"its constructor {cls.__name__}{sig} does not accept {', '.join(missing)}"
    required = [p.name for p in ps if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL,) and p.name not in fields
                and p.name not in ("device", "dtype")]
    if required:
        return f"its constructor requires {', '.join(required)}, which its params model does not declare"
    return None


# singular labels of each kind, for messages
KIND_LABELS: dict[str, str] = {
    "cores": "core",
    "backends": "backend",
    "discretizers": "discretizer",
    "stacking_policies": "stacking policy",
    "datasets": "dataset",
    "converters": "converter",
}


def label(kind: str, key: Any) -> str:
    """``core 's4d'``, ``scan backend 'naive'``, ``stacking policy 'periodic'``."""
    if isinstance(key, tuple):
        return f"{key[0]} backend {key[1]!r}"
    return f"{KIND_LABELS.get(kind, kind)} {key!r}"


@dataclass(frozen=True)
class Conflict:
    """One name claimed by several plugins. ``owner`` keeps it (zoo-core itself, or the distribution
    registry.yaml names for the core); with no owner nobody does, whatever the install order."""

    kind: str
    key: Any
    claimants: tuple[Provider, ...]  # sorted by distribution, so messages do not depend on load order
    owner: Provider | None = None
    why: str = ""

    def others(self, prov: Provider) -> list[Provider]:
        return [c for c in self.claimants if c != prov]

    def message(self) -> str:
        """What failed, why, and the fix: for the error of a command that needs the name."""
        who = " and ".join(str(c) for c in self.claimants)
        dists = sorted({c.dist for c in self.claimants})
        return (f"{label(self.kind, self.key)} is registered by {who}; a name claimed by two plugins is used from "
                f"neither (the install order must not decide which code runs). Uninstall the one you do not want "
                f"(pip uninstall {' or pip uninstall '.join(dists)}), or leave it out of an allow-list: "
                f"ZOO_LOAD_PLUGINS=<the plugins you use> (see `zoo plugins`)")

    def summary(self) -> str:
        """One log line: the refusal when nobody keeps the name, else who keeps it over whom."""
        if self.owner is None:
            return self.message()
        others = ", ".join(str(o) for o in self.others(self.owner))
        return (f"{label(self.kind, self.key)} is also registered by {others}; {self.owner} keeps it ({self.why}). "
                "See `zoo plugins`; uninstall the other plugin if you did not mean to install it")

    def note_for(self, prov: Provider) -> str:
        """One line for ``zoo plugins`` about this plugin's part in the conflict."""
        others = ", ".join(str(o) for o in self.others(prov))
        if self.owner is None:
            return f"{label(self.kind, self.key)} is also registered by {others}: used from neither"
        if self.owner == prov:
            return f"{label(self.kind, self.key)} is also registered by {others}: kept here ({self.why})"
        return f"{label(self.kind, self.key)} is also registered by {self.owner}, which keeps it ({self.why}): not used from here"


def check_backend(entry: BackendEntry, problem: Problem, who: str) -> None:
    """Raise BackendUnavailableError with the reason if ``entry`` cannot serve ``problem``."""
    reason = entry.supports(problem)
    if reason is not None:
        raise BackendUnavailableError(f"{entry.op} backend {entry.name!r} cannot serve {who}: {reason}.")


def iter_entries(reg: Registry) -> Iterable[tuple[str, str, Any]]:
    """(kind, name, entry) for every registration."""
    for kind in KINDS:
        for key, entry in getattr(reg, kind).items():
            yield kind, (f"{key[0]}:{key[1]}" if isinstance(key, tuple) else key), entry
