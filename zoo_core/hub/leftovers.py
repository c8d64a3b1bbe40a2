"""Sweep the partial downloads a killed pull left in a repo's ``blobs/`` folder of the HF cache.

huggingface_hub downloads a blob into a temporary file beside it and renames it into place; a
process killed mid-body (SIGKILL, power loss) leaves the temporary file forever:

- clients >= 1.x (2.4 read): ``<etag>.<8 hex>.incomplete``, one per process (``uuid4().hex[:8]``),
  deleted by the client itself on any error it survives, never resumed;
- clients 0.x (0.24.7 read): ``<etag>.incomplete``, resumed by the next download *of the same
  etag*; one whose etag the repo no longer serves stays forever.

Only names of exactly these shapes, with a hex etag (what the Hub and hex-ETag mirrors send), inside
the ``blobs/`` folder of the repo being pulled, are candidates; nothing else there is touched. A
candidate is deleted only when no process can still be writing it:

- the client's own lock for that etag (``.locks/models--org--name/<etag>.lock``, held for the whole
  download) can be taken without waiting, and
- it has not been written to for ``STALE_SECONDS`` (10 minutes): a live download writes a chunk at
  least every few seconds, and this also covers filesystems where ``flock`` silently succeeds for
  everyone (the reason 2.x uses per-process names).

The writer's pid is not in the name, so pid liveness cannot be used. Deleting a 0.x resumable file
costs only the resume (the bytes are fetched again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

try:  # POSIX; without it, only the age rule applies
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # the module or None: Windows has no fcntl

log = logging.getLogger("zoo_core.hub")

STALE_SECONDS = 600.0
_INCOMPLETE = re.compile(r"(?P<etag>[0-9a-f]{32,128})(?:\.[0-9a-f]{8})?\.incomplete")


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


@contextlib.contextmanager
def _lock_free(lock_path: Path) -> Iterator[bool]:
    """Whether nobody holds the client's lock; held by us for the duration when free."""
    if fcntl is None or not lock_path.is_file():
        yield True  # no lock file: no client is downloading this etag through the lock
        return
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except OSError:
        yield False  # cannot tell: leave the file alone
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False  # a live download holds it
            return
        yield True
    finally:
        os.close(fd)  # closing releases our lock


def sweep_incomplete(cache_dir: Path, repo_id: str, *, stale_seconds: float = STALE_SECONDS) -> list[str]:
    """Delete the client's partial downloads of ``repo_id`` that no live process writes; returns their names."""
    blobs = cache_dir / _repo_folder(repo_id) / "blobs"
    locks = cache_dir / ".locks" / _repo_folder(repo_id)
    try:
        entries = sorted(os.listdir(blobs))
    except OSError:
        return []
    removed = []
    now = time.time()
    for name in entries:
        match = _INCOMPLETE.fullmatch(name)
        path = blobs / name
        try:
            info = path.lstat()
        except OSError:
            continue
        if match is None or not path.is_file() or path.is_symlink() or now - info.st_mtime < stale_seconds:
            continue
        with _lock_free(locks / f"{match['etag']}.lock") as free:
            if free:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed.append(name)
    if removed:
        log.info("%s: removed %d partial download(s) a killed pull left in %s: %s", repo_id, len(removed), blobs,
                 ", ".join(removed))
    return removed
