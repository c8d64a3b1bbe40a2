"""Weights files whose metadata lies: a huge stored spec, a spec that is a path, wrong types, and
a core now provided by another distribution. Each is refused by ``check_folder`` and
``load_pretrained`` before anything big is read or allocated, with exit 3 (4 for the provider)."""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open
from safetensors.torch import load_file

from zoo_core.build import build_model
from zoo_core.cli import main
from zoo_core.errors import CheckpointError, ProviderMismatchError
from zoo_core.factory import check_folder, load_pretrained
from zoo_core.io.pretrained import (
    CONFIG,
    TRUST_PROVIDER_ENV,
    WEIGHTS,
    canonical_safetensors,
    save_pretrained,
)

SPEC = {
    "schema_version": 1,
    "task": {"kind": "classification", "classes": 3},
    "input": {"channels": 2},
    "model": {"d_model": 8, "depth": 2, "core": {"kind": "s4d", "preset": "tiny"}},
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile") / "m"
    save_pretrained(build_model(SPEC, seed=0), folder)
    return folder


def _metadata(folder: Path) -> dict[str, str]:
    with safe_open(str(folder / WEIGHTS), "pt") as f:
        return dict(f.metadata())


def forge(saved: Path, dest: Path, **changes: str | None) -> Path:
    """A copy of ``saved`` whose metadata entries are replaced (None deletes one); the header
    stays consistent with the data, so only the metadata lies. No config.json (the weights' own
    metadata is what is attacked)."""
    meta = _metadata(saved)
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    dest.mkdir(parents=True)
    (dest / WEIGHTS).write_bytes(canonical_safetensors(load_file(str(saved / WEIGHTS)), meta))
    return dest


def _spec_with(**model: Any) -> str:
    spec = json.loads(json.dumps(build_model(SPEC, seed=0).spec))
    spec["model"].update(model)
    return json.dumps(spec, sort_keys=True)


# 1. a stored spec that describes a huge model --------------------------------------------------
@pytest.mark.parametrize("model", [{"d_model": 4096, "depth": 64}, {"d_model": 65536, "depth": 1000}])
def test_huge_stored_spec_is_refused_fast_without_allocating(saved, tmp_path, model):
    folder = forge(saved, tmp_path / "huge", spec=_spec_with(**model))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    for load in (check_folder, load_pretrained):
        with pytest.raises(CheckpointError) as info:
            load(folder)
        msg = str(info.value)
        assert "the spec stored in the file describes" in msg and "wrong shape" in msg
    assert time.perf_counter() - started < 20
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 1024, f"max RSS grew by {grown_mib:.0f} MiB"


def test_every_core_builds_on_the_meta_device():
    from zoo_core.footprint import expected_tensors, meta_model
    from zoo_core.plugins import get_registry
    from zoo_core.spec import load_spec

    for kind in sorted(get_registry().cores):
        spec = json.loads(json.dumps(SPEC))
        spec["model"]["core"] = {"kind": kind}
        real = build_model(spec, seed=0)
        meta = meta_model(load_spec(spec))
        assert {p.device.type for p in meta.parameters()} == {"meta"}, kind
        shapes = {n: s for n, (s, _) in expected_tensors(meta).items()}
        assert shapes == {n: s for n, (s, _) in expected_tensors(real).items()}, kind


# 2. a stored spec that is a string (read as a path before) ----------------------------------------
def _load_with_timeout(folder: Path, unblock: Path, seconds: float = 20) -> BaseException | None:
    """Run load_pretrained in a thread; a hang fails the test instead of hanging it."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            load_pretrained(folder)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():  # a reader blocks on the FIFO: open its write end to release it
        fd = os.open(unblock, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(5)
        pytest.fail(f"load_pretrained hung for {seconds} s on a stored spec naming a FIFO")
    return outcome[0]


def test_string_spec_naming_a_fifo_is_refused_without_opening_it(saved, tmp_path):
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    folder = forge(saved, tmp_path / "fifo", spec=json.dumps(str(fifo)))
    exc = _load_with_timeout(folder, fifo)
    assert isinstance(exc, CheckpointError), exc
    assert "'spec' must be a mapping" in str(exc) and "never read as a path" in str(exc)


@pytest.mark.skipif(not Path("/etc/passwd").is_file(), reason="needs /etc/passwd")
def test_string_spec_naming_a_local_file_does_not_echo_it(saved, tmp_path):
    folder = forge(saved, tmp_path / "passwd", spec=json.dumps("/etc/passwd"))
    with pytest.raises(CheckpointError) as info:
        check_folder(folder)
    first_line = Path("/etc/passwd").read_text().splitlines()[0]
    assert first_line not in str(info.value) and "root:" not in str(info.value)
    assert "'spec' must be a mapping" in str(info.value) and info.value.exit_code == 3


# 3. metadata of the wrong type --------------------------------------------------------------------
MALFORMED = {
    "complex_string": ({"complex": '"5"'}, "'complex'"),
    "complex_number": ({"complex": "5"}, "'complex'"),
    "complex_list_of_ints": ({"complex": "[1, 2]"}, "'complex'"),
    "spec_list": ({"spec": "[1,2]"}, "'spec'"),
    "spec_null": ({"spec": "null"}, "'spec'"),
    "spec_number": ({"spec": "7"}, "'spec'"),
    "versions_list": ({"versions": "[]"}, "'versions'"),
    "versions_number_values": ({"versions": '{"zoo-core": 1}'}, "'versions'"),
    "tied_dict_values": ({"tied": '{"a": {"b": 1}}'}, "'tied'"),
    "tied_int_value": ({"tied": '{"a": 1}'}, "'tied'"),
    "tied_list": ({"tied": '["a"]'}, "'tied'"),
    "missing_spec": ({"spec": None}, "'spec'"),
    "missing_versions": ({"versions": None}, "'versions'"),
    "missing_complex": ({"complex": None}, "'complex'"),
    "missing_tied": ({"tied": None}, "'tied'"),
    "missing_format": ({"format": None}, "format"),
    "wrong_format": ({"format": "zoo.safetensors/9"}, "format"),
    "extra_key": ({"loader": "os.system"}, "'loader'"),
    "spec_not_json": ({"spec": "{not json"}, "'spec'"),
    "deep_json": ({"spec": "[" * 100_000 + "]" * 100_000}, "'spec'"),
    "spec_empty_mapping": ({"spec": "{}"}, "stored spec"),
    "spec_core_not_mapping": ({"spec": '{"schema_version": 1, "model": {"core": "s4d"}}'}, "stored spec"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_metadata_is_refused_naming_the_field(saved, tmp_path, name):
    changes, field = MALFORMED[name]
    folder = forge(saved, tmp_path / name, **changes)
    for load in (check_folder, load_pretrained):
        with pytest.raises(CheckpointError) as info:
            load(folder)
        assert field in str(info.value)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_metadata_through_the_cli_exits_3_without_traceback(saved, tmp_path, name, capsys):
    changes, field = MALFORMED[name]
    folder = forge(saved, tmp_path / name, **changes)
    assert main(["inspect", str(folder)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and field in err


# 5. the core's provider ------------------------------------------------------------------------------
def _versions(**dists: str) -> str:
    return json.dumps({"zoo-core": "0.1.0", "torch": "2.0.0", **dists}, sort_keys=True)


def test_core_saved_by_another_distribution_is_refused(saved, tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_PROVIDER_ENV, raising=False)
    folder = forge(saved, tmp_path / "impostor", versions=_versions(**{"zoo-s4d-fast": "9.9"}))
    for load in (check_folder, load_pretrained):
        with pytest.raises(ProviderMismatchError) as info:
            load(folder)
        msg = str(info.value)
        assert "zoo-s4d-fast 9.9" in msg and "zoo-s4d" in msg and "trust_provider=True" in msg and TRUST_PROVIDER_ENV in msg
    assert main(["inspect", str(folder)]) == 4
    load_pretrained(folder, trust_provider=True)
    monkeypatch.setenv(TRUST_PROVIDER_ENV, "1")
    load_pretrained(folder)


def test_other_version_of_the_same_distribution_loads(saved, tmp_path, caplog):
    folder = forge(saved, tmp_path / "older", versions=_versions(**{"zoo-s4d": "0.0.1"}))
    with caplog.at_level("INFO", logger="zoo_core.io.pretrained"):
        load_pretrained(folder)
    assert "zoo-s4d 0.0.1" in caplog.text


def test_unmodified_folder_passes_check_folder(saved):
    check_folder(saved)
    assert (saved / CONFIG).is_file()


# create_model with overrides builds from the stored spec too: the same checks first ------------------
def test_create_model_with_overrides_refuses_a_huge_stored_spec(saved, tmp_path):
    from zoo_core.hub import create_model

    folder = forge(saved, tmp_path / "huge", spec=_spec_with(d_model=4096, depth=64))
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match="the spec stored in the file describes"):
        create_model(f"local-dir:{folder}", strict=False, task={"classes": 3})
    assert time.perf_counter() - started < 20


def test_create_model_overrides_that_ask_for_the_impossible_are_refused_before_allocating(saved, monkeypatch):
    from zoo_core.footprint import MemoryBudgetError
    from zoo_core.hub import create_model

    monkeypatch.setenv("ZOO_MEMORY_BUDGET", "1GiB")
    with pytest.raises(MemoryBudgetError):
        create_model(f"local-dir:{saved}", strict=False, model={"d_model": 16384, "depth": 64})
    assert create_model(f"local-dir:{saved}", strict=False, task={"classes": 3}) is not None
