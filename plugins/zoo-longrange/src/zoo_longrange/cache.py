"""A disk cache for generated splits: a generator is deterministic from its parameters, so the
arrays are written once to ``$ZOO_DATA_DIR/zoo-longrange/`` and every later process (each cell of
a sweep, each seed of a run) reads them instead of generating them again (Pathfinder-14 takes
about 19 ms of CPU time an image on one core, 10,000 images a set).

The key is a hash of the generator's name, its version and every parameter, so a change to any of
them generates afresh. Files are compressed ``.npz`` read with ``allow_pickle=False``, written to a
temporary name and renamed (a killed writer leaves no half file under the key); processes that ask
for a key at once wait on a lock beside it while the first one generates.
``ZOO_LONGRANGE_CACHE=0`` turns the cache off; a folder that cannot be written only costs the
regeneration (logged once).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zoo_core.datasets import data_home

log = logging.getLogger(__name__)
_warned: set[str] = set()


def cache_dir() -> Path:
    return data_home() / "zoo-longrange"


def enabled() -> bool:
    return os.environ.get("ZOO_LONGRANGE_CACHE", "1").strip().lower() not in {"0", "false", "no", "off"}


def key(name: str, version: int, params: dict[str, Any]) -> str:
    blob = json.dumps({"name": name, "version": version, **params}, sort_keys=True, default=str)
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:20]}"


def cached(name: str, version: int, params: dict[str, Any], make: Callable[[], dict[str, np.ndarray]],
           want: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """``make()``'s arrays (only those named in ``want``, when given), read from the cache when an
    earlier call stored them. Processes asking for the same key at once (a sweep's workers) wait for
    the first one's file instead of each generating it (an exclusive lock beside the file)."""
    if not enabled():
        return make()
    path = cache_dir() / f"{key(name, version, params)}.npz"
    found = _read(path, want)
    if found is not None:
        return found
    with _locked(path.with_suffix(".lock")):
        found = _read(path, want)  # written while this process waited for the lock
        if found is not None:
            return found
        arrays = make()
        _write(path, arrays)
    return arrays


def _read(path: Path, want: Sequence[str] | None) -> dict[str, np.ndarray] | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in (want or f.files)}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # a truncated or foreign file: regenerate over it
        log.warning("zoo-longrange: ignoring the unreadable cache file %s (%s); generating again", path, exc)
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (POSIX); without fcntl or a writable folder, no lock."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # held (and closed) below, for as long as the lock
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
        # compressed: a padded token set is mostly zeros (ListOps-LRA's train X is 1.5 GB as int64)
        savez: Callable[..., None] = np.savez_compressed  # its stub reads **arrays as its allow_pickle flag
        with os.fdopen(fd, "wb") as out:
            savez(out, **arrays)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if str(path.parent) not in _warned:
            _warned.add(str(path.parent))
            log.warning("zoo-longrange: cannot write the generated-data cache in %s (%s); every process will generate "
                        "the data again (set ZOO_DATA_DIR to a writable folder)", path.parent, exc)
