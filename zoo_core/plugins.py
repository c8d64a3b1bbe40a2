"""Our own entry-point loader on top of pluggy.

Every plugin, zoo-core's own defaults included, is an entry point in the group
``zoo_core.plugins``. A plugin that fails to import, fails pluggy's validation, declares an
incompatible API or raises while registering is recorded as failed and costs only itself; with
``ZOO_STRICT_PLUGINS=1`` any such failure is fatal. Two plugins registering one name is always an
error naming both.

Environment: ``ZOO_LOAD_PLUGINS=a,b`` loads only those (by entry-point or distribution name;
``''`` loads none), ``ZOO_DISABLE_PLUGIN_AUTOLOAD=1`` loads none; zoo-core's own defaults always
load. ``ZOO_STRICT_PLUGINS=1`` makes failures fatal.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata as md
import os
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .errors import DuplicateNameError, PluginLoadError
from .registry import (
    OPS,
    BackendEntry,
    CoreEntry,
    DiscretizerEntry,
    Provider,
    Registry,
    SimpleEntry,
)

GROUP = "zoo_core.plugins"
PLUGIN_API = 1
CORE_DIST = "zoo-core"
INLINE_DIST = "<inline>"


@dataclass
class PluginInfo:
    """One plugin's load record (what ``zoo plugins`` shows)."""

    name: str
    dist: str
    version: str
    module: str
    status: str = "loaded"  # loaded | failed | disabled
    error: str = ""
    hooks: list[str] = field(default_factory=list)
    provides: dict[str, list[str]] = field(default_factory=dict)
    plugin: Any = field(default=None, repr=False, compare=False)

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


def _api_error(module: Any) -> str | None:
    api = getattr(module, "zoo_api", None)
    if api is None:
        return f"declares no plugin API version (set `zoo_api = {PLUGIN_API}` in the plugin module)"
    if isinstance(api, bool) or not (
        isinstance(api, int) or (isinstance(api, (tuple, list, set, frozenset)) and all(type(v) is int for v in api))
    ):
        return f"declares zoo_api = {api!r}; it must be an int (e.g. {PLUGIN_API}) or a tuple of ints"
    ok = api == PLUGIN_API if isinstance(api, int) else PLUGIN_API in api
    if not ok:
        return f"written for zoo plugin API {api!r}, but this zoo-core speaks API {PLUGIN_API}; upgrade the plugin or zoo-core"
    return None


_HOOKS = {
    "cores": "zoo_register_cores",
    "backends": "zoo_register_backends",
    "discretizers": "zoo_register_discretizers",
    "stacking_policies": "zoo_register_stacking_policies",
    "datasets": "zoo_register_datasets",
    "converters": "zoo_register_converters",
}


def _make_register(kind: str, prov: Provider, out: list[tuple[Any, Any]]) -> Callable[..., None]:
    """A register() for one plugin and kind, appending (key, entry) to ``out``."""

    def register_core(name: str, target: Any, *, params: type, presets: dict, capabilities: Iterable[str] = (), card: str = "") -> None:
        if "tiny" not in presets:
            raise ValueError(f"core {name!r} registers no 'tiny' preset (every core needs one for tests)")
        out.append((name, CoreEntry(name, target, params, dict(presets), frozenset(capabilities), card, prov)))

    def register_backend(name: str, op: str, target: Any, *, priority: int = 0, supports: Callable | None = None,
                         requires: Sequence[str] = (), description: str = "", device_priority: dict[str, int] | None = None) -> None:
        if op not in OPS:
            raise ValueError(f"backend {name!r}: op must be one of {OPS}, not {op!r}")
        out.append(((op, name), BackendEntry(name, op, target, priority, supports, tuple(requires), description, prov,
                                             dict(device_priority or {}))))

    def register_discretizer(name: str, target: Any, *, structures: Iterable[str] = ("diag",), description: str = "") -> None:
        out.append((name, DiscretizerEntry(name, target, frozenset(structures), description, prov)))

    def register_simple(name: str, target: Any, *, description: str = "", **extra: Any) -> None:
        out.append((name, SimpleEntry(name, target, description, prov, extra)))

    return {"cores": register_core, "backends": register_backend, "discretizers": register_discretizer}.get(kind, register_simple)


