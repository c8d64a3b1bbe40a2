"""Pull a model folder from the Hub, the bundled copies or a local folder, every file verified.

- revisions are resolved to commit shas and returned (``PullResult.commit``); ``--local-dir``
  pulls also write it to ``zoo-pull.json``;
- every pulled file is checked against a hash we trust (``verify.py``: the registry pin, an ETag
  that is a sha256 or git sha1, the paths-info API's LFS sha256 / blob id, or offline what was
  recorded when it was verified online); the client checks only sizes. A file that fails is removed
  from the cache (blob and pointer) and downloaded once more; a second failure is an error. A file
  nothing vouches for is reported ``unverified`` (``PullResult.unverified``, a warning) and refused
  with ``require_verified`` / ``ZOO_HUB_REQUIRE_VERIFIED=1``;
- partial downloads a killed pull left in the repo's ``blobs/`` are swept (``leftovers.py``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ZooError
from ..io.atomic import atomic_write_file, recover_dir
from .catalogue import Catalogue, PretrainedEntry, load_catalogue, sha256_file
from .client import (
    IMAGES,
    PUSHED,
    RECORD,
    WEIGHTS,
    _cache_dir,
    _progress_bars,
    _retrying,
    _short,
    _translate,
    is_offline,
    retry_settings,
)
from .errors import HubConnectionError, HubError
from .leftovers import sweep_incomplete
from .refs import HUB_PREFIX, LOCAL_PREFIX, ModelRef, check_repo_id, check_revision, parse_ref
from .verify import (
    Sources,
    Verdict,
    hub_file_hashes,
    read_cache_record,
    recorded_local,
    strict_verification,
    unverified_reason,
    verify,
    write_cache_record,
)

log = logging.getLogger("zoo_core.hub")


@dataclass
class PullResult:
    """Where a pulled model lies and exactly what it is.

    ``commit`` is the resolved commit sha (None for bundled and local folders without a record);
    ``files`` maps each file to its sha256; ``verified`` names, per file, the trusted hash it
    matched; ``unverified`` lists the files nothing vouched for; ``pinned`` says every file matched
    a registry pin.
    """

    ref: str
    path: Path
    source: str  # "hub", "bundled" or "local"
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    pinned: bool = False
    verified: dict[str, str] = field(default_factory=dict)
    unverified: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


# pulling ---------------------------------------------------------------------------------------
def _download_metadata(folder: Path, name: str) -> list[str]:
    """The lines huggingface_hub records beside a ``--local-dir`` download: commit sha, etag, time."""
    meta = folder / ".cache" / "huggingface" / "download" / f"{name}.metadata"
    return meta.read_text().splitlines() if meta.is_file() else []


def _announced_etag(folder: Path, name: str, local_dir: bool) -> str | None:
    """The ETag the server announced for a pulled file (the cache blob's name, or the download metadata)."""
    if local_dir:
        lines = _download_metadata(folder, name)
        return lines[1].strip() if len(lines) > 1 else None
    target = Path(os.path.realpath(folder / name))
    return target.name if target != (folder / name).absolute() else None


def _read_record(folder: Path) -> dict[str, Any]:
    path = folder / RECORD
    if not path.is_file() or path.stat().st_size > 2**20:
        return {}  # absent, or not a record we wrote (a FIFO would hang the read, a huge file cost memory)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _verify(folder: Path, names: list[str], pins: Mapping[str, str], *, local_dir: bool, repo_id: str,
            commit: str | None, token: str | None, offline: bool) -> Verdict:
    """Check each file against the first hash we trust (``verify.py``); the Hub's file metadata only if needed."""
    etags = {n: _announced_etag(folder, n, local_dir) for n in names}
    if local_dir:
        recorded = recorded_local(_read_record(folder), commit)
    else:
        recorded = read_cache_record(folder.parent.parent, commit) if commit else {}
    ask = None if offline or commit is None else (lambda: hub_file_hashes(repo_id, commit, names, token))
    return verify(folder, names, Sources(pins, etags, recorded, ask))


