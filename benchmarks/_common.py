"""Helpers shared by the benchmarks: machine state, interleaved timing, JSONL rows, peak RSS.

Method (shared/reference/perf-baselines.md): each block waits (≤ quiet_wait s) for a quiet
machine, warms every implementation up once, then runs interleaved rounds with a rotating order
and records ``foreign``, the cores other processes used meanwhile. Peak memory is read from
/proc/self/status (VmHWM after a reset through /proc/self/clear_refs) in a fresh process.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import Tensor

Call = Callable[[], None]


# ---------------------------------------------------------------------------------------
# machine state
# ---------------------------------------------------------------------------------------
def _busy_seconds() -> float:
    """CPU seconds spent by all processes since boot (/proc/stat, USER_HZ = 100)."""
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


def wait_quiet(limit_s: float = 30.0, below: float = 0.25) -> float:
    """Wait until other processes use < `below` cores (1 s samples), at most limit_s seconds."""
    meter, t0 = Foreign(), time.perf_counter()
    while True:
        meter.start()
        time.sleep(1.0)
        load = meter.stop()
        if load < below or time.perf_counter() - t0 > limit_s:
            return load


def machine() -> dict:
    with open("/proc/cpuinfo") as f:
        info = f.read()
    models = [ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")]
    flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
    simd = [s for s in ("avx2", "fma", "avx512f") if f" {s}" in flags]
    mem = next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal")).split()[1]
    return {"cpu": models[0] if models else platform.processor(), "logical_cpus": len(models),
            "simd": simd, "mem_gib": round(int(mem) / 2**20, 1), "python": platform.python_version(),
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def rel(a: Tensor, b: Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------
def time_block(calls: dict[str, Call], repeats: int, quiet_wait: float, *,
               fewer: Mapping[str, int] | None = None, warm: Mapping[str, Call] | None = None,
               round_wait: float = 0.0) -> tuple[dict[str, list[float]], float]:
    """Warm up each call once, then `repeats` interleaved rounds with rotating order.

    fewer: {name: n}, a slow call timed in the first n rounds only; warm: {name: call}, a cheaper
    warm-up (e.g. the same code at a short length) used instead of the call itself; round_wait:
    also wait (≤ this many seconds) for a quiet machine before every round, and average
    ``foreign`` over the timed rounds only (weighted by their wall time).
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


def summary(ts: list[float]) -> dict:
    q = statistics.quantiles(ts, n=4, method="inclusive") if len(ts) > 1 else [ts[0]] * 3
    return {"median_s": statistics.median(ts), "q25_s": q[0], "q75_s": q[2], "n": len(ts),
            "times_s": [round(t, 6) for t in ts]}


class Writer:
    def __init__(self, path: Path, base: dict) -> None:
        self.path, self.base = path, base
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: dict) -> None:
        row = {**self.base, **row, "when": dt.datetime.now().isoformat(timespec="seconds"),
               "loadavg1": os.getloadavg()[0]}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if row.get("median_s") is not None:
            print(f"  {row['workload']:<34} {row['impl']:<24} {row['median_s']:9.4f} s "
                  f"[{row['q25_s']:.4f}, {row['q75_s']:.4f}] foreign={row['foreign']:.2f}", flush=True)
        elif row.get("status") == "skipped":
            print(f"  {row['workload']:<34} {row['impl']:<24} skipped: {row['reason']}", flush=True)


# ---------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(ln for ln in f if ln.startswith(field)).split()[1])


def reset_peak_rss(trim: bool = False) -> int:
    """Reset VmHWM (peak RSS) to the current RSS; returns that RSS in KiB.

    trim: first hand the allocator's free memory back to the OS (glibc ``malloc_trim``), so that
    a later step cannot reuse it unseen and read as a smaller peak.
    """
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss_kib("VmRSS")


def layer_call(layer: torch.nn.Module, x: Tensor, mode: str) -> Call:
    """One timed call of a layer on x (B, L, H): forward under no_grad, or forward + backward of a
    fixed random cotangent into every parameter and the input."""
    torch.manual_seed(1)
    grad_y = torch.randn_like(x)  # (B, L, H)

    def fwd() -> None:
        with torch.no_grad():
            layer(x)

    def fwdbwd() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(grad_y)

    if mode == "fwdbwd":
        x.requires_grad_(True)
    return fwd if mode == "fwd" else fwdbwd


def load_rows(path: Path) -> tuple[dict[tuple, dict], dict[str, dict], dict]:
    """A results .jsonl: the latest row per (workload, impl, threads), run records, the start-up check."""
    latest: dict[tuple, dict] = {}
    runs: dict[str, dict] = {}
    check: dict = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "run":
            runs[row["run"]] = row
        elif row["kind"] == "check":
            check = row
        else:
            latest[(row["workload"], row["impl"], row["threads"])] = row
    return latest, runs, check
