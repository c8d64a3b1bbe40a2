"""The suite's own support. The switch for optional extras (root conftest.py, tests/_hide):
``ZOO_TEST_HIDE`` hides an extra from the test process and its subprocesses, and
``@pytest.mark.requires`` turns its absence into a skip that names the install command, never a
failure. And the shared builders of ``zoo_core.testing.helpers``: ``cores_with`` follows what cores
declare, so a newly registered core joins every test parametrized over it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zoo_core.build import build_model
from zoo_core.params import CoreParams
from zoo_core.plugins import entry_point_sources, inline_source, load_registry
from zoo_core.testing.helpers import cores_with, inline_plugin, model_spec, unroll

ROOT = Path(__file__).resolve().parents[1]

BODY = '''
import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.requires("aeon")
def test_needs_aeon():
    import aeon  # noqa: F401


@pytest.mark.requires("zoo_no_such_module")
def test_needs_something_unknown():
    raise AssertionError("ran without its module")


def test_hidden_here_and_in_subprocesses():
    assert importlib.util.find_spec("aeon") is None
    with pytest.raises(ModuleNotFoundError):
        import aeon  # noqa: F401
    code = "import importlib.util; print(importlib.util.find_spec('aeon'))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "None"
    assert importlib.util.find_spec("numpy") is not None  # only what was named is hidden
'''


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(BODY)
    run_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(tmp_path / "test_probe.py")], cwd=tmp_path, env=run_env, capture_output=True, text=True,
                          timeout=300)


def test_a_hidden_extra_skips_with_its_install_command(tmp_path: Path) -> None:
    out = _pytest(tmp_path, ZOO_TEST_HIDE="aeon")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed, 2 skipped" in out.stdout
    assert "needs 'aeon', not installed: pip install 'zoo-core[data]'" in out.stdout
    assert "needs 'zoo_no_such_module', not installed: pip install zoo_no_such_module" in out.stdout


def test_cores_with_reads_declared_capabilities_so_a_new_core_joins(no_allow_list: None) -> None:
    def zoo_register_cores(register):  # type: ignore[no-untyped-def]
        toy = "zoo_core.testing.toys:ToyDiag"
        register("toy-streams", toy, params=CoreParams, presets={"tiny": {}}, capabilities=["step", "lti"])
        register("toy-whole", toy, params=CoreParams, presets={"tiny": {}}, capabilities=["lti"])

    reg = load_registry([*entry_point_sources(), inline_source("t", inline_plugin("t", zoo_register_cores=zoo_register_cores))])
    streaming = cores_with("step", registry=reg)
    assert "toy-streams" in streaming and "toy-whole" not in streaming
    assert streaming == sorted(n for n, e in reg.cores.items() if "step" in e.capabilities)
    assert "toy-whole" in cores_with(without=["step"], registry=reg) and "toy-streams" not in cores_with(without=["step"], registry=reg)
    assert cores_with("step", "no-such-capability", registry=reg) == []


@pytest.mark.parametrize("core", cores_with())
def test_model_spec_builds_every_registered_core_from_its_tiny_preset(core: str) -> None:
    model = build_model(model_spec(core, d_model=4, depth=1, pool="last"), seed=0).double().eval()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    with torch.no_grad():
        y = model(x)
        assert y.shape == (2, 3)
        if core in cores_with("step"):
            torch.testing.assert_close(unroll(model, x)[-1], y, rtol=1e-8, atol=1e-10)
