"""What a pulled file's content is checked against, and what is remembered about it.

huggingface_hub checks only sizes, and the ETag it names a cache blob after is whatever the server
sent: the Hub sends a git sha1 (regular files) and the LFS sha256 (``X-Linked-Etag``), but a mirror
or proxy may send an md5, a weak ``W/"…"`` validator, a digest of another length or nothing. So a
file is verified only against a hash we trust, first found first used:

1. the registry pin (``registry.yaml``'s sha256);
2. the announced ETag when it *is* a content hash: 64 hex is the LFS sha256, 40 hex a git blob
   sha1 (which says nothing about an LFS file's content: that is the pointer's id);
3. the Hub's file metadata at the pulled commit (``HfApi.get_paths_info``): ``lfs.sha256`` for LFS
   files, the git blob id for the others (asked only when 1-2 leave a file unchecked);
4. offline, the trusted sha256 recorded when the file was verified online (``zoo-verified.json`` in
   the repo's cache folder, or ``zoo-pull.json`` of a ``--local-dir`` pull).

A file none of these vouches for is *unverified*: reported as such, never called verified, and
refused when ``require_verified`` (``--require-verified``, ``ZOO_HUB_REQUIRE_VERIFIED=1``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..io.atomic import atomic_write_file
from ..plugins import env_flag
from .catalogue import sha256_file

log = logging.getLogger("zoo_core.hub")

CACHE_RECORD = "zoo-verified.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Expected:
    """What a file must hash to (``kind`` ``sha256`` or ``git-sha1``) and who vouches for it."""

    kind: str
    digest: str
    source: str


@dataclass
class Verdict:
    """The outcome for a set of files: sha256 of each, who verified which, which failed and why."""

    hashes: dict[str, str] = field(default_factory=dict)
    verified: dict[str, str] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    unverified: list[str] = field(default_factory=list)


def git_sha1(path: Path) -> str:
    """Git's blob id of a file: what the Hub's ETag is for a regular (non-LFS) file."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def from_etag(etag: str | None) -> Expected | None:
    """The content hash an announced ETag is, or None when it is none we can check (md5, weak, other lengths)."""
    if etag and _SHA256.fullmatch(etag):
        return Expected("sha256", etag, "the LFS sha256 the Hub announced (X-Linked-Etag)")
    if etag and _SHA1.fullmatch(etag):
        return Expected("git-sha1", etag, "the git blob sha1 the Hub announced (ETag)")
    return None


