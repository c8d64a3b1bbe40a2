"""Our own entry-point loader on top of pluggy.

Every plugin, zoo-core's own defaults included, is an entry point in the group
``zoo_core.plugins``. A plugin that fails to import, fails pluggy's validation, declares an
incompatible API or raises while registering (any exception, ``SystemExit`` and a
``KeyboardInterrupt`` it raises itself included) is recorded as failed and costs only itself; with
``ZOO_STRICT_PLUGINS=1`` any such failure is fatal. A name two plugins register is used from
neither, whatever the install order (both are listed as ``conflict``), unless one of them is
zoo-core or the distribution ``registry.yaml`` names for that core: that one keeps it. A plugin's
other registrations keep working. Changes a plugin makes to global torch state while it loads are
undone and reported (``plugin_guard``).

What cannot be stopped in-process: a plugin is code you installed. ``os._exit``, killing the
process, monkeypatching zoo-core or torch, threads it starts: ``zoo plugins`` shows which plugins
were imported, and ``ZOO_LOAD_PLUGINS`` (an allow-list) is the defence. A real Ctrl-C during
loading stops the command as usual; a ``KeyboardInterrupt`` the plugin raises without one is its
failure (a SIGINT handler tells the two apart while plugins load, in the main thread).

Environment: ``ZOO_LOAD_PLUGINS=a,b`` loads only those (by entry-point or distribution name;
``''`` loads none), ``ZOO_DISABLE_PLUGIN_AUTOLOAD=1`` loads none; zoo-core's own defaults always
load. ``ZOO_STRICT_PLUGINS=1`` makes failures fatal.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata as md
import logging
import os
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .errors import DuplicateNameError, PluginAPIVersionError, PluginLoadError
from .plugin_conflicts import CORE_DIST, resolve_claims
from .plugin_guard import CtrlC, TorchImportWatch, guarded_torch_state, watching_torch_import
from .plugin_registry import (
    KIND_LABELS,
    OPS,
    BackendEntry,
    CoreEntry,
    DiscretizerEntry,
    Problem,
    Provider,
    Registry,
    SimpleEntry,
    constructor_problem,
)

log = logging.getLogger(__name__)

GROUP = "zoo_core.plugins"
PLUGIN_API = 1
INLINE_DIST = "<inline>"


@dataclass
class PluginInfo:
    """One plugin's load record (what ``zoo plugins`` shows)."""

    name: str
    dist: str
    version: str
    module: str
    status: str = "loaded"  # loaded | conflict (some names lost to another plugin) | failed | disabled
    error: str = ""
    hooks: list[str] = field(default_factory=list)
    provides: dict[str, list[str]] = field(default_factory=dict)
    plugin: Any = field(default=None, repr=False, compare=False)
    imported: bool = False  # its module code ran in this process (whatever its status now)
    conflicts: list[str] = field(default_factory=list)  # one line per name it shares with another plugin
    warnings: list[str] = field(default_factory=list)  # e.g. global torch state it changed (restored)
    error_type: type[PluginLoadError] = field(default=PluginLoadError, repr=False, compare=False)  # raised in strict mode

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dist": self.dist,
            "version": self.version,
            "module": self.module,
            "status": self.status,
            "error": self.error,
            "hooks": self.hooks,
            "provides": self.provides,
            "imported": self.imported,
            "conflicts": self.conflicts,
            "warnings": self.warnings,
            "api_version": PLUGIN_API,
        }


@dataclass(frozen=True)
class PluginSource:
    """Something to load as a plugin: an entry point, or an in-memory object (tests)."""

    name: str
    dist: str
    version: str
    module: str
    load: Callable[[], Any]


def env_flag(name: str) -> bool:
    """An on/off environment variable: 1, true, yes or on (any case) is on."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def strict_mode() -> bool:
    return env_flag("ZOO_STRICT_PLUGINS")


def entry_point_sources() -> list[PluginSource]:
    """All installed entry points of our group, zoo-core's first, then by distribution."""
    out = []
    for ep in md.entry_points(group=GROUP):
        dist = ep.dist.metadata["Name"] if ep.dist is not None else "<unknown>"
        version = ep.dist.version if ep.dist is not None else "?"
        out.append(PluginSource(ep.name, dist, version, ep.value, ep.load))
    return sorted(out, key=lambda s: (s.dist != CORE_DIST, s.dist, s.name))


