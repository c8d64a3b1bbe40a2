"""Atomic, durable writes of a folder or a single file.

A folder is written into a sibling staging folder ``.<name>.staging-<pid>-<rand>`` in the *same*
parent (never ``$TMPDIR``: a rename across filesystems is a copy, Lightning #21744), every file and
the staging folder are fsynced, and then the staging folder is renamed into place. Replacing an
existing folder takes two renames (target to ``.<name>.old-<pid>-<rand>``, staging to target); a
crash between them leaves the target missing and the old folder beside it, which the next call (or
``recover_dir``) renames back. Leftovers of dead processes are swept before each write, so a killed
save costs disk space only until the next one.

POSIX semantics are assumed (atomic ``rename``, fsync on directories). Process liveness is judged
by pid on this machine, so two hosts writing the same folder on a shared filesystem are not
supported.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ..errors import CheckpointError

try:  # POSIX only; without it the swap runs unlocked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # the module or None: Windows has no fcntl

__all__ = ["atomic_write_dir", "atomic_write_file", "recover_dir"]

FileSource = bytes | Callable[[Path], None]
"""File contents, or a function that writes the file at the path it is given."""

_STAGING = "staging"
_OLD = "old"
_TMP = "tmp"

# Leftover names this process is using right now (so the sweep can tell them from litter of an
# earlier call of this same pid that failed to clean up).
_ACTIVE: set[str] = set()
_ACTIVE_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------
# Small helpers


def _fsync_path(path: Path) -> None:
    """fsync a file or directory by path (directories: no-op where they cannot be opened)."""
    if path.is_dir() and os.name == "nt":  # pragma: no cover - Windows cannot fsync directories
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _leftover_name(name: str, kind: str) -> str:
    return f".{name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _leftover_pid(entry: str, name: str, kind: str) -> int | None:
    """The pid encoded in a leftover's name, or None if ``entry`` is not a leftover of ``name``."""
    prefix = f".{name}.{kind}-"
    if not entry.startswith(prefix):
        return None
    pid, sep, token = entry[len(prefix) :].partition("-")
    if not sep or not token or not pid.isdigit():
        return None
    return int(pid)


def _pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:  # pragma: no cover - unexpected; be conservative
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return True  # no procfs, or it vanished: kill() said it exists
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def _is_dead_leftover(entry: str, name: str, kind: str) -> bool:
    pid = _leftover_pid(entry, name, kind)
    if pid is None:
        return False
    if pid == os.getpid():
        with _ACTIVE_LOCK:
            return entry not in _ACTIVE
    return not _pid_alive(pid)


@contextlib.contextmanager
def _active(*names: str) -> Iterator[None]:
    with _ACTIVE_LOCK:
        _ACTIVE.update(names)
    try:
        yield
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.difference_update(names)


@contextlib.contextmanager
def _parent_lock(parent: Path) -> Iterator[None]:
    """Exclusive flock on the parent directory, so two processes never swap the same target at once.

    Best effort: where directories cannot be locked (no fcntl, some network filesystems), runs
    unlocked.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    try:
        fd = os.open(parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - unreadable parent; the writes will report it
        yield
        return
    try:
        with contextlib.suppress(OSError):  # e.g. NFS: run unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _remove(path: Path) -> None:
    """Delete a file or folder tree, ignoring errors (what remains is swept later)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _check_file_name(fname: str) -> None:
    if not fname or fname in (".", "..") or "/" in fname or "\\" in fname or "\0" in fname:
        raise ValueError(f"file name {fname!r} must be a plain name inside the folder (no separators)")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return f"{exc} (disk full, quota or file-size limit)"
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------------
# Sweeping and recovery


def _sweep(target: Path) -> None:
    """Restore a crash-window target and delete leftovers of dead processes. Call under the lock."""
    parent, name = target.parent, target.name
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return
    dead_old = [e for e in entries if _is_dead_leftover(e, name, _OLD)]
    if dead_old and not os.path.lexists(target):
        # Killed between "target -> old" and "staging -> target": the old folder is complete.
        newest = max(dead_old, key=lambda e: (parent / e).lstat().st_mtime_ns)
        os.rename(parent / newest, target)
        _fsync_path(parent)
        dead_old.remove(newest)
    dead = dead_old + [e for e in entries for kind in (_STAGING, _TMP) if _is_dead_leftover(e, name, kind)]
    for entry in dead:
        _remove(parent / entry)


