"""One JSONL → Markdown renderer for every report.

A report is: a header (machine, the commit that measured the rows, the commands that regenerate
it), the findings (``benchmarks/findings/<REPORT>.md``, included verbatim: conclusions are written
by a person reading the tables, never computed inside f-strings), then the measured tables,
rendered the same way for every family: median, IQR, n, tokens/s, the ratio against the family's
peer, the physical floor where one is known, and ``foreign``. Memory rows are pivoted by
implementation beside their floors. It reads the harness's rows (schema 2) and the rows the
pre-harness scripts wrote (same fields; kinds ``result``/``recurrent``/... kept as they were), so
old results re-render with the same numbers.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import BUSY, HERE, MODES, ROOT, Row, fmt_t, load_rows, read_rows

BANDWIDTH = 24.8e9  # B/s: best of copy/add/triad, 2 threads (shared/reference/perf-baselines.md)
SCAN_STATE_BYTES = {"s5": 32 * 8, "lru": 64 * 8, "linoss": 256 * 4}  # per (b, t) at d_state=64
Column = tuple[str, Callable[[Row], str | None]]


@dataclass(frozen=True)
class ReportSpec:
    """What one REPORT file shows.

    peers: per row kind, the implementations the ratio column divides by (the first one present
    in a table); sections: (row kinds, heading) in report order; columns: extra per-kind columns;
    floors: memory floors (bytes) for rows that did not record theirs (the pre-harness rows).
    """

    name: str
    title: str
    results: str
    commands: tuple[str, ...]
    peers: dict[str, tuple[str, ...]]
    sections: tuple[tuple[tuple[str, ...], str], ...]
    columns: dict[str, tuple[Column, ...]] = field(default_factory=dict)
    floors: Callable[[Row], dict[str, float]] | None = None
    order: tuple[str, ...] = ()
    spread: bool = False
    seconds_digits: int = 2  # decimals of times ≥ 1 s (the Mamba rows were published with 3)

    @property
    def findings(self) -> Path:
        return HERE / "findings" / self.name


def _iters(r: Row) -> str | None:
    return f"{r['iterations']} ({r['windows']} × ≤{r['max_window_iterations']})" if "iterations" in r else None


def _scan_floor(r: Row) -> float | None:
    """The scan op's memory floor: read b and write h once at the machine's bandwidth."""
    core = r.get("core")
    if core not in SCAN_STATE_BYTES or not r.get("B"):
        return None
    return 2 * r["B"] * r["L"] * SCAN_STATE_BYTES[core] / BANDWIDTH


def _floor_cols() -> tuple[Column, ...]:
    def floor(r: Row) -> str | None:
        f = _scan_floor(r)
        return fmt_t(f) if f else None

    def times(r: Row) -> str | None:
        f = _scan_floor(r)
        return f"{r['median_s'] / f:.0f}×" if f and r.get("median_s") else None
    return (("memory floor (read b, write h)", floor), ("× floor", times))


def _s4d_floors(r: Row) -> dict[str, float]:
    H, N, L = r.get("H") or 256, r.get("N") or 64, r["L"]
    return {"one (H, N/2, L) complex64": r.get("vandermonde_bytes", H * (N // 2) * L * 8),
            "(H, L) float32 output": H * L * 4}


def _s4_floors(r: Row) -> dict[str, float]:
    H, N, L = r.get("H") or 256, r.get("N") or 64, r["L"]
    return {"one (H, N, F) complex64": r.get("hnf_bytes", H * N * (L // 2 + 1) * 8), "(H, L) float32 output": H * L * 4}


def _scan_floors(r: Row) -> dict[str, float]:
    B, H, L, core = r.get("B") or 32, r.get("H") or 64, r["L"], r.get("core", "")
    return {"(B, L, H) f32": B * L * H * 4, "(B, L, S) state": B * L * SCAN_STATE_BYTES.get(core, 0)}


def _peak(r: Row) -> str | None:
    return f"{r['peak_mib']:.1f}" if isinstance(r.get("peak_mib"), (int, float)) else None


RUN = "python -m benchmarks run"
REPORTS: dict[str, ReportSpec] = {s.name: s for s in (
    ReportSpec("REPORT.md", "S4D layer benchmark: zoo backends vs a straightforward S4D", "s4d.jsonl",
               (f"{RUN} s4d/layer --out benchmarks/results/s4d.jsonl",
                f"{RUN} s4d/recurrent --out benchmarks/results/s4d.jsonl",
                f"{RUN} s4d/kernel --out benchmarks/results/s4d.jsonl"),
               peers={"layer": ("straightforward",), "recurrent": ("straightforward",),
                      "kernel": ("straightforward_kernel",)},
               sections=((("layer", "recurrent"), "Whole layer"),
                         (("kernel",), "Kernel step alone (H, L) from the parameters, no batch"),
                         (("memory",), "Peak memory of the kernel step")),
               floors=_s4d_floors,
               order=("straightforward", "zoo_vandermonde_fft", "zoo_naive_kernel_fft", "zoo_scan_parallel",
                      "zoo_scan_naive", "straightforward_kernel", "kernel_vandermonde", "kernel_naive",
                      "kernel=vandermonde conv=fft", "auto", "kernel=naive conv=fft", "scan=scan", "scan=naive",
                      "kernel=vandermonde", "kernel=naive")),
    ReportSpec("REPORT_S4.md", "S4 kernel benchmark: kernel_cauchy vs the naive kernel, a straightforward Cauchy "
               "and pykeops", "s4.jsonl",
               ("pip install pykeops  # optional; not a project dependency",
                f"{RUN} s4/kernel --round-wait 30 --slow-repeats 3 --out benchmarks/results/s4.jsonl",
                f"{RUN} s4/cauchy-parts --round-wait 30 --no-memory --out benchmarks/results/s4.jsonl",
                f"{RUN} s4/layer --repeats 3 --out benchmarks/results/s4.jsonl"),
               peers={"kernel": ("kernel_dplr_naive", "kernel=naive")},
               sections=((("kernel",), "Kernel step alone: (H, L) from the parameters"),
                         (("profile", "parts"), "Where kernel_cauchy spends its time"),
                         (("layer",), "The whole S4 layer"), (("memory",), "Peak memory")),
               columns={"layer": (("resolved to", lambda r: r.get("label")), ("peak MiB above start", _peak))},
               floors=_s4_floors,
               order=("kernel_cauchy", "kernel_cauchy_keops", "straightforward_cauchy", "kernel_dplr_naive",
                      "kernel=cauchy", "kernel=keops", "kernel=naive")),
    ReportSpec("REPORT_SCAN.md", "Scans (S5, LRU, LinOSS): fused C++ scan vs naive loop vs parallel scan vs chunked, "
               "and S5 vs s5-pytorch", "scan.jsonl",
               (f"{RUN} s5/layer lru/layer linoss/layer --round-wait 30 --out benchmarks/results/scan.jsonl",
                f"{RUN} s5/scan-op lru/scan-op linoss/scan-op --repeats 3 --round-wait 30 "
                "--out benchmarks/results/scan.jsonl",
                f"{RUN} s5/layer linoss/layer --L 4096 --profile --out benchmarks/results/scan.jsonl"),
               peers={"layer": ("naive", "scan=naive"), "scanop": ("naive (scan op only)", "scan=naive")},
               sections=((("scanop",), "The scan op alone, on what each layer scans"), (("profile",), "torch.profiler"),
                         (("layer",), "Whole layer, every table"), (("memory",), "Peak memory")),
               columns={"scanop": _floor_cols()}, floors=_scan_floors,
               order=("naive", "scan", "chunked", "scan=cpu-scan", "scan=naive", "scan=scan", "scan=chunked", "auto",
                      "scan-N128", "s5-pytorch"), spread=True),
    ReportSpec("REPORT_MAMBA.md", "Mamba on CPU: mixer and generation", "mamba.jsonl",
               (f"{RUN} mamba/layer --repeats 3 --quiet-wait 3 --out benchmarks/results/mamba.jsonl",
                f"{RUN} mamba/layer --H 768 --L 256 1024 --repeats 3 --out benchmarks/results/mamba.jsonl",
                f"{RUN} mamba/layer --H 768 --L 4096 --impls 'scan=*' --repeats 3 "
                "--out benchmarks/results/mamba.jsonl",
                f"{RUN} mamba/generate --repeats 3 --out benchmarks/results/mamba.jsonl",
                f"{RUN} mamba/selective-scan --repeats 5 --out benchmarks/results/mamba.jsonl"),
               peers={"mixer": ("zoo-scan", "scan=selective-chunked"), "layer": ("scan=selective-chunked",),
                      "generate": ("transformers generate",), "scanop": ("scan=selective-chunked",)},
               sections=((("mixer", "layer"), "Mixer (B=8, N=16, d_conv 4, expand 2)"),
                         (("scanop",), "The selective scan op alone (H = Di; input-dependent B, C; D; no h0)"),
                         (("generate",), "Generation"), (("memory",), "Peak memory")),
               columns={"mixer": (("peak MiB (in-process)", _peak),),
                        "generate": (("same tokens", lambda r: str(r["same_tokens"]) if "same_tokens" in r else None),)},
               order=("zoo-scan", "zoo-naive", "transformers", "mambapy", "scan=selective-chunked",
                      "scan=selective-naive"), seconds_digits=3),
    ReportSpec("REPORT_LRCSSM.md", "LrcSSM: quasi-DEER / Newton against the sequential loop", "lrcssm.jsonl",
               (f"{RUN} lrcssm/layer --out benchmarks/results/lrcssm.jsonl",
                f"{RUN} lrcssm/tune --out benchmarks/results/lrcssm.jsonl"),
               peers={"layer": ("sequential",), "tune": ("sequential",)},
               sections=((("layer",), "Parallel (deer) vs its own sequential loop"),
                         (("tune",), "Tuning at L=4096: window size and the scan inside Newton"),
                         (("memory",), "Peak memory")),
               columns={k: (("Newton sweeps", _iters),) for k in ("layer", "tune")},
               order=("sequential", "deer", "deer scan=naive", "deer one window")),
    ReportSpec("REPORT_DEPTH.md", "Depth recurrence: ABCDEF vs AAAAAA training, adaptive vs fixed-depth inference",
               "depth.jsonl",
               (f"{RUN} depth/train --repeats 7 --out benchmarks/results/depth.jsonl",
                "zoo sweep benchmarks/repro/sweeps/jv-lru.yaml  # the trained models adaptive depth reads",
                f"{RUN} depth/adaptive --repeats 7 --out benchmarks/results/depth.jsonl"),
               peers={"train": ("ABCDEF-final",), "adaptive": ("fixed-6",)},
               sections=((("train",), "Training throughput (one optimiser step)"),
                         (("memory",), "Peak memory of one training step"),
                         (("adaptive",), "Adaptive depth vs fixed depth, per trained model")),
               columns={"train": (("params", lambda r: f"{r['params']:,}" if "params" in r else None),
                                  ("sequences/s", lambda r: f"{r['B'] / r['median_s']:.1f}" if r.get("B") else None)),
                        "adaptive": (("accuracy", lambda r: f"{100 * r['accuracy']:.2f}%" if "accuracy" in r else None),
                                     ("mean depth", lambda r: f"{r['mean_depth']:.2f}" if "mean_depth" in r else None),
                                     ("FLOPs vs fixed-6",
                                      lambda r: f"{r['flops_ratio']:.2f}×" if "flops_ratio" in r else None))},
               order=("ABCDEF-final", "AAAAAA-final", "AAAAAA-blockwise", "fixed-6", "adaptive", "fixed-2 (AA)")),
    ReportSpec("REPORT_FAMILIES.md", "The 2026 families (Mamba-2, RG-LRU, Gated DeltaNet, Mamba-3) and the attention "
               "baseline: each fast path against its peer and its sequential reference", "families.jsonl",
               (f"{RUN} mamba2/layer rglru/layer gdn/layer mamba3/layer attention/layer --L 1024 --repeats 3 "
                "--max-call-s 60 --out benchmarks/results/families.jsonl",
                f"{RUN} mamba2/layer rglru/layer gdn/layer mamba3/layer attention/layer --L 4096 --repeats 3 "
                "--impls 'scan=ssd-chunked' transformers auto 'scan=gdn-chunked' 'fla naive chunk' "
                "'scan=mamba3-chunked' 'zoo mamba2*' 'attention=sdpa' --out benchmarks/results/families.jsonl"),
               peers={}, sections=((("layer",), "One layer per family (B=8, H=64)"), (("memory",), "Peak memory"))),
    ReportSpec("REPORT_STREAM.md", "Streaming step at B=1: the lean eager step, the compiled step and the exported "
               "stream model in onnxruntime, against the general path", "stream.jsonl",
               (f"{RUN} 'stream/*' --threads 1 --repeats 7 --out benchmarks/results/stream.jsonl",),
               peers={"stream": ("general path",)},
               sections=((("stream",), "Per-token latency (each call: 100 consecutive tokens from the zero state)"),),
               columns={"stream": (("µs/token", lambda r: f"{r['median_s'] / r['L'] * 1e6:.0f}" if r.get("L") else None),
                                   ("file", lambda r: f"{r['file_kib']:.0f} KiB" if "file_kib" in r else None))},
               order=("general path", "eager step", "eager plan", "compiled step", "onnxruntime", "onnxruntime io-binding")),
    ReportSpec("REPORT_CORES.md", "Every other core: each backend combination the registry serves", "cores.jsonl",
               (f"{RUN} s5-bidirectional --out benchmarks/results/cores.jsonl  # and any core without a report",),
               peers={}, sections=((("layer",), "One layer per core"), (("memory",), "Peak memory"))),
)}


# ---------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------
def kind_of(r: Row) -> str:
    """A row's table kind; the Mamba script's rows were all kind 'result', named by workload."""
    if r["kind"] == "result":
        return "generate" if r["workload"].startswith("generate") else "mixer"
    return str(r["kind"])


def timed(r: Row | None) -> float | None:
    return r.get("median_s") if r and r.get("status", "ok") == "ok" else None


def measured_at(path: Path, runs: list[Row]) -> str:
    """Which code measured the rows: the commit each harness run recorded, and (the pre-harness
    scripts recorded none) the commit that added the results file's rows for the older runs."""
    recorded = sorted({r["commit"] for r in runs if r.get("commit")})
    said = ("Measured at commit " + ", ".join(f"`{c}`" for c in recorded) + ".") if recorded else ""
    if runs and all(r.get("commit") for r in runs):
        return said
    return (said + " " if said else "") + _pre_harness(path)