def _selected(src: PluginSource) -> bool:
    if src.dist == CORE_DIST or src.dist == INLINE_DIST:
        return True  # the essential set is never disabled; inline plugins were asked for explicitly
    if env_flag("ZOO_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    allow = os.environ.get("ZOO_LOAD_PLUGINS")
    if allow is None:
        return True
    wanted = {x.strip() for x in allow.split(",") if x.strip()}
    return src.name in wanted or src.dist in wanted


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return " ".join(text.split())[:500]


def check_api(module: Any) -> None:
    """Raise ``PluginAPIVersionError`` unless the plugin module declares an API this zoo-core speaks."""
    api = getattr(module, "zoo_api", None)
    if api is None:
        raise PluginAPIVersionError(f"declares no plugin API version (set `zoo_api = {PLUGIN_API}` in the plugin module)")
    if isinstance(api, bool) or not (
        isinstance(api, int) or (isinstance(api, (tuple, list, set, frozenset)) and all(type(v) is int for v in api))
    ):
        raise PluginAPIVersionError(f"declares zoo_api = {api!r}; it must be an int (e.g. {PLUGIN_API}) or a tuple of ints")
    ok = api == PLUGIN_API if isinstance(api, int) else PLUGIN_API in api
    if not ok:
        raise PluginAPIVersionError(f"written for zoo plugin API {api!r}, but this zoo-core speaks API {PLUGIN_API}; "
                                    "upgrade the plugin or zoo-core")


_HOOKS = {
    "cores": "zoo_register_cores",
    "backends": "zoo_register_backends",
    "discretizers": "zoo_register_discretizers",
    "stacking_policies": "zoo_register_stacking_policies",
    "datasets": "zoo_register_datasets",
    "converters": "zoo_register_converters",
}

Staged = dict[str, list[tuple[Any, Any]]]


def _capabilities(name: str, params: type, declared: Iterable[str] | None) -> frozenset[str]:
    """A core's capabilities: declared once, on its params model (``CoreParams.capabilities``); an
    explicit ``capabilities=`` must agree with a params model that declares some."""
    own = frozenset(getattr(params, "capabilities", frozenset()))
    if declared is None:
        return own
    given = frozenset(declared)
    if own and given != own:
        raise ValueError(f"core {name!r}: capabilities={sorted(given)} differ from those its params model "
                         f"{params.__name__} declares ({sorted(own)}); declare them once, on the params model")
    return given


def _make_register(kind: str, prov: Provider, out: list[tuple[Any, Any]]) -> Callable[..., None]:
    """A register() for one plugin and kind, appending (key, entry) to ``out``.

    These signatures are the plugin API: ``hookspecs.py`` documents them verbatim (a test compares).
    """

    def register_core(name: str, target: Any, *, params: type, presets: Mapping[str, Mapping[str, Any]],
                      capabilities: Iterable[str] | None = None, card: str = "") -> None:
        if "tiny" not in presets:
            raise ValueError(f"core {name!r} registers no 'tiny' preset (every core needs one for tests)")
        caps = _capabilities(name, params, capabilities)
        if not isinstance(target, str):  # a class given directly: its constructor can be checked now
            problem = constructor_problem(target, params)
            if problem:
                raise ValueError(f"core {name!r}: {problem} (a core's constructor must accept every params field, "
                                 "backend included, plus device and dtype)")
        out.append((name, CoreEntry(name, target, params, dict(presets), caps, card, prov)))

    def register_backend(name: str, op: str, target: Any, *, priority: int = 0, supports: Callable[[Problem], str | None] | None = None,
                         requires: Sequence[str] = (), description: str = "", device_priority: Mapping[str, int] | None = None,
                         aliases: Sequence[str] = (), probe: Callable[[Problem], str | None] | None = None) -> None:
        if op not in OPS:
            raise ValueError(f"backend {name!r}: op must be one of {OPS}, not {op!r}")
        out.append(((op, name), BackendEntry(name, op, target, priority, supports, tuple(requires), description, prov,
                                             dict(device_priority or {}), tuple(aliases), probe)))

    def register_discretizer(name: str, target: Any, *, structures: Iterable[str] = ("diag",), description: str = "") -> None:
        out.append((name, DiscretizerEntry(name, target, frozenset(structures), description, prov)))

    def register_simple(name: str, target: Any, *, description: str = "", **extra: Any) -> None:
        out.append((name, SimpleEntry(name, target, description, prov, extra)))

    by_kind: dict[str, Callable[..., None]] = {"cores": register_core, "backends": register_backend,
                                               "discretizers": register_discretizer}
    return by_kind.get(kind, register_simple)


def _call_hooks(pm: pluggy.PluginManager, info: PluginInfo, plugin: Any) -> Staged:
    """Call each registration hook of one plugin on its own; raise on the plugin's first error."""
    prov = Provider(info.name, info.dist, info.version)
    staged: Staged = {}
    for kind, hook in _HOOKS.items():
        impls = [i for i in getattr(pm.hook, hook).get_hookimpls() if i.plugin is plugin]
        for impl in impls:
            items: list[tuple[Any, Any]] = []
            impl.function(_make_register(kind, prov, items))
            staged.setdefault(kind, []).extend(items)
            info.hooks.append(hook)
    for kind, items in staged.items():
        keys = [key for key, _ in items]
        twice = sorted({str(k) for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"registers {KIND_LABELS[kind]} {', '.join(twice)} more than once")
    return staged


def _fail(info: PluginInfo, ctrl_c: CtrlC, what: str, exc: BaseException) -> None:
    """Record a plugin's exception as its failure; the user's own Ctrl-C still stops the command."""
    if ctrl_c.is_users(exc):
        raise exc
    info.status, info.error = "failed", f"{what}: {_short(exc)}"
    info.hooks.clear()


def _load_one(pm: pluggy.PluginManager, src: PluginSource, ctrl_c: CtrlC) -> tuple[PluginInfo, Any]:
    """Import one plugin and check its API and hooks; every exception is the plugin's (BaseException
    included: SystemExit or KeyboardInterrupt raised by its code must not end the command)."""
    info = PluginInfo(src.name, src.dist, src.version, src.module)
    try:
        info.imported = True
        plugin = src.load()
    except BaseException as exc:  # noqa: BLE001 - a plugin's import may raise anything
        _fail(info, ctrl_c, "import failed", exc)
        return info, None
    try:
        check_api(plugin)
    except PluginAPIVersionError as exc:  # recorded as the failure reason, with the error's name
        info.status, info.error, info.error_type = "failed", f"{type(exc).__name__}: {exc}", type(exc)
        return info, None
    try:
        pm.register(plugin, name=f"{src.dist}:{src.name}")
        pm.check_pending()
    except BaseException as exc:  # noqa: BLE001 - pluggy validates the plugin's own attributes
        if pm.is_registered(plugin):
            pm.unregister(plugin)
        _fail(info, ctrl_c, "invalid hooks", exc)
        return info, None
    return info, plugin


def _stage(pm: pluggy.PluginManager, src: PluginSource, ctrl_c: CtrlC, watch: TorchImportWatch) -> tuple[PluginInfo, Staged | None]:
    """Import and register one plugin under guard: its exceptions and its changes to global torch
    state are recorded on its PluginInfo and cost nobody else."""
    changes: list[str] = []
    staged: Staged | None = None
    with guarded_torch_state(watch, changes):
        info, plugin = _load_one(pm, src, ctrl_c)
        if plugin is not None:
            try:
                staged = _call_hooks(pm, info, plugin)
                info.plugin = plugin
            except BaseException as exc:  # noqa: BLE001 - the plugin's registration code
                _fail(info, ctrl_c, "registration raised", exc)
                pm.unregister(plugin)
    for change in changes:
        text = f"changed torch's {change} while loading; restored (a plugin must not change global torch state)"
        info.warnings.append(text)
        log.warning("plugin %r (%s %s) %s", info.name, info.dist, info.version, text)
    return info, staged


def _check_fatal(info: PluginInfo, strict: bool) -> None:
    """zoo-core's own plugins must load; with ZOO_STRICT_PLUGINS every plugin must."""
    if info.status not in ("failed", "conflict") or not (strict or info.dist == CORE_DIST):
        return
    why = " (fatal because ZOO_STRICT_PLUGINS is set)" if info.dist != CORE_DIST else ""
    if info.status == "conflict":
        raise DuplicateNameError(f"plugin {info.name!r} from {info.dist} {info.version} conflicts with another: "
                                 f"{'; '.join(info.conflicts)}. Uninstall one of them, or restrict loading with "
                                 f"ZOO_LOAD_PLUGINS{why}")
    raise info.error_type(f"plugin {info.name!r} from {info.dist} {info.version} failed to load: {info.error}{why}")


def load_registry(sources: Sequence[PluginSource] | None = None, *, strict: bool | None = None) -> Registry:
    """Load plugins into a fresh Registry.

    Every plugin is imported and registers on its own (a failure of any kind costs only it), then
    all registrations are committed at once so a name claimed twice is settled the same way
    whatever the install order (``_owner``).

    Args:
        sources: what to load; defaults to the installed entry points of ``zoo_core.plugins``.
        strict: make any plugin failure or conflict fatal; defaults to ``ZOO_STRICT_PLUGINS``.
    """
    strict = strict_mode() if strict is None else strict
    if sources is None:
        sources = entry_point_sources()
        if not any(s.dist == CORE_DIST for s in sources):
            raise PluginLoadError(
                "zoo-core's own entry points were not found: zoo-core is not installed in this "
                "environment (running from a source tree?). Install it with: pip install -e ."
            )
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    reg = Registry()
    staged: list[tuple[PluginInfo, Staged]] = []
    with watching_torch_import() as watch, CtrlC().installed() as ctrl_c:
        for src in sources:
            if not _selected(src):
                reg.plugins.append(PluginInfo(src.name, src.dist, src.version, src.module, status="disabled"))
                continue
            info, items = _stage(pm, src, ctrl_c, watch)
            reg.plugins.append(info)
            if items is not None:
                staged.append((info, items))
            _check_fatal(info, strict)
    resolve_claims(reg, staged)
    for info in reg.plugins:
        _check_fatal(info, strict)
    for record in reg.conflicts.values():
        log.warning("%s", record.summary())
    return reg


def call_command_hooks(cli: Any, reg: Registry | None = None) -> list[str]:
    """Let each loaded plugin add CLI subcommands; one that raises loses only its own commands."""
    problems = []
    for info in (reg or get_registry()).plugins:
        fn = getattr(info.plugin, "zoo_register_commands", None)
        if info.status not in ("loaded", "conflict") or fn is None:
            continue
        try:
            fn(cli)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a plugin must not end the command
            if isinstance(exc, KeyboardInterrupt):
                raise  # outside the guarded load a Ctrl-C cannot be told apart: the user's wins
            problems.append(f"plugin {info.name!r} ({info.dist} {info.version}) failed to add commands: {_short(exc)}")
    return problems


def inline_source(name: str, plugin: Any, *, dist: str = INLINE_DIST, version: str = "0") -> PluginSource:
    """A plugin object as a load source, for tests and notebooks."""
    return PluginSource(name, dist, version, getattr(plugin, "__name__", repr(plugin)), lambda: plugin)


def failure_details(exc: BaseException) -> str:
    """The traceback of a plugin failure, for ``--verbose`` output."""
    return "".join(traceback.format_exception(exc))


_DEFAULT: Registry | None = None
_ACTIVE: contextvars.ContextVar[Registry | None] = contextvars.ContextVar("zoo_registry", default=None)


def get_registry() -> Registry:
    """The registry in use: the one ``using_registry`` set, else the process-wide one of the
    installed plugins, loaded on first use."""
    global _DEFAULT
    active = _ACTIVE.get()
    if active is not None:
        return active
    if _DEFAULT is None:
        _DEFAULT = load_registry()
    return _DEFAULT


@contextlib.contextmanager
def using_registry(reg: Registry | None) -> Iterator[None]:
    """Make ``reg`` what ``get_registry()`` returns inside the block (None: no change), so cores
    built there resolve their backends and discretizers in the same registry as their spec."""
    if reg is None:
        yield
        return
    token = _ACTIVE.set(reg)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def set_registry(reg: Registry | None) -> None:
    """Replace (or with None, reset) the process-wide registry; for tests."""
    global _DEFAULT
    _DEFAULT = reg
