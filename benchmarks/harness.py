"""The measuring method, once: machine state, interleaved timing, peak RSS, rows, formatting.

Method (shared/reference/perf-baselines.md): each table waits (≤ quiet_wait s) for a quiet
machine, warms every implementation up once, then runs interleaved rounds with a rotating order
(so machine drift hits all alike) and records ``foreign``, the cores other processes used
meanwhile. Peak memory is read from /proc/self/status (VmHWM after a reset through
/proc/self/clear_refs) in a fresh process (``benchmarks.runner.memory_child``). Every script that
measures imports these helpers instead of keeping its own copy.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Call = Callable[[], None]
Row = dict[str, Any]
MODES = {"fwd": "forward", "fwdbwd": "forward+backward"}
BUSY = 0.25  # foreign cores above which a table is marked as timed on a busy machine
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# ---------------------------------------------------------------------------------------
# formatting (the renderer and the console use the same)
# ---------------------------------------------------------------------------------------
def fmt_t(s: float | None, digits: int = 2) -> str:
    """Seconds as the reports print them: ms (one decimal) below a second, s with `digits`
    decimals above; '–' when not measured."""
    if s is None:
        return "–"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.{digits}f} s"


# ---------------------------------------------------------------------------------------
# machine state
# ---------------------------------------------------------------------------------------
def _busy_seconds() -> float:
    """CPU seconds spent by all processes since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Foreign:
    """Average number of cores used by other processes between start() and stop()."""

    def start(self) -> None:
        self.t, self.busy, self.own = time.perf_counter(), _busy_seconds(), _own_seconds()

    def stop(self) -> float:
        wall = time.perf_counter() - self.t
        other = (_busy_seconds() - self.busy) - (_own_seconds() - self.own)
        return max(0.0, other / max(wall, 1e-9))


def wait_quiet(limit_s: float = 30.0, below: float = BUSY) -> float:
    """Wait until other processes use < `below` cores (1 s samples), at most limit_s seconds;
    returns the last load seen. limit_s = 0 returns at once (smoke runs, tests)."""
    if limit_s <= 0:
        return 0.0
    meter, t0 = Foreign(), time.perf_counter()
    while True:
        meter.start()
        time.sleep(1.0)
        load = meter.stop()
        if load < below or time.perf_counter() - t0 > limit_s:
            return load


