"""Publish to and pull from the Hugging Face Hub, through ``huggingface_hub`` only.

The client's own settings apply: ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME`` / ``HF_HUB_CACHE`` and
``HF_HUB_DISABLE_PROGRESS_BARS`` are read by ``huggingface_hub`` once, when it is imported (set
them before). ``HF_HUB_OFFLINE`` is honoured even when set later: it turns every pull into a
cache-only one.

What this layer adds to the client:

- revisions are resolved to commit shas and returned (``PullResult.commit``); ``--local-dir``
  pulls also write it to ``zoo-pull.json``;
- every pulled file is checked against a hash we trust (``verify.py``: the registry pin, an ETag
  that is a sha256 or git sha1, the paths-info API's LFS sha256 / blob id, or offline what was
  recorded when it was verified online); the client checks only sizes. A file that fails is removed
  from the cache (blob and pointer) and downloaded once more; a second failure is an error. A file
  nothing vouches for is reported ``unverified`` (``PullResult.unverified``, a warning) and refused
  with ``require_verified`` / ``ZOO_HUB_REQUIRE_VERIFIED=1``;
- a transient failure (5xx, 408/429, dropped connection, truncated body) is retried
  ``ZOO_HUB_RETRIES`` times in all (default 3) with exponential backoff from ``ZOO_HUB_BACKOFF``
  seconds (default 1); the client alone does not retry a GET answered 5xx;
- partial downloads a killed pull left in the repo's ``blobs/`` are swept (``leftovers.py``);
- errors become ``HubError`` / ``HubConnectionError`` (exit 5) / ``CheckpointError`` /
  ``MissingPluginError`` with what to do;
- progress bars only on a terminal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ZooError
from ..plugins import env_flag
from .catalogue import Catalogue, PretrainedEntry, load_catalogue, sha256_file
from .errors import HubConnectionError, HubError, HubSettingError, MissingPluginError
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

WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "README.md"
PUSHED = (WEIGHTS, CONFIG, CARD, "vocab.json")  # vocab.json: a language model's tokenizer (zoo_core.tokenizer), when it ships one
IMAGES = (".png", ".svg", ".jpg")
RECORD = "zoo-pull.json"
_TRANSIENT = {"ConnectError", "ConnectionError", "TransportError", "TimeoutException", "Timeout", "ReadTimeout",
              "RemoteProtocolError", "ChunkedEncodingError", "ProtocolError", "ReadError", "IncompleteRead"}


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


@dataclass
class PushResult:
    """What a push created: the commit (or the pull request) on the Hub."""

    repo_id: str
    commit: str | None
    commit_url: str | None
    revision: str
    pr_url: str | None = None
    files: dict[str, str] = field(default_factory=dict)


# environment and client helpers ---------------------------------------------------------------
def is_offline(local_files_only: bool = False) -> bool:
    """``local_files_only``, or ``HF_HUB_OFFLINE`` as the client read it at import or as set now."""
    from huggingface_hub import constants

    return bool(local_files_only or constants.HF_HUB_OFFLINE or env_flag("HF_HUB_OFFLINE"))


def _cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE)


@contextlib.contextmanager
def _progress_bars() -> Iterator[None]:
    """huggingface_hub's bars on a terminal; off when stderr is not one (logs, CI, pipes)."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    switch = not sys.stderr.isatty() and not are_progress_bars_disabled()
    if switch:
        disable_progress_bars()
    try:
        yield
    finally:
        if switch:
            enable_progress_bars()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _status(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)


def is_transient(exc: BaseException) -> bool:
    """A failure worth retrying: 5xx, 408, 429, a dropped or timed-out connection, a short body."""
    for e in _chain(exc):
        if isinstance(e, ZooError):
            return False  # ours, already decided (a HubConnectionError is a ConnectionError but was retried already)
        status = _status(e)
        if status is not None:
            return status in (408, 429) or status >= 500
        if any(c.__name__ in _TRANSIENT for c in type(e).__mro__) or isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            return True
    return False


