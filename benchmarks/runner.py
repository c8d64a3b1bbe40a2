"""One runner for every family: agreement check, interleaved timing, fresh-process peak memory.

For each family matched by the pattern: the agreement check (small sizes, float32) runs first
and stops the run when an implementation computes something else; then for each (L, B, mode) one
table: the implementations that are selected, available and not predicted too slow or too big
are timed together in interleaved rounds (``harness.time_block``), and each one's peak memory is
measured in a fresh process (``python -m benchmarks child``). An implementation predicted (from
its time at a shorter L, power law with exponent in [1, 2]) to exceed ``max_call_s`` is skipped
with the reason; one predicted above ``slow_call_s`` is timed in the first ``slow_repeats`` rounds
only and warmed up at L=256 (the row carries a note).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.cases import Built, Family, Impl, Sizes
from benchmarks.harness import ROOT, Row, Writer, commit, machine, peak_of, summary, time_block

WARM_L = 256  # warm-up length of a slow implementation


@dataclass
class Options:
    """What ``python -m benchmarks run`` was asked for (None: the family's default)."""

    lengths: list[int] | None = None
    batches: list[int] | None = None
    H: int | None = None
    N: int | None = None
    modes: list[str] | None = None
    impls: list[str] | None = None
    repeats: int = 5
    quiet_wait: float = 30.0
    round_wait: float = 0.0
    threads: int | None = None
    memory: bool = True
    check: bool = True
    profile: bool = False
    max_call_s: float = 60.0
    slow_call_s: float = 8.0
    slow_repeats: int = 2
    max_mem_gib: float = 12.0
    out: Path = ROOT / "build" / "bench.jsonl"  # scratch (git-ignored); reports read benchmarks/results/
    argv: list[str] = field(default_factory=list)


@dataclass
class History:
    """Medians and peaks measured so far in this run, for predicting the next length."""

    points: dict[tuple[str, str, str, int], list[tuple[int, float]]] = field(default_factory=dict)  # (L, median s)
    peaks: dict[tuple[str, str, str, int], list[tuple[int, float]]] = field(default_factory=dict)

    def predict(self, key: tuple[str, str, str, int], L: int) -> float | None:
        """Seconds per call at L: a power law through the last two shorter lengths (exponent
        clamped to [1, 2]), or linear from one."""
        pts = sorted(p for p in self.points.get(key, []) if p[0] < L)
        if not pts:
            return None
        l1, t1 = pts[-1]
        k = 1.0
        if len(pts) >= 2:
            l0, t0 = pts[-2]
            k = min(2.0, max(1.0, math.log(t1 / t0) / math.log(l1 / l0))) if t0 > 0 and l1 > l0 else 1.0
        return t1 * (L / l1) ** k

    def predict_peak(self, key: tuple[str, str, str, int], L: int) -> float | None:
        """Peak MiB at L, linear in L from the longest shorter L."""
        pts = sorted(p for p in self.peaks.get(key, []) if p[0] < L)
        return None if not pts else pts[-1][1] * L / pts[-1][0]


def sizes_of(family: Family, opts: Options, L: int, B: int) -> Sizes:
    s = {**family.sizes, "L": L, "B": B}
    if opts.H:
        s["H"] = opts.H
    if opts.N:
        s["N"] = opts.N
    return s


def set_threads(family: Family, opts: Options) -> int:
    import torch

    n = opts.threads or int(family.extra.get("threads", 2))
    torch.set_num_threads(n)
    return n


def run(families: Sequence[Family], opts: Options) -> Path:
    """Run every family; rows are appended to opts.out (JSONL), one run record at the end."""
    import torch

    torch.set_num_interop_threads(1)
    run_id = uuid.uuid4().hex[:8]
    t0 = time.perf_counter()
    history = History()
    for family in families:
        if not family.impls():
            print(f"{family.name}: nothing to run here ({family.extra.get('needs', 'no implementation')})", flush=True)
            continue
        threads = set_threads(family, opts)
        out = Writer(opts.out, {"schema": 2, "bench": family.report, "family": family.name, "run": run_id,
                                "threads": threads, "H": opts.H or family.sizes.get("H"),
                                "N": opts.N or family.sizes.get("N")})
        if opts.check:
            check_family(family, out)
        for L in opts.lengths or family.lengths:
            for B in family.batch(L, opts.batches):
                for mode in opts.modes or family.modes:
                    if mode not in family.modes:
                        continue
                    table(family, opts, out, history, sizes_of(family, opts, L, B), mode)
    Writer(opts.out, {"schema": 2, "run": run_id}).write({
        "kind": "run", "workload": "run", "impl": "-", "median_s": None, "machine": machine(), "commit": commit(),
        "cmd": "python -m benchmarks " + " ".join(opts.argv), "families": [f.name for f in families],
        "interop_threads": torch.get_num_interop_threads(), "total_s": round(time.perf_counter() - t0, 1)})
    print(f"done in {(time.perf_counter() - t0) / 60:.1f} min; rows appended to {opts.out}", flush=True)
    return opts.out


def check_family(family: Family, out: Writer) -> None:
    from benchmarks.catalog import family_check

    check = family_check(family)
    if check is None:
        return
    got = check(family)
    errs = got.get("errors", {})
    out.write({"kind": "check", "workload": f"{family.name} agreement (relative L2, float32)", "impl": "all",
               "median_s": None, "reference": family.ref(), **got})
    worst = max(errs.values(), default=0.0)
    print(f"{family.name}: agreement check passed (max relative error {worst:.1e} vs {family.ref()})", flush=True)


def workload(family: Family, s: Sizes, mode: str) -> str:
    """The table a row belongs to: family, sizes, mode, and the allocator where it was not the default
    (``THP_MEM_ALLOC_ENABLE=1``: c10 backs large tensors with 2 MiB pages, far fewer first-touch page
    faults; read once per process, so a run under it is its own table)."""
    batch = f" B={s['B']}" if s.get("B") else ""
    length = f" L={s['L']}" if s.get("L") else ""
    return f"{family.name}{batch}{length} {mode}{' THP' if thp_alloc() else ''}"


def thp_alloc() -> bool:
    """Whether this process's CPU allocator asks for transparent huge pages (c10's THP_MEM_ALLOC_ENABLE: "1"
    turns it on, c10 ignores any value but "0" and "1")."""
    return os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"


def why_not(family: Family, impl: Impl, opts: Options, history: History, s: Sizes, mode: str) -> str | None:
    """Why an implementation is not timed in this table, or None."""
    reason = impl.unavailable() or (impl.skip(s, mode) if impl.skip else None)
    if reason:
        return reason
    key = (family.name, impl.name, mode, s.get("B", 0))
    guess = history.predict(key, s["L"])
    if guess is not None and guess > opts.max_call_s:
        return f"predicted {guess:.0f} s per call (from its shorter-L times) > --max-call-s {opts.max_call_s:.0f} s"
    peak = history.predict_peak(key, s["L"])
    if peak is not None and peak > opts.max_mem_gib * 1024:
        return f"predicted peak {peak / 1024:.1f} GiB (linear in L from a shorter L) > --max-mem-gib {opts.max_mem_gib:g}"
    return None


def table(family: Family, opts: Options, out: Writer, history: History, s: Sizes, mode: str) -> None:
    """One interleaved table: build, time, write; then the memory rows."""
    name = workload(family, s, mode)
    base = {"kind": family.kind, "workload": name, "L": s["L"], "B": s.get("B") or None, "mode": mode, "median_s": None,
            "core": family.name.split("/")[0], "peer": family.peer_name()}
    built: dict[str, Built] = {}
    fewer: dict[str, int] = {}
    warm: dict[str, Any] = {}
    for impl in family.chosen(opts.impls):
        reason = why_not(family, impl, opts, history, s, mode)
        if reason:
            out.write({**base, "impl": impl.name, "status": "skipped", "reason": reason})
            continue
        built[impl.name] = impl.build(s, mode)
        guess = history.predict((family.name, impl.name, mode, s.get("B", 0)), s["L"])
        if guess is not None and guess > opts.slow_call_s:
            fewer[impl.name] = opts.slow_repeats
            warm[impl.name] = impl.build({**s, "L": WARM_L}, mode).call
    if not built:
        return
    print(f"{name}: {', '.join(built)}", flush=True)
    if opts.profile:
        return profile(built, out, base)
    times, foreign = time_block({k: b.call for k, b in built.items()}, opts.repeats, opts.quiet_wait,
                                fewer=fewer, warm=warm, round_wait=opts.round_wait)
    for impl_name, ts in times.items():
        row = summary(ts)
        history.points.setdefault((family.name, impl_name, mode, s.get("B", 0)), []).append((s["L"], row["median_s"]))
        note = (f"predicted > {opts.slow_call_s:.0f} s per call: timed in the first {fewer[impl_name]} rounds only, "
                f"warmed up at L={WARM_L}") if impl_name in fewer else None
        out.write({**base, "impl": impl_name, **row, "foreign": round(foreign, 3), "status": "ok",
                   **built[impl_name].info(), **({"note": note} if note else {})})
    built.clear()
    if opts.memory and family.memory:
        for impl_name in times:
            memory_row(family, opts, out, history, s, mode, impl_name)


def memory_row(family: Family, opts: Options, out: Writer, history: History, s: Sizes, mode: str,
               impl_name: str) -> None:
    """Peak RSS of one call in a fresh process (``python -m benchmarks child``)."""
    spec = {"family": family.name, "impl": impl_name, "sizes": s, "mode": mode,
            "threads": opts.threads or int(family.extra.get("threads", 2))}
    res = subprocess.run([sys.executable, "-m", "benchmarks", "child", json.dumps(spec)], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    base = {"kind": "memory", "workload": f"memory {workload(family, s, mode)}", "impl": impl_name, "L": s["L"],
            "B": s.get("B") or None, "mode": mode, "median_s": None, "core": family.name.split("/")[0]}
    floors = family.floors(s) if family.floors else {}
    if res.returncode != 0:
        out.write({**base, "status": "failed", "reason": f"exit {res.returncode}: {res.stderr.strip()[-500:]}"})
        return
    row = json.loads(res.stdout.strip().splitlines()[-1])
    history.peaks.setdefault((family.name, impl_name, mode, s.get("B", 0)), []).append((s["L"], row["peak_mib"]))
    out.write({**base, "status": "ok", **row, "floors": floors})


def memory_child(spec: Row) -> Row:
    """In a fresh process: build the call, warm it up at a short length (lazy library init), run
    it once more first when the family primes (an optimiser's state), then its peak RSS."""
    from benchmarks.catalog import families

    family = families()[spec["family"]]
    import torch

    torch.set_num_threads(int(spec["threads"]))
    impl = next(i for i in family.impls() if i.name == spec["impl"])
    s, mode = spec["sizes"], spec["mode"]
    call = impl.build(s, mode).call
    impl.build({**s, "L": min(family.warm_L, s["L"])}, mode).call()
    if family.prime:
        call()
    return peak_of(call)


def profile(built: dict[str, Built], out: Writer, base: Row, top_n: int = 8) -> None:
    """torch.profiler's top operators by self CPU time, one call per implementation (after a warm-up)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for impl_name, b in built.items():
        b.call()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            b.call()
            wall = time.perf_counter() - t0
        ev = prof.key_averages()
        top = sorted(ev, key=lambda e: e.self_cpu_time_total, reverse=True)[:top_n]
        out.write({**base, "kind": "profile", "workload": f"profile {base['workload']}", "impl": impl_name,
                   "status": "ok", "wall_s": round(wall, 4),
                   "self_total_s": round(sum(e.self_cpu_time_total for e in ev) / 1e6, 4),
                   "aten_calls": sum(e.count for e in ev if e.key.startswith("aten::")),
                   "top": [{"op": e.key, "self_s": round(e.self_cpu_time_total / 1e6, 4), "calls": e.count}
                           for e in top]})
