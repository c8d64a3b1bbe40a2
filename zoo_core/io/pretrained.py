"""Save and load a model folder: ``model.safetensors`` (+ spec and versions in its metadata) and
``config.json``. Writes are atomic (staging folder, fsync, rename); loads are strict and never
unpickle anything.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from safetensors.torch import save as save_bytes
from torch import Tensor, nn

from .. import __version__
from ..errors import CheckpointError, ProviderMismatchError
from ..plugins import env_flag, get_registry
from .atomic import atomic_write_dir, recover_dir
from .safetensors_check import TensorInfo, read_checked, read_header_file
from .strict import compare_state

log = logging.getLogger(__name__)

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
    """zoo-core, torch and the plugins that provide the model's cores (a hybrid stack has several)."""
    found = {"zoo-core": __version__, "torch": torch.__version__.split("+")[0]}
    reg = get_registry()
    for kind in _core_kinds(getattr(model, "spec", {})):
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
    check_destination(directory)
    _check_replaceable(directory)
    try:
        return atomic_write_dir(directory, model_files(model))
    except (NotADirectoryError, FileExistsError, PermissionError) as exc:  # raced after the check, or read-only
        raise CheckpointError(f"cannot save to {directory}: {exc.strerror or exc}; choose a folder you can write") from None


