"""The safetensors pre-parse and checked loader (reliability.md §7.A W1-W5, W7, W10-W13)."""

from __future__ import annotations

import io
import json
import os
import random
import struct
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save, save_file

from zoo_core.errors import CheckpointError
from zoo_core.io.safetensors_check import (
    DTYPES,
    MAX_HEADER,
    MAX_TENSORS,
    TensorInfo,
    load_checked,
    read_checked,
    read_header,
)

TRUNCATED = "truncated (incomplete download or interrupted write?)"
SOURCE = "/models/x/model.safetensors"


# ---------------------------------------------------------------------------------------------
# Crafting helpers (reliability.md §7.A)


def frame(header: bytes, data: bytes = b"", n: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if n is None else n) + header + data


def T(dtype: str = "F32", shape: tuple[Any, ...] = (2,), off: tuple[Any, ...] = (0, 8)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(off)}


def hdr(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def small_valid() -> bytes:
    """A small valid file written by safetensors itself, with metadata."""
    tensors = {
        "embed.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "blocks.0.a": torch.tensor([1, -2], dtype=torch.int16),
        "blocks.0.b": torch.tensor([0.5], dtype=torch.bfloat16),
    }
    return save(tensors, metadata={"format": "pt", "zoo": "1"})


def structural_cases() -> Iterator[tuple[str, bytes, str | None]]:
    """(case id, file bytes, expected message fragment or None) for every structural corruption."""
    z8 = b"\0" * 8
    valid = small_valid()
    for cut in range(1, len(valid)):
        yield f"truncated@{cut}", valid[:cut], TRUNCATED
    yield "empty", b"", "empty"
    yield "seven_bytes", b"\x10" + b"\0" * 6, TRUNCATED
    yield "length_prefix_only", struct.pack("<Q", 0), "not a JSON object"
    yield "header_len_over_cap", frame(hdr({"a": T()}), z8, n=MAX_HEADER + 1), "exceeds"
    yield "header_len_u64_max", frame(hdr({"a": T()}), z8, n=2**64 - 1), "exceeds"
    yield "header_len_gt_file", frame(hdr({"a": T()}), z8, n=len(hdr({"a": T()})) + 100), TRUNCATED
    yield "non_utf8", frame(b'{"a\xff":' + hdr(T()) + b"}", z8), "UTF-8"
    yield "non_json", frame(b"{not json}", z8), "not valid JSON"
    yield "json_array", frame(b"[]", z8), "not a JSON object"
    yield "json_string", frame(b'"abc"', z8), "not a JSON object"
    yield "json_trailing_garbage", frame(hdr({"a": T()}) + b"}", z8), "not valid JSON"
    yield "nul_padding", frame(hdr({"a": T()}) + b"\0" * 8, z8), "not valid JSON"
    yield "nan_constant", frame(b'{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,8]}}', z8), "JSON"
    yield "deep_nesting", frame(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", z8), None
    yield "huge_int", frame(b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,8]}}', z8), None
    yield "entry_not_object", frame(hdr({"a": 5}), z8), "entry must be an object"
    yield "missing_offsets", frame(hdr({"a": {"dtype": "F32", "shape": [2]}}), z8), "missing"
    yield "unknown_field", frame(hdr({"a": {**T(), "evil": 1}}), z8), "unknown fields"
    yield "bad_dtype", frame(hdr({"a": T("F33")}), z8), "dtype"
    yield "dtype_not_str", frame(hdr({"a": T(5)}), z8), "dtype"
    yield "unsupported_f4", frame(hdr({"a": T("F4", (16,))}), z8), "dtype"
    yield "negative_shape", frame(hdr({"a": T(shape=(-2,))}), z8), "shape"
    yield "float_shape", frame(hdr({"a": T(shape=(2.0,))}), z8), "shape"
    yield "bool_shape", frame(hdr({"a": T(shape=(True, 2))}), z8), "shape"
    yield "shape_not_list", frame(hdr({"a": {**T(), "shape": "2"}}), z8), "shape"
    yield "rank_too_high", frame(hdr({"a": T(shape=(1,) * 65 + (2,))}), z8), "shape"
    yield "negative_offset", frame(hdr({"a": T(off=(-1, 7))}), z8), "data_offsets"
    yield "float_offset", frame(hdr({"a": T(off=(0.0, 8))}), z8), "data_offsets"
    yield "three_offsets", frame(hdr({"a": T(off=(0, 4, 8))}), z8), "data_offsets"
    yield "reversed_offsets", frame(hdr({"a": T(off=(8, 0))}), z8), "reversed"
    yield "offsets_past_end", frame(hdr({"a": T(shape=(4,), off=(0, 16))}), z8), TRUNCATED
    yield "wrong_numel", frame(hdr({"a": T(shape=(3,))}), z8), "needs 12"
    yield "shape_overflow_u64", frame(hdr({"a": T(shape=(2, 2**64 - 2))}), z8), "overflows"
    yield "shape_product_overflow", frame(hdr({"a": T(shape=(2**32, 2**32))}), z8), "overflows"
    yield "declared_4tb", frame(hdr({"a": T(shape=(2**40,), off=(0, 2**42))}), z8), TRUNCATED
    yield "overlap_full", frame(hdr({"a": T(), "b": T()}), z8), "overlaps"
    yield "overlap_partial", frame(hdr({"a": T(), "b": T(off=(4, 12))}), b"\0" * 12), "overlaps"
    yield "gap", frame(hdr({"a": T(), "b": T(off=(12, 20))}), b"\0" * 20), "gap"
    yield "gap_at_start", frame(hdr({"a": T(off=(4, 12))}), b"\0" * 12), "gap"
    yield "trailing_data", frame(hdr({"a": T()}), z8 + b"PK\x05\x06"), "trailing data after the last tensor"
    yield "one_byte_short", frame(hdr({"a": T()}), b"\0" * 7), TRUNCATED
    yield "metadata_not_str", frame(hdr({"__metadata__": {"k": 1}, "a": T()}), z8), "strings to strings"
    yield "metadata_nested", frame(hdr({"__metadata__": {"k": {"x": "y"}}, "a": T()}), z8), "strings to strings"
    yield "metadata_list", frame(hdr({"__metadata__": ["k"], "a": T()}), z8), "strings to strings"
    yield "duplicate_key", frame(b'{"w":' + hdr(T()) + b',"w":' + hdr(T()) + b"}", z8), "duplicate key 'w'"
    yield "dtype_smuggle", frame(b'{"w":' + hdr(T()) + b',"w":' + hdr(T("I32")) + b"}", z8), "duplicate key 'w'"
    dup_field = b'{"w":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}}'
    yield "duplicate_field", frame(dup_field, z8), "duplicate key 'dtype'"
    dup_meta = b'{"__metadata__":{"k":"a","k":"b"},"w":' + hdr(T()) + b"}"
    yield "duplicate_metadata_key", frame(dup_meta, z8), "duplicate key 'k'"
    for name in ("../x", "a/../../b", "../../etc/passwd", "/etc/passwd", "a\\b", "..", "x/..", "a\x00b"):
        yield f"path_like[{name!r}]", frame(hdr({name: T()}), z8), "tensor name"
    yield "reserved_metadata_name", frame(hdr({"__metadata__": T()}), z8), "__metadata__"
    yield "empty_name", frame(hdr({"": T()}), z8), "empty name"
    yield "lone_surrogate_name", frame(b'{"\\ud800":' + hdr(T()) + b"}", z8), "Unicode"


