"""One cell = one ``zoo train`` subprocess; this module prepares it, runs it, and reads what it left.

Why a subprocess per cell rather than ``zoo_core.train.train(...)`` in this process: a cell that
crashes (a segfault in a kernel, the OOM killer, a diverged run raising) takes only its own process
down and is recorded as failed; memory, threads and the global torch state a run sets
(deterministic algorithms, default dtype) do not leak into the next cell; each cell gets its own
thread count (``OMP_NUM_THREADS`` = the cell's ``num_cpus``), so local and Ray runs compute with the
same threads and give the same numbers; and the command recorded in the row is exactly what ran.
The price is the interpreter start and imports (seconds), small beside any real cell.

Everything a cell needs travels in a ``Payload`` (plain data, the spec's text included), so a Ray
worker on another node runs ``run_payload`` with nothing but this package installed; the run folder
must be on storage the node sees for resume (``zoo train --resume`` inside a half-done cell).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, TypedDict

import yaml

from .config import Cell, Sweep

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(: |$)")  # a traceback's last line
ERROR_LINES = 6  # how much of a failed cell's log its row keeps (the whole log stays in log.txt)


@dataclass(frozen=True)
class Payload:
    """What a worker (local or Ray) needs to run one cell."""

    key: str
    run_dir: str  # absolute
    spec_text: str
    device: str
    threads: int

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "zoo_core.cli", "train", str(Path(self.run_dir) / "spec.yaml"), "-o", self.run_dir,
                "--resume", "--plain", "--device", self.device]

    def env(self) -> dict[str, str]:
        n = str(self.threads)
        return {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "PYTHONUNBUFFERED": "1"}


class Outcome(TypedDict):
    key: str
    ok: bool
    error: str | None
    wall_s: float
    metrics: dict[str, Any] | None
    host: str


def machine_cpus() -> int:
    """The CPUs this process may use (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def payload(sweep: Sweep, cell: Cell) -> Payload:
    return Payload(cell.key, str(run_dir(sweep, cell)), yaml.safe_dump(cell.spec, sort_keys=False), sweep.device,
                   max(1, int(sweep.resources.num_cpus)))


def run_dir(sweep: Sweep, cell: Cell) -> Path:
    return sweep.output / cell.key


def command(p: Payload, cwd: Path | None = None) -> str:
    """The shell command that reproduces the cell (paths relative to ``cwd`` when under it)."""
    def rel(path: str) -> str:
        try:
            return str(Path(path).relative_to(cwd or Path.cwd()))
        except ValueError:
            return path
    d = rel(p.run_dir)
    args = ["zoo", "train", f"{d}/spec.yaml", "-o", d, "--resume", "--device", p.device]
    return f"OMP_NUM_THREADS={p.threads} " + " ".join(shlex.quote(a) for a in args)


def prepare(p: Payload) -> list[str]:
    """Write the cell's spec (unchanged when it is already there: a resumed cell) and return its argv."""
    d = Path(p.run_dir)
    d.mkdir(parents=True, exist_ok=True)
    spec = d / "spec.yaml"
    if not spec.is_file() or spec.read_text(encoding="utf-8") != p.spec_text:
        tmp = d / ".spec.yaml.tmp"
        tmp.write_text(p.spec_text, encoding="utf-8")
        tmp.replace(spec)
    return p.argv()


def finished_on_disk(d: Path) -> bool:
    """A complete ``zoo train`` run: its metrics.json and every run's result.json are written."""
    return (d / "metrics.json").is_file() and any(d.glob("seed-*/lr-*/result.json"))


def collect(p: Payload, rc: int, wall: float) -> Outcome:
    """What the finished subprocess left: the metrics, or the error (the tail of its log)."""
    d = Path(p.run_dir)
    host = os.uname().nodename
    if rc == 0 and finished_on_disk(d):
        metrics = json.loads((d / "metrics.json").read_text(encoding="utf-8"))
        return Outcome(key=p.key, ok=True, error=None, wall_s=wall, metrics=metrics, host=host)
    return Outcome(key=p.key, ok=False, error=_error(d / "log.txt", rc), wall_s=wall, metrics=None, host=host)


def _error(log: Path, rc: int) -> str:
    why = f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    lines = [ln for ln in (log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []) if ln.strip()]
    if rc == 0:
        why = "zoo train exited 0 but left no metrics.json / result.json"
    if not lines:
        return why
    # first line: why and the error: zoo train's one-line error, or a traceback's exception line, which
    # is not always the last (torch's "Could not run ... from the 'CUDA' backend" lists 50 dispatch keys after it)
    tb = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")), default=None)
    heads = [] if tb is None else [i for i in range(tb, len(lines)) if _EXCEPTION_LINE.match(lines[i])]
    end = heads[0] + 1 if heads else len(lines)
    return f"{why}: {lines[end - 1].strip()}\nthe end of {log}:\n" + "\n".join(lines[max(0, end - ERROR_LINES):end])


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: a ``preexec_fn`` making the cell die when the sweep process does (even by SIGKILL), so a
    killed sweep leaves no orphan writing into a folder the resumed sweep is about to continue.
    libc is loaded here, before the fork: the child only calls it (nothing imported after a fork)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return preexec


def start(p: Payload) -> tuple[subprocess.Popen[bytes], Any]:
    """Launch the cell (stdout and stderr appended to ``<run_dir>/log.txt``); returns the process and the log."""
    argv = prepare(p)
    log = open(Path(p.run_dir) / "log.txt", "ab")  # noqa: SIM115 - closed by the caller when the process ends
    log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode())
    log.flush()
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=p.env(),
                            preexec_fn=_die_with_parent()), log


def run_payload(p: dict[str, Any]) -> Outcome:
    """Run one cell to its end in this process's child (what a Ray task executes); never raises for a failed cell."""
    pay = Payload(**p)
    t0 = time.perf_counter()
    try:
        proc, log = start(pay)
    except OSError as exc:
        return Outcome(key=pay.key, ok=False, error=f"could not start zoo train: {exc}", wall_s=0.0, metrics=None,
                       host=os.uname().nodename)
    with log:
        rc = proc.wait()
    return collect(pay, rc, time.perf_counter() - t0)


def as_dict(p: Payload) -> dict[str, Any]:
    return asdict(p)
