"""Typed exceptions. Each says what failed, why, and how to fix it.

CLI exit codes: 2 for usage / spec / input errors, 3 for integrity errors (weights files),
4 for plugin errors, 5 for connection failures (the Hub unreachable or failing after retries);
1 is left to crashes.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def suggest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Closest names to `name` among `candidates`, best first."""
    return difflib.get_close_matches(name, sorted(set(candidates)), n=n, cutoff=0.5)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' did you mean X?' or '' when nothing is close."""
    close = suggest(name, candidates)
    if not close:
        return ""
    return " did you mean " + " or ".join(repr(c) for c in close) + "?"


class ZooError(Exception):
    """Base class of every error the zoo raises on purpose."""

    exit_code = 1


class SpecError(ZooError, ValueError):
    """A spec (YAML file or dict) is malformed or names something that does not exist."""

    exit_code = 2
    # (location, line, column, message) per problem, set where a spec's errors are formatted
    # (zoo_core.spec.errors, the YAML loader) so callers and tests read them without parsing text.
    errors: list[tuple[tuple[str | int, ...], int | None, int | None, str]]


class UsageError(ZooError, ValueError):
    """A command was given arguments it cannot act on (a malformed name, a folder that is in the way)."""

    exit_code = 2


class UnknownNameError(ZooError, KeyError):
    """A registry lookup failed; the message lists close names."""

    exit_code = 2

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class BackendUnavailableError(ZooError, ValueError):
    """A kernel backend cannot serve a core (missing package, wrong structure, device, ...)."""

    exit_code = 2


class CheckpointError(ZooError, ValueError):
    """A weights file or saved folder is corrupt, incomplete or does not fit the model."""

    exit_code = 3


class ConnectionFailedError(ZooError, ConnectionError):
    """A remote service (the Hub) could not be reached or kept failing after retries: exit 5, not a crash."""

    exit_code = 5


class PluginError(ZooError, RuntimeError):
    """Base class of plugin loading problems."""

    exit_code = 4


class PluginLoadError(PluginError):
    """A plugin failed to import or to register (named by distribution and version)."""


class ProviderMismatchError(PluginError):
    """Weights saved with a core from one distribution, now registered by another (an impostor?)."""


class DuplicateNameError(PluginError):
    """Two plugins registered the same name."""


class NameConflictError(DuplicateNameError):
    """A command needs a name that two plugins claim, so neither provides it (both named)."""


class PluginAPIVersionError(PluginLoadError):
    """A plugin declares no zoo plugin API, or one this zoo-core does not speak (``zoo_api``): raised by
    ``zoo_core.plugins.check_api`` and recorded as the plugin's failure (fatal in strict mode)."""


class CoreArgumentError(ZooError, ValueError):
    """A core's constructor argument breaks its params model's rules (range, type, consistency) or
    names a component that cannot serve it: the message names the core and the argument."""

    exit_code = 2


class NotCausalError(ZooError, NotImplementedError):
    """A non-causal core or block was asked to stream (step, init_state, or a carried state)."""

    exit_code = 2