def _pre_harness(path: Path) -> str:
    try:
        got = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", str(path)], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        got = []
    if len(got) == 2:
        return (f"Measured by the pre-harness benchmark scripts, which recorded no commit; the rows were committed "
                f"in `{got[0]}` ({got[1]}), so they measured the code at or just before it. Re-rendered unchanged "
                "by the harness.")
    return "Measured by the pre-harness benchmark scripts, which recorded no commit."


# ---------------------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------------------
def header(spec: ReportSpec, path: Path, latest: dict[tuple[Any, ...], Row], runs: dict[str, Row],
           check: Row) -> list[str]:
    used = [r for rid, r in runs.items() if rid in {x.get("run") for x in latest.values()}] or list(runs.values())
    run = used[-1] if used else {}
    m = run.get("machine", {})
    threads = sorted({str(r["threads"]) for r in latest.values() if r.get("threads") is not None})
    minutes = [f"{r.get('total_s', 0) / 60:.1f}" for r in used if r.get("total_s")]
    recorded = [c for r in used for c in recorded_commands(spec, r)]
    errs = check.get("errors", {})
    rel_path = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    out = [f"# {spec.title}", "",
           f"Generated by `python -m benchmarks report {spec.name}` from `{rel_path}`. Speed and memory are "
           "benchmarks, not timed tests: compare the ratios within a table, not absolute seconds across machines.",
           "", "## Machine, commit and commands", "",
           f"- CPU: {m.get('cpu', '?')}, {m.get('logical_cpus', '?')} logical CPUs ({', '.join(m.get('simd', []))}), "
           f"{m.get('mem_gib', '?')} GiB RAM",
           f"- torch {m.get('torch', '?')}, Python {m.get('python', '?')}; intra-op threads "
           f"{', '.join(threads) or '?'}",
           f"- {measured_at(path, used)}"]
    if minutes:
        out.append(f"- runtime: {' + '.join(minutes)} min")
    if errs:
        out.append(f"- Start-up agreement check: max relative error {max(errs.values()):.1e} (L2, float32; "
                   "timing stops if any implementation is beyond 1e-4)")
    out += ["", "Regenerate (from the repository root, in the project's venv; each run appends rows and the latest "
            "row per table and implementation is kept; a rerun's figures move within noise):", "", "```bash",
            *spec.commands, f"python -m benchmarks report {spec.name}", "```", ""]
    if recorded:
        old = any("benchmarks/bench_" in c for c in recorded)
        out += ["The rows shown were written by these commands (as recorded"
                + ("; the `bench_*.py` scripts were replaced by the harness, whose commands are above" if old else "")
                + "):", "", "```bash",
                *[c.strip() for c in recorded], "```", ""]
    return out


