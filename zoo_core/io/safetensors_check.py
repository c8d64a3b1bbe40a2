"""Our own safetensors header check, run before the safetensors library touches the bytes.

safetensors rejects structurally broken files but accepts several semantic tricks: duplicate tensor
names (one parser reads F32 where another reads I32), unknown fields, empty or path-like names,
NaN/Inf payloads and headers with a million entries that take tens of seconds to load
(reference/reliability.md §1.4). ``read_header`` closes those holes and gives a specific message for
files that are not safetensors at all (a torch zip, a pickle, an HTML error page, a Git LFS pointer).

``read_checked`` first reads only the header and compares the size it promises with the file's
size from ``fstat`` (a valid header on a huge sparse file is refused before its data is read), then
reads the whole file with one ``read`` (never mmap: a file truncated or rewritten
under us must neither kill the process with SIGBUS nor change tensors already loaded), checks the
header, lets safetensors build the tensors from the same bytes and rejects non-finite values.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from ..errors import CheckpointError

__all__ = [
    "DTYPES",
    "MAX_HEADER",
    "MAX_TENSORS",
    "TensorInfo",
    "load_checked",
    "read_checked",
    "read_header",
    "read_header_file",
]

MAX_HEADER = 16 * 2**20
"""Largest JSON header accepted, in bytes (safetensors itself allows 100 MB)."""

MAX_TENSORS = 65536
"""Most tensor entries accepted in one file."""

_TRUNCATED = "truncated (incomplete download or interrupted write?)"
_METADATA = "__metadata__"
_INFO_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_MAX_NUMEL_BYTES = 2**63  # checked arithmetic, as safetensors does with u64/usize
_JSON_WS = " \t\r\n"
_MAX_RANK = 64  # bounds the per-entry work; no real tensor comes near it
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_CHUNK = 2**22  # elements per step of the non-finite scan, to bound temporary memory

# safetensors dtype name -> torch attribute name, for the dtypes the safetensors torch binding maps.
_DTYPE_ATTRS = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "C64": "complex64",
}

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr) for name, attr in _DTYPE_ATTRS.items() if hasattr(torch, attr)
}
"""safetensors dtype names this loader accepts, mapped to torch dtypes (depends on the torch version)."""

_ITEMSIZE: dict[str, int] = {name: dtype.itemsize for name, dtype in DTYPES.items()}

# isfinite is implemented natively for these; other floating dtypes (float8) are upcast per chunk.
_NATIVE_FINITE = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64})


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a safetensors header.

    Attributes:
        dtype: safetensors dtype name, e.g. ``"F32"``.
        shape: tensor shape.
        start: first byte, relative to the start of the data region (after the header).
        end: one past the last byte, relative to the start of the data region.
    """

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def _fail(source: str, message: str) -> NoReturn:
    raise CheckpointError(f"{source}: {message}")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while parsing a header.

    Parsing creates ~10 acyclic containers per entry; the collections they trigger cost more than
    the parse itself (65 536 entries: 1.6 s with the GC running, 0.4 s paused).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ---------------------------------------------------------------------------------------------
# Sniffing files that are not safetensors


def _sniff_foreign(head: bytes) -> str | None:
    """A specific message for a file that is recognisably something else, or None.

    Every signature here decodes to a header length far above ``MAX_HEADER``, so no valid
    safetensors file can match it.
    """
    if head.startswith(b"PK\x03\x04"):
        return ("a PyTorch zip checkpoint, not safetensors — it was not loaded (unpickling can run arbitrary code); "
                "convert it to safetensors with its own project's tools")
    if head.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer, not safetensors — fetch the real file with git lfs pull"
    text = head.lstrip(b" \t\r\n\xef\xbb\xbf").lower()
    if text.startswith((b"<!doctype", b"<html")):
        return (
            "an HTML page, not safetensors — the download returned an error page "
            "(check the URL, revision and token, then download again)"
        )
    if text.startswith(b"<?xml"):
        return (
            "an XML document, not safetensors — the download returned an error response "
            "(check the URL, revision and token, then download again)"
        )
    return None


