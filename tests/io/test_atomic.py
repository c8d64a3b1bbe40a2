"""Atomic folder and file writes (reliability.md §7.D I1, I3, I4)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from zoo_core.errors import CheckpointError
from zoo_core.io.atomic import atomic_write_dir, atomic_write_file, recover_dir
from zoo_core.testing.helpers import model_spec

REPO = Path(__file__).resolve().parents[2]
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX rename/fsync/signals")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def snapshot(folder: Path) -> dict[str, bytes]:
    """File name -> bytes for a flat folder."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def manifest_files(version: int, rng: random.Random) -> dict[str, bytes]:
    """A versioned folder whose manifest.json pins the sha256 of every other file."""
    files = {f"part{i}.bin": bytes([version % 251]) * rng.randrange(1, 64_000) for i in range(3)}
    manifest = {"version": version, "sha256": {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}}
    files["manifest.json"] = json.dumps(manifest).encode()
    return files


def check_manifest(folder: Path) -> int:
    """Assert the folder is one complete version; return that version."""
    manifest = json.loads((folder / "manifest.json").read_bytes())
    names = {p.name for p in folder.iterdir()}
    assert names == set(manifest["sha256"]) | {"manifest.json"}, names
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    return int(manifest["version"])


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(proc.stdout)


# ---------------------------------------------------------------------------------------------
# Basics


def test_create_then_replace(tmp_path: Path) -> None:
    target = tmp_path / "model"
    assert atomic_write_dir(target, {"a.txt": b"one", "b.txt": b"two"}) == target
    assert snapshot(target) == {"a.txt": b"one", "b.txt": b"two"}
    atomic_write_dir(target, {"c.txt": b"three"})
    assert snapshot(target) == {"c.txt": b"three"}  # the folder is replaced, not merged
    assert os.listdir(tmp_path) == ["model"]


def test_callable_receives_staging_path(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from zoo_core.io.safetensors_check import read_checked

    seen: list[Path] = []

    def write(path: Path) -> None:
        seen.append(path)
        save_file({"w": torch.arange(4.0)}, path, metadata={"k": "v"})

    target = tmp_path / "model"
    atomic_write_dir(target, {"model.safetensors": write, "config.json": b"{}"})
    assert seen[0].parent.name.startswith(".model.staging-") and seen[0].parent.parent == tmp_path
    tensors, meta = read_checked(target / "model.safetensors")
    assert tensors["w"].tolist() == [0.0, 1.0, 2.0, 3.0] and meta == {"k": "v"}
    assert os.listdir(tmp_path) == ["model"]


def test_parent_is_created(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "model"
    atomic_write_dir(target, {"x": b"1"})
    assert snapshot(target) == {"x": b"1"}


def test_target_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.write_bytes(b"not a folder")
    with pytest.raises(CheckpointError, match="not a folder"):
        atomic_write_dir(target, {"x": b"1"})
    assert target.read_bytes() == b"not a folder"
    assert os.listdir(tmp_path) == ["model"]


def test_target_that_is_a_symlink_is_an_error(tmp_path: Path) -> None:
    real = tmp_path / "real"
    atomic_write_dir(real, {"x": b"1"})
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(CheckpointError, match="symbolic link"):
        atomic_write_dir(link, {"x": b"2"})
    assert snapshot(real) == {"x": b"1"}


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\\b", "a\0b"])
def test_file_names_must_be_plain(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="plain name"):
        atomic_write_dir(tmp_path / "m", {name: b"1"})
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------------------------------------
# Failures during the write


def test_callable_raising_mid_save_leaves_old_folder(tmp_path: Path) -> None:
    target = tmp_path / "model"
    atomic_write_dir(target, {"a.bin": b"old-a", "b.bin": b"old-b"})
    before = snapshot(target)

    def explode(path: Path) -> None:
        path.write_bytes(b"partial")
        raise RuntimeError("boom in the writer")

    with pytest.raises(CheckpointError) as info:
        atomic_write_dir(target, {"a.bin": b"new-a", "b.bin": explode, "c.bin": b"new-c"})
    message = str(info.value)
    assert str(target) in message and "boom in the writer" in message and "unchanged" in message
    assert isinstance(info.value.__cause__, RuntimeError)
    assert snapshot(target) == before
    assert os.listdir(tmp_path) == ["model"]


def test_callable_that_writes_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="did not create the file"):
        atomic_write_dir(tmp_path / "m", {"x": lambda path: None})
    assert os.listdir(tmp_path) == []


def test_keyboard_interrupt_cleans_up_and_propagates(tmp_path: Path) -> None:
    target = tmp_path / "model"
    atomic_write_dir(target, {"a": b"old"})

    def interrupt(path: Path) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write_dir(target, {"a": interrupt})
    assert snapshot(target) == {"a": b"old"}
    assert os.listdir(tmp_path) == ["model"]


def test_failed_swap_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the second rename fails, the old folder is put back under the target name."""
    target = tmp_path / "model"
    atomic_write_dir(target, {"a": b"old"})
    real_rename = os.rename

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(src).name.startswith(".model.staging-"):
            raise OSError(5, "simulated I/O error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(CheckpointError, match="simulated I/O error"):
        atomic_write_dir(target, {"a": b"new"})
    monkeypatch.undo()
    assert snapshot(target) == {"a": b"old"}
    assert os.listdir(tmp_path) == ["model"]


_DISK_FULL_CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    from zoo_core.errors import CheckpointError
    from zoo_core.io.atomic import atomic_write_dir

    def chunks(path):
        with open(path, "wb") as handle:
            for _ in range(4):
                handle.write(b"\\1" * (1 << 19))

    big = chunks if sys.argv[2] == "callable" else b"\\1" * (2 << 20)
    try:
        atomic_write_dir(sys.argv[1], {"small.bin": b"new", "big.bin": big, "manifest.json": b"{}"})
    except CheckpointError as exc:
        print(exc)
        sys.exit(0)
    sys.exit(7)
    """
)