def recorded_commands(spec: ReportSpec, run: Row) -> list[str]:
    """The command lines a run record kept: the harness's and most old scripts' ``cmd``, the depth
    script's ``commands``, the Mamba script's bare ``argv``."""
    if run.get("cmd"):
        return [str(run["cmd"]).strip()]
    if run.get("commands"):
        return [str(c).strip() for c in run["commands"]]
    if "argv" in run:
        return [f"python benchmarks/bench_{Path(spec.results).stem}.py {' '.join(run['argv'])}".strip()]
    return []


def method() -> list[str]:
    return ["## Method", "",
            "- Each table first waits (≤ `--quiet-wait` s, and each round ≤ `--round-wait` s) for a quiet machine, "
            "warms every implementation up once, then times `--repeats` interleaved rounds with a rotating order; "
            "median and IQR (25th–75th percentile) over the rounds (column n). Rows marked † ran fewer rounds.",
            "- `fwd` runs under `torch.no_grad()`; `fwdbwd` backpropagates a fixed random cotangent into every "
            "parameter and the input.",
            "- Ratio column `vs X` = X's median / this median (> 1: faster than X), within one interleaved table.",
            "- `foreign`: cores other processes used during the timed rounds (≤ 0.25 is a quiet machine).",
            "- Peak memory: one fresh process per (implementation, size, mode); after imports and a short warm-up the "
            "allocator is trimmed and VmHWM reset; the row is VmHWM after one call minus the RSS then.", ""]


