"""Test-wide settings: load only this repository's plugins, so stray installs cannot leak in."""

from __future__ import annotations

import os
import re
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


os.environ["ZOO_LOAD_PLUGINS"] = ",".join(_repo_plugin_dists())
os.environ.pop("ZOO_STRICT_PLUGINS", None)
os.environ.pop("ZOO_DISABLE_PLUGIN_AUTOLOAD", None)
torch.set_num_threads(min(2, torch.get_num_threads()))


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
