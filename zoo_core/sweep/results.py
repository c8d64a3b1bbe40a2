"""``results.jsonl``: one JSON line per finished (or failed) cell, appended by the sweep process only.

The last line of a key wins (a failed cell retried later, a cell rerun after its folder was
deleted). A line cut short by a kill is skipped with a warning and the next append starts on a new
line, so a killed sweep never leaves the file unreadable.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from pathlib import Path
from typing import Any

from .config import Cell
from .execute import Outcome, Payload, command

log = logging.getLogger(__name__)


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s:%d: not a JSON line (a write cut short by a kill?); skipped", path, i)
    return rows


def latest(path: Path) -> dict[str, dict[str, Any]]:
    """The last row of each cell key."""
    return {r["key"]: r for r in read_rows(path) if "key" in r}


def append(path: Path, row: dict[str, Any]) -> None:
    """Append one line and fsync it: a line that is there is a cell that will not run again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell():
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":  # the previous writer was killed mid-line
                f.write(b"\n")
        f.write((json.dumps(row) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def make_row(cell: Cell, pay: Payload, out: Outcome, output: Path) -> dict[str, Any]:
    """The JSONL row of a finished cell: its names, the test and validation metrics, size, times, command."""
    row: dict[str, Any] = {
        "key": cell.key, "status": "ok" if out["ok"] else "failed", "spec": cell.spec_label, "spec_path": cell.spec_path,
        "dataset": cell.dataset, "seed": cell.seed, "lr": cell.lr, "axes": cell.axes, "config_hash": cell.config_hash,
        "training": cell.training(), "run_dir": os.path.relpath(pay.run_dir, output), "command": command(pay),
        "wall_s": round(out["wall_s"], 3), "host": out["host"], "when": dt.datetime.now().isoformat(timespec="seconds"),
    }
    m = out["metrics"]
    if not out["ok"] or m is None:
        row["error"] = out["error"]
        return row
    seed = m["seeds"][0]
    run = seed["runs"][0]
    row.update({
        "metric": m["metric"], "task": m["task"], "test": seed["test"], "val": seed["val"],
        "best_epoch": seed["best_epoch"], "epochs_run": run.get("epochs_run", len(run["history"])),
        "params": m["params"], "train_wall_s": m["wall_time_s"], "epoch_time_s": [h["time_s"] for h in run["history"]],
        # wall_s is this invocation of zoo train; a cell resumed from its checkpoint spent more before it
        "cell_wall_s": round(out["wall_s"] + m.get("earlier_wall_s", 0.0), 3),
        "model_dir": os.path.relpath(seed["model_dir"], output) if seed.get("model_dir") else None,
        "device": m.get("device"), "threads": pay.threads, "backends": run.get("backends"),
    })
    return row


# what must agree between two runs of one cell (the Ray run and the local run, a rerun): not times or hosts
RESULT_FIELDS = ("status", "metric", "test", "val", "best_epoch", "epochs_run", "params")


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in RESULT_FIELDS}
