"""The Hub's small ones: partial downloads a killed pull left, connection failures' exit code,
bad ``ZOO_HUB_*`` settings, ``--local-dir`` into a folder holding the user's files, and ``zoo push``
of a folder that would not load."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from zoo_core.errors import CheckpointError
from zoo_core.hub import HubConnectionError, pull, push_to_hub
from zoo_core.hub.errors import HubSettingError
from zoo_core.io.pretrained import save_pretrained

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

SHA = "ab" * 32


@pytest.fixture
def repo(hub, make_model):
    push_to_hub(make_model(0), "org/f")
    hub.clear()


# partial downloads of a killed pull -----------------------------------------------------------------
def _leftover(folder: Path, name: str, *, age: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"half a body")
    then = time.time() - age
    os.utime(path, (then, then))
    return path


@pytest.mark.skipif(fcntl is None, reason="POSIX flock")
def test_partial_downloads_a_killed_pull_left_are_swept_and_nothing_else(hub, repo, hf_home):
    cache = hf_home / "hub"
    blobs = cache / "models--org--f" / "blobs"
    hour = 3600.0
    gone = [_leftover(blobs, f"{SHA}.0a1b2c3d.incomplete", age=hour),  # huggingface_hub >= 1.x, per process
            _leftover(blobs, f"{'cd' * 20}.incomplete", age=hour),  # 0.x, resumable, of an etag no longer served
            _leftover(blobs, f"{'ef' * 16}.9f8e7d6c.incomplete", age=hour)]  # an md5-ETag mirror's
    kept = [_leftover(blobs, f"{'12' * 32}.0a1b2c3d.incomplete", age=5.0),  # recent: a download may be writing it
            _leftover(blobs, "notes.incomplete", age=hour),  # not the client's pattern
            _leftover(blobs, "my-notes.txt", age=hour),
            _leftover(blobs, f"{SHA}.incomplete.bak", age=hour),
            _leftover(cache / "models--org--g" / "blobs", f"{SHA}.0a1b2c3d.incomplete", age=hour)]  # another repo's
    locked = _leftover(blobs, f"{'34' * 32}.0a1b2c3d.incomplete", age=hour)  # its writer holds the client's lock
    lock = cache / ".locks" / "models--org--f" / f"{'34' * 32}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        got = pull("hf-hub:org/f")
    finally:
        os.close(fd)
    assert "model.safetensors" in got.files
    assert [p.name for p in gone if p.exists()] == []
    assert [p.name for p in kept + [locked] if not p.exists()] == []


# exit codes and settings --------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_hub_exits_5_not_1(hub, cli):
    done = cli("pull", "hf-hub:org/f", env={"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "ZOO_HUB_RETRIES": "1"})
    assert done.returncode == 5, done.stderr
    assert "could not reach the Hub" in done.stderr and "Traceback" not in done.stderr
    assert HubConnectionError("x").exit_code == 5


@pytest.mark.parametrize("name, value, allowed", [
    ("ZOO_HUB_RETRIES", "abc", "whole number >= 1"),
    ("ZOO_HUB_RETRIES", "0", "whole number >= 1"),
    ("ZOO_HUB_BACKOFF", "-1", "from 0 to 3600"),
    ("ZOO_HUB_BACKOFF", "soon", "from 0 to 3600"),
])
def test_bad_retry_settings_are_usage_errors_naming_the_variable(hub, repo, cli, make_model, monkeypatch, name, value, allowed):
    done = cli("pull", "hf-hub:org/f", env={name: value})
    assert done.returncode == 2 and f"{name}={value!r}" in done.stderr and allowed in done.stderr
    assert "Traceback" not in done.stderr and "Hub request" not in done.stderr
    monkeypatch.setenv(name, value)
    with pytest.raises(HubSettingError, match=name):
        pull("hf-hub:org/f")
    with pytest.raises(HubSettingError, match=name):
        push_to_hub(make_model(1), "org/f")
    assert hub.requests == []  # refused before any request


# --local-dir into a folder holding the user's own files ---------------------------------------------------
def test_local_dir_counts_and_records_only_the_repos_files(hub, repo, tmp_path, cli):
    target = tmp_path / "work"
    (target / "data").mkdir(parents=True)
    (target / "notes.txt").write_text("mine")
    (target / "train.py").write_text("print('mine')")
    (target / "data" / "x.csv").write_text("1,2")
    repo_files = ["README.md", "config.json", "model.safetensors"]
    got = pull("hf-hub:org/f", local_dir=target)
    assert sorted(got.files) == repo_files
    assert sorted(json.loads((target / "zoo-pull.json").read_text())["files"]) == repo_files
    done = cli("pull", "hf-hub:org/f", "--local-dir", str(target))
    assert done.returncode == 0 and "(3 files," in done.stdout
    assert (target / "notes.txt").read_text() == "mine" and (target / "data" / "x.csv").read_text() == "1,2"
    assert sorted(pull(f"local-dir:{target}").files) == repo_files


# zoo push of a folder that would not load ---------------------------------------------------------------
def _respecced_folder(make_model, tmp_path: Path, edit) -> Path:
    """A saved folder whose weights' metadata ``spec`` is replaced by ``edit(spec)`` (config.json agrees)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = tmp_path / "m"
    save_pretrained(make_model(0), str(folder))
    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    spec = edit(json.loads(meta["spec"]))
    meta["spec"] = json.dumps(spec)
    save_file(tensors, str(path), metadata=meta)
    config = json.loads((folder / "config.json").read_text())
    config["spec"] = spec
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _oversize(spec: dict) -> dict:
    return {**spec, "model": {**spec["model"], "d_model": 4096, "depth": 64}}


@pytest.mark.parametrize("edit", [lambda spec: "specs/s4d-tiny.yaml", _oversize], ids=["string-spec", "oversize-spec"])
def test_push_refuses_a_folder_that_would_not_load_before_any_request(hub, make_model, tmp_path, cli, edit):
    folder = _respecced_folder(make_model, tmp_path, edit)
    with pytest.raises(CheckpointError, match="spec"):
        push_to_hub(str(folder), "org/bad")
    done = cli("push", str(folder), "org/bad")
    assert done.returncode == 3 and "spec" in done.stderr and "Traceback" not in done.stderr
    assert hub.requests == [] and hub.repos == {}  # no repo created, no commit


# a language model's vocabulary travels with it ----------------------------------------------------
def test_a_pushed_vocabulary_is_pulled_back_and_loads(hub, tmp_path):
    from zoo_core.tokenizer import CharTokenizer

    folder = Path(__file__).resolve().parents[2] / "pretrained" / "mamba-char.shakespeare"
    push_to_hub(folder, "org/char")
    got = pull("hf-hub:org/char")
    assert (got.path / "vocab.json").read_bytes() == (folder / "vocab.json").read_bytes()
    assert CharTokenizer.from_pretrained(got.path).encode("ROMEO:") == CharTokenizer.from_pretrained(folder).encode("ROMEO:")
    local = pull("hf-hub:org/char", local_dir=tmp_path / "m")
    assert (local.path / "vocab.json").is_file() and "vocab.json" in local.files