CASES = list(structural_cases())


@pytest.mark.parametrize(("case", "blob", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_structural_corruption_rejected_fast(case: str, blob: bytes, fragment: str | None) -> None:
    started = time.perf_counter()
    with pytest.raises(CheckpointError) as info:
        read_header(blob, source=SOURCE)
    elapsed = time.perf_counter() - started
    message = str(info.value)
    assert message.startswith(SOURCE + ":"), message
    if fragment is not None:
        assert fragment in message, message
    assert elapsed < 0.1, f"{case}: {elapsed:.3f}s"


def test_structural_corruption_rejected_by_full_loader_too(tmp_path: Path) -> None:
    """The same corpus through ``read_checked`` (file on disk): CheckpointError only."""
    path = tmp_path / "bad.safetensors"
    for _case, blob, _ in CASES:
        path.write_bytes(blob)
        with pytest.raises(CheckpointError, match=str(path).replace("\\", "\\\\")):
            read_checked(path)


def test_corpus_covers_the_catalogue() -> None:
    ids = {c[0].split("@")[0].split("[")[0] for c in CASES}
    needed = {
        "truncated", "header_len_over_cap", "header_len_gt_file", "non_json", "json_array", "bad_dtype",
        "negative_shape", "overlap_full", "overlap_partial", "gap", "reversed_offsets", "offsets_past_end",
        "one_byte_short", "wrong_numel", "trailing_data", "unknown_field", "metadata_not_str",
        "duplicate_key", "dtype_smuggle", "path_like", "reserved_metadata_name", "empty_name",
    }  # fmt: skip
    assert needed <= ids
    assert len(CASES) > 100


def test_truncation_at_every_offset_names_the_cause() -> None:
    valid = small_valid()
    for cut in range(0, len(valid)):
        with pytest.raises(CheckpointError) as info:
            read_header(valid[:cut], source=SOURCE)
        assert ("empty" if cut == 0 else TRUNCATED) in str(info.value), (cut, str(info.value))


# ---------------------------------------------------------------------------------------------
# W5: files that are not safetensors


def _torch_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/version", b"3\n")
    return buffer.getvalue()


# What torch.save wrote before the zip format: a pickled magic number (bytes written by hand; no
# pickle module in this repository).
_LEGACY_PICKLE = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03.\x80\x02}q\x00."
_PROTO4_PICKLE = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."

SNIFFS = [
    ("empty", b"", "the file is empty"),
    ("torch_zip", _torch_zip(), "a PyTorch zip checkpoint, not safetensors — it was not loaded"),
    ("legacy_pickle", _LEGACY_PICKLE, "pickle checkpoint"),
    ("pickle_proto4", _PROTO4_PICKLE, "pickle checkpoint"),
    ("html_doctype", b"<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>", "an HTML page"),
    ("html_tag", b"\n  <HTML><head><title>Error</title></head></html>", "an HTML page"),
    (
        "git_lfs",
        b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 1234\n",
        "a Git LFS pointer — fetch the real file with git lfs pull".replace(" —", ", not safetensors —"),
    ),
]


@pytest.mark.parametrize(("case", "blob", "fragment"), SNIFFS, ids=[s[0] for s in SNIFFS])
def test_format_sniffing(case: str, blob: bytes, fragment: str) -> None:
    with pytest.raises(CheckpointError) as info:
        read_header(blob, source=SOURCE)
    message = str(info.value)
    assert fragment in message, message
    assert message.startswith(SOURCE)
    assert "header length" not in message  # the misleading message safetensors gives (§1.4)


def test_pickle_message_says_it_was_not_loaded() -> None:
    with pytest.raises(CheckpointError, match="not loaded"):
        read_header(_LEGACY_PICKLE, source=SOURCE)


def test_html_message_says_error_page() -> None:
    with pytest.raises(CheckpointError, match="the download returned an error page"):
        read_header(b"<!doctype html><p>404</p>", source=SOURCE)


@pytest.mark.parametrize("first", [0x80, ord("{")])
def test_valid_files_whose_first_byte_looks_like_pickle_or_json(first: int) -> None:
    """Header length 0x80 starts with the pickle opcode, 0x7B with '{': both must still load."""
    body = hdr({"a": T()})
    header = body + b" " * (first - len(body))  # safetensors allows trailing whitespace padding
    blob = frame(header, struct.pack("<2f", 1.0, 2.0))
    assert blob[0] == first
    tensors, _ = load_checked(blob, source=SOURCE)
    assert tensors["a"].tolist() == [1.0, 2.0]


# ---------------------------------------------------------------------------------------------
# W4: caps


def _many_entries(count: int, escape: bool = False) -> bytes:
    header = hdr({f"t{i}": T(shape=(0,), off=(0, 0)) for i in range(count)})
    if escape:  # defeats the byte-level pre-count; the JSON hook must still stop early
        header = header.replace(b'"data_offsets"', b'"data\\u005foffsets"')
    return frame(header)


@pytest.mark.parametrize("escape", [False, True], ids=["plain", "escaped_keys"])
def test_100k_tiny_entries_rejected_fast(escape: bool) -> None:
    blob = _many_entries(100_000, escape)
    assert len(blob) < MAX_HEADER  # so it is the entry cap that must catch it
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match=f"more than {MAX_TENSORS} entries"):
        read_header(blob, source=SOURCE)
    assert time.perf_counter() - started < 1.0


