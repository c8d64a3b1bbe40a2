"""``create_model(ref)``: a reference (``arch.tag``, ``hf-hub:``, ``local-dir:``) pulled to a folder
(``pulling.py``), its plugin checked, then built and loaded by ``zoo_core.factory`` (or built fresh).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ZooError
from ..footprint import check_build
from ..plugin_catalogue import plugin_owners
from ..plugins import get_registry
from ..spec import load_spec
from .catalogue import Catalogue, load_catalogue
from .client import CONFIG, WEIGHTS
from .errors import MissingPluginError
from .pulling import pull
from .refs import parse_ref

log = logging.getLogger("zoo_core.hub")


# building ----------------------------------------------------------------------------------------
def check_plugins(folder: Path, *, where: str, registry: Any = None) -> None:
    """Refuse, with the install command, weights whose core's plugin is not installed."""
    from ..io.pretrained import MAX_CONFIG  # lazy: keeps safetensors, torch out of hub.create

    path = folder / CONFIG
    if not path.is_file() or path.stat().st_size > MAX_CONFIG:
        return  # absent, not a regular file or oversize: the full load check reports it precisely
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        kind = config["spec"]["model"]["core"]["kind"]
    except (ValueError, KeyError, TypeError):
        return  # malformed: the full load check reports it precisely
    if not isinstance(kind, str):
        return  # a hostile or broken config.json: the full load check names the field
    reg = registry or get_registry()
    if kind in reg.cores:
        return
    reg.refuse_conflict("cores", kind)  # installed twice, kept by neither: not "missing"
    recorded = config.get("versions")
    versions = {k: v for k, v in recorded.items() if isinstance(v, str)} if isinstance(recorded, dict) else {}
    dist = plugin_owners().owners.get(kind)  # only the catalogue names what to install: never the file itself
    if dist is None:
        claimed = sorted(k for k in versions if k not in ("zoo-core", "torch"))
        said = f" (the file says it was saved with {', '.join(claimed)}: unverified)" if claimed else ""
        raise MissingPluginError(f"{where} holds weights for core {kind!r}, which no installed plugin provides and "
                                 f"registry.yaml names no plugin for{said}; install the plugin its author publishes, then retry")
    pinned = f"{dist}=={versions[dist]}" if dist in versions else dist
    raise MissingPluginError(f"{where} holds weights for core {kind!r} from the plugin {dist}"
                             f"{' ' + versions[dist] if dist in versions else ''}, which is not installed: "
                             f"pip install {pinned} (or pip install -e plugins/{dist} from a checkout)")


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _load_matching(model: Any, tensors: Mapping[str, Any], info: Mapping[str, Any], source: str) -> None:
    """strict=False: copy the tensors whose name and shape fit; log the rest."""
    import torch

    from ..io.pretrained import _unique_tensors  # lazy: keeps safetensors, torch out of api

    own, _ = _unique_tensors(model)
    skipped = sorted(set(tensors) - set(own))
    with torch.no_grad():
        for name, target in own.items():
            value = tensors.get(name)
            if value is not None and target.is_complex() and tuple(value.shape) == (*target.shape, 2):
                value = torch.view_as_complex(value.contiguous())
            if value is None or tuple(value.shape) != tuple(target.shape):
                skipped.append(name)
                continue
            target.copy_(value)
    if skipped:
        log.warning("%s: strict=False left %d tensors as initialised or unused: %s", source, len(skipped), ", ".join(skipped[:20]))


def create_model(ref: str, pretrained: bool = True, *, revision: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, local_files_only: bool = False,
                 token: str | None = None, force_download: bool = False, strict: bool = True,
                 device: Any = None, registry: Any = None, source: str = "auto",
                 catalogue: Catalogue | None = None, require_verified: bool | None = None, **overrides: Any) -> Any:
    """Build a model from a reference, with its trained weights when ``pretrained``.

    ``overrides`` are merged into the spec (``task={"classes": 5}``, ``model={"depth": 2}``); with
    ``strict=True`` (the default) every stored tensor must then still fit, else the mismatches are
    listed. ``pretrained=False`` builds the same architecture with fresh weights. Files no trusted
    hash vouches for are loaded with a warning, or refused with ``require_verified``
    (default: ``ZOO_HUB_REQUIRE_VERIFIED``).
    """
    from ..build import build_model  # lazy: keeps torch out of api
    from ..factory import check_folder, load_pretrained  # lazy: keeps safetensors, torch out of api
    from ..io.pretrained import load_weights, read_folder  # lazy: keeps safetensors, torch out of api

    r = parse_ref(ref, revision=revision)
    if not pretrained and r.kind in ("arch", "tag"):
        entry = (catalogue or load_catalogue()).get(r.name or "")
        spec = load_spec(_merge(entry.spec, overrides), registry=registry)
        check_build(spec)
        return build_model(spec, registry=registry, device=device)
    got = pull(ref, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token,
               force_download=force_download, source=source, catalogue=catalogue, require_verified=require_verified)
    where = f"{got.repo_id}@{got.commit}" if got.repo_id else str(got.path)
    check_plugins(got.path, where=where, registry=registry)
    if pretrained and strict and not overrides:
        return load_pretrained(got.path, device=device, registry=registry)
    check_folder(got.path, registry=registry)  # the stored spec fits its tensors: nothing huge is built from a lie
    tensors, info = read_folder(got.path)
    try:
        spec = load_spec(_merge(info["spec"], overrides), registry=registry)
    except ZooError as exc:
        raise CheckpointError(f"{where}: the stored spec cannot be built here: {exc}") from None
    check_build(spec)  # with the overrides applied it must still fit this machine (exit 2 with the estimate)
    model = build_model(spec, registry=registry, device=device)
    if pretrained:
        source_name = str(got.path / WEIGHTS)
        (load_weights if strict else _load_matching)(model, tensors, info, source=source_name)
    return model.eval()