def findings(spec: ReportSpec, where: Path | None = None) -> list[str]:
    """The report's findings file, verbatim (none yet: nothing)."""
    path = (where / spec.name) if where else spec.findings
    if not path.is_file():
        return []
    return [f"<!-- findings: benchmarks/findings/{spec.name}, included verbatim; written by a person from the "
            "tables below when they were measured -->", "", path.read_text(encoding="utf-8").rstrip(), ""]


def _order(spec: ReportSpec, name: str) -> tuple[int, str]:
    return (spec.order.index(name) if name in spec.order else len(spec.order), "")


def ratio(x: float) -> str:
    """A speed ratio: two decimals, three significant digits below 0.1 (a much slower peer)."""
    return f"{x:.2f}×" if x >= 0.1 else f"{x:.2g}×"


def timing_table(spec: ReportSpec, kind: str, rows: list[Row]) -> list[str]:
    """One interleaved table: median, IQR, n, tokens/s, ratio vs the peer, extra columns, foreign."""
    ok = {r["impl"]: r for r in rows if timed(r)}
    named = [r["peer"] for r in rows if r.get("peer")]  # the harness records its family's peer
    peer = next((ok[p] for p in [*named, *spec.peers.get(kind, ())] if p in ok), None)
    extra = [c for c in spec.columns.get(kind, ()) if any(c[1](r) for r in rows if timed(r))]
    tok = any(r.get("B") and r.get("L") or r.get("tokens_per_s") for r in ok.values())
    head = ["implementation", "median", "IQR", "n"] + (["tokens/s"] if tok else []) \
        + ([f"vs {peer['impl']}"] if peer else []) + [c[0] for c in extra] + ["foreign"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (not timed(r), _order(spec, r["impl"]))):
        if not timed(r):
            out.append(f"| {r['impl']} | {r.get('status', '?')} |" + " |" * (len(head) - 2))
            continue
        d = spec.seconds_digits
        cells = [r["impl"] + (" †" if r.get("note") else ""), fmt_t(r["median_s"], d),
                 f"{fmt_t(r.get('q25_s'), d)} – {fmt_t(r.get('q75_s'), d)}", str(r.get("n", "–"))]
        if tok:
            t = r.get("tokens_per_s") or (r["B"] * r["L"] / r["median_s"] if r.get("B") and r.get("L") else None)
            cells.append(f"{t:,.0f}" if t else "–")
        if peer:
            cells.append(ratio(peer["median_s"] / r["median_s"]))
        cells += [c[1](r) or "–" for c in extra]
        f = float(r.get("foreign", 0))
        cells.append(f"{f:.2f}{' (busy)' if f > BUSY else ''}")
        out.append("| " + " | ".join(cells) + " |")
    notes = [f"- † {r['impl']}: {r['note']}." for r in rows if r.get("note")]
    notes += [f"- {r['impl']} {r.get('status')}: {r.get('reason', '?')}." for r in rows if not timed(r)]
    if any(float(r.get("foreign", 0)) > BUSY for r in rows):
        notes.append(f"- Timed while other processes used > {BUSY} cores: absolute times are inflated; the "
                     "interleaved ratios are less affected but still less reliable.")
    return out + ([""] + notes if notes else [])