@posix_only
@pytest.mark.parametrize("kind", ["bytes", "callable"])
def test_disk_full_gives_checkpoint_error_and_keeps_old(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "model"
    atomic_write_dir(target, {"small.bin": b"old", "manifest.json": b'{"v": 0}'})
    before = snapshot(target)
    proc = subprocess.run(
        [sys.executable, "-c", _DISK_FULL_CHILD, str(target), kind],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert str(target) in proc.stdout and "File too large" in proc.stdout, proc.stdout
    assert snapshot(target) == before
    assert os.listdir(tmp_path) == ["model"]


# ---------------------------------------------------------------------------------------------
# Killed saves (I1)

_KILL_CHILD = textwrap.dedent(
    """
    import hashlib, json, random, sys
    from zoo_core.io.atomic import atomic_write_dir

    target, seed, version = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    print("ready", flush=True)
    while True:
        version += 1
        files = {f"part{i}.bin": bytes([version % 251]) * rng.randrange(1, 64_000) for i in range(3)}
        digests = {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
        payload = files.pop("part2.bin")
        def write_part2(path, payload=payload):
            with open(path, "wb") as handle:
                handle.write(payload[: len(payload) // 2])
                handle.write(payload[len(payload) // 2 :])
        files["part2.bin"] = write_part2
        files["manifest.json"] = json.dumps({"version": version, "sha256": digests}).encode()
        atomic_write_dir(target, files)
        print(version, flush=True)
    """
)


@posix_only
def test_sigkill_during_saves_leaves_old_or_new(tmp_path: Path) -> None:
    target = tmp_path / "model"
    rng = random.Random(1234)
    atomic_write_dir(target, manifest_files(0, rng))
    version, window_hits, started = 0, 0, time.monotonic()
    for trial in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILL_CHILD, str(target), str(trial), str(version)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGKILL, err
        committed = [int(line) for line in out.split()]
        last = committed[-1] if committed else version
        if not target.exists():
            window_hits += 1  # killed between the two renames: the old folder sits beside it
        recover_dir(target)
        found = check_manifest(target)
        assert found in (last, last + 1), (found, last)  # entirely old or entirely new
        assert os.listdir(tmp_path) == ["model"], os.listdir(tmp_path)
        version = found
    assert version > 0
    assert time.monotonic() - started < 15


@posix_only
def test_crash_window_is_restored_on_next_call(tmp_path: Path) -> None:
    target = tmp_path / "model"
    old_files = manifest_files(1, random.Random(0))
    atomic_write_dir(target, old_files)
    pid = dead_pid()
    os.rename(target, tmp_path / f".model.old-{pid}-0badc0de")
    staging = tmp_path / f".model.staging-{pid}-feedface"
    staging.mkdir()
    (staging / "part0.bin").write_bytes(b"half a file")
    recover_dir(target)
    assert snapshot(target) == old_files
    assert os.listdir(tmp_path) == ["model"]
    # The same through the next save: restored, then replaced, nothing left over.
    os.rename(target, tmp_path / f".model.old-{pid}-0badc0de")
    atomic_write_dir(target, manifest_files(2, random.Random(0)))
    assert check_manifest(target) == 2
    assert os.listdir(tmp_path) == ["model"]


@posix_only
def test_leftovers_of_live_processes_are_kept(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        live = tmp_path / f".model.staging-{sleeper.pid}-00000000"
        live.mkdir()
        dead = tmp_path / f".model.staging-{dead_pid()}-11111111"
        dead.mkdir()
        mine = tmp_path / f".model.staging-{os.getpid()}-22222222"  # an earlier failed call of ours
        mine.mkdir()
        other = tmp_path / f".other.staging-{dead_pid()}-33333333"  # a different target's
        other.mkdir()
        atomic_write_dir(tmp_path / "model", {"x": b"1"})
        assert sorted(os.listdir(tmp_path)) == sorted(["model", live.name, other.name])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_concurrent_saves_from_threads(tmp_path: Path) -> None:
    target = tmp_path / "model"
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for i in range(10):
                atomic_write_dir(target, manifest_files(seed * 100 + i, rng))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    check_manifest(target)
    assert os.listdir(tmp_path) == ["model"]


# ---------------------------------------------------------------------------------------------
# Durability and placement (I4)


def test_staging_never_uses_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    readonly = tmp_path / "readonly-tmp"
    readonly.mkdir()
    readonly.chmod(0o555)
    monkeypatch.setenv("TMPDIR", str(readonly))
    monkeypatch.setattr(tempfile, "tempdir", None)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tempfile module must not be used")

    for name in ("mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile", "TemporaryDirectory", "gettempdir"):
        monkeypatch.setattr(tempfile, name, forbidden)
    out = tmp_path / "out"
    out.mkdir()
    target = out / "model"
    atomic_write_dir(target, {"model.safetensors": lambda p: save_file({"w": torch.ones(2)}, p), "config.json": b"{}"})
    atomic_write_dir(target, {"config.json": b"{}"})
    atomic_write_file(out / "card.md", b"# card")
    assert sorted(os.listdir(out)) == ["card.md", "model"]
    readonly.chmod(0o755)


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else str(fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@posix_only
def test_fsync_files_staging_and_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "model"
    atomic_write_dir(target, {"old": b"0"})
    synced = _record_fsyncs(monkeypatch)
    atomic_write_dir(target, {"a.bin": b"1", "b.bin": lambda p: p.write_bytes(b"2"), "c.bin": b"3"})
    assert len(synced) >= 5  # 3 files + staging folder + parent
    if os.path.exists("/proc/self/fd"):
        names = [Path(s).name for s in synced]
        assert {"a.bin", "b.bin", "c.bin"} <= set(names)
        assert any(n.startswith(".model.staging-") for n in names)
        assert synced[-1] == str(tmp_path)  # the parent, after the rename


@posix_only
def test_atomic_write_file_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced = _record_fsyncs(monkeypatch)
    atomic_write_file(tmp_path / "config.json", b"{}")
    assert len(synced) == 2
    if os.path.exists("/proc/self/fd"):
        assert synced[-1] == str(tmp_path)


# ---------------------------------------------------------------------------------------------
# atomic_write_file


def test_atomic_write_file_replaces(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    atomic_write_file(path, b"one")
    atomic_write_file(path, b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["config.json"]


def test_atomic_write_file_failure_keeps_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.json"
    atomic_write_file(path, b"old")

    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(CheckpointError, match="disk full"):
        atomic_write_file(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["config.json"]


def test_atomic_write_file_onto_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is a folder"):
        atomic_write_file(tmp_path, b"x")


def test_atomic_write_file_sweeps_dead_tmp(tmp_path: Path) -> None:
    litter = tmp_path / f".config.json.tmp-{dead_pid()}-abcdef01"
    litter.write_bytes(b"half")
    atomic_write_file(tmp_path / "config.json", b"{}")
    assert os.listdir(tmp_path) == ["config.json"]


def test_recover_dir_on_missing_parent_is_a_no_op(tmp_path: Path) -> None:
    recover_dir(tmp_path / "nowhere" / "model")


# ---------------------------------------------------------------------------------------------
# Every load path recovers a folder left between the two renames of a swap


def _half_swapped_model(tmp_path: Path) -> Path:
    """A saved tiny model (BasicMotions-shaped) whose folder a killed save left aside as ``.m.old-<dead pid>-…``."""
    from zoo_core.build import build_model
    from zoo_core.io.pretrained import save_pretrained

    spec = model_spec("s4d", task={"kind": "classification", "classes": 4}, inp={"channels": 6}, d_model=8, depth=1)
    target = tmp_path / "m"
    save_pretrained(build_model(spec, seed=0), str(target))
    os.rename(target, tmp_path / f".m.old-{dead_pid()}-0badc0de")
    return target


@posix_only
def test_zoo_pull_local_dir_recovers_a_half_swapped_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zoo_core.cli.hub import main

    target = _half_swapped_model(tmp_path)
    assert main(["pull", f"local-dir:{target}"]) == 0, capsys.readouterr().err
    assert (target / "model.safetensors").is_file() and os.listdir(tmp_path) == ["m"]


@posix_only
@pytest.mark.requires("aeon")
@pytest.mark.parametrize("form", ["local-dir:", ""])
def test_zoo_eval_recovers_a_half_swapped_folder(tmp_path: Path, form: str, capsys: pytest.CaptureFixture[str]) -> None:
    from zoo_core.cli.train import main

    target = _half_swapped_model(tmp_path)
    assert main(["eval", f"{form}{target}", "--dataset", "BasicMotions"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["dataset"] == "BasicMotions"
    assert (target / "model.safetensors").is_file() and os.listdir(tmp_path) == ["m"]