def check_destination(directory: str | os.PathLike[str]) -> None:
    """A save target must be a folder or not exist, under folders: a path under a file
    (``afile/sub``) is refused with the file named, before anything is built or written."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"cannot save to {path}: it is a file, not a folder; choose a new or empty folder")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise CheckpointError(f"cannot save to {path}: {parent} is a file, not a folder, so nothing can be "
                                      "created under it; choose a path under a folder")
            return


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


# loading: metadata, provider, meta-device shape check ----------------------------------------
TRUST_PROVIDER_ENV = "ZOO_TRUST_PROVIDER"
"""Set to 1 to load weights whose core is now registered by another distribution than the one
that saved them (the ``trust_provider=True`` keyword of ``load_pretrained`` / ``check_folder``)."""

MAX_CONFIG = 16 * 2**20
"""Largest config.json read (a saved model's is a few KB)."""


class StoredMetadata(BaseModel):
    """The decoded ``__metadata__`` of a saved model: strict types, no other keys.

    Why: every later step (building the stored spec, mapping complex and tied tensors) trusts these
    types; a hostile file that stores ``spec`` as a string must not reach ``load_spec`` (which reads
    a string as a path: a FIFO hangs the loader, ``/etc/passwd`` is read and echoed).
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    format: str
    spec: dict[str, Any]
    versions: dict[str, str]
    complex: list[str]
    tied: dict[str, str]


_JSON_FIELDS = ("spec", "versions", "complex", "tied")
_WANT = {"spec": "a mapping (the model spec itself; a stored spec is never read as a path)",
         "versions": "a mapping of distribution names to version strings",
         "complex": "a list of tensor names", "tied": "a mapping of tensor names to tensor names"}


def _json_meta(meta: Mapping[str, str], key: str, source: str) -> Any:
    if key not in meta:
        raise CheckpointError(f"{source}: the metadata has no {key!r} entry; it was not written by zoo_core.save_pretrained")
    try:
        return json.loads(meta[key])
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{source}: metadata entry {key!r} is not valid JSON ({exc})") from None


def decode_metadata(meta: Mapping[str, str], source: str) -> dict[str, Any]:
    """Decode and type-check a weights file's metadata; ``CheckpointError`` (exit 3) names the field.

    Values are never echoed: a hostile file's metadata is not shown back to the user.
    """
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{source}: format {str(meta.get('format'))[:80]!r} is not {FORMAT!r}; only folders "
                              "written by zoo_core's save_pretrained load here")
    extra = sorted(set(meta) - {"format", *_JSON_FIELDS})
    if extra:
        raise CheckpointError(f"{source}: unknown metadata entr{'ies' if len(extra) > 1 else 'y'} "
                              f"{', '.join(repr(k[:80]) for k in extra[:5])}; {FORMAT} files hold only format, "
                              f"{', '.join(_JSON_FIELDS)} (the file was not written by zoo_core.save_pretrained, or was edited)")
    raw = {"format": meta["format"], **{k: _json_meta(meta, k, source) for k in _JSON_FIELDS}}
    try:
        return StoredMetadata.model_validate(raw).model_dump()
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        where = ".".join(str(p) for p in err["loc"])
        raise CheckpointError(f"{source}: metadata entry {field!r} must be {_WANT.get(field, 'well-typed')}; "
                              f"{where}: {err['msg'].lower()} ({len(exc.errors())} problem(s) in all). The file "
                              "was not written by zoo_core.save_pretrained or was edited: save the model again") from None


def _check_config(directory: Path, spec: Mapping[str, Any]) -> None:
    """config.json, where present, must carry the weights file's own spec."""
    config_path = directory / CONFIG
    if not config_path.is_file():
        return
    if config_path.stat().st_size > MAX_CONFIG:
        raise CheckpointError(f"{config_path}: {config_path.stat().st_size} bytes, far larger than a saved model's "
                              f"config (cap {MAX_CONFIG}); delete it to use the weights file's own spec")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{config_path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("spec") != spec:
        raise CheckpointError(f"{config_path}: its spec differs from the one inside {WEIGHTS}; the folder was edited or "
                              "half-copied (the weights file's own spec is authoritative: delete config.json to use it)")


def _weights_path(directory: str | os.PathLike[str]) -> Path:
    recover_dir(directory)  # a save killed between its two renames left the old folder aside
    path = Path(directory) / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {WEIGHTS} here; is this a folder written by save_pretrained?")
    return path


def _read_info(directory: str | os.PathLike[str]) -> tuple[Path, dict[str, Any], dict[str, TensorInfo]]:
    """(weights path, decoded metadata, header tensors), reading only the header."""
    path = _weights_path(directory)
    infos, meta = read_header_file(path)
    info = decode_metadata(meta, str(path))
    _check_config(Path(directory), info["spec"])
    return path, info, infos


def read_folder(directory: str | os.PathLike[str], *, allow_nonfinite: bool = False) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read and check a saved folder; returns (tensors as stored, decoded metadata).

    Non-finite values are refused unless ``allow_nonfinite`` (e.g. to inspect a diverged run).
    """
    path, info, _ = _read_info(directory)
    tensors, meta = read_checked(path, allow_nonfinite=allow_nonfinite)
    if decode_metadata(meta, str(path)) != info:
        raise CheckpointError(f"{path}: the file changed while it was read (its metadata differs between two reads); load it again")
    return tensors, info


def _core_kinds(spec: Mapping[str, Any]) -> list[str]:
    """The kinds of model.core and of a hybrid stack's model.cores, in that order, each once."""
    model = spec.get("model")
    body: Mapping[str, Any] = model if isinstance(model, dict) else {}
    named = body.get("cores")
    cores = [body.get("core"), *(named.values() if isinstance(named, dict) else ())]
    kinds = [c.get("kind") for c in cores if isinstance(c, dict)]
    return list(dict.fromkeys(k for k in kinds if isinstance(k, str)))


def check_provider(info: Mapping[str, Any], registry: Any, *, source: str, trust_provider: bool = False) -> None:
    """The distribution now registered for the stored core must be the one that saved the weights.

    Why: a newly installed plugin registering an existing core name (an impostor) would otherwise
    run its own code on these weights. A different version of the same distribution is fine
    (logged). ``trust_provider`` (or ``ZOO_TRUST_PROVIDER=1``) accepts another distribution.
    """
    for kind in _core_kinds(info["spec"]):  # every core of a hybrid stack
        _check_provider(kind, info, registry, source=source, trust_provider=trust_provider)


def _check_provider(kind: str, info: Mapping[str, Any], registry: Any, *, source: str, trust_provider: bool) -> None:
    if kind not in registry.cores:
        return  # load_spec reports an unknown or missing core with its own message
    now = registry.cores[kind].provider
    recorded = {d: v for d, v in info["versions"].items() if d not in ("zoo-core", "torch")}
    if now.dist == "zoo-core" and not recorded or now.dist in recorded:
        saved = info["versions"].get(now.dist)
        if saved is not None and saved != now.version:
            log.info("%s: core %r was saved with %s %s; %s is installed", source, kind, now.dist, saved, now.version)
        return
    if trust_provider or env_flag(TRUST_PROVIDER_ENV):
        log.warning("%s: core %r is now provided by %s, not by %s that saved it; loading anyway (trusted)",
                    source, kind, now.dist, ", ".join(recorded) or "zoo-core")
        return
    saved_by = ", ".join(f"{d} {v}" for d, v in recorded.items()) or "zoo-core itself"
    raise ProviderMismatchError(
        f"{source}: core {kind!r} was saved by {saved_by}, but {now.dist} {now.version} provides it now: another "
        f"distribution registering the same name would run its own code on these weights. Check `zoo plugins`; "
        f"if {now.dist} is the one you want, load with trust_provider=True or {TRUST_PROVIDER_ENV}=1"
    )


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
