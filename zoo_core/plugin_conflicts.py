"""Who gets a name that several plugins register: settled once all plugins are staged, so the
outcome never depends on install or load order.

zoo-core's own registrations win; a core goes to the distribution ``registry.yaml``'s ``plugins:``
section names for it; otherwise nobody gets the name and every use of it is refused naming all
claimants (``Registry.refuse_conflict``). Each claimant's PluginInfo records its part (``conflicts``)
and a claimant that lost a name has status ``conflict``; its other names stay registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .plugin_catalogue import plugin_owners
from .plugin_registry import Conflict, Registry

CORE_DIST = "zoo-core"


def _owner(kind: str, key: Any, claims: list[tuple[Any, Any]], owners: Callable[[], dict[str, str]]) -> tuple[Any, str]:
    """The claim that keeps a contested name and why, or (None, ""): zoo-core's own registrations,
    then for a core the distribution the catalogue names for it; never the load order."""
    core_claims = [c for c in claims if c[1].provider.dist == CORE_DIST]
    if len(core_claims) == 1:
        return core_claims[0], "zoo-core's own"
    if kind == "cores" and not core_claims:
        dist = owners().get(key)
        named = [c for c in claims if c[1].provider.dist == dist]
        if len(named) == 1:
            return named[0], f"registry.yaml names {dist} for it"
    return None, ""


def resolve_claims(reg: Registry, staged: list[tuple[Any, dict[str, list[tuple[Any, Any]]]]]) -> None:
    """Commit every registration; a name claimed by several plugins goes to its owner (``_owner``)
    or to nobody, and each claimant records the conflict. Order independent by construction."""
    claims: dict[tuple[str, Any], list[tuple[Any, Any]]] = {}
    for info, items in staged:
        for kind, pairs in items.items():
            for key, entry in pairs:
                claims.setdefault((kind, key), []).append((info, entry))
    cache: dict[str, dict[str, str]] = {}

    def owners() -> dict[str, str]:  # registry.yaml is read only when a core is contested, and once
        if "owners" not in cache:
            cache["owners"] = plugin_owners().owners
        return cache["owners"]

    for (kind, key), found in claims.items():
        winner, why = (found[0], "") if len(found) == 1 else _owner(kind, key, found, owners)
        if len(found) > 1:
            provs = tuple(sorted((e.provider for _, e in found), key=lambda p: (p.dist, p.plugin)))
            record = Conflict(kind, key, provs, winner[1].provider if winner else None, why)
            reg.conflicts[(kind, key)] = record
            for info, entry in found:
                info.conflicts.append(record.note_for(entry.provider))
                if winner is None or winner[0] is not info:
                    info.status = "conflict"
        if winner is not None:
            info, entry = winner
            getattr(reg, kind)[key] = entry
            info.provides.setdefault(kind, []).append(key if isinstance(key, str) else f"{key[0]}:{key[1]}")
