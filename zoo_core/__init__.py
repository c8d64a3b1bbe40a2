"""SSM Zoo core: protocols, plugins, specs, model assembly, kernels, IO and the conformance suite.

Importing ``zoo_core`` does not import torch; the model-building API is loaded on first use.

Layers, lowest first (``zoo_core/LAYERS.md`` has the table ``tests/test_layers.py`` enforces): errors,
protocols -> kernels, discretize, init -> plugin registry, plugins, backends -> spec -> nn (the data
path) -> build, footprint -> io -> factory -> hub -> train -> cli, testing. Lower never imports higher.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    BackendUnavailableError,
    CheckpointError,
    DuplicateNameError,
    PluginLoadError,
    SpecError,
    UnknownNameError,
    ZooError,
)
from .hookspecs import RegisterBackend, RegisterCore, RegisterDiscretizer, RegisterSimple, hookimpl

__version__ = "0.1.0"

_LAZY = {
    "build_model": "zoo_core.build",
    "SequenceModel": "zoo_core.nn.model",
    "save_pretrained": "zoo_core.io.pretrained",
    "load_pretrained": "zoo_core.factory",
    "load_spec": "zoo_core.spec",
    "get_registry": "zoo_core.plugins",
    "rescale_sampling_rate": "zoo_core.nn.model",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zoo_core' has no attribute {name!r}")


__all__ = [
    "BackendUnavailableError",
    "CheckpointError",
    "DuplicateNameError",
    "PluginLoadError",
    "RegisterBackend",
    "RegisterCore",
    "RegisterDiscretizer",
    "RegisterSimple",
    "SpecError",
    "UnknownNameError",
    "ZooError",
    "hookimpl",
    *_LAZY,
]
