"""The Hub client as the zoo uses it: ``huggingface_hub`` only, its own settings, retries and errors.

The client's own settings apply: ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME`` / ``HF_HUB_CACHE`` and
``HF_HUB_DISABLE_PROGRESS_BARS`` are read by ``huggingface_hub`` once, when it is imported (set
them before). ``HF_HUB_OFFLINE`` is honoured even when set later: it turns every pull into a
cache-only one.

- a transient failure (5xx, 408/429, dropped connection, truncated body) is retried
  ``ZOO_HUB_RETRIES`` times in all (default 3) with exponential backoff from ``ZOO_HUB_BACKOFF``
  seconds (default 1); the client alone does not retry a GET answered 5xx;
- errors become ``HubError`` / ``HubConnectionError`` (exit 5) / ``CheckpointError`` /
  ``MissingPluginError`` with what to do;
- progress bars only on a terminal.

``pulling.py`` fetches and verifies, ``pushing.py`` publishes, ``create.py`` builds a model from a reference.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ZooError
from ..plugins import env_flag
from .errors import HubConnectionError, HubError, HubSettingError

log = logging.getLogger("zoo_core.hub")


WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "README.md"
PUSHED = (WEIGHTS, CONFIG, CARD, "vocab.json")  # vocab.json: a language model's tokenizer (zoo_core.tokenizer), when it ships one
IMAGES = (".png", ".svg", ".jpg")
RECORD = "zoo-pull.json"
_TRANSIENT = {"ConnectError", "ConnectionError", "TransportError", "TimeoutException", "Timeout", "ReadTimeout",
              "RemoteProtocolError", "ChunkedEncodingError", "ProtocolError", "ReadError", "IncompleteRead"}


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