def recover_dir(target: str | os.PathLike[str]) -> None:
    """Repair what a killed ``atomic_write_dir``/``atomic_write_file`` left for ``target``.

    If ``target`` is missing but a dead process's ``.<name>.old-*`` exists (killed between the two
    renames), it is renamed back; then staging, old and tmp leftovers of dead processes are deleted.
    Leftovers of live processes are never touched. Loaders may call this before reading a folder.

    Args:
        target: the folder (or file) that was being written.
    """
    target = Path(target)
    if not target.parent.is_dir():
        return
    with _parent_lock(target.parent):
        _sweep(target)


# ---------------------------------------------------------------------------------------------
# Writing


def _write_one(path: Path, source: FileSource) -> None:
    """Write one file (bytes or via a callable) and fsync it."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        with open(path, "xb") as handle:
            handle.write(source)
            handle.flush()
            os.fsync(handle.fileno())
        return
    if not callable(source):
        raise TypeError(f"contents of {path.name!r} must be bytes or a callable, got {type(source).__name__}")
    source(path)
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, "the writer callable did not create the file", str(path))
    _fsync_path(path)


def _write_staging(staging: Path, files: Mapping[str, FileSource]) -> None:
    os.mkdir(staging)
    for fname, source in files.items():
        _write_one(staging / fname, source)
    _fsync_path(staging)


def _swap(staging: Path, target: Path) -> None:
    """Move the complete staging folder into place and drop the previous folder."""
    parent = target.parent
    if not os.path.lexists(target):
        os.rename(staging, target)
        _fsync_path(parent)
        return
    old = parent / _leftover_name(target.name, _OLD)
    with _active(old.name):
        os.rename(target, old)
        try:
            os.rename(staging, target)
        except BaseException:
            os.rename(old, target)
            raise
        _fsync_path(parent)
        _remove(old)


def _check_target_dir(target: Path) -> None:
    try:  # one lstat: a concurrent save may rename the target away between two separate checks
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise CheckpointError(f"{target} is a symbolic link; save to the folder it points to instead")
    if not stat.S_ISDIR(mode):
        raise CheckpointError(f"{target} exists and is not a folder; choose another path or remove it")


def atomic_write_dir(target: str | os.PathLike[str], files: Mapping[str, FileSource]) -> Path:
    """Write a folder so that readers and crashes only ever see the old or the new folder.

    Args:
        target: the folder to create or replace. Its parent is created if missing.
        files: file name (plain, no separators) to contents: bytes, or a callable that writes the
            file at the staging path it is given (e.g. ``lambda p: save_file(tensors, p)``).

    Returns:
        The target path.

    Raises:
        CheckpointError: ``target`` is not a folder, or writing failed (disk full, a callable
            raised, ...); the previous folder is then left untouched and the staging folder removed.
        ValueError: a file name is not a plain name.
    """
    target = Path(target)
    for fname in files:
        _check_file_name(fname)
    _check_target_dir(target)
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot save {target}: cannot create the parent folder: {_describe(exc)}") from exc
    with _parent_lock(parent):
        _sweep(target)
    _check_target_dir(target)
    staging = parent / _leftover_name(target.name, _STAGING)
    with _active(staging.name):
        try:
            _write_staging(staging, files)
        except BaseException as exc:
            _remove(staging)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: clean up but do not disguise them
            raise CheckpointError(
                f"cannot save {target}: {_describe(exc)}; the previous contents of {target} are unchanged"
            ) from exc
        try:
            with _parent_lock(parent):
                _check_target_dir(target)
                _swap(staging, target)
        except BaseException as exc:
            _remove(staging)
            if not isinstance(exc, Exception) or isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(
                f"cannot save {target}: moving the new folder into place failed: {_describe(exc)}"
            ) from exc
    return target


def atomic_write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace one file atomically: write a sibling temp file, fsync it, rename it, fsync the folder.

    Args:
        path: the file to create or replace. Its parent folder must exist.
        data: the new contents.

    Raises:
        CheckpointError: writing failed; the previous file is left untouched and the temp file removed.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder; cannot replace it with a file")
    with _parent_lock(path.parent):
        _sweep(path)
    tmp = path.parent / _leftover_name(path.name, _TMP)
    with _active(tmp.name):
        try:
            _write_one(tmp, data)
            os.replace(tmp, path)
            _fsync_path(path.parent)
        except BaseException as exc:
            _remove(tmp)
            if not isinstance(exc, Exception):
                raise
            raise CheckpointError(
                f"cannot save {path}: {_describe(exc)}; the previous contents of {path} are unchanged"
            ) from exc