def memory_tables(spec: ReportSpec, rows: list[Row]) -> list[str]:
    """One pivot per family (or core): peak MiB by implementation, a line per (B, L, mode), floors beside."""
    fams: dict[str, list[Row]] = {}
    for r in rows:
        fams.setdefault(str(r.get("family") or r.get("core") or Path(spec.results).stem), []).append(r)
    out = ["Peak RSS of one call above the RSS just before it (MiB), each in a fresh process; beside it what any "
           "implementation must hold at that size (MiB).", ""]
    for name, mine in sorted(fams.items()):
        out += ([f"### {name}", ""] if len(fams) > 1 else []) + memory_pivot(spec, mine) + [""]
    return out


def memory_pivot(spec: ReportSpec, rows: list[Row]) -> list[str]:
    groups: dict[tuple[Any, ...], dict[str, Row]] = {}
    for r in rows:
        groups.setdefault((r.get("core") or r.get("family") or Path(spec.results).stem, r.get("B") or 0, r["L"],
                           list(MODES).index(r["mode"]) if r.get("mode") in MODES else 9, r.get("mode", "")),
                          {})[r["impl"]] = r
    impls = sorted({r["impl"] for r in rows}, key=lambda n: (_order(spec, n), n))
    floor_names: list[str] = []
    for r in rows:
        for k in _floors(spec, r):
            if k not in floor_names:
                floor_names.append(k)
    out = ["| table | L | mode | " + " | ".join(impls + floor_names) + " |",
           "|---|---|---|" + "---|" * (len(impls) + len(floor_names))]
    for (core, B, L, _, mode), by in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1:4])):
        cells = [f"{by[i]['peak_mib']:.0f}" if i in by and by[i].get("status", "ok") == "ok" and "peak_mib" in by[i]
                 else ("failed" if i in by else "–") for i in impls]
        fl = _floors(spec, next(iter(by.values())))
        cells += [f"{fl[k] / 2**20:.0f}" if k in fl else "–" for k in floor_names]
        label = f"{core}" + (f" B={B}" if B else "")
        out.append(f"| {label} | {L} | {mode} | " + " | ".join(cells) + " |")
    bad = [f"- {r['impl']} at {r['workload']}: {r.get('reason', '?')}" for r in rows if r.get("status") not in (None, "ok")]
    return out + ([""] + bad if bad else [])


