"""Run a sweep's unfinished cells: local worker processes by default, or one Ray task per cell.

Resumable: a cell whose row in ``results.jsonl`` says ``ok`` (with the same settings) and whose run
folder holds its ``metrics.json`` and ``result.json`` is skipped; every other cell runs ``zoo train
--resume`` in its folder, so a cell cut short by a kill continues from its last checkpoint. One
process appends the rows (this one, also under Ray), and a lock on the output folder keeps a second
``zoo sweep`` from writing into the same cells at once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import ZooError
from ..train.progress import Progress
from .config import Cell, Sweep
from .execute import Outcome, Payload, collect, finished_on_disk, machine_cpus, payload, run_dir, start
from .ray_backend import run_on_ray
from .results import append, latest, make_row

log = logging.getLogger(__name__)
POLL_S = 0.2


class SweepInterrupted(ZooError):
    exit_code = 130


@dataclass
class Summary:
    total: int
    skipped: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] != "ok"]


def default_workers(sweep: Sweep) -> int:
    """As many cells at once as the machine has CPUs for, at the cell's ``num_cpus`` each."""
    return max(1, int(machine_cpus() // max(sweep.resources.num_cpus, 1)))


def split_done(sweep: Sweep, cells: list[Cell], *, missing: bool = False) -> tuple[list[Cell], list[Cell]]:
    """(to run, finished). A cell is finished when its latest row is ok and its run folder is complete, or, with
    ``missing``, on the row alone (a fresh clone holds the committed results but not the ignored run folders). A
    finished row made with other settings is an error naming the way out."""
    rows = latest(sweep.results)
    todo: list[Cell] = []
    done: list[Cell] = []
    for c in cells:
        row = rows.get(c.key)
        if row is not None and row.get("status") == "ok" and row.get("config_hash") != c.config_hash:
            raise ZooError(f"cell {c.key} finished earlier with other settings (the sweep file changed since: config "
                           f"{row.get('config_hash')} there, {c.config_hash} now); to train it again, delete its folder "
                           f"{run_dir(sweep, c)} and its line in {sweep.results}, or choose another output folder (-o)")
        ok = row is not None and row.get("status") == "ok" and (missing or finished_on_disk(run_dir(sweep, c)))
        (done if ok else todo).append(c)
    return todo, done


@contextmanager
def folder_lock(output: Path) -> Iterator[None]:
    """Hold ``<output>/.sweep.lock`` (released by the OS if this process dies)."""
    output.mkdir(parents=True, exist_ok=True)
    path = output / ".sweep.lock"
    with open(path, "a+", encoding="utf-8") as f:
        try:
            import fcntl  # lazy: POSIX only; elsewhere the sweep runs without the lock
        except ImportError:
            yield
            return
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise ZooError(f"another zoo sweep (pid {f.read().strip() or '?'}) is running in {output}; wait for it to "
                           "end, or give this one another output folder (-o)") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield


class SweepProgress:
    """Cells done/running/failed and an ETA: a tqdm bar on a terminal, plain lines otherwise."""

    def __init__(self, progress: Progress, total: int, slots: int) -> None:
        self.p, self.total, self.slots = progress, total, slots
        self.done = self.failed = self.running = 0
        self.walls: list[float] = []
        self.p.start_epoch("cells", total)

    def status(self) -> str:
        return f"{self.done} done, {min(self.running, self.slots)} running, {self.failed} failed, ETA {self.eta()}"

    def eta(self) -> str:
        if not self.walls:
            return "?"
        left = self.total - self.done - self.failed
        s = sum(self.walls) / len(self.walls) * left / max(1, min(self.slots, left or 1))
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m" if s >= 3600 else f"{int(s // 60)}m{int(s % 60):02d}s"

    def started(self, cell: Cell) -> None:
        self.running += 1
        self.p.advance(0, self.status())

    def finished(self, row: dict[str, Any]) -> None:
        self.running -= 1
        self.walls.append(row["wall_s"])
        if row["status"] == "ok":
            self.done += 1
            m = row["metric"]
            what = f"test {m} {row['test'][m]:.4f}, val {m} {row['val'][m]:.4f}"
        else:
            self.failed += 1
            what = "FAILED: " + (row.get("error") or "").splitlines()[0]
        self.p.line(f"[{self.done + self.failed}/{self.total}: {self.status()}] {row['key']}: {what} ({row['wall_s']:.0f} s)")
        self.p.advance(1, self.status())

    def close(self) -> None:
        self.p.end_epoch(f"{self.total} cells: {self.done} done, {self.failed} failed")


Record = Callable[[Cell, Payload, Outcome], None]


def run_sweep(sweep: Sweep, *, workers: int | None = None, ray: str | None = None, only: Callable[[Cell], bool] | None = None,
              progress: Progress | None = None, missing: bool = False) -> Summary:
    """Run every unfinished cell (those ``only`` keeps; with ``missing``, only those without an ok results row);
    returns the rows written by this call."""
    cells = [c for c in sweep.cells if only is None or only(c)]
    progress = progress or Progress()
    with folder_lock(sweep.output):
        todo, done = split_done(sweep, cells, missing=missing)
        summary = Summary(total=len(cells), skipped=len(done))
        slots = workers or default_workers(sweep)
        rows = latest(sweep.results)
        # a fresh clone has the committed results but not the (ignored) run folders: say why those train again
        orphans = sum(1 for c in todo if (rows.get(c.key) or {}).get("status") == "ok")
        again = (f" ({orphans} of them have a results row but no finished run folder here: trained again; "
                 "--missing would skip them)") if orphans else ""
        progress.line(f"{sweep.name}: {len(cells)} cells, {len(done)} finished before, {len(todo)} to run{again} "
                      f"({'Ray ' + ray if ray else f'{slots} local worker(s)'}); results: {sweep.results}")
        if not todo:
            return summary
        prog = SweepProgress(progress, len(todo), slots)

        def record(cell: Cell, pay: Payload, out: Outcome) -> None:
            row = make_row(cell, pay, out, sweep.output)
            append(sweep.results, row)
            summary.rows.append(row)
            prog.finished(row)

        try:
            if ray:
                run_on_ray(sweep, todo, ray, workers, record, prog.started)
            else:
                _run_local(sweep, todo, slots, record, prog.started)
        except KeyboardInterrupt:
            raise SweepInterrupted(f"interrupted after {len(summary.rows)} of {len(todo)} cells; run the same command "
                                   "again to continue (finished cells are skipped, half-done ones resume)") from None
        finally:
            prog.close()
    return summary


def _run_local(sweep: Sweep, todo: list[Cell], slots: int, record: Record, started: Callable[[Cell], None]) -> None:
    queue = list(todo)
    running: dict[subprocess.Popen[bytes], tuple[Cell, Payload, Any, float]] = {}
    try:
        while queue or running:
            while queue and len(running) < slots:
                cell = queue.pop(0)
                pay = payload(sweep, cell)
                try:
                    proc, fh = start(pay)
                except OSError as exc:
                    record(cell, pay, Outcome(key=cell.key, ok=False, error=f"could not start zoo train: {exc}", wall_s=0.0,
                                              metrics=None, host=os.uname().nodename))
                    continue
                running[proc] = (cell, pay, fh, time.perf_counter())
                started(cell)
            time.sleep(POLL_S)
            for proc in [p for p in running if p.poll() is not None]:
                cell, pay, fh, t0 = running.pop(proc)
                fh.close()
                record(cell, pay, collect(pay, proc.returncode, time.perf_counter() - t0))
    except KeyboardInterrupt:
        _stop(running)  # then the sweep reports the interruption
        raise


def _stop(running: dict[subprocess.Popen[bytes], tuple[Cell, Payload, Any, float]]) -> None:
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + 10
    for proc, (_, _, fh, _) in running.items():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        fh.close()