def test_exactly_max_tensors_is_accepted() -> None:
    infos, _ = read_header(_many_entries(MAX_TENSORS), source=SOURCE)
    assert len(infos) == MAX_TENSORS


def test_huge_header_rejected_from_prefix() -> None:
    """The 59 MB / 1 M-tensor file of §1.4: rejected before any JSON is parsed."""
    header = b"{" + b" " * (60 * 2**20) + b"}"
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match="exceeds"):
        read_header(frame(header), source=SOURCE)
    assert time.perf_counter() - started < 0.5


# ---------------------------------------------------------------------------------------------
# Valid files


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _all_dtype_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for name, dtype in DTYPES.items():
        if dtype.is_floating_point or dtype.is_complex:
            base = torch.randn(3, 4, generator=gen, dtype=torch.float32)
            out[f"t.{name}"] = base.to(dtype) if not dtype.is_complex else torch.complex(base, -base)
        elif dtype == torch.bool:
            out[f"t.{name}"] = torch.rand(3, 4, generator=gen) > 0.5
        else:
            out[f"t.{name}"] = torch.randint(0, 100, (3, 4), generator=gen).to(dtype)
    out["scalar"] = torch.tensor(3.5)
    out["empty"] = torch.zeros(0, 5)
    out["model.layers.0.mixer.A_log"] = torch.randn(7, generator=gen)
    return out