def _floors(spec: ReportSpec, r: Row) -> dict[str, float]:
    return dict(r.get("floors") or (spec.floors(r) if spec.floors else {}))


def profile_tables(rows: list[Row]) -> list[str]:
    """torch.profiler rows: wall time under the profiler, aten calls, the top operators."""
    out = ["Wall time under the profiler is inflated by its per-op bookkeeping; the aten call count and the operator "
           "mix are the point.", "", "| table | backend | wall (profiled) | aten calls | top operators (self time × calls) |",
           "|---|---|---|---|---|"]
    for r in rows:
        top = "; ".join(f"{e['op'].replace('autograd::engine::evaluate_function: ', 'bwd ')} {fmt_t(e['self_s'])} "
                        f"×{e['calls']}" for e in r.get("top", [])[:6])
        out.append(f"| {r['workload']} | {r['impl']} | {fmt_t(r.get('wall_s'))} | {r.get('aten_calls', 0):,} | {top} |")
    return out


def info_rows(rows: list[Row]) -> list[str]:
    """Rows that carry facts, not times (e.g. a decoding state's size)."""
    skip = {"kind", "workload", "impl", "run", "threads", "when", "loadavg1", "schema", "bench", "family", "median_s"}
    return [f"- {r['workload']}, {r['impl']}: " + ", ".join(f"{k} = {v}" for k, v in r.items() if k not in skip)
            for r in rows]


