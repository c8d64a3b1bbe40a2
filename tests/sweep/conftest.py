"""Sweep tests: tiny specs and sweep files, and a stand-in for ``zoo train`` (a few-ms child process)
that writes what a finished run writes, so the scheduler's logic is tested without training."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from zoo_core.sweep import execute
from zoo_core.testing.helpers import model_spec

FAKE_TRAIN = r'''
import json, sys, time
from pathlib import Path
d = Path(sys.argv[1]); spec = __import__("yaml").safe_load((d / "spec.yaml").read_text())
t = spec["training"]; lr, seed = t["lr"], t["seed"]
(d / "starts.txt").open("a").write("x")
if lr == 0.5:
    print("Traceback (most recent call last):\nzoo train: error: the fake run diverged (lr 0.5)", file=sys.stderr)
    sys.exit(2)
time.sleep(float(t.get("grad_clip") or 0))
run = d / f"seed-{seed}" / f"lr-{lr:g}"; run.mkdir(parents=True, exist_ok=True)
acc = round(0.5 + 0.1 * seed + lr, 6); val = round(acc - (0.3 if lr == 0.2 else 0.0), 6)
(run / "result.json").write_text("{}")
m = {"metric": "accuracy", "task": "classification", "params": 100 * spec["model"]["d_model"], "wall_time_s": 0.1,
     "earlier_wall_s": 2.5 if seed == 2 else 0.0, "device": "cpu",
     "seeds": [{"seed": seed, "lr": lr, "best_epoch": 1, "model_dir": str(run / "best"),
     "test": {"accuracy": acc, "loss": 1 - acc}, "val": {"accuracy": val, "loss": 1 - val},
     "runs": [{"epochs_run": 1, "history": [{"epoch": 1, "time_s": 0.01}]}]}]}
(d / "metrics.json").write_text(json.dumps(m))
'''


def tiny_spec_dict(*, dataset: str = "BasicMotions", core: str = "lru", d_model: int = 8, depth: int = 1) -> dict[str, Any]:
    spec = model_spec(core, task={"kind": "classification", "classes": 4}, inp={"channels": 6}, d_model=d_model, depth=depth)
    return {**spec, "name": "tiny", "training": {"dataset": dataset, "epochs": 1, "batch_size": 16}}


def write_sweep(folder: Path, body: dict[str, Any], *, spec: dict[str, Any] | None = None, name: str = "sweep.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(yaml.safe_dump(spec or tiny_spec_dict()))
    path = folder / name
    path.write_text(yaml.safe_dump({"schema_version": 1, "specs": {"tiny": "tiny.yaml"}, **body}, sort_keys=False))
    return path


@pytest.fixture
def fake_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Cells run FAKE_TRAIN instead of ``zoo train`` (lr 0.5 fails; training.grad_clip = seconds to sleep)."""
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(execute.Payload, "argv", lambda self: [sys.executable, str(script), self.run_dir])
    return script