def _snapshot_files(folder: Path, commit: str | None, local_dir: bool) -> list[str]:
    """The repo's files in a pulled folder: a ``--local-dir`` may also hold the user's own files, never counted."""
    names = sorted(n for n in os.listdir(folder) if (folder / n).is_file() and n != RECORD)
    if not local_dir:
        return names
    return [n for n in names if (lines := _download_metadata(folder, n)) and lines[0].strip() == commit]


def _evict(folder: Path, name: str, local_dir: bool) -> None:
    """Remove a bad file: the blob and the pointer in the cache, or the file and its metadata."""
    path = folder / name
    if local_dir:
        meta = folder / ".cache" / "huggingface" / "download" / f"{name}.metadata"
        for p in (path, meta):
            p.unlink(missing_ok=True)
        return
    blob = Path(os.path.realpath(path))
    path.unlink(missing_ok=True)
    if blob != path.absolute():
        blob.unlink(missing_ok=True)


def _local_commit(folder: Path) -> str | None:
    lines = _download_metadata(folder, WEIGHTS)
    return lines[0].strip() if lines else None


def _listed(repo_id: str, commit: str | None, token: str | None, offline: bool) -> bool:
    """Whether the Hub lists the weights at ``commit`` (a failed download vs a repo without weights)."""
    from huggingface_hub import HfApi

    if offline or commit is None:
        return offline  # offline: a partial snapshot in the cache; report it as such
    try:
        info = HfApi(token=token).model_info(repo_id, revision=commit)
    except Exception as exc:
        raise HubConnectionError(f"{repo_id}@{commit}: the pull did not complete and the Hub is unreachable ({_short(exc)})") from exc
    return any(s.rfilename == WEIGHTS for s in info.siblings or [])


def _download(repo_id: str, revision: str, *, cache_dir: Path, local_dir: Path | None, offline: bool,
              token: str | None, force_download: bool) -> tuple[Path, str | None]:
    from huggingface_hub import snapshot_download

    kw: dict[str, Any] = {"repo_id": repo_id, "revision": revision, "token": token, "local_files_only": offline,
                          "force_download": force_download, "allow_patterns": [*PUSHED, *(f"*{s}" for s in IMAGES)]}
    if local_dir is not None:
        kw["local_dir"] = str(local_dir)
    else:
        kw["cache_dir"] = str(cache_dir)
    with _progress_bars():
        path = Path(_retrying(lambda: snapshot_download(**kw), f"pulling {repo_id}@{revision}"))
    commit = _local_commit(path) if local_dir is not None else path.name
    return path, commit


