"""Real cells (tiny LRU models on BasicMotions, 2 epochs, 4 cells): a sweep killed after its first
cell resumes and ends with every cell once, and the same sweep on a two-worker local Ray cluster
writes the same per-cell metrics as the local run (issue 15's test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from zoo_core.sweep import load_sweep, run_sweep
from zoo_core.sweep.results import comparable, latest, read_rows
from zoo_core.train.progress import Progress

from .conftest import tiny_spec_dict, write_sweep

pytestmark = pytest.mark.requires("aeon")
BODY = {"output": "local", "seeds": [1, 2], "lrs": [0.01, 0.003], "training": {"epochs": 2}}


def _kill_after_first_cell(path: Path, results: Path) -> int:
    """Start ``zoo sweep`` in a child; SIGKILL it once the first row is written. Returns the rows then."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "zoo_core.cli", "sweep", str(path), "--workers", "2", "--plain", "-q"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not (results.is_file() and results.read_text().count("\n") >= 1):
        assert proc.poll() is None, f"the sweep ended before it was killed: {proc.stderr.read().decode() if proc.stderr else ''}"
        assert time.monotonic() < deadline, "no cell finished in 240 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return len(read_rows(results))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("sweep")
    path = write_sweep(folder, BODY, spec=tiny_spec_dict(core="lru", d_model=8, depth=1))
    sweep = load_sweep(path)
    at_kill = _kill_after_first_cell(path, sweep.results)
    summary = run_sweep(sweep, workers=2, progress=Progress(quiet=True))
    return {"path": path, "sweep": sweep, "at_kill": at_kill, "summary": summary}


def test_a_killed_sweep_resumes_and_ends_with_every_cell_once(local_run: dict[str, Any]) -> None:
    sweep = local_run["sweep"]
    rows = read_rows(sweep.results)
    assert 1 <= local_run["at_kill"] < 4, "the kill came after every cell had finished: nothing was resumed"
    assert sorted(r["key"] for r in rows) == sorted(c.key for c in sweep.cells)  # each once
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    assert all(r["backends"] and r["backends"][0].startswith("LRU: ") for r in rows), rows[0].get("backends")  # what ran
    assert local_run["summary"].skipped == local_run["at_kill"]
    # the cell that was running when the sweep died was started twice (zoo train --resume in its folder)
    starts = {r["key"]: (sweep.output / r["run_dir"] / "log.txt").read_text().count("\n# ") for r in rows}
    assert max(starts.values()) == 2 and min(starts.values()) == 1


@pytest.mark.requires("ray")
def test_a_two_worker_local_ray_cluster_writes_the_same_metrics_as_the_local_run(local_run: dict[str, Any]) -> None:
    sweep = load_sweep(local_run["path"], output=local_run["sweep"].output.parent / "ray")
    summary = run_sweep(sweep, workers=2, ray="auto", progress=Progress(quiet=True))
    assert not summary.failed, [r.get("error") for r in summary.failed]
    local, ray = latest(local_run["sweep"].results), latest(sweep.results)
    assert set(local) == set(ray) and len(ray) == 4
    for key in local:
        assert comparable(ray[key]) == comparable(local[key]), key
    assert len({r["test"]["accuracy"] for r in ray.values()} | {0.0}) > 1  # trained numbers, not a constant