def retry_settings() -> tuple[int, float]:
    """(attempts, first backoff in seconds) from ``ZOO_HUB_RETRIES`` / ``ZOO_HUB_BACKOFF``, validated.

    Checked before any request, so a typo is a usage error naming the variable (exit 2), not a Hub failure.
    """
    raw_n, raw_d = os.environ.get("ZOO_HUB_RETRIES", "3"), os.environ.get("ZOO_HUB_BACKOFF", "1.0")
    try:
        attempts = int(raw_n.strip())
    except ValueError:
        attempts = 0
    if attempts < 1:
        raise HubSettingError(f"ZOO_HUB_RETRIES={raw_n!r} is not allowed: it is the number of attempts in all, a whole "
                              "number >= 1 (default 3); set e.g. ZOO_HUB_RETRIES=3 or unset it")
    try:
        delay = float(raw_d.strip())
    except ValueError:
        delay = -1.0
    if not (0.0 <= delay <= 3600.0):
        raise HubSettingError(f"ZOO_HUB_BACKOFF={raw_d!r} is not allowed: it is the first wait between attempts in seconds, "
                              "a number from 0 to 3600 (default 1, doubling); set e.g. ZOO_HUB_BACKOFF=1 or unset it")
    return attempts, delay


def _retrying(fn: Any, what: str) -> Any:
    attempts, delay = retry_settings()
    for i in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if i == attempts - 1 or not is_transient(exc):
                raise
            wait = delay * 2**i
            log.warning("%s failed (%s); retrying in %.1f s (%d of %d)", what, _short(exc), wait, i + 2, attempts)
            time.sleep(wait)
    raise AssertionError("unreachable")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


# error translation ---------------------------------------------------------------------------
def _cached_state(cache_dir: Path, repo_id: str) -> str:
    """What the cache holds for a repo: its commits and which names point to them."""
    folder = cache_dir / f"models--{repo_id.replace('/', '--')}"
    snaps = sorted(p.name for p in (folder / "snapshots").glob("*")) if (folder / "snapshots").is_dir() else []
    if not snaps:
        return f"the cache ({cache_dir}) holds nothing of {repo_id}"
    refs = {}
    if (folder / "refs").is_dir():
        for p in (folder / "refs").rglob("*"):
            if p.is_file():
                refs[str(p.relative_to(folder / "refs"))] = p.read_text().strip()
    names = ", ".join(f"{k} -> {v[:12]}" for k, v in sorted(refs.items())) or "none: they were pulled by commit sha"
    return (f"the cache holds commits {', '.join(snaps)} of {repo_id} (names known offline: {names}); "
            f"load one of them by sha, e.g. hf-hub:{repo_id}@{snaps[0]}")


def _refs_hint(repo_id: str, token: str | None) -> str:
    from huggingface_hub import HfApi

    try:
        refs = HfApi(token=token).list_repo_refs(repo_id)
    except Exception:  # noqa: BLE001 - a hint only
        return ""
    names = [b.name for b in refs.branches] + [t.name for t in refs.tags]
    return f" Branches and tags there: {', '.join(sorted(names)) or '(none)'}."