def hub_file_hashes(repo_id: str, commit: str, names: list[str], token: str | None) -> dict[str, Expected] | None:
    """The hashes the Hub's paths-info API gives at ``commit``; None when the server does not answer it."""
    from huggingface_hub import HfApi

    try:
        infos = HfApi(token=token).get_paths_info(repo_id, names, revision=commit)
    except Exception as exc:  # noqa: BLE001 - a mirror without the API: the files stay unverified, said so
        log.info("%s@%s: the paths-info API did not answer (%s); no file hashes from the Hub", repo_id, commit, exc)
        return None
    out: dict[str, Expected] = {}
    for info in infos:
        lfs = getattr(info, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        blob_id = getattr(info, "blob_id", None)
        if isinstance(sha, str) and _SHA256.fullmatch(sha):
            out[info.path] = Expected("sha256", sha, "the LFS sha256 the Hub's paths-info API gives")
        elif lfs is None and isinstance(blob_id, str) and _SHA1.fullmatch(blob_id):
            out[info.path] = Expected("git-sha1", blob_id, "the git blob sha1 the Hub's paths-info API gives")
    return out


def _mismatch(path: Path, digest: str, want: Expected) -> str | None:
    """Why ``path`` does not match ``want`` (None when it does)."""
    got = digest if want.kind == "sha256" else git_sha1(path)
    if got == want.digest:
        return None
    return f"{want.kind} {got[:16]}... but {want.digest[:16]}... is {want.source}"


@dataclass
class Sources:
    """Where trusted hashes come from for one pulled folder."""

    pins: Mapping[str, str]
    etags: Mapping[str, str | None]
    recorded: Mapping[str, tuple[str, str]]  # name -> (sha256, source) verified online earlier
    ask_hub: Callable[[], dict[str, Expected] | None] | None  # the Hub's file hashes; None when offline


def verify(folder: Path, names: list[str], src: Sources) -> Verdict:
    """Check each file against the first trusted hash (see the module docstring); the Hub is asked once, if needed."""
    out = Verdict()
    pending: list[str] = []
    for name in names:
        path = folder / name
        out.hashes[name] = digest = sha256_file(path)
        want = Expected("sha256", src.pins[name], "the sha256 registry.yaml pins") if name in src.pins else from_etag(src.etags.get(name))
        if want is not None and (want.kind == "sha256" or _mismatch(path, digest, want) is None):
            _judge(out, name, path, digest, want)
        else:
            pending.append(name)  # no hash, or a git sha1 that may be an LFS pointer's: ask the Hub
    hub = src.ask_hub() if pending and src.ask_hub is not None else None
    for name in pending:
        path, digest = folder / name, out.hashes[name]
        want = (hub or {}).get(name)
        if want is None and name in src.recorded:
            sha, source = src.recorded[name]
            want = Expected("sha256", sha, f"the sha256 recorded when it was verified online ({source})")
        if want is None and hub is None and (etag := from_etag(src.etags.get(name))) is not None:
            want = etag  # a git sha1 ETag that does not match, and no Hub metadata to say it names a pointer
        if want is None:
            out.unverified.append(name)
        else:
            _judge(out, name, path, digest, want)
    return out


def _judge(out: Verdict, name: str, path: Path, digest: str, want: Expected) -> None:
    why = _mismatch(path, digest, want)
    if why is None:
        out.verified[name] = want.source
    else:
        out.bad[name] = why


# what is remembered between pulls -------------------------------------------------------------------
def read_cache_record(repo_folder: Path, commit: str) -> dict[str, tuple[str, str]]:
    """(sha256, source) per file verified online at ``commit``, from the repo's cache folder."""
    try:
        data = json.loads((repo_folder / CACHE_RECORD).read_text(encoding="utf-8"))
        entries = data[commit]
        return {n: (e["sha256"], e["source"]) for n, e in entries.items() if _SHA256.fullmatch(str(e["sha256"]))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_cache_record(repo_folder: Path, commit: str, verdict: Verdict) -> None:
    """Remember what was verified (and only that), so an offline re-load is checked against it."""
    path = repo_folder / CACHE_RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    entries = {n: {"sha256": verdict.hashes[n], "source": s} for n, s in verdict.verified.items()
               if not s.startswith("the sha256 recorded")}
    previous = data.get(commit)
    if not isinstance(previous, dict):
        previous = {}
    data[commit] = {**{n: e for n, e in previous.items() if n not in verdict.bad}, **entries}
    try:
        atomic_write_file(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    except Exception as exc:  # noqa: BLE001 - a read-only cache: offline loads then report unverified
        log.warning("%s: could not record what was verified (%s); offline loads will report those files unverified", path, exc)


def recorded_local(record: Mapping[str, Any], commit: str | None) -> dict[str, tuple[str, str]]:
    """(sha256, source) per file a ``--local-dir`` pull of ``commit`` verified, from its ``zoo-pull.json``."""
    if not commit or record.get("commit") != commit or not isinstance(record.get("verified"), dict):
        return {}
    files = record.get("files") or {}
    return {n: (files[n], s) for n, s in record["verified"].items() if isinstance(files.get(n), str) and isinstance(s, str)}


def strict_verification(flag: bool | None) -> bool:
    """The strict switch: the argument when given, else ``ZOO_HUB_REQUIRE_VERIFIED``."""
    return flag if flag is not None else env_flag("ZOO_HUB_REQUIRE_VERIFIED")


def unverified_reason(names: list[str]) -> str:
    """The one sentence that says why files are unverified and how to get them verified."""
    return (f"{', '.join(names)} could not be verified: no registry pin, no sha256 or git sha1 ETag and no file hashes "
            "from the Hub's paths-info API vouch for their content (a mirror or proxy that is not the Hub?); pull from "
            "the Hub itself or a mirror that serves its hashes, or pin the sha256 in registry.yaml")