def _sniff_implausible(head: bytes) -> str | None:
    """A message for files whose length prefix is impossible and that look like pickle or JSON.

    Only called once the prefix exceeds ``MAX_HEADER``: a valid file's first byte may be 0x80 or
    ``{`` (a 128- or 123-byte header), so these signatures are ambiguous on their own.
    """
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return (
            "a pickle checkpoint (e.g. an old-style torch.save file), not safetensors; it was not "
            "loaded, because unpickling can run arbitrary code — convert it to safetensors with its own project's tools"
        )
    text = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if text.startswith((b"{", b"[")):
        return "a JSON document, not safetensors — the download returned an error response or this is a config file"
    return None


# ---------------------------------------------------------------------------------------------
# Header parsing


class _Pairs:
    """``object_pairs_hook`` that rejects duplicate keys and bounds the number of JSON objects."""

    def __init__(self, source: str, max_objects: int) -> None:
        self.source = source
        self.max_objects = max_objects
        self.count = 0

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self.count += 1
        if self.count > self.max_objects:
            _fail(self.source, f"header has more than {MAX_TENSORS} entries (the cap); refusing to parse it")
        out = dict(pairs)
        if len(out) != len(pairs):
            _fail(
                self.source,
                f"duplicate key {_first_duplicate(pairs)!r} in the header; parsers disagree on which copy wins "
                "(a known dtype-smuggling trick), so the file is rejected",
            )
        return out