def _translate(exc: Exception, *, repo_id: str, revision: str, offline: bool, cache_dir: Path, token: str | None) -> ZooError:
    from huggingface_hub import utils as hfu

    where = f"{repo_id}@{revision}"
    if any("does not have an ETag" in str(e) for e in _chain(exc)):
        from huggingface_hub import constants

        return HubError(f"the server at {constants.ENDPOINT} answered {where} without an ETag, so huggingface_hub cannot "
                        "cache it or tell what it is: it is not the Hub or a Hub-compatible mirror; point HF_ENDPOINT at "
                        "the Hub (or unset it) or at a mirror that sends the Hub's ETag headers")
    if isinstance(exc, hfu.LocalEntryNotFoundError) or (offline and isinstance(exc, (FileNotFoundError, hfu.EntryNotFoundError))):
        if offline:
            return HubError(f"offline (HF_HUB_OFFLINE or local_files_only) and {where} is not in the cache: "
                            f"{_cached_state(cache_dir, repo_id)}. Or go online once: zoo pull hf-hub:{where}")
        return HubConnectionError(f"could not reach the Hub to pull {where} and it is not cached ({_short(exc)}); "
                                  "check the network or HF_ENDPOINT, then retry")
    if isinstance(exc, hfu.GatedRepoError):
        return HubError(f"{repo_id} is gated: accept its conditions on the Hub with the account of your token, then retry")
    if isinstance(exc, hfu.RepositoryNotFoundError):
        return HubError(f"repository {repo_id} was not found on the Hub (or it is private and your token cannot see it); "
                        "check the spelling, or set HF_TOKEN to a token with access")
    if isinstance(exc, hfu.RevisionNotFoundError):
        return HubError(f"revision {revision!r} does not exist in {repo_id}.{_refs_hint(repo_id, token)}")
    if isinstance(exc, hfu.EntryNotFoundError):
        return CheckpointError(f"{where} holds no {WEIGHTS}; it is not a model saved by SSM Zoo")
    if isinstance(exc, hfu.HfHubHTTPError) and _status(exc) in (401, 403):
        return HubError(f"the Hub refused the token ({_status(exc)}) for {repo_id}: it is invalid, expired or lacks "
                        "write access; create a write token and set HF_TOKEN (or run `hf auth login`)")
    if is_transient(exc):
        return HubConnectionError(f"the Hub kept failing for {where} after retries ({_short(exc)}); nothing partial "
                                  "was kept in the cache; retry later")
    return HubError(f"the Hub request for {where} failed: {_short(exc)}")


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
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
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
        from .leftovers import sweep_incomplete

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
        from ..io.atomic import atomic_write_file

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
    from ..io.atomic import recover_dir

    assert ref.path is not None
    folder = ref.path
    recover_dir(folder)  # a save killed between its two renames left the folder aside: put it back first
    if not (folder / WEIGHTS).is_file():
        raise HubError(f"{ref.text}: {folder} holds no {WEIGHTS}; give a folder written by save_pretrained or zoo pull --local-dir")
    record = _read_record(folder)
    hashes = {n: sha256_file(folder / n) for n in PUSHED if (folder / n).is_file()}
    bad = sorted(n for n, d in (record.get("files") or {}).items() if n in hashes and hashes[n] != d)
    if bad:
        raise CheckpointError(f"{folder}: {', '.join(bad)} changed since it was pulled (sha256 differs from {RECORD}); pull it again")
    unverified = sorted(n for n in record.get("unverified") or [] if n in hashes)
    verified = {n: s for n, s in (record.get("verified") or {}).items() if n in hashes and isinstance(s, str)}
    result = PullResult(ref.text, folder, "local", record.get("repo_id"), record.get("revision"), record.get("commit"), hashes,
                        verified=verified, unverified=unverified)
    _announce_unverified(result, strict)
    return result


def resolve_folder(model: str | os.PathLike[str], **kw: Any) -> PullResult:
    """A model folder path or a reference, ready to load: what ``zoo eval`` (and any loader taking either) calls.

    A plain path goes through ``local-dir:`` so that a folder a killed save left between its two
    renames is recovered first (``recover_dir``), as for every other load.
    """
    from ..io.atomic import recover_dir

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