def test_valid_file_round_trips_bit_identically(tmp_path: Path) -> None:
    tensors = _all_dtype_tensors()
    metadata = {"format": "pt", "zoo.spec": json.dumps({"d_model": 4}), "ünïcode": "ok ✓"}
    path = tmp_path / "model.safetensors"
    save_file(tensors, path, metadata=metadata)
    loaded, meta = read_checked(path)
    assert meta == metadata
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype, name
        assert loaded[name].shape == tensor.shape, name
        assert _bits(loaded[name]) == _bits(tensor), name
    reference = load_file(path)
    assert all(_bits(reference[n]) == _bits(loaded[n]) for n in tensors)


def test_read_header_reports_entries(tmp_path: Path) -> None:
    blob = save({"b": torch.zeros(3, dtype=torch.float64), "a": torch.ones(2, dtype=torch.int8)})
    infos, meta = read_header(blob, source=SOURCE)
    assert meta == {}
    assert infos["b"] == TensorInfo("F64", (3,), 0, 24)
    assert infos["a"] == TensorInfo("I8", (2,), 24, 26)


def test_header_order_need_not_follow_offsets() -> None:
    """Writers list entries in any order (older safetensors sorted names); only the tiling counts."""
    blob = frame(hdr({"z": T(off=(8, 16)), "a": T(off=(0, 8))}), struct.pack("<4f", 1, 2, 3, 4))
    tensors, _ = load_checked(blob, source=SOURCE)
    assert tensors["a"].tolist() == [1, 2] and tensors["z"].tolist() == [3, 4]


def test_leading_whitespace_and_empty_header_accepted() -> None:
    """safetensors #686 allows whitespace padding; an empty header is a valid empty file."""
    tensors, _ = load_checked(frame(b"  \n" + hdr({"a": T()}), b"\0" * 8), source=SOURCE)
    assert list(tensors) == ["a"]
    assert load_checked(frame(b"{}"), source=SOURCE) == ({}, {})