def _first_duplicate(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return ""  # pragma: no cover - only called when a duplicate exists


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _parse_json(header: bytes, source: str) -> dict[str, Any]:
    """Decode the header bytes into a dict, rejecting anything but one JSON object."""
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(source, f"header is not valid UTF-8 (byte {exc.start}); the file is corrupt")
    stripped = text.lstrip(_JSON_WS)
    if not stripped.startswith("{"):
        first = stripped[:1] or "nothing"
        _fail(source, f"header is not a JSON object (it starts with {first!r}); the file is corrupt")
    if header.count(b'"data_offsets"') > MAX_TENSORS:
        _fail(source, f"header has more than {MAX_TENSORS} entries (the cap); refusing to parse it")
    hook = _Pairs(source, MAX_TENSORS + 2)  # + the metadata map and the top-level object
    try:
        obj = json.loads(text, object_pairs_hook=hook, parse_constant=_reject_constant)
    except CheckpointError:
        raise
    except RecursionError:
        _fail(source, "header nests too deeply to be a safetensors header; the file is corrupt")
    except ValueError as exc:  # JSONDecodeError, over-long integers, NaN/Infinity
        _fail(source, f"header is not valid JSON ({exc}); the file is corrupt")
    if not isinstance(obj, dict):
        _fail(source, f"header is a JSON {type(obj).__name__}, not an object; the file is corrupt")
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_text(value: str, what: str, source: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        _fail(source, f"{what} {value!r} is not valid Unicode (lone surrogate)")


def _check_metadata(value: Any, source: str) -> dict[str, str]:
    if isinstance(value, dict) and value.keys() >= _INFO_KEYS:
        _fail(
            source,
            "a tensor is named '__metadata__', which safetensors reserves for the metadata map "
            "(safetensors #849); the file was written by a broken writer",
        )
    if not isinstance(value, dict):
        _fail(source, f"__metadata__ must be a map of strings to strings, got a JSON {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(item, str):
            _fail(
                source,
                f"__metadata__ must be a map of strings to strings; key {key!r} holds a {type(item).__name__}",
            )
        _check_text(key, "metadata key", source)
        _check_text(item, "metadata value", source)
    return dict(value)


def _check_name(name: str, source: str) -> None:
    """Reject empty, reserved and path-like tensor names (names must never act as paths)."""
    if not name:
        _fail(source, "a tensor has an empty name; the file is corrupt or hostile")
    _check_text(name, "tensor name", source)
    bad = name.startswith("/") or "\\" in name or ".." in name.split("/") or _CONTROL.search(name) is not None
    if bad:
        _fail(
            source,
            f"tensor name {name!r} is path-like or holds control characters; "
            "tensor names are never paths, so the file is rejected",
        )


def _check_entry(name: str, value: Any, source: str) -> TensorInfo:
    """Validate one tensor entry and return it as a TensorInfo."""
    _check_name(name, source)
    where = f"tensor {name!r}"
    if not isinstance(value, dict):
        _fail(source, f"{where}: entry must be an object with dtype, shape and data_offsets")
    keys = set(value)
    if keys != _INFO_KEYS:
        missing = sorted(_INFO_KEYS - keys)
        extra = sorted(keys - _INFO_KEYS)
        parts = ([f"missing {missing}"] if missing else []) + ([f"unknown fields {extra}"] if extra else [])
        _fail(source, f"{where}: entry must have exactly dtype, shape and data_offsets ({'; '.join(parts)})")
    dtype = value["dtype"]
    if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
        _fail(source, f"{where}: unknown or unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})")
    shape = value["shape"]
    if not isinstance(shape, list) or len(shape) > _MAX_RANK:
        _fail(source, f"{where}: shape must be a list of at most {_MAX_RANK} non-negative integers")
    if not all(_is_int(d) and d >= 0 for d in shape):
        _fail(source, f"{where}: shape must be a list of non-negative integers, got {shape!r:.200}")
    numel = 1
    for dim in shape:
        numel *= dim
        if numel * _ITEMSIZE[dtype] >= _MAX_NUMEL_BYTES:
            _fail(source, f"{where}: shape {shape!r:.200} overflows (more than 2**63 bytes)")
    offsets = value["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)):
        _fail(source, f"{where}: data_offsets must be two non-negative integers, got {offsets!r:.200}")
    start, end = offsets
    if start > end:
        _fail(source, f"{where}: data_offsets [{start}, {end}] are reversed")
    nbytes = numel * _ITEMSIZE[dtype]
    if end - start != nbytes:
        _fail(
            source,
            f"{where}: data_offsets [{start}, {end}] span {end - start} bytes but "
            f"{dtype} {tuple(shape)} needs {nbytes}",
        )
    return TensorInfo(dtype=dtype, shape=tuple(shape), start=start, end=end)


def _check_tiling(infos: dict[str, TensorInfo], data_len: int, source: str) -> None:
    """The tensors must cover the data region exactly: no overlap, no gap, no trailing bytes."""
    cursor = 0
    previous = None
    for name, info in sorted(infos.items(), key=lambda item: (item[1].start, item[1].end, item[0])):
        if info.start < cursor:
            _fail(
                source,
                f"tensor {name!r} (bytes {info.start} to {info.end}) overlaps tensor {previous!r} "
                f"(which ends at {cursor}); the file is corrupt or hostile",
            )
        if info.start > cursor:
            after = f"after tensor {previous!r} " if previous is not None else ""
            _fail(
                source,
                f"gap of {info.start - cursor} bytes {after}before tensor {name!r} "
                f"(bytes {cursor} to {info.start} belong to no tensor); the file is corrupt or hostile",
            )
        cursor = info.end
        previous = name
    if cursor > data_len:
        _fail(
            source,
            f"the header promises {cursor} bytes of tensor data but only {data_len} are present — {_TRUNCATED}",
        )
    if cursor < data_len:
        _fail(
            source,
            f"trailing data after the last tensor: the header promises {cursor} bytes of tensor data but "
            f"{data_len} are present ({data_len - cursor} bytes past byte {cursor} of the data region); "
            "the file is corrupt or a polyglot",
        )


def _header_length(head: bytes, size: int, source: str) -> int:
    """The header's byte count from the file's first bytes, checked against the file's ``size``."""
    if size == 0:
        _fail(source, f"the file is empty (0 bytes) — {_TRUNCATED}")
    foreign = _sniff_foreign(head)
    if foreign is not None:
        _fail(source, f"this is {foreign}")
    if size < 8:
        _fail(source, f"only {size} bytes, too short for the 8-byte header length — {_TRUNCATED}")
    n_header = int.from_bytes(head[:8], "little")
    if n_header > MAX_HEADER:
        other = _sniff_implausible(head)
        if other is not None:
            _fail(source, f"this is {other}")
        _fail(
            source,
            f"header length {n_header} exceeds the {MAX_HEADER}-byte cap; "
            "this is not a safetensors file or its length prefix is corrupt",
        )
    if 8 + n_header > size:
        _fail(
            source,
            f"the header length says {n_header} bytes but only {size - 8} follow the length prefix — {_TRUNCATED}",
        )
    return n_header


def _parse_header(raw: bytes, data_len: int, source: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and check the JSON header; ``data_len`` is the size of the data region after it."""
    with _gc_paused():
        obj = _parse_json(raw, source)
        metadata: dict[str, str] = {}
        if _METADATA in obj:
            metadata = _check_metadata(obj.pop(_METADATA), source)
        if len(obj) > MAX_TENSORS:
            _fail(source, f"header has {len(obj)} entries, more than the cap of {MAX_TENSORS}")
        infos = {name: _check_entry(name, value, source) for name, value in obj.items()}
        _check_tiling(infos, data_len, source)
    return infos, metadata


def read_header(data: bytes | memoryview, *, source: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Check a whole safetensors file held in memory and return its header.

    Args:
        data: the complete file contents.
        source: where the bytes came from (a path or URL); every error message starts with it.

    Returns:
        ``(tensors, metadata)``: tensor name to TensorInfo (offsets relative to the data region),
        and the ``__metadata__`` map (empty when absent).

    Raises:
        CheckpointError: the bytes are not a well-formed safetensors file, with a message naming
            ``source``, the failed check and, where one exists, the fix.
    """
    view = memoryview(data).cast("B")
    size = len(view)
    n_header = _header_length(bytes(view[:64]), size, source)
    return _parse_header(bytes(view[8 : 8 + n_header]), size - 8 - n_header, source)


def _open_regular(source: str) -> Any:
    """Open ``source`` for reading only if it is a regular file (a FIFO or device would block or
    stream forever); the caller closes it."""
    try:
        if not stat.S_ISREG(os.stat(source).st_mode):
            _fail(source, "not a regular file (a FIFO, device or folder); a weights file is a plain file")
        handle = open(source, "rb")  # noqa: SIM115 - returned to the caller's with-block
    except OSError as exc:
        _fail(source, f"cannot read the weights file: {exc.strerror or exc}")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # swapped between stat and open
        handle.close()
        _fail(source, "not a regular file (a FIFO, device or folder); a weights file is a plain file")
    return handle


def _read_exactly(handle: Any, start: int, count: int, source: str) -> bytes:
    handle.seek(start)
    data = handle.read(count)
    if len(data) != count:
        _fail(source, f"the file shrank while it was read ({len(data)} of {count} bytes from byte {start}) — {_TRUNCATED}")
    return data


def _header_from(handle: Any, source: str) -> tuple[int, int, dict[str, TensorInfo], dict[str, str]]:
    """(file size, header length, tensors, metadata) from an open file, reading only the header:
    the sizes come from ``fstat``, so a file whose size disagrees is refused before its data is read."""
    size = os.fstat(handle.fileno()).st_size
    n_header = _header_length(_read_exactly(handle, 0, min(size, 64), source), size, source)
    infos, metadata = _parse_header(_read_exactly(handle, 8, n_header, source), size - 8 - n_header, source)
    return size, n_header, infos, metadata


def read_header_file(path: str | os.PathLike[str]) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Check a safetensors file's header and sizes without reading its tensor data.

    Returns:
        ``(tensors, metadata)`` as ``read_header``.

    Raises:
        CheckpointError: not a regular file, unreadable, malformed, or its size differs from what
            the header promises (both sizes in the message).
    """
    source = os.fspath(path)
    with _open_regular(source) as handle:
        _, _, infos, metadata = _header_from(handle, source)
    return infos, metadata


# ---------------------------------------------------------------------------------------------
# Loading


def _count_nonfinite(tensor: torch.Tensor) -> int:
    """Number of NaN/Inf elements, scanned in chunks to bound temporary memory."""
    flat = tensor.reshape(-1)
    total = 0
    for begin in range(0, flat.numel(), _CHUNK):
        chunk = flat[begin : begin + _CHUNK]
        if chunk.dtype not in _NATIVE_FINITE:
            chunk = chunk.float()
        total += int(chunk.numel() - torch.isfinite(chunk).sum().item())
    return total


def _check_finite(tensors: dict[str, torch.Tensor], source: str) -> None:
    bad = [
        (name, count)
        for name, tensor in tensors.items()
        if (tensor.is_floating_point() or tensor.is_complex())
        for count in [_count_nonfinite(tensor)]
        if count
    ]
    if not bad:
        return
    listed = _join(f"tensor {name!r} holds {count} non-finite value{'s' if count != 1 else ''}" for name, count in bad)
    _fail(
        source,
        f"{listed}; a checkpoint with NaN/Inf is usually the product of a diverged run. "
        "Load it anyway with allow_nonfinite=True (zoo_core.load_pretrained, zoo inspect --allow-nonfinite)",
    )


def _join(items: Iterable[str], limit: int = 20) -> str:
    items = list(items)
    shown = "; ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown}; … and {len(items) - limit} more"


def _check_agreement(tensors: dict[str, torch.Tensor], infos: dict[str, TensorInfo], source: str) -> None:
    """safetensors must have read the header exactly as we did (no parser differential)."""
    if tensors.keys() != infos.keys():
        _fail(source, "safetensors and the zoo's header check disagree on the tensor names; rejected")
    for name, tensor in tensors.items():
        info = infos[name]
        if tensor.dtype != DTYPES[info.dtype] or tuple(tensor.shape) != info.shape:
            _fail(
                source,
                f"safetensors and the zoo's header check disagree on tensor {name!r} "
                f"({tensor.dtype} {tuple(tensor.shape)} vs {info.dtype} {info.shape}); rejected",
            )


def load_checked(
    data: bytes, *, source: str, allow_nonfinite: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Check and load a safetensors file already held in memory.

    Useful when the caller also hashes the bytes: hashing and parsing the same buffer leaves no
    window for the file to change in between.

    Args:
        data: the complete file contents.
        source: where the bytes came from; every error message starts with it.
        allow_nonfinite: accept NaN/Inf in floating tensors instead of raising.

    Returns:
        ``(tensors, metadata)``; the tensors own their memory (nothing refers back to ``data``).

    Raises:
        CheckpointError: the file is malformed, or holds non-finite values and
            ``allow_nonfinite`` is False.
    """
    from safetensors.torch import load

    infos, metadata = read_header(data, source=source)
    try:
        tensors = load(bytes(data))
    except Exception as exc:  # SafetensorError, and anything else the binding may raise
        _fail(source, f"safetensors rejected the file after the zoo's header check passed: {exc}")
    _check_agreement(tensors, infos, source)
    if not allow_nonfinite:
        _check_finite(tensors, source)
    return tensors, metadata


def read_checked(
    path: str | os.PathLike[str], *, allow_nonfinite: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Check a safetensors file's header against its size, then read it with one ``read``, check
    it and load it without memory-mapping.

    Args:
        path: the ``.safetensors`` file.
        allow_nonfinite: accept NaN/Inf in floating tensors instead of raising.

    Returns:
        ``(tensors, metadata)``. Truncating or rewriting the file afterwards does not affect them.

    Raises:
        CheckpointError: the file cannot be read, is malformed, or holds non-finite values and
            ``allow_nonfinite`` is False.
    """
    source = os.fspath(path)
    with _open_regular(source) as handle:
        size, _, _, _ = _header_from(handle, source)  # sizes agree before any tensor byte is read
        try:
            data = _read_exactly(handle, 0, size, source)
        except OSError as exc:
            _fail(source, f"cannot read the weights file: {exc.strerror or exc}")
    return load_checked(data, source=source, allow_nonfinite=allow_nonfinite)