# building ----------------------------------------------------------------------------------------
def check_plugins(folder: Path, *, where: str, registry: Any = None) -> None:
    """Refuse, with the install command, weights whose core's plugin is not installed."""
    from ..plugin_catalogue import plugin_owners
    from ..plugins import get_registry

    path = folder / CONFIG
    if not path.is_file():
        return  # read_folder's own check names the plugin from the weights' metadata
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        kind = config["spec"]["model"]["core"]["kind"]
    except (ValueError, KeyError, TypeError):
        return  # malformed: read_folder reports it precisely
    reg = registry or get_registry()
    if kind in reg.cores:
        return
    reg.refuse_conflict("cores", kind)  # installed twice, kept by neither: not "missing"
    versions = {k: v for k, v in (config.get("versions") or {}).items() if k not in ("zoo-core", "torch")}
    dist = plugin_owners().owners.get(kind) or next(iter(versions), None)
    if dist is None:
        raise MissingPluginError(f"{where} holds weights for core {kind!r}, which no installed plugin provides and "
                                 "no known plugin is named for; install the plugin its author publishes, then retry")
    pinned = f"{dist}=={versions[dist]}" if dist in versions else dist
    raise MissingPluginError(f"{where} holds weights for core {kind!r} from the plugin {dist}"
                             f"{' ' + versions[dist] if dist in versions else ''}, which is not installed: "
                             f"pip install {pinned} (or pip install -e plugins/{dist} from a checkout)")


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _load_matching(model: Any, tensors: Mapping[str, Any], info: Mapping[str, Any], source: str) -> None:
    """strict=False: copy the tensors whose name and shape fit; log the rest."""
    import torch

    from ..io.pretrained import _unique_tensors

    own, _ = _unique_tensors(model)
    skipped = sorted(set(tensors) - set(own))
    with torch.no_grad():
        for name, target in own.items():
            value = tensors.get(name)
            if value is not None and target.is_complex() and tuple(value.shape) == (*target.shape, 2):
                value = torch.view_as_complex(value.contiguous())
            if value is None or tuple(value.shape) != tuple(target.shape):
                skipped.append(name)
                continue
            target.copy_(value)
    if skipped:
        log.warning("%s: strict=False left %d tensors as initialised or unused: %s", source, len(skipped), ", ".join(skipped[:20]))


def create_model(ref: str, pretrained: bool = True, *, revision: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, local_files_only: bool = False,
                 token: str | None = None, force_download: bool = False, strict: bool = True,
                 device: Any = None, registry: Any = None, source: str = "auto",
                 catalogue: Catalogue | None = None, require_verified: bool | None = None, **overrides: Any) -> Any:
    """Build a model from a reference, with its trained weights when ``pretrained``.

    ``overrides`` are merged into the spec (``task={"classes": 5}``, ``model={"depth": 2}``); with
    ``strict=True`` (the default) every stored tensor must then still fit, else the mismatches are
    listed. ``pretrained=False`` builds the same architecture with fresh weights. Files no trusted
    hash vouches for are loaded with a warning, or refused with ``require_verified``
    (default: ``ZOO_HUB_REQUIRE_VERIFIED``).
    """
    from ..build import build_model
    from ..footprint import check_build
    from ..factory import check_folder, load_pretrained
    from ..io.pretrained import load_weights, read_folder
    from ..spec import load_spec

    r = parse_ref(ref, revision=revision)
    if not pretrained and r.kind in ("arch", "tag"):
        entry = (catalogue or load_catalogue()).get(r.name or "")
        spec = load_spec(_merge(entry.spec, overrides), registry=registry)
        check_build(spec)
        return build_model(spec, registry=registry, device=device)
    got = pull(ref, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token,
               force_download=force_download, source=source, catalogue=catalogue, require_verified=require_verified)
    where = f"{got.repo_id}@{got.commit}" if got.repo_id else str(got.path)
    check_plugins(got.path, where=where, registry=registry)
    if pretrained and strict and not overrides:
        return load_pretrained(got.path, device=device, registry=registry)
    check_folder(got.path, registry=registry)  # the stored spec fits its tensors: nothing huge is built from a lie
    tensors, info = read_folder(got.path)
    try:
        spec = load_spec(_merge(info["spec"], overrides), registry=registry)
    except ZooError as exc:
        raise CheckpointError(f"{where}: the stored spec cannot be built here: {exc}") from None
    check_build(spec)  # with the overrides applied it must still fit this machine (exit 2 with the estimate)
    model = build_model(spec, registry=registry, device=device)
    if pretrained:
        source_name = str(got.path / WEIGHTS)
        (load_weights if strict else _load_matching)(model, tensors, info, source=source_name)
    return model.eval()


