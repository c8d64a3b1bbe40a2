"""The zoo's hook specifications: register-callback hooks, one per kind of component.

Each hook receives a ``register`` callable bound to the calling plugin, so every registration
carries its provenance (distribution and version). Registration is metadata only: model code is
named by a ``"module:attr"`` target (or given directly) and imported when a model is built.

The ``register`` callables are typed (``RegisterCore``, ``RegisterBackend``, ``RegisterDiscretizer``,
``RegisterSimple``), so a plugin's hook implementations type-check without ``type: ignore``::

    @hookimpl
    def zoo_register_cores(register: RegisterCore) -> None:
        register("mycore", "my_pkg.core:MyCore", params=MyParams, presets={"tiny": {"d_state": 4}})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import pluggy

PROJECT = "zoo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class RegisterCore(Protocol):
    """The ``register`` of ``zoo_register_cores``."""

    def __call__(self, name: str, target: Any, *, params: type, presets: Mapping[str, Mapping[str, Any]],
                 capabilities: Iterable[str] | None = None, card: str = "") -> None: ...


class RegisterBackend(Protocol):
    """The ``register`` of ``zoo_register_backends``; ``supports`` takes a ``zoo_core.plugin_registry.Problem``."""

    def __call__(self, name: str, op: str, target: Any, *, priority: int = 0, supports: Callable[[Any], str | None] | None = None,
                 requires: Sequence[str] = (), description: str = "", device_priority: Mapping[str, int] | None = None,
                 aliases: Sequence[str] = (), probe: Callable[[Any], str | None] | None = None) -> None: ...


class RegisterDiscretizer(Protocol):
    """The ``register`` of ``zoo_register_discretizers``."""

    def __call__(self, name: str, target: Any, *, structures: Iterable[str] = ("diag",), description: str = "") -> None: ...


class RegisterSimple(Protocol):
    """The ``register`` of stacking policies, datasets and converters."""

    def __call__(self, name: str, target: Any, *, description: str = "", **extra: Any) -> None: ...


@hookspec
def zoo_register_cores(register: RegisterCore) -> None:
    """Register SSM cores.

    ``register(name, target, *, params, presets, capabilities=None, card='')`` where ``target`` is
    the core class or ``"module:Class"``, ``params`` a pydantic model (a ``CoreParams`` subclass)
    of the constructor's keyword arguments, ``presets`` a mapping of preset name to params (it must
    include ``"tiny"``), ``capabilities`` names such as ``"causal"``, ``"step"``, ``"lti"`` (None:
    those the params model declares in ``CoreParams.capabilities``, where they belong) and ``card``
    a description. The constructor must accept every params field (``backend`` included) and
    ``device``/``dtype``: checked at registration for a class, when the core is built otherwise.
    """


@hookspec
def zoo_register_discretizers(register: RegisterDiscretizer) -> None:
    """Register discretizers: ``register(name, target, *, structures=('diag',), description='')``;
    ``structures`` are the state structures it handles (``"diag"``, ``"dplr"``, ...)."""


@hookspec
def zoo_register_backends(register: RegisterBackend) -> None:
    """Register kernel backends.

    ``register(name, op, target, *, priority=0, supports=None, requires=(), description='', device_priority=None,
    aliases=(), probe=None)``;
    ``op`` is ``"kernel"``, ``"conv"`` or ``"scan"``; ``target`` implements the op's Protocol
    (``zoo_core.protocols.KernelOp``, ``ConvOp``, ``ScanOp``, ``SelectiveScanOp``);
    ``supports(problem) -> str | None`` returns the reason it cannot serve a problem (``None`` means
    it can; it looks at the problem only and imports nothing optional); ``requires`` names importable
    packages it needs; ``probe(problem) -> str | None``, asked only once ``supports`` and ``requires``
    pass, is a run-time check (a kernel compiles, a library passes a self-test) whose reason makes
    ``auto`` announce the slower backend it takes instead; ``device_priority`` maps a device type
    to the priority ``auto`` uses there; ``aliases`` are other names a spec may use for it (a name
    another backend of the op already has is used for this one only where that one cannot serve).
    """


@hookspec
def zoo_register_stacking_policies(register: RegisterSimple) -> None:
    """Register stacking policies: ``register(name, target, *, description='', **extra)``;
    ``target`` is the policy class or ``"module:Class"``."""


@hookspec
def zoo_register_datasets(register: RegisterSimple) -> None:
    """Register datasets: ``register(name, target, *, description='', **extra)``; ``target`` is
    the loader or ``"module:function"``; extra keywords are the entry's metadata: the
    ``DatasetInfo`` fields (``task=``, ``channels=``, ``classes=``, ``length=``, ``sizes=``, ...)
    and ``params=``, the keyword arguments the loader is called with."""


@hookspec
def zoo_register_converters(register: RegisterSimple) -> None:
    """Register foreign-checkpoint converters: ``register(name, target, *, description='', **extra)``;
    ``target`` has ``detect(source)`` and ``convert(source)``."""


@hookspec
def zoo_register_commands(cli: Any) -> None:
    """Add ``zoo`` subcommands; ``cli`` is the argparse subparsers object."""
