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

    ``register(name, target, *, params, presets, capabilities, card="")`` where ``target`` is the
    core class or ``"module:Class"``, ``params`` a pydantic model of the constructor's keyword
    arguments and ``presets`` a mapping of preset name to params (it must include ``"tiny"``).
    """


@hookspec
def zoo_register_discretizers(register: Callable[..., None]) -> None:
    """Register discretizers: ``register(name, target, *, structures, description="")``."""


@hookspec
def zoo_register_backends(register: Callable[..., None]) -> None:
    """Register kernel backends.

    ``register(name, op, target, *, priority=0, supports=None, requires=(), description="")``;
    ``op`` is ``"kernel"``, ``"conv"`` or ``"scan"``; ``supports(problem) -> str | None`` returns
    the reason it cannot serve a problem (``None`` means it can).
    """


@hookspec
def zoo_register_stacking_policies(register: Callable[..., None]) -> None:
    """Register stacking policies: ``register(name, policy_cls, *, description="")``."""


@hookspec
def zoo_register_datasets(register: Callable[..., None]) -> None:
    """Register datasets: ``register(name, target, *, description="", extra=None)``."""


@hookspec
def zoo_register_converters(register: Callable[..., None]) -> None:
    """Register foreign-checkpoint converters: ``register(name, target, *, description="")``."""


@hookspec
def zoo_register_commands(cli: Any) -> None:
    """Add ``zoo`` subcommands; ``cli`` is the argparse subparsers object."""
