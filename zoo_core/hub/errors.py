"""Errors of the Hub layer. Each says what failed and what to do; none ever contains a token."""

from __future__ import annotations

from ..errors import PluginError, ZooError


class HubError(ZooError):
    """A reference, repo, revision or token problem, or nothing cached while offline (CLI exit 2)."""

    exit_code = 2


class HubConnectionError(HubError):
    """The Hub could not be reached, or kept failing, after the retries (CLI exit 1)."""

    exit_code = 1


class MissingPluginError(PluginError):
    """Pulled weights need a core whose plugin is not installed; the message has the install command."""
