"""Pretrained models: references, the catalogue (``registry.yaml``), model cards, push and pull.

Importing this package imports neither torch nor huggingface_hub (so ``HF_*`` variables can still
be set); the functions below load them on first use.
"""

from __future__ import annotations

from typing import Any

from .errors import HubConnectionError, HubError, MissingPluginError
from .refs import ModelRef, parse_ref

_LAZY = {
    "create_model": "zoo_core.hub.create",
    "pull": "zoo_core.hub.pulling",
    "pull_hub": "zoo_core.hub.pulling",
    "push_to_hub": "zoo_core.hub.pushing",
    "PullResult": "zoo_core.hub.pulling",
    "PushResult": "zoo_core.hub.pushing",
    "render_card": "zoo_core.hub.card",
    "load_catalogue": "zoo_core.hub.catalogue",
    "check_catalogue": "zoo_core.hub.catalogue",
    "Catalogue": "zoo_core.hub.catalogue",
    "PretrainedEntry": "zoo_core.hub.catalogue",
    "Metric": "zoo_core.hub.catalogue",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zoo_core.hub' has no attribute {name!r}")


__all__ = ["HubConnectionError", "HubError", "MissingPluginError", "ModelRef", "parse_ref", *_LAZY]  # noqa: PLE0604