def machine() -> Row:
    """CPU model, SIMD flags, memory and versions: what a reader needs to compare two reports."""
    import torch

    with open("/proc/cpuinfo") as f:
        info = f.read()
    models = [ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")]
    flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
    simd = [s for s in ("avx2", "fma", "avx512f") if f" {s}" in flags]
    with open("/proc/meminfo") as f:
        mem = next(ln for ln in f if ln.startswith("MemTotal")).split()[1]
    return {"cpu": models[0] if models else platform.processor(), "logical_cpus": len(models),
            "simd": simd, "mem_gib": round(int(mem) / 2**20, 1), "python": platform.python_version(),
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def commit() -> str | None:
    """The checkout's commit (short hash, '+dirty' when tracked files differ), so each report says
    which code measured it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "zoo_core", "plugins", "benchmarks"],
                               cwd=ROOT, check=False).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


# ---------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------
def time_block(calls: Mapping[str, Call], repeats: int, quiet_wait: float, *,
               fewer: Mapping[str, int] | None = None, warm: Mapping[str, Call] | None = None,
               round_wait: float = 0.0) -> tuple[dict[str, list[float]], float]:
    """Warm up each call once, then `repeats` interleaved rounds with rotating order.

    fewer: {name: n}, a slow call timed in the first n rounds only; warm: {name: call}, a cheaper
    warm-up (the same code at a short length) used instead of the call itself; round_wait: also
    wait (≤ this many seconds) for a quiet machine before every round, and average ``foreign``
    over the timed rounds only (weighted by their wall time).
    """
    fewer, warm = fewer or {}, warm or {}
    wait_quiet(quiet_wait)
    for name, call in calls.items():
        warm.get(name, call)()
    meter = Foreign()
    meter.start()
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    busy = wall = 0.0
    for r in range(repeats):
        if round_wait:
            wait_quiet(round_wait)
            meter.start()
        t_round = time.perf_counter()
        for name in names[r % len(names):] + names[:r % len(names)]:
            if r >= fewer.get(name, repeats):
                continue
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
        if round_wait:
            dt_round = time.perf_counter() - t_round
            busy, wall = busy + meter.stop() * dt_round, wall + dt_round
    return times, (busy / max(wall, 1e-9) if round_wait else meter.stop())


def summary(ts: list[float]) -> Row:
    """Median and inter-quartile range of one implementation's timed rounds."""
    q = statistics.quantiles(ts, n=4, method="inclusive") if len(ts) > 1 else [ts[0]] * 3
    return {"median_s": statistics.median(ts), "q25_s": q[0], "q75_s": q[2], "n": len(ts),
            "times_s": [round(t, 6) for t in ts]}


def rel(a: Any, b: Any) -> float:
    """Relative L2 difference of two tensors (the agreement checks' measure)."""
    return float(((a - b).norm() / b.norm()).item())


# ---------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------
def rss_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmRSS now, VmHWM the peak since the last reset)."""
    with open("/proc/self/status") as f:
        return int(next(ln for ln in f if ln.startswith(field)).split()[1])


def reset_peak_rss(trim: bool = True) -> int:
    """Reset VmHWM (peak RSS) to the current RSS; returns that RSS in KiB.

    trim: first hand the allocator's free memory back to the OS (glibc ``malloc_trim``), so that
    a later step cannot reuse it unseen and read as a smaller peak.
    """
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_kib("VmRSS")


def peak_of(call: Call) -> Row:
    """Peak RSS of one call above the RSS just before it (run this in a fresh process)."""
    before = reset_peak_rss(trim=True)
    t0 = time.perf_counter()
    call()
    took = time.perf_counter() - t0
    return {"peak_mib": (rss_kib("VmHWM") - before) / 1024, "rss_before_mib": before / 1024,
            "call_s": round(took, 3)}


# ---------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------
class Writer:
    """Appends JSONL rows (each stamped with the run's fields, the time and the 1-min load)."""

    def __init__(self, path: Path, base: Row) -> None:
        self.path, self.base = path, base
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: Row) -> None:
        row = {**self.base, **row, "when": dt.datetime.now().isoformat(timespec="seconds"),
               "loadavg1": os.getloadavg()[0]}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if row.get("median_s") is not None:
            print(f"  {row['workload']:<34} {row['impl']:<28} {fmt_t(row['median_s']):>9} "
                  f"[{fmt_t(row['q25_s'])}, {fmt_t(row['q75_s'])}] foreign={row.get('foreign', 0):.2f}", flush=True)
        elif row.get("status") == "skipped":
            print(f"  {row['workload']:<34} {row['impl']:<28} skipped: {row['reason']}", flush=True)
        elif row.get("kind") == "memory" and row.get("status") == "ok":
            print(f"  {row['workload']:<34} {row['impl']:<28} peak +{row['peak_mib']:.1f} MiB", flush=True)


def read_rows(path: Path) -> list[Row]:
    """Every row of a results file, in order (old script rows and harness rows alike)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_rows(path: Path) -> tuple[dict[tuple[Any, ...], Row], dict[str, Row], Row]:
    """A results .jsonl: the latest row per (workload, impl, threads), the run records by id, the
    last start-up check. A partial rerun thus replaces just the rows it measured."""
    latest: dict[tuple[Any, ...], Row] = {}
    runs: dict[str, Row] = {}
    check: Row = {}
    for row in read_rows(path):
        if row["kind"] == "run":
            runs[row["run"]] = row
        elif row["kind"] == "check":
            check = row
        else:
            key = (row["workload"], row["impl"], row.get("threads"))
            latest.pop(key, None)  # a rerun row moves to where it was written
            latest[key] = row
    return latest, runs, check
