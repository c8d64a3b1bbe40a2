"""Models from saved folders: check a folder against the spec it stores, then build and load it.

Above ``build`` (it builds), ``footprint`` (the meta-device shape check) and ``io`` (files to tensors):
``io`` reads and writes folders without ever building a model, and the hub resolves references to
folders and hands them here (``zoo_core.hub.create_model``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .build import build_model
from .errors import CheckpointError, PluginError, ZooError
from .footprint import expected_tensors, meta_model
from .io.pretrained import WEIGHTS, _read_info, check_provider, load_weights, read_folder
from .io.safetensors_check import DTYPES, TensorInfo
from .io.strict import compare_state
from .plugins import get_registry
from .spec import Spec, load_spec


def _stored_spec(info: Mapping[str, Any], registry: Any, source: str) -> Spec:
    try:
        return load_spec(info["spec"], registry=registry)
    except PluginError:
        raise  # e.g. two plugins claim the core: a plugin problem (exit 4), not the file's
    except ZooError as exc:
        raise CheckpointError(f"{source}: the stored spec cannot be built here: {exc}") from None


def _check_shapes(spec: Spec, infos: Mapping[str, TensorInfo], registry: Any, source: str) -> None:
    """The stored spec's tensors (a meta-device build: no memory) against the header's, before any
    real build: a small file whose spec claims a huge model is refused here."""
    try:
        expected = expected_tensors(meta_model(spec, registry=registry))
    except ZooError as exc:
        raise CheckpointError(f"{source}: the stored spec cannot be built here: {exc}") from None
    stored = {n: _Stored(i.shape, DTYPES[i.dtype]) for n, i in infos.items()}
    try:
        compare_state(expected, stored, source=source)
    except CheckpointError as exc:
        want = sum(math.prod(s) for s, _ in expected.values())
        have = sum(math.prod(i.shape) for i in infos.values())
        raise CheckpointError(f"the spec stored in the file describes {want:,} values in {len(expected)} tensors, "
                              f"the file holds {have:,} in {len(infos)}: {exc}") from None


@dataclass(frozen=True)
class _Stored:
    shape: tuple[int, ...]
    dtype: torch.dtype


def _checked(directory: str | os.PathLike[str], *, registry: Any, trust_provider: bool) -> tuple[Spec, dict[str, Any]]:
    reg = registry if registry is not None else get_registry()
    path, info, infos = _read_info(directory)
    check_provider(info, reg, source=str(path), trust_provider=trust_provider)
    spec = _stored_spec(info, registry, str(path))
    _check_shapes(spec, infos, registry, str(path))
    return spec, info


def check_folder(directory: str | os.PathLike[str], *, registry: Any = None, trust_provider: bool = False) -> None:
    """Everything ``load_pretrained`` checks, without reading tensor data or allocating the model.

    Recovers a half-swapped folder, checks the safetensors header against the file size, validates
    the metadata's types, compares the stored core's provider with the registered one, and compares
    the stored spec's tensors (built on the meta device) with the header's names, shapes and dtypes.

    Raises:
        CheckpointError: (exit 3) the folder would not load, with the reason.
        ProviderMismatchError: (exit 4) the core is now registered by another distribution.
    """
    _checked(directory, registry=registry, trust_provider=trust_provider)


def load_pretrained(directory: str | os.PathLike[str], *, device: Any = None, registry: Any = None,
                    allow_nonfinite: bool = False, trust_provider: bool = False) -> Any:
    """Rebuild the model from the spec stored in the folder and load its weights strictly.

    ``check_folder`` runs first (no tensor data read, nothing allocated); ``trust_provider``
    accepts a core now registered by another distribution than the one that saved it.
    """
    spec, info = _checked(directory, registry=registry, trust_provider=trust_provider)
    tensors, again = read_folder(directory, allow_nonfinite=allow_nonfinite)
    if again != info:
        raise CheckpointError(f"{directory}: the folder changed while it was loaded; load it again")
    try:
        model = build_model(spec, registry=registry, device=device)
    except ZooError as exc:
        raise CheckpointError(f"{directory}: the stored spec cannot be built here: {exc}") from None
    load_weights(model, tensors, info, source=str(Path(directory) / WEIGHTS))
    return model.eval()
