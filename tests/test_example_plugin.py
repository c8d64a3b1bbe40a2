"""A third-party plugin, installed for real (into a private target folder), is discovered through
its entry point, builds from a spec, and passes the conformance suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "zoo-plugin-example"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
         "--target", str(target), str(EXAMPLE)],
        check=True, capture_output=True, timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target), "ZOO_LOAD_PLUGINS": "zoo-plugin-example"}
    return env


def _run(args, env):
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_example_plugin_registers_builds_and_passes_the_suite(installed):
    plugins = json.loads(_run([sys.executable, "-m", "zoo_core.cli", "plugins", "--json"], installed).stdout)
    row = next(p for p in plugins if p["dist"] == "zoo-plugin-example")
    assert row["status"] == "loaded" and row["provides"] == {"cores": ["ema"]}
    build = _run([sys.executable, "-m", "zoo_core.cli", "build", str(EXAMPLE / "spec.yaml")], installed)
    assert build.returncode == 0, build.stderr
    # CPU: the fused C++ scan where it builds, else the loop (the fastest PyTorch path there)
    from zoo_core.kernels.cpp import unavailable_reason

    fastest = "naive" if unavailable_reason("linear_scan") else "cpu-scan"
    assert f"backend (blocks AB): recurrent: scan={fastest}" in build.stdout
    suite = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")], installed)
    assert suite.returncode == 0, suite.stdout + suite.stderr
    from zoo_core.testing import CHECKS

    assert f"{len(CHECKS)} passed" in suite.stdout  # every conformance check ran and passed
