"""Hub tests: one loopback Hub server for the session, the real huggingface_hub client pointed at it.

The client reads HF_ENDPOINT and its other settings once, at import, so they are set here, at
collection, before anything imports huggingface_hub. Each test gets an empty server (no repos,
faults or log), its own HF_HOME, and a guard that fails it if it opens a non-loopback connection
(subprocesses get the same guard through tests/hub/_guard/sitecustomize.py).
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zoo_core.testing.helpers import model_spec
from zoo_core.testing.hub_server import WRITE_TOKEN, HubServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

_ALREADY_IMPORTED = "huggingface_hub" in sys.modules
HUB = HubServer().start()
os.environ.update(HUB.environ())
os.environ["ZOO_HUB_BACKOFF"] = "0"  # retries without sleeping; the retry count stays the default (3)

if _ALREADY_IMPORTED:  # something imported the client before us: patch what it read (works on 1.x and 2.x)
    from huggingface_hub import constants as _c

    _c.ENDPOINT = HUB.url
    _c.HUGGINGFACE_CO_URL_TEMPLATE = HUB.url + "/{repo_id}/resolve/{revision}/{filename}"
    _c.HF_HUB_DISABLE_XET = True
    _c.HF_HUB_DISABLE_TELEMETRY = True

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_VIOLATIONS: list[str] = []
_real_connect = socket.socket.connect
_real_getaddrinfo = socket.getaddrinfo


def _guarded_connect(self: socket.socket, address: object) -> None:
    if self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and address[0] not in _LOOPBACK:
        _VIOLATIONS.append(f"{address[0]}:{address[1]}")
        raise OSError(f"hub tests may only connect to loopback, not {address[0]}:{address[1]}")
    _real_connect(self, address)  # type: ignore[arg-type]


def _guarded_getaddrinfo(host: object, *args: object, **kw: object) -> object:
    if isinstance(host, (str, bytes)) and (host.decode() if isinstance(host, bytes) else host) not in _LOOPBACK:
        _VIOLATIONS.append(f"DNS {host!r}")
        raise OSError(f"hub tests may only resolve loopback names, not {host!r}")
    return _real_getaddrinfo(host, *args, **kw)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch):
    """Fail any test that connects (or resolves a name) outside loopback."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", _guarded_getaddrinfo)
    _VIOLATIONS.clear()
    yield _VIOLATIONS
    found = list(_VIOLATIONS)
    _VIOLATIONS.clear()
    if found:
        pytest.fail(f"the test tried to reach the network: {', '.join(found)}")


@pytest.fixture
def hub() -> HubServer:
    """The session's loopback Hub, emptied for this test."""
    from huggingface_hub import constants

    assert constants.ENDPOINT == HUB.url, "huggingface_hub was imported with another HF_ENDPOINT"
    HUB.repos.clear()
    HUB.lfs.clear()
    HUB.clear()
    yield HUB
    HUB.clear()


@pytest.fixture(autouse=True)
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HF_HOME per test, both in the environment (subprocesses) and in the client's constants."""
    from huggingface_hub import constants

    home = tmp_path / "hf_home"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    for name, value in {"HF_HOME": home, "HF_HUB_CACHE": home / "hub", "HF_TOKEN_PATH": home / "token",
                        "HF_STORED_TOKENS_PATH": home / "stored_tokens", "HF_ASSETS_CACHE": home / "assets",
                        "HUGGINGFACE_HUB_CACHE": home / "hub"}.items():
        if hasattr(constants, name):
            monkeypatch.setattr(constants, name, str(value))
    if hasattr(constants, "HF_HUB_OFFLINE"):  # read once at import, possibly by another test module
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return home


SPEC = model_spec("s4d", inp={"channels": 2}, d_model=8, depth=2)


@pytest.fixture
def make_model():
    """A tiny S4D classifier; different seeds give different weights."""
    from zoo_core.build import build_model

    return lambda seed=0: build_model(SPEC, seed=seed).eval()


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m zoo_core.cli.hub ARGS`` in a subprocess, loopback-only, with the current HF_* settings."""
    full = {**os.environ, **(env or {}), "ZOO_TEST_LOOPBACK_ONLY": "1",
            "PYTHONPATH": os.pathsep.join([str(HERE / "_guard"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "zoo_core.cli.hub", *args], capture_output=True, text=True, check=False,
                          env=full, timeout=timeout, cwd=ROOT)


def cache_problems(cache: Path, *, resumable: bool = False) -> list[str]:
    """Everything wrong in an HF cache: blobs whose content does not hash to their name, leftovers, dangling links.

    ``resumable``: tolerate ``*.incomplete`` files right after a failed pull (clients < 2.0 keep them
    on purpose to resume; they are never served, and the next pull completes and removes them).
    """
    problems = []
    for blob in cache.glob("models--*/blobs/*"):
        data = blob.read_bytes()
        if blob.name.endswith(".incomplete"):
            if not resumable:
                problems.append(f"leftover {blob.name}")
        elif len(blob.name) == 64 and hashlib.sha256(data).hexdigest() != blob.name:
            problems.append(f"blob {blob.name[:12]} does not match its sha256")
        elif len(blob.name) == 40 and hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != blob.name:
            problems.append(f"blob {blob.name[:12]} does not match its git sha1")
    for link in cache.glob("models--*/snapshots/*/*"):
        if link.is_symlink() and not link.exists():
            problems.append(f"dangling {link}")
    return problems


@pytest.fixture
def cli():
    """Run ``python -m zoo_core.cli.hub`` in a loopback-only subprocess."""
    return run_cli


@pytest.fixture
def check_cache():
    return cache_problems
