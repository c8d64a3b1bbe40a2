"""Errors of the Hub layer. Each says what failed and what to do; none ever contains a token."""

from __future__ import annotations

from ..errors import ConnectionFailedError, PluginError, ZooError


class HubError(ZooError):
    """A reference, repo, revision or token problem, or nothing cached while offline (CLI exit 2)."""

    exit_code = 2


class HubConnectionError(HubError, ConnectionFailedError):
    """The Hub could not be reached, or kept failing, after the retries (CLI exit 5: neither a crash nor a usage error)."""

    exit_code = 5


class HubSettingError(ZooError, ValueError):
    """A ``ZOO_HUB_*`` environment variable has a value that is not allowed (CLI exit 2)."""

    exit_code = 2


class MissingPluginError(PluginError):
    """Pulled weights need a core whose plugin is not installed; the message has the install command."""
