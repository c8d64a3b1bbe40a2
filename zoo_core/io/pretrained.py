"""Save and load a model folder: ``model.safetensors`` (+ spec and versions in its metadata) and
``config.json``. Writes are atomic (staging folder, fsync, rename); loads are strict and never
unpickle anything.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_bytes
from torch import Tensor, nn

from ..errors import CheckpointError, ZooError
from .atomic import atomic_write_dir, recover_dir
from .safetensors_check import read_checked
from .strict import compare_state

FORMAT = "zoo.safetensors/1"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def _unique_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """State tensors with tied ones kept once; returns (tensors, alias -> kept name)."""
    out: dict[str, Tensor] = {}
    tied: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        key = (t.data_ptr(), t.numel(), tuple(t.shape))
        if t.numel() and key in seen:
            tied[name] = seen[key]
            continue
        seen[key] = name
        out[name] = t.detach()
    return out, tied


def versions(model: nn.Module) -> dict[str, str]:
    """zoo-core, torch and the plugin that provides the model's core."""
    from .. import __version__
    from ..plugins import get_registry

    found = {"zoo-core": __version__, "torch": torch.__version__.split("+")[0]}
    kind = getattr(model, "spec", {}).get("model", {}).get("core", {}).get("kind")
    reg = get_registry()
    if kind in reg.cores:
        prov = reg.cores[kind].provider
        found[prov.dist] = prov.version
    return found


OURS = {WEIGHTS, CONFIG, "README.md"}


def _check_replaceable(directory: str | os.PathLike[str]) -> None:
    """Replacing a folder swaps the whole folder: refuse one that holds anything we did not write."""
    path = Path(directory)
    if not path.is_dir():
        return
    foreign = sorted(p.name for p in path.iterdir() if p.name not in OURS)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise CheckpointError(
            f"{path} already holds files that are not part of a saved model ({shown}); saving replaces "
            "the whole folder and would delete them. Choose a new or empty folder."
        )


def canonical_safetensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """safetensors bytes with the header's keys sorted, so equal models give byte-identical files.

    The safetensors writer emits ``__metadata__`` in hash-map order, which changes from one save to
    the next; registry pins (sha256) and "nothing changed, no new Hub commit" both need the same
    bytes for the same tensors. Offsets are relative to the data section, which is kept as is.
    """
    raw = save_bytes(tensors, metadata=metadata)
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the format aligns the data section to 8 bytes
    return len(text).to_bytes(8, "little") + text + raw[8 + n :]


def save_pretrained(model: nn.Module, directory: str | os.PathLike[str]) -> Path:
    """Write ``directory`` atomically: it ends up entirely old or entirely new.

    ``directory`` must be new, empty, or a folder this function wrote before.
    """
    _check_replaceable(directory)
    return atomic_write_dir(directory, model_files(model))


def model_files(model: nn.Module) -> dict[str, Any]:
    """The files of a saved model, for ``atomic_write_dir``: callers that add files of their own
    (training checkpoints) write them in the same staging folder instead of copying a saved one."""
    spec = getattr(model, "spec", None)
    if not spec:
        raise ValueError("this model carries no spec; build it with zoo_core.build_model to save it")
    tensors, tied = _unique_tensors(model)
    complex_names = sorted(n for n, t in tensors.items() if t.is_complex())
    to_save = {n: (torch.view_as_real(t) if t.is_complex() else t).contiguous().clone() for n, t in tensors.items()}
    vers = versions(model)
    meta = {
        "format": FORMAT,
        "spec": json.dumps(spec, sort_keys=True),
        "versions": json.dumps(vers, sort_keys=True),
        "complex": json.dumps(complex_names),
        "tied": json.dumps(tied, sort_keys=True),
    }
    config = {
        "architecture": "zoo-sequence-model",
        "model_type": spec.get("model", {}).get("core", {}).get("kind"),
        "zoo_format": FORMAT,
        "schema_version": spec.get("schema_version"),
        "spec": spec,
        "versions": vers,
    }
    files = {
        WEIGHTS: lambda p: Path(p).write_bytes(canonical_safetensors(to_save, meta)),
        CONFIG: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
    }
    return files


def _json_meta(meta: Mapping[str, str], key: str, source: str) -> Any:
    if key not in meta:
        raise CheckpointError(f"{source}: the metadata has no {key!r} entry; it was not written by zoo_core.save_pretrained")
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{source}: metadata entry {key!r} is not valid JSON ({exc})") from None


def read_folder(directory: str | os.PathLike[str], *, allow_nonfinite: bool = False) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read and check a saved folder; returns (tensors as stored, decoded metadata).

    Non-finite values are refused unless ``allow_nonfinite`` (e.g. to inspect a diverged run).
    """
    recover_dir(directory)  # a save killed between its two renames left the old folder aside
    path = Path(directory) / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {WEIGHTS} here; is this a folder written by save_pretrained?")
    tensors, meta = read_checked(path, allow_nonfinite=allow_nonfinite)
    source = str(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{source}: format {meta.get('format')!r} is not {FORMAT!r}; only folders written by zoo_core's save_pretrained load here")
    info = {k: _json_meta(meta, k, source) for k in ("spec", "versions", "complex", "tied")}
    config_path = Path(directory) / CONFIG
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{config_path}: not valid JSON ({exc})") from None
        if not isinstance(config, dict) or config.get("spec") != info["spec"]:
            raise CheckpointError(f"{config_path}: its spec differs from the one inside {WEIGHTS}; the folder was edited or half-copied (the weights file's own spec is authoritative: delete config.json to use it)")
    return tensors, info


def load_weights(model: nn.Module, tensors: Mapping[str, Tensor], info: Mapping[str, Any], *, source: str) -> None:
    """Copy stored tensors into ``model`` strictly: every tensor present, nothing extra, same shapes."""
    own, tied = _unique_tensors(model)
    stored_complex = set(info.get("complex", []))
    expected = {
        n: ((*t.shape, 2), t.real.dtype) if t.is_complex() else (tuple(t.shape), t.dtype) for n, t in own.items()
    }
    compare_state(expected, tensors, source=source)
    with torch.no_grad():
        for name, target in own.items():
            value = tensors[name]
            if target.is_complex() or name in stored_complex:
                value = torch.view_as_complex(value.contiguous()) if target.is_complex() else value
            target.copy_(value)


def load_weights_file(model: nn.Module, directory: str | os.PathLike[str]) -> None:
    """Load a saved folder's weights into an already built model (strict)."""
    tensors, info = read_folder(directory)
    load_weights(model, tensors, info, source=str(Path(directory) / WEIGHTS))


def load_pretrained(directory: str | os.PathLike[str], *, device: Any = None, registry: Any = None,
                    allow_nonfinite: bool = False) -> Any:
    """Rebuild the model from the spec stored in the folder and load its weights strictly."""
    from ..build import build_model

    tensors, info = read_folder(directory, allow_nonfinite=allow_nonfinite)
    try:
        model = build_model(info["spec"], registry=registry, device=device)
    except ZooError as exc:
        raise CheckpointError(f"{directory}: the stored spec cannot be built here: {exc}") from None
    load_weights(model, tensors, info, source=str(Path(directory) / WEIGHTS))
    return model.eval()