def pull_hub(repo_id: str, revision: str | None = None, *, pins: Mapping[str, str] | None = None,
             cache_dir: str | os.PathLike[str] | None = None, local_dir: str | os.PathLike[str] | None = None,
             local_files_only: bool = False, token: str | None = None, force_download: bool = False,
             ref: str | None = None, require_verified: bool | None = None) -> PullResult:
    """Pull ``repo_id`` at ``revision`` (default ``main``) into the HF cache (or ``local_dir``) and verify it.

    ``require_verified`` (default: ``ZOO_HUB_REQUIRE_VERIFIED``) refuses files no trusted hash vouches for.
    """
    check_repo_id(repo_id)
    revision = check_revision(revision or "main")
    pins = dict(pins or {})
    offline = is_offline(local_files_only)
    cache = _cache_dir(cache_dir)
    ldir = Path(local_dir) if local_dir is not None else None
    strict = strict_verification(require_verified)
    retry_settings()  # a bad ZOO_HUB_* value is a usage error before any request
    if ldir is None:
        sweep_incomplete(cache, repo_id)
    for attempt in (1, 2):
        try:
            folder, commit = _download(repo_id, revision, cache_dir=cache, local_dir=ldir, offline=offline,
                                       token=token, force_download=force_download and attempt == 1)
        except ZooError:
            raise
        except Exception as exc:
            raise _translate(exc, repo_id=repo_id, revision=revision, offline=offline, cache_dir=cache, token=token) from exc
        present = _snapshot_files(folder, commit, ldir is not None)
        if WEIGHTS not in present:
            if _listed(repo_id, commit, token, offline) and attempt == 1:
                continue  # older clients return a partial snapshot when a download fails: try once more
            if _listed(repo_id, commit, token, offline):
                raise HubConnectionError(f"{repo_id}@{commit}: {WEIGHTS} could not be downloaded (the Hub lists it); retry later")
            raise CheckpointError(f"{repo_id}@{commit} holds no {WEIGHTS} ({', '.join(present) or 'no files'})"
                                  + ("; go online to complete the pull" if offline else "; it is not a model saved by SSM Zoo"))
        missing = sorted(set(pins) - set(present))
        if missing:
            raise CheckpointError(f"{repo_id}@{commit} lacks {', '.join(missing)}, which registry.yaml pins")
        verdict = _verify(folder, present, pins, local_dir=ldir is not None, repo_id=repo_id, commit=commit,
                          token=token, offline=offline)
        bad = verdict.bad
        if not bad:
            break
        if ldir is None and commit is not None and not offline:
            write_cache_record(folder.parent.parent, commit, verdict)  # forget what the bad files were trusted as
        for name in bad:
            _evict(folder, name, ldir is not None)
        detail = "; ".join(f"{n}: {why}" for n, why in sorted(bad.items()))
        if attempt == 2 or offline:
            raise CheckpointError(f"{repo_id}@{commit}: {detail}. The bad files were removed from the cache and not "
                                  "loaded" + ("; go online to download them again" if offline else "; the download failed twice"))
        log.warning("%s@%s: %s; removed from the cache, downloading again", repo_id, commit, detail)
    result = PullResult(ref or f"hf-hub:{repo_id}@{revision}", folder, "hub", repo_id, revision, commit, verdict.hashes,
                        pinned=bool(pins) and set(pins) >= set(verdict.hashes), verified=verdict.verified,
                        unverified=sorted(verdict.unverified))
    if ldir is not None:
        atomic_write_file(ldir / RECORD, (json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n").encode())
    elif commit is not None and not offline:
        write_cache_record(folder.parent.parent, commit, verdict)
    _announce_unverified(result, strict)
    return result


def _announce_unverified(result: PullResult, strict: bool) -> None:
    """Say once that files are unverified; refuse them when ``strict``."""
    if not result.unverified:
        return
    where = f"{result.repo_id}@{result.commit}" if result.repo_id else str(result.path)
    reason = unverified_reason(result.unverified)
    if strict:
        raise CheckpointError(f"{where}: {reason}. Refused because verified content is required (--require-verified or "
                              "ZOO_HUB_REQUIRE_VERIFIED=1); drop that to use them unverified")
    log.warning("%s: %s; using them unverified", where, reason)


def _pull_bundled(entry: PretrainedEntry) -> PullResult:
    assert entry.bundled is not None
    present = sorted(n for n in os.listdir(entry.bundled) if (entry.bundled / n).is_file())
    hashes = {n: sha256_file(entry.bundled / n) for n in present}
    bad = sorted(n for n, d in entry.files.items() if hashes.get(n) != d)
    if bad:
        raise CheckpointError(f"{entry.name}: the bundled copy in {entry.bundled} does not match registry.yaml's sha256 "
                              f"pins for {', '.join(bad)}; restore it (git checkout -- {entry.bundled}) or pull from the Hub")
    return PullResult(entry.name, entry.bundled, "bundled", entry.hub_repo, entry.revision, entry.revision, hashes,
                      pinned=set(entry.files) >= set(hashes))


def _pull_local(ref: ModelRef, strict: bool = False) -> PullResult:
    assert ref.path is not None
    folder = ref.path
    recover_dir(folder)  # a save killed between its two renames left the folder aside: put it back first
    if not (folder / WEIGHTS).is_file():
        raise HubError(f"{ref.text}: {folder} holds no {WEIGHTS}; give a folder written by save_pretrained or zoo pull --local-dir")
    record = _read_record(folder)
    hashes = {n: sha256_file(folder / n) for n in PUSHED if (folder / n).is_file()}
    recorded_files, recorded_verified = record.get("files"), record.get("verified")
    files: dict[str, Any] = recorded_files if isinstance(recorded_files, dict) else {}
    bad = sorted(n for n, d in files.items() if n in hashes and hashes[n] != d)
    if bad:
        raise CheckpointError(f"{folder}: {', '.join(bad)} changed since it was pulled (sha256 differs from {RECORD}); pull it again")
    claimed: dict[str, Any] = recorded_verified if isinstance(recorded_verified, dict) else {}
    # verified only where the sha256 recorded at the verified pull was just compared; a pulled folder's
    # other files (missing from the record, or added since) are unverified
    verified = {n: s for n, s in claimed.items() if isinstance(s, str) and n in hashes and files.get(n) == hashes[n]}
    unverified = sorted(n for n in hashes if n not in verified) if record else []
    result = PullResult(ref.text, folder, "local", record.get("repo_id"), record.get("revision"), record.get("commit"), hashes,
                        verified=verified, unverified=unverified)
    _announce_unverified(result, strict)
    return result


def resolve_folder(model: str | os.PathLike[str], **kw: Any) -> PullResult:
    """A model folder path or a reference, ready to load: what ``zoo eval`` (and any loader taking either) calls.

    A plain path goes through ``local-dir:`` so that a folder a killed save left between its two
    renames is recovered first (``recover_dir``), as for every other load.
    """
    text = os.fspath(model)
    if not text.startswith((HUB_PREFIX, LOCAL_PREFIX)):
        path = Path(text).expanduser()
        recover_dir(path)
        if path.is_dir():
            return pull(LOCAL_PREFIX + text, **kw)
    return pull(text, **kw)


def pull(ref: str, *, revision: str | None = None, cache_dir: str | os.PathLike[str] | None = None,
         local_dir: str | os.PathLike[str] | None = None, local_files_only: bool = False, token: str | None = None,
         force_download: bool = False, source: str = "auto", catalogue: Catalogue | None = None,
         require_verified: bool | None = None) -> PullResult:
    """Fetch the files of a model reference and verify them; nothing is built or loaded.

    Args:
        ref: ``arch``, ``arch.tag``, ``hf-hub:org/name[@revision]`` or ``local-dir:path``.
        source: for catalogue names: ``auto`` (the bundled copy when it ships and no ``local_dir``
            is asked for, else the Hub at the pinned commit), ``hub`` or ``bundled``.
        require_verified: refuse files no trusted hash vouches for (default: ``ZOO_HUB_REQUIRE_VERIFIED``).
    """
    if source not in ("auto", "hub", "bundled"):
        raise HubError(f"source must be 'auto', 'hub' or 'bundled', not {source!r}")
    r = parse_ref(ref, revision=revision)
    if r.kind == "local":
        return _pull_local(r, strict_verification(require_verified))
    if r.kind == "hub":
        assert r.repo_id is not None
        return pull_hub(r.repo_id, r.revision, cache_dir=cache_dir, local_dir=local_dir, local_files_only=local_files_only,
                        token=token, force_download=force_download, ref=r.text, require_verified=require_verified)
    entry = (catalogue or load_catalogue()).get(r.name or "")
    bundled_ok = entry.bundled is not None and entry.bundled.is_dir()
    if source == "bundled" or (source == "auto" and bundled_ok and local_dir is None) or (source == "auto" and not entry.hub_repo):
        if entry.bundled is None or not bundled_ok:
            raise HubError(f"{entry.name}: no bundled copy ships here ({entry.bundled or 'none catalogued'}); pull it from the Hub")
        return _pull_bundled(entry)
    if not entry.hub_repo:
        raise HubError(f"{entry.name} has no Hub source in registry.yaml; only its bundled copy can be used")
    return pull_hub(entry.hub_repo, entry.revision, pins=entry.files, cache_dir=cache_dir, local_dir=local_dir,
                    local_files_only=local_files_only, token=token, force_download=force_download, ref=entry.name,
                    require_verified=require_verified)
