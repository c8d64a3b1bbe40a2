"""``registry.yaml``'s ``plugins:`` and ``planned:`` sections: which distribution provides which core.

``registry.yaml`` is the one catalogue (``zoo_core.hub.catalogue`` reads its ``pretrained:`` section);
this module sits low, beside the plugin registry, so install hints and conflict settling read it
without importing the hub, spec or torch. Without a catalogue (zoo-core installed without its
checkout and no ``$ZOO_REGISTRY``) there are no owners to name: hints say so instead.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("zoo_core.plugins")


def default_path() -> Path | None:
    """``$ZOO_REGISTRY``, else the ``registry.yaml`` of the checkout zoo_core runs from."""
    env = os.environ.get("ZOO_REGISTRY")
    if env:
        return Path(env)
    candidate = Path(__file__).resolve().parents[1] / "registry.yaml"
    return candidate if candidate.is_file() else None


@dataclass(frozen=True)
class PluginOwners:
    """core name -> the distribution that provides it, and the distributions not released yet."""

    owners: dict[str, str]
    planned: frozenset[str]


def _read(path: Path | None) -> dict[str, Any]:
    """The parsed catalogue, or {} (warned) when it is missing or unreadable: hints are a courtesy."""
    if path is None or not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        log.warning("cannot read the plugin catalogue %s (%s); no plugin is named for cores not installed", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _cores_of(section: Any) -> dict[str, str]:
    """core -> dist for one section (``plugins:`` or ``planned:``), skipping malformed entries."""
    owners: dict[str, str] = {}
    for dist, entry in section.items() if isinstance(section, dict) else ():
        for core in entry.get("cores", []) if isinstance(entry, dict) else []:
            owners[str(core)] = str(dist)
    return owners


def plugin_owners(path: Path | None = None) -> PluginOwners:
    """Who provides each core, per ``registry.yaml`` (``default_path()`` unless ``path`` is given)."""
    data = _read(path if path is not None else default_path())
    planned = _cores_of(data.get("planned"))
    return PluginOwners({**planned, **_cores_of(data.get("plugins"))}, frozenset(planned.values()))