def test_loaded_tensors_survive_truncation_and_overwrite(tmp_path: Path) -> None:
    """W10: no mmap, so changing the file after loading changes nothing (and never SIGBUS)."""
    path = tmp_path / "model.safetensors"
    original = {"w": torch.randn(512, 512), "b": torch.randn(512)}
    save_file(original, path)
    loaded, _ = read_checked(path)
    expected = {k: _bits(v) for k, v in loaded.items()}
    with open(path, "r+b") as handle:  # overwrite in place, same size
        size = handle.seek(0, os.SEEK_END)
        handle.seek(0)
        handle.write(b"\xff" * size)
    assert {k: _bits(v) for k, v in loaded.items()} == expected
    os.truncate(path, 16)
    assert {k: _bits(v) for k, v in loaded.items()} == expected
    assert float(loaded["w"].sum()) == float(original["w"].sum())


def test_loaded_tensors_are_writable_and_independent() -> None:
    blob = save({"w": torch.ones(4)})
    tensors, _ = load_checked(blob, source=SOURCE)
    tensors["w"].add_(1)  # must not touch (or fail on) the immutable input buffer
    assert tensors["w"].tolist() == [2.0] * 4
    assert load_checked(blob, source=SOURCE)[0]["w"].tolist() == [1.0] * 4


def test_missing_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot read"):
        read_checked(tmp_path / "nope.safetensors")


# ---------------------------------------------------------------------------------------------
# W13: non-finite values


def test_nonfinite_rejected_by_default(tmp_path: Path) -> None:
    weights = torch.ones(10)
    weights[[1, 4, 7]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    path = tmp_path / "nan.safetensors"
    save_file({"ok": torch.ones(3), "x": weights, "ints": torch.arange(3)}, path)
    with pytest.raises(CheckpointError) as info:
        read_checked(path)
    message = str(info.value)
    assert "tensor 'x' holds 3 non-finite values" in message
    assert "'ok'" not in message and "allow_nonfinite=True" in message
    tensors, _ = read_checked(path, allow_nonfinite=True)
    assert int(torch.isnan(tensors["x"]).sum()) == 1


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float64, torch.complex64, torch.float8_e5m2, torch.float8_e4m3fn]
)
def test_nonfinite_detected_in_every_floating_dtype(dtype: torch.dtype) -> None:
    base = torch.zeros(5, dtype=torch.float32)
    base[2] = float("nan")
    value = torch.complex(base, torch.zeros(5)) if dtype.is_complex else base.to(dtype)
    blob = save({"a": torch.ones(2), "bad": value})
    with pytest.raises(CheckpointError, match="tensor 'bad' holds 1 non-finite value"):
        load_checked(blob, source=SOURCE)


def test_all_nonfinite_tensors_listed_together() -> None:
    blob = save({"p": torch.full((4,), float("inf")), "q": torch.tensor([float("nan"), 0.0])})
    with pytest.raises(CheckpointError) as info:
        load_checked(blob, source=SOURCE)
    assert "tensor 'p' holds 4 non-finite values" in str(info.value)
    assert "tensor 'q' holds 1 non-finite value" in str(info.value)


# ---------------------------------------------------------------------------------------------
# W12: mutation fuzz


def _mutate(rng: random.Random, blob: bytes, header_end: int) -> bytes:
    """One random byte-level mutation, biased toward the length prefix and the header."""
    data = bytearray(blob)
    if not data:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    pos = rng.randrange(min(header_end, len(data))) if rng.random() < 0.8 else rng.randrange(len(data))
    op = rng.randrange(9)
    if op == 0:
        data[pos] ^= 1 << rng.randrange(8)
    elif op == 1:
        data[pos] = rng.randrange(256)
    elif op == 2:
        data[pos] = rng.choice(b'{}[]",: 0123456789-.eE\\\x00\x80\xff')
    elif op == 3:
        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif op == 4:
        del data[pos : pos + rng.randint(1, 8)]
    elif op == 5:
        del data[rng.randrange(len(data)) :]
    elif op == 6:
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif op == 7:
        width = rng.randint(1, 16)
        data[pos:pos] = data[pos : pos + width]
    else:
        other = rng.randrange(len(data))
        data[pos], data[other] = data[other], data[pos]
    return bytes(data)