def spread(path: Path) -> list[str]:
    """Tables timed quietly in more than one run: each run's median, to show run-to-run spread."""
    seen: dict[tuple[str, str], list[Row]] = {}
    for r in read_rows(path):
        if r["kind"] in ("layer", "scanop") and r.get("status") == "ok" and r.get("foreign", 1) <= BUSY:
            seen.setdefault((r["workload"], r["impl"]), []).append(r)
    multi = {k: v for k, v in seen.items() if len({r["run"] for r in v}) > 1}
    if not multi:
        return []
    out = ["## Run-to-run spread", "",
           "Tables timed on a quiet machine (foreign ≤ 0.25) in more than one run. Absolute times move between runs "
           "on this VM; the ratios within a table move much less.", "",
           "| table | implementation | medians per run (oldest first) | max / min |", "|---|---|---|---|"]
    for (workload, impl), rows in sorted(multi.items()):
        ts = [r["median_s"] for r in rows]
        out.append(f"| {workload} | {impl} | {', '.join(fmt_t(t) for t in ts)} | {max(ts) / min(ts):.2f} |")
    return out + [""]


def _table_key(r: Row) -> tuple[Any, ...]:
    mode = list(MODES).index(r["mode"]) if r.get("mode") in MODES else 9
    return (str(r.get("core") or r.get("family") or ""), r.get("D") or 0, r.get("L") or 0, mode,
            r.get("B") or 0, r["workload"])


def _mine(spec: ReportSpec, r: Row) -> bool:
    """A row of this report: every row of a pre-harness file, the harness's rows of its families."""
    return r.get("schema") != 2 or r.get("bench") == spec.name


def render(spec: ReportSpec, path: Path | None = None, findings_dir: Path | None = None) -> str:
    """The whole report as Markdown, from a results file (default benchmarks/results/<spec.results>)
    and its findings (default benchmarks/findings/<spec.name>)."""
    path = path or HERE / "results" / spec.results
    latest, runs, _ = load_rows(path)
    latest = {k: r for k, r in latest.items() if _mine(spec, r)}
    checks = [r for r in read_rows(path) if r["kind"] == "check" and _mine(spec, r)]
    check = {"errors": {k: v for c in checks for k, v in c.get("errors", {}).items()}}
    rows = list(latest.values())
    lines = [*header(spec, path, latest, runs, check), *method(), *findings(spec, findings_dir)]
    shown: set[str] = set()
    for kinds, title in spec.sections:
        mine = [r for r in rows if kind_of(r) in kinds]
        shown |= set(kinds)
        if not mine:
            continue
        lines += [f"## {title}", ""]
        if kinds == ("memory",):
            lines += memory_tables(spec, mine)
            continue
        if "profile" in kinds and not any(timed(r) for r in mine):
            lines += [*profile_tables(mine), ""]
            continue
        groups: dict[str, list[Row]] = {}
        for r in mine:
            groups.setdefault(r["workload"], []).append(r)
        tables = dict(sorted(groups.items(), key=lambda kv: max(_table_key(r) for r in kv[1])))
        facts = []
        for workload, trs in tables.items():
            if not any(timed(r) or r.get("status") in ("skipped", "failed") for r in trs):
                facts += trs
                continue
            lines += [f"### {workload}", "", *timing_table(spec, kind_of(trs[0]), trs), ""]
        if facts:
            lines += [*info_rows(facts), ""]
    rest = [r for r in rows if kind_of(r) not in shown]
    if rest:
        lines += ["## Other rows", "", *info_rows(rest), ""]
    if spec.spread:
        lines += spread(path)
    return "\n".join(lines).rstrip() + "\n"


def write(name: str, path: Path | None = None, out: Path | None = None) -> Path | None:
    """Render one report into benchmarks/<name> (or ``out``); None when it has no results yet."""
    spec = REPORTS[name]
    path = path or HERE / "results" / spec.results
    if not path.is_file():
        return None
    dest = out or HERE / spec.name
    dest.write_text(render(spec, path), encoding="utf-8")
    return dest
