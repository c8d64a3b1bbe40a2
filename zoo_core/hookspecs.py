"""The zoo's hook specifications: register-callback hooks, one per kind of component.

Each hook receives a ``register`` callable bound to the calling plugin, so every registration
carries its provenance (distribution and version). Registration is metadata only: model code is
named by a ``"module:attr"`` target (or given directly) and imported when a model is built.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

PROJECT = "zoo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def zoo_register_cores(register: Callable[..., None]) -> None:
    """Register SSM cores.

    ``register(name, target, *, params, presets, capabilities=(), card='')`` where ``target`` is
    the core class or ``"module:Class"``, ``params`` a pydantic model (a ``CoreParams`` subclass)
    of the constructor's keyword arguments, ``presets`` a mapping of preset name to params (it must
    include ``"tiny"``), ``capabilities`` names such as ``"step"``, ``"lti"`` and ``card`` a
    description. The constructor must accept every params field (``backend`` included) and
    ``device``/``dtype``: checked at registration for a class, when the core is built otherwise.
    """


@hookspec
def zoo_register_discretizers(register: Callable[..., None]) -> None:
    """Register discretizers: ``register(name, target, *, structures=('diag',), description='')``;
    ``structures`` are the state structures it handles (``"diag"``, ``"dplr"``, ...)."""


@hookspec
def zoo_register_backends(register: Callable[..., None]) -> None:
    """Register kernel backends.

    ``register(name, op, target, *, priority=0, supports=None, requires=(), description='', device_priority=None)``;
    ``op`` is ``"kernel"``, ``"conv"`` or ``"scan"``; ``supports(problem) -> str | None`` returns
    the reason it cannot serve a problem (``None`` means it can); ``requires`` names importable
    packages it needs; ``device_priority`` maps a device type to the priority ``auto`` uses there.
    """


@hookspec
def zoo_register_stacking_policies(register: Callable[..., None]) -> None:
    """Register stacking policies: ``register(name, target, *, description='', **extra)``;
    ``target`` is the policy class or ``"module:Class"``."""


@hookspec
def zoo_register_datasets(register: Callable[..., None]) -> None:
    """Register datasets: ``register(name, target, *, description='', **extra)``; ``target`` is
    the loader or ``"module:function"``; extra keywords are the entry's metadata: the
    ``DatasetInfo`` fields (``task=``, ``channels=``, ``classes=``, ``length=``, ``sizes=``, ...)
    and ``params=``, the keyword arguments the loader is called with."""


@hookspec
def zoo_register_converters(register: Callable[..., None]) -> None:
    """Register foreign-checkpoint converters: ``register(name, target, *, description='', **extra)``;
    ``target`` has ``detect(source)`` and ``convert(source)``."""


@hookspec
def zoo_register_commands(cli: Any) -> None:
    """Add ``zoo`` subcommands; ``cli`` is the argparse subparsers object."""