# pushing -----------------------------------------------------------------------------------------
def _stage(model_or_dir: Any, staging: Path, repo_id: str) -> dict[str, str]:
    """Write what will be pushed into ``staging``; returns sha256 per file."""
    from ..io.pretrained import read_folder, save_pretrained
    from .card import render_card

    if isinstance(model_or_dir, (str, os.PathLike)):
        src = Path(model_or_dir)
        if not src.is_dir():
            raise HubError(f"{src} is not a folder; push a folder written by save_pretrained, or a model")
    else:
        src = staging.parent / "saved"
        save_pretrained(model_or_dir, src)
    _check_loadable(src)  # never publish weights that would not load: before anything is uploaded
    tensors, info = read_folder(src)
    staging.mkdir()
    for name in os.listdir(src):
        if name in PUSHED or name.endswith(IMAGES):
            shutil.copyfile(src / name, staging / name)
    if not (staging / CONFIG).is_file():
        raise HubError(f"{src} has no {CONFIG}; save it again with save_pretrained (Hub tooling reads config.json)")
    if not (staging / CARD).is_file():
        card = render_card(name=repo_id.split("/")[1], spec=info["spec"], versions=info["versions"], repo_id=repo_id,
                           num_params=sum(int(t.numel()) for t in tensors.values()))
        (staging / CARD).write_text(card, encoding="utf-8")
    return {n: sha256_file(staging / n) for n in sorted(os.listdir(staging))}


def _check_loadable(folder: Path) -> None:
    """The full load check of ``zoo_core.factory.check_folder`` (metadata, header, a meta-device build).

    Why: a folder whose stored spec is a string, is far larger than its tensors or has metadata of
    the wrong types would be published and then fail for everyone who pulls it.
    """
    from ..factory import check_folder

    check_folder(folder)


def push_to_hub(model_or_dir: Any, repo_id: str, *, revision: str | None = None, private: bool | None = None,
                commit_message: str | None = None, create_pr: bool = False, token: str | None = None) -> PushResult:
    """Publish a model (or a saved folder) as one commit: ``model.safetensors``, ``config.json``, ``README.md``.

    The folder is checked strictly first (weights that would not load are never published). A
    missing ``README.md`` is generated with ``render_card``. ``revision`` names a branch, created
    from ``main`` if missing; ``create_pr`` opens a pull request against it instead of committing.
    """
    from huggingface_hub import HfApi, get_token

    check_repo_id(repo_id)
    branch = check_revision(revision) if revision else "main"
    retry_settings()  # a bad ZOO_HUB_* value is a usage error before any request
    token = token or get_token()
    if not token:
        raise HubError("pushing needs a Hub token with write access: set HF_TOKEN, pass token=, or run `hf auth login`")
    with tempfile.TemporaryDirectory(prefix="zoo-push-") as tmp:
        staging = Path(tmp) / "push"
        files = _stage(model_or_dir, staging, repo_id)
        api = HfApi(token=token)
        try:
            repo_kw = {} if private is None else {"private": private}
            _retrying(lambda: api.create_repo(repo_id, repo_type="model", exist_ok=True, **repo_kw), f"creating {repo_id}")
            if branch != "main":
                _retrying(lambda: api.create_branch(repo_id, branch=branch, exist_ok=True), f"creating branch {branch}")
            message = commit_message or f"Upload {repo_id.split('/')[1]} with SSM Zoo"
            with _progress_bars():  # a retried commit whose first try landed is a no-op: the client skips unchanged files
                info = _retrying(lambda: api.upload_folder(repo_id=repo_id, folder_path=str(staging), revision=branch,
                                                           create_pr=create_pr, commit_message=message), f"pushing to {repo_id}")
        except Exception as exc:
            raise _translate(exc, repo_id=repo_id, revision=branch, offline=False, cache_dir=_cache_dir(None), token=token) from exc
    return PushResult(repo_id, getattr(info, "oid", None), getattr(info, "commit_url", None), branch,
                      getattr(info, "pr_url", None), files)