def _consistent(blob: bytes, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A clean load of a mutant must agree byte for byte with the header we checked."""
    infos, meta = read_header(blob, source="mutant")
    assert meta == metadata
    assert tensors.keys() == infos.keys()
    base = 8 + struct.unpack("<Q", blob[:8])[0]
    for name, info in infos.items():
        assert tensors[name].dtype == DTYPES[info.dtype]
        assert tuple(tensors[name].shape) == info.shape
        assert _bits(tensors[name]) == blob[base + info.start : base + info.end]


def test_mutation_fuzz() -> None:
    """~2000 mutants: each is a clean load or a CheckpointError, nothing else.

    A mutant can be a valid file with different contents (a flipped data byte, a renamed tensor,
    an edited metadata value); only a pinned sha256 can catch those. For every clean load we check
    that safetensors read exactly what our header check saw (no parser differential).
    """
    valid = small_valid()
    header_end = 8 + struct.unpack("<Q", valid[:8])[0]
    reference, ref_meta = load_checked(valid, source="reference")
    rng = random.Random(20260401)
    outcomes = {"identical": 0, "rejected": 0, "valid_but_different": 0}
    started = time.perf_counter()
    for _ in range(2000):
        mutant = _mutate(rng, valid, header_end)
        if rng.random() < 0.3:
            mutant = _mutate(rng, mutant, header_end)
        try:
            tensors, metadata = load_checked(mutant, source="mutant")
        except CheckpointError:
            outcomes["rejected"] += 1
            continue
        same = (
            metadata == ref_meta
            and tensors.keys() == reference.keys()
            and all(
                t.dtype == reference[n].dtype and t.shape == reference[n].shape and _bits(t) == _bits(reference[n])
                for n, t in tensors.items()
            )
        )
        if same:
            outcomes["identical"] += 1
        else:
            _consistent(mutant, tensors, metadata)
            outcomes["valid_but_different"] += 1
    elapsed = time.perf_counter() - started
    assert sum(outcomes.values()) == 2000
    assert outcomes["rejected"] > 1000 and outcomes["identical"] > 0, outcomes
    assert elapsed < 20, elapsed


# ---------------------------------------------------------------------------------------------
# Sizes from fstat before any data is read (issue 11)


def _sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)  # sparse: no disk, no memory
    return path


def test_valid_header_on_a_huge_sparse_file_is_refused_before_reading_it(tmp_path: Path) -> None:
    from zoo_core.io.safetensors_check import read_header_file

    head = save({"w": torch.zeros(4)})  # a small valid file: header + 16 bytes of data
    path = _sparse(tmp_path / "model.safetensors", head, 6 * 2**30)
    started = time.perf_counter()
    for read in (read_header_file, read_checked):
        with pytest.raises(CheckpointError) as info:
            read(path)
        msg = str(info.value)
        data_len = 6 * 2**30 - len(head) + 16
        assert "trailing data" in msg and "promises 16 bytes" in msg and f"{data_len} are present" in msg
    assert time.perf_counter() - started < 2


def test_header_file_check_reads_no_tensor_data(tmp_path: Path) -> None:
    from zoo_core.io.safetensors_check import read_header_file

    path = tmp_path / "model.safetensors"
    save_file({"a": torch.ones(3), "b": torch.zeros(2, 2)}, str(path), metadata={"k": "v"})
    infos, meta = read_header_file(path)
    assert infos["b"].shape == (2, 2) and meta == {"k": "v"}
    path.write_bytes(path.read_bytes()[:-4])  # truncated data: the size check alone finds it
    with pytest.raises(CheckpointError, match=TRUNCATED.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        read_header_file(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="not a regular file"):
        read_checked(fifo)  # opening a FIFO for reading would block until a writer comes