def _call_hooks(pm: pluggy.PluginManager, info: PluginInfo, plugin: Any) -> dict[str, list[tuple[Any, Any]]]:
    """Call each registration hook of one plugin on its own; raise on the plugin's first error."""
    prov = Provider(info.name, info.dist, info.version)
    staged: dict[str, list[tuple[Any, Any]]] = {}
    for kind, hook in _HOOKS.items():
        impls = [i for i in getattr(pm.hook, hook).get_hookimpls() if i.plugin is plugin]
        for impl in impls:
            items: list[tuple[Any, Any]] = []
            impl.function(_make_register(kind, prov, items))
            staged.setdefault(kind, []).extend(items)
            info.hooks.append(hook)
    return staged


def _commit(reg: Registry, info: PluginInfo, staged: dict[str, list[tuple[Any, Any]]]) -> None:
    """Add one plugin's registrations, all or nothing; a name taken already is a DuplicateNameError."""
    for kind, items in staged.items():
        table = getattr(reg, kind)
        for key, entry in items:
            if key in table:
                other = table[key].provider
                label = f"{key[0]} backend {key[1]!r}" if isinstance(key, tuple) else f"{kind[:-1].replace('_', ' ')} {key!r}"
                raise DuplicateNameError(
                    f"{label} is registered twice: by {other} and by {entry.provider}. "
                    "Uninstall one of them, or restrict loading with ZOO_LOAD_PLUGINS."
                )
    for kind, items in staged.items():
        table = getattr(reg, kind)
        for key, entry in items:
            table[key] = entry
            info.provides.setdefault(kind, []).append(key if isinstance(key, str) else f"{key[0]}:{key[1]}")


def _load_one(pm: pluggy.PluginManager, src: PluginSource) -> tuple[PluginInfo, Any]:
    info = PluginInfo(src.name, src.dist, src.version, src.module)
    try:
        plugin = src.load()
    except BaseException as exc:  # a plugin's import may raise anything, SystemExit included
        if isinstance(exc, KeyboardInterrupt):
            raise
        info.status, info.error = "failed", f"import failed: {_short(exc)}"
        return info, None
    api = _api_error(plugin)
    if api:
        info.status, info.error = "failed", api
        return info, None
    pm_name = f"{src.dist}:{src.name}"
    try:
        pm.register(plugin, name=pm_name)
        pm.check_pending()
    except Exception as exc:
        if pm.is_registered(plugin):
            pm.unregister(plugin)
        info.status, info.error = "failed", f"invalid hooks: {_short(exc)}"
        return info, None
    return info, plugin


def load_registry(sources: Sequence[PluginSource] | None = None, *, strict: bool | None = None) -> Registry:
    """Load plugins into a fresh Registry.

    Args:
        sources: what to load; defaults to the installed entry points of ``zoo_core.plugins``.
        strict: make any plugin failure fatal; defaults to ``ZOO_STRICT_PLUGINS``.
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
    for src in sources:
        if not _selected(src):
            reg.plugins.append(PluginInfo(src.name, src.dist, src.version, src.module, status="disabled"))
            continue
        info, plugin = _load_one(pm, src)
        if plugin is not None:
            try:
                staged = _call_hooks(pm, info, plugin)
            except Exception as exc:
                info.status, info.error = "failed", f"registration raised: {_short(exc)}"
                info.hooks.clear()
                pm.unregister(plugin)
            else:
                try:
                    _commit(reg, info, staged)
                    info.plugin = plugin
                except DuplicateNameError as exc:
                    if strict:
                        raise
                    info.status, info.error = "failed", str(exc)
                    info.hooks.clear()
                    pm.unregister(plugin)
        reg.plugins.append(info)
        if info.status == "failed" and (strict or src.dist == CORE_DIST):
            raise PluginLoadError(
                f"plugin {src.name!r} from {src.dist} {src.version} failed to load: {info.error}"
                + ("" if src.dist == CORE_DIST else " (fatal because ZOO_STRICT_PLUGINS is set)")
            )
    return reg


def call_command_hooks(cli: Any, reg: Registry | None = None) -> list[str]:
    """Let each loaded plugin add CLI subcommands; one that raises loses only its own commands."""
    problems = []
    for info in (reg or get_registry()).plugins:
        fn = getattr(info.plugin, "zoo_register_commands", None)
        if info.status != "loaded" or fn is None:
            continue
        try:
            fn(cli)
        except Exception as exc:
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
