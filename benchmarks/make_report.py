"""Turn ``results/s4d.jsonl`` (from ``bench_s4d.py``) into ``REPORT.md``, or with ``--s4``
``results/s4.jsonl`` (from ``bench_s4.py``) into ``REPORT_S4.md``.

Keeps the latest row per (workload, impl, threads), so a partial rerun with ``--only`` or
``--L`` replaces just the rows it measured.

    python benchmarks/make_report.py [--jsonl benchmarks/results/s4d.jsonl] [--out benchmarks/REPORT.md]
    python benchmarks/make_report.py --s4     # results/s4.jsonl -> REPORT_S4.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_rows as load  # noqa: E402

HERE = Path(__file__).resolve().parent
TARGET = 3.0
BUSY = 0.25  # foreign cores above which a table is marked as timed on a busy machine
REFERENCE = {"layer": "straightforward", "recurrent": "straightforward", "kernel": "straightforward_kernel"}
FAST = {"layer": "zoo_vandermonde_fft", "recurrent": "zoo_vandermonde_fft", "kernel": "kernel_vandermonde"}
MODES = {"fwd": "forward", "fwdbwd": "forward+backward"}
# The shipped S4D rows predate the faster conv_fft layout; said in the report while they are current.
S4D_MEASURED_AT = ("Measured at commit d3e44fd, before conv_fft switched to transforming along the contiguous axis\n"
                   "(a later commit; about 1.3x faster FFT convolution at L=16384), so the layer speed-ups above are conservative.")
ORDER = ["straightforward", "zoo_vandermonde_fft", "zoo_naive_kernel_fft", "zoo_scan_parallel", "zoo_scan_naive",
         "straightforward_kernel", "kernel_vandermonde", "kernel_naive"]




def fmt_t(s: float | None) -> str:
    if s is None:
        return "–"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def speedup(rows: list[dict], row: dict) -> float | None:
    ref = next((r for r in rows if r["impl"] == REFERENCE[row["kind"]] and r.get("median_s")), None)
    if ref is None or not row.get("median_s"):
        return None
    return ref["median_s"] / row["median_s"]


def timing_table(rows: list[dict]) -> list[str]:
    out = ["| implementation | median | IQR | n | tokens/s | speed-up vs straightforward | foreign |",
           "|---|---|---|---|---|---|---|"]
    rows = sorted(rows, key=lambda r: (r.get("status") == "skipped", ORDER.index(r["impl"])))
    for r in rows:
        if r.get("status") == "skipped":
            out.append(f"| {r['impl']} | skipped | | | | | |")
            continue
        tok = f"{r['B'] * r['L'] / r['median_s']:,.0f}" if r.get("B") else "–"
        s = speedup(rows, r)
        busy = " (busy)" if r["foreign"] > BUSY else ""
        out.append(f"| {r['impl']} | {fmt_t(r['median_s'])} | {fmt_t(r['q25_s'])} – {fmt_t(r['q75_s'])} | "
                   f"{r['n']} | {tok} | {'–' if s is None else f'{s:.2f}×'} | {r['foreign']:.2f}{busy} |")
    notes = [f"- {r['impl']} skipped: {r['reason']}." for r in rows if r.get("status") == "skipped"]
    if any(r.get("foreign", 0) > BUSY for r in rows):
        notes.append(f"- Timed while other processes used > {BUSY} cores: absolute times are inflated; the "
                     "interleaved ratios are less affected but still less reliable.")
    return out + ([""] + notes if notes else [])


def group(latest: dict[tuple, dict], kind: str) -> dict[str, list[dict]]:
    blocks: dict[str, list[dict]] = {}
    for row in latest.values():
        if row["kind"] == kind:
            blocks.setdefault(row["workload"], []).append(row)
    order = {"fwd": 0, "fwdbwd": 1}
    return dict(sorted(blocks.items(), key=lambda kv: (kv[1][0]["L"], order[kv[1][0]["mode"]])))


def ratio_at(latest: dict[tuple, dict], kind: str, L: int, mode: str) -> tuple[float, dict, dict] | None:
    rows = [r for r in latest.values() if r["kind"] == kind and r["L"] == L and r["mode"] == mode]
    fast = next((r for r in rows if r["impl"] == FAST[kind] and r.get("median_s")), None)
    ref = next((r for r in rows if r["impl"] == REFERENCE[kind] and r.get("median_s")), None)
    return None if fast is None or ref is None else (ref["median_s"] / fast["median_s"], ref, fast)


def verdict(latest: dict[tuple, dict], L: int) -> list[str]:
    out = [f"**Speed target: zoo vandermonde+fft ≥ {TARGET:.0f}× faster than the straightforward S4D at L={L}.**", ""]
    for kind, what in (("layer", "whole layer"), ("kernel", "kernel step alone")):
        for mode, word in MODES.items():
            got = ratio_at(latest, kind, L, mode)
            if got is None:
                out.append(f"- {what}, {word}: not measured.")
                continue
            s, ref, fast = got
            batch = f", B={ref['B']}" if ref.get("B") else ""
            busy = f" (timed with {ref['foreign']:.2f} foreign cores busy)" if ref["foreign"] > BUSY else ""
            out.append(f"- {what}, {word}{batch}: straightforward {fmt_t(ref['median_s'])} → vandermonde "
                       f"{fmt_t(fast['median_s'])}, **{s:.1f}×**: target {'met' if s >= TARGET else 'NOT met'}{busy}.")
    return out + ["", *kernel_share(latest, L)]


def kernel_share(latest: dict[tuple, dict], L: int) -> list[str]:
    """How much of the vandermonde layer's time is its kernel step (the rest: FFT conv, D·u)."""
    out = []
    for mode, word in MODES.items():
        layer, kernel = ratio_at(latest, "layer", L, mode), ratio_at(latest, "kernel", L, mode)
        if layer and kernel:
            lt, kt = layer[2]["median_s"], kernel[2]["median_s"]
            out.append(f"- {word}: the kernel step is {fmt_t(kt)} of the vandermonde layer's {fmt_t(lt)} "
                       f"({100 * kt / lt:.0f}%); the rest is the FFT convolution and D·u.")
    return [f"Where the vandermonde+fft layer spends its time at L={L} (kernel and layer tables, B={layer[1]['B']}):",
            "", *out] if out else []


def memory_section(latest: dict[tuple, dict]) -> list[str]:
    rows = [r for r in latest.values() if r["kind"] == "memory"]
    if not rows:
        return ["No memory rows."]
    Ls = sorted({r["L"] for r in rows})
    impls = [i for i in ("straightforward_kernel", "kernel_vandermonde", "kernel_naive") if any(r["impl"] == i for r in rows)]
    peak = {(r["impl"], r["L"], r["mode"]): r["peak_mib"] for r in rows}
    vbytes = {r["L"]: r["vandermonde_bytes"] for r in rows}
    out = ["Peak RSS of one kernel step above the RSS just before it (MiB), each in a fresh process. "
           "For scale: one complex64 (H, N/2, L) Vandermonde temporary, and the (H, L) float32 kernel "
           "that every implementation must return.", "",
           "| L | mode | " + " | ".join(impls) + " | one (H, N/2, L) complex64 | (H, L) float32 output |",
           "|---|---|" + "---|" * len(impls) + "---|---|"]
    for L in Ls:
        for mode in MODES:
            cells = [f"{peak[(i, L, mode)]:.0f}" if (i, L, mode) in peak else "–" for i in impls]
            H = rows[0]["H"]
            out.append(f"| {L} | {mode} | " + " | ".join(cells)
                       + f" | {vbytes[L] / 2**20:.0f} | {H * L * 4 / 2**20:.0f} |")
    return out


def memory_verdict(peak: dict, vbytes: dict, Ls: list[int]) -> list[str]:
    lo, hi = Ls[0], Ls[-1]
    out = [f"**Memory target: the kernel step's peak does not grow as H·N·L** (L {lo} → {hi} is {hi // lo}×).", ""]
    for mode, word in MODES.items():
        for impl in ("straightforward_kernel", "kernel_vandermonde"):
            a, b = peak.get((impl, lo, mode)), peak.get((impl, hi, mode))
            if a is None or b is None:
                continue
            out.append(f"- {impl}, {word}: {a:.0f} → {b:.0f} MiB ({b / max(a, 1e-9):.1f}× for {hi // lo}× L; "
                       f"{b * 2**20 / vbytes[hi]:.2f}× one (H, N/2, L) complex temporary at L={hi}).")
    v = peak.get(("kernel_vandermonde", hi, "fwdbwd")) or peak.get(("kernel_vandermonde", hi, "fwd"))
    if v is not None:
        ok = v * 2**20 < 0.25 * vbytes[hi]
        out += ["", f"Target {'met' if ok else 'NOT met'}: at L={hi} kernel_vandermonde peaks at {v:.0f} MiB, "
                    f"{'well below' if ok else 'not far below'} the {vbytes[hi] / 2**20:.0f} MiB of a single "
                    "(H, N/2, L) temporary. What still grows with L is O(H·L), not O(H·N·L): the complex "
                    "(H, J, T) block product (8·H·L bytes) and the float32 (H, L) kernel, plus the "
                    "(H, N/2, T + J) complex powers (O(H·N·√L))."]
    return out


def commands(latest: dict[tuple, dict], runs: dict[str, dict]) -> list[str]:
    """Commands of the runs whose rows made it into the report, oldest first."""
    used = {r["run"] for r in latest.values()}
    return [r["cmd"].strip() for rid, r in runs.items() if rid in used]


def header(latest: dict[tuple, dict], runs: dict[str, dict], check: dict) -> list[str]:
    run = list(runs.values())[-1] if runs else {}
    m = run.get("machine", {})
    errs = check.get("errors", {})
    cmds = commands(latest, runs) or ["python benchmarks/bench_s4d.py"]
    used = [r for rid, r in runs.items() if rid in {x["run"] for x in latest.values()}]
    total = sum(r.get("total_s", 0) for r in used)
    minutes = [f"{r.get('total_s', 0) / 60:.1f}" for r in used]
    return [
        "# S4D layer benchmark: zoo backends vs a straightforward S4D", "",
        "Generated by `benchmarks/make_report.py` from `benchmarks/results/s4d.jsonl`. Speed and memory are "
        "benchmarks, not timed tests: compare the ratios within a table, not absolute seconds across machines.", "",
        "## Machine and command", "",
        f"- CPU: {m.get('cpu', '?')}, {m.get('logical_cpus', '?')} logical CPUs ({', '.join(m.get('simd', []))}), "
        f"{m.get('mem_gib', '?')} GiB RAM",
        f"- torch {m.get('torch', '?')} (CPU capability {m.get('torch_cpu_capability', '?')}), "
        f"Python {m.get('python', '?')}; intra-op threads {run.get('threads', '?')}, inter-op threads "
        f"{run.get('interop_threads', '?')}",
        f"- H={run.get('H')}, N={run.get('N')} (N/2 = {run.get('N', 0) // 2} complex pairs stored), float32",
        f"- runtime: {' + '.join(minutes)} min"
        + (f" = {total / 60:.1f} min" if len(used) > 1 else ""), "",
        "Reproduce (from the repository root, in the project's venv)"
        + (": the full sweep, then the reruns of tables first timed on a busy machine (the latest row "
           "per table and implementation is kept):" if len(cmds) > 1 else ":"), "",
        "```bash", *cmds, "python benchmarks/make_report.py", "```", "",
        *([S4D_MEASURED_AT, ""] if all(r.get("when", "") < "2026-11-30T07" for r in runs.values()) else []),
        "## Method", "",
        "- **straightforward** (`benchmarks/straightforward_s4d.py`): builds the whole (H, N/2, L) Vandermonde "
        "matrix as `exp(dtA[..., None] * arange(L))` (complex exp), contracts it with C·B̄, takes 2·Re, then the "
        "2L-padded rfft convolution and + D·u. It holds the same parameters as the zoo layer.",
        "- zoo backends: `S4D(d_model=H, d_state=N, backend=...)` with {kernel: vandermonde, conv: fft} "
        "(= `auto`), {kernel: naive, conv: fft}, {scan: scan} (chunked parallel recurrence) and "
        "{scan: naive} (python loop over L).",
        "- One warm-up call each, then `--repeats` rounds (column n); every round runs each implementation of a table once, "
        "rotating the order. median and IQR (25th–75th percentile) over the timed runs. `fwd` runs under "
        "`torch.no_grad()`; `fwdbwd` is forward + `backward` of a fixed random cotangent into all parameters "
        "and the input.",
        "- **speed-up** = straightforward median / implementation median (> 1: faster than straightforward).",
        "- B = 16384 // L (16 / 4 / 1), i.e. 16 MiB of float32 input. The recurrent backends hold several "
        "(B, L, H, N/2) complex tensors and are timed at B=1 in their own *recurrent* tables, beside "
        "straightforward and vandermonde+fft at the same B.",
        "- `foreign`: cores used by other processes while the table was timed (≤ 0.25 is a quiet machine).",
        f"- Start-up check: every zoo backend and kernel agrees with the straightforward layer to "
        f"{max(errs.values()):.1e} relative (L2, float32, H=16, L ∈ {{37, 1000}}; tolerance 1e-4)."
        if errs else "- Start-up check: not recorded.", "",
    ]


def memory_verdict_short(latest: dict[tuple, dict]) -> list[str]:
    rows = [r for r in latest.values() if r["kind"] == "memory"]
    if not rows:
        return []
    peak = {(r["impl"], r["L"], r["mode"]): r["peak_mib"] for r in rows}
    vbytes = {r["L"]: r["vandermonde_bytes"] for r in rows}
    return memory_verdict(peak, vbytes, sorted({r["L"] for r in rows}))


# ---------------------------------------------------------------------------------------
# S4 (bench_s4.py -> REPORT_S4.md)
# ---------------------------------------------------------------------------------------
S4_ORDER = ["kernel_cauchy", "kernel_cauchy_keops", "straightforward_cauchy", "kernel_dplr_naive"]
S4_NAIVE, S4_FAST, S4_KEOPS, S4_SF = S4_ORDER[3], S4_ORDER[0], S4_ORDER[1], S4_ORDER[2]
S4_TARGET = 20.0
S4_MEM_GIB = 24


def s4_get(latest: dict[tuple, dict], kind: str, impl: str, L: int, mode: str) -> dict | None:
    return next((r for r in latest.values() if r["kind"] == kind and r["impl"] == impl and r.get("L") == L
                 and r.get("mode") == mode), None)


def s4_t(row: dict | None) -> float | None:
    return row.get("median_s") if row else None


def s4_busy(*rows: dict | None) -> str:
    f = max((r.get("foreign", 0) for r in rows if r), default=0)
    return f" (timed with {f:.2f} foreign cores busy)" if f > BUSY else ""


def s4_header(latest: dict[tuple, dict], runs: dict[str, dict], check: dict) -> list[str]:
    used = [r for rid, r in runs.items() if rid in {x["run"] for x in latest.values()}]
    run = used[-1] if used else {}
    m = run.get("machine", {})
    errs = check.get("errors", {})
    cmds = [r["cmd"].strip() for r in used] or ["python benchmarks/bench_s4.py"]
    with_keops = [r for r in used if r.get("keops_reason") is None]
    keops = None if with_keops else run.get("keops_reason", check.get("keops_reason"))
    keops_version = with_keops[-1].get("keops_version") if with_keops else None
    minutes = [f"{r.get('total_s', 0) / 60:.1f}" for r in used]
    total = sum(r.get("total_s", 0) for r in used)
    return [
        "# S4 kernel benchmark: kernel_cauchy vs the naive kernel, a straightforward Cauchy and pykeops", "",
        "Generated by `benchmarks/make_report.py --s4` from `benchmarks/results/s4.jsonl`. Speed and memory are "
        "benchmarks, not timed tests: compare the ratios within a table, not absolute seconds across machines.", "",
        "## Machine and command", "",
        f"- CPU: {m.get('cpu', '?')}, {m.get('logical_cpus', '?')} logical CPUs ({', '.join(m.get('simd', []))}), "
        f"{m.get('mem_gib', '?')} GiB RAM",
        f"- torch {m.get('torch', '?')} (CPU capability {m.get('torch_cpu_capability', '?')}), "
        f"Python {m.get('python', '?')}; intra-op threads {run.get('threads', '?')}, inter-op threads "
        f"{run.get('interop_threads', '?')}; pykeops runs its own OpenMP pool",
        f"- H={run.get('H')}, N={run.get('N')} (M = {run.get('N', 0) // 2} conjugate pairs stored), float32 "
        "parameters (complex64 systems), S4's HiPPO-LegS init",
        "- pykeops: " + (f"{keops_version or '?'}, installed beside the venv for this run (not a project "
                         "dependency) and passed its run-time check (`zoo_core.kernels.keops.runtime_reason()`)"
                         if keops is None else f"not measured: {keops}"),
        f"- runtime: {' + '.join(minutes)} min" + (f" = {total / 60:.1f} min" if len(used) > 1 else ""), "",
        "Reproduce (from the repository root, in the project's venv"
        + ("; the latest row per table and implementation is kept):" if len(cmds) > 1 else "):"), "",
        "```bash", "pip install pykeops  # optional; not a project dependency", *cmds,
        "python benchmarks/make_report.py --s4", "```", "",
        "## Method", "",
        "- **kernel_cauchy** (`zoo_core.kernels.dplr`, the `cauchy` backend): K̂ at the F = L/2 + 1 roots of unity "
        "from four Cauchy sums over the stored half state (conjugate completion as 2 sums), a division-free "
        "rank-1 Woodbury step, then irfft; frequencies in chunks, recomputed in backward.",
        "- **kernel_cauchy_keops** (`zoo_core.kernels.keops`, the optional `keops` backend): the same maths with "
        "the four sums fused in one pykeops reduction (real/imaginary split, KeOps' symbolic gradients).",
        "- **straightforward_cauchy** (`benchmarks/straightforward_cauchy.py`): the same maths as one broadcast "
        "over the whole (H, N, F) array of reciprocals, four broadcast sums, plain autograd.",
        "- **kernel_dplr_naive** (`zoo_core.kernels.dplr`, the `naive` reference): C from C̃ by a dense solve, "
        "dense bilinear Ā, then K_l = Re(C Ā^l B̄) one mat-vec per step.",
        "- Each call builds the system from an S4 layer's parameters; `fwd` runs under `torch.no_grad()`, "
        "`fwdbwd` backpropagates a fixed random (H, L) cotangent into every parameter.",
        "- One warm-up call each, then `--repeats` interleaved rounds with rotating order (column n); median and "
        "IQR (25th–75th percentile). Rows marked † ran fewer rounds (see the note under their table).",
        "- Each table first waits (≤ `--quiet-wait` s), and each round again (≤ `--round-wait` s), for a quiet "
        "machine; `foreign`: cores used by other processes during the timed rounds (≤ 0.25 is a quiet machine).",
        "- Peak memory: one fresh process per (implementation, L, mode); after imports, parameters and a warm-up "
        "at L=64, glibc's free memory is trimmed and VmHWM reset; the row is VmHWM after one step minus the RSS "
        "then.",
        f"- Start-up check: every implementation agrees with kernel_cauchy to {max(errs.values()):.1e} relative "
        "(L2, float32, H=16, L ∈ {37, 1000}; straightforward_cauchy also in every parameter gradient; "
        "tolerance 1e-4)." if errs else "- Start-up check: not recorded.", "",
    ]


def s4_targets(latest: dict[tuple, dict], L: int) -> list[str]:
    out = [f"**Speed target 1: kernel_cauchy ≥ {S4_TARGET:.0f}× faster than kernel_dplr_naive at L={L}.**", ""]
    for mode, word in MODES.items():
        naive, fast = s4_get(latest, "kernel", S4_NAIVE, L, mode), s4_get(latest, "kernel", S4_FAST, L, mode)
        if not (s4_t(naive) and s4_t(fast)):
            out.append(f"- {word}: not measured.")
            continue
        s = naive["median_s"] / fast["median_s"]
        out.append(f"- {word}: naive {fmt_t(naive['median_s'])} (n={naive['n']}) → cauchy {fmt_t(fast['median_s'])}, "
                   f"**{s:.1f}×**: target {'met' if s >= S4_TARGET else 'NOT met'}{s4_busy(naive, fast)}.")
    out += ["", "**Speed target 2: kernel_cauchy at least as fast as pykeops (kernel_cauchy_keops).**", ""]
    Ls = sorted({r["L"] for r in latest.values() if r["kind"] == "kernel"})
    skipped = next((r for r in latest.values() if r["kind"] == "kernel" and r["impl"] == S4_KEOPS
                    and r.get("status") == "skipped"), None)
    for Lx in Ls:
        for mode, word in MODES.items():
            keops, fast = s4_get(latest, "kernel", S4_KEOPS, Lx, mode), s4_get(latest, "kernel", S4_FAST, Lx, mode)
            if not (s4_t(keops) and s4_t(fast)):
                continue
            s = keops["median_s"] / fast["median_s"]
            verdict = "met" if s >= 1 else "NOT met"
            bold = "**" if Lx == L else ""
            out.append(f"- {bold}L={Lx}, {word}{bold}: pykeops {fmt_t(keops['median_s'])} vs cauchy "
                       f"{fmt_t(fast['median_s'])}: cauchy is **{s:.2f}×** as fast: {verdict}{s4_busy(keops, fast)}.")
    if skipped and skipped.get("median_s") is None and not any(s4_t(s4_get(latest, "kernel", S4_KEOPS, x, "fwd")) for x in Ls):
        out.append(f"- not measured: {skipped['reason']}.")
    return out


def s4_memory_verdict(latest: dict[tuple, dict]) -> list[str]:
    rows = [r for r in latest.values() if r["kind"] == "memory"]
    if not rows:
        return []
    peak = {(r["impl"], r["L"], r["mode"]): r["peak_mib"] for r in rows}
    hnf = {r["L"]: r["hnf_bytes"] / 2**20 for r in rows}
    Ls = sorted(hnf)
    lo, hi = Ls[0], Ls[-1]
    out = [f"**Memory target 3: the kernel step's peak does not grow as H·N·L** (L {lo} → {hi} is {hi // lo}×; "
           f"one complex64 (H, N, F) array is {hnf[hi]:.0f} MiB at L={hi}).", ""]
    for impl in (S4_FAST, S4_SF, S4_KEOPS):
        for mode, word in MODES.items():
            a, b = peak.get((impl, lo, mode)), peak.get((impl, hi, mode))
            if a is None or b is None:
                continue
            growth = f"{b / a:.1f}× for {hi // lo}× L" if a >= 1 else f"under 1 MiB at L={lo}"
            out.append(f"- {impl}, {word}: {a:.0f} → {b:.0f} MiB ({growth}; {b / hnf[hi]:.2f}× one (H, N, F) array).")
    v = peak.get((S4_FAST, hi, "fwdbwd")) or peak.get((S4_FAST, hi, "fwd"))
    if v is not None:
        ok = v < 0.25 * hnf[hi]
        out += ["", f"Target {'met' if ok else 'NOT met'}: at L={hi} kernel_cauchy peaks at {v:.0f} MiB, "
                    f"{'well below' if ok else 'not far below'} the {hnf[hi]:.0f} MiB of one (H, N, F) array. "
                    "What grows with L is O(H·L): the (H, F) complex K̂, its chunks' (H, 4, G) sums and the "
                    "(H, L) float32 kernel (16 MiB at L=16384); each (H, M, G) chunk intermediate is fixed "
                    "(CHUNK_ELEMENTS entries)."]
    return out


def s4_layer_verdict(latest: dict[tuple, dict]) -> list[str]:
    rows = sorted((r for r in latest.values() if r["kind"] == "layer"), key=lambda r: r["impl"] != "S4 backend=auto")
    if not rows:
        return []
    r0 = rows[0]
    out = [f"**Layer 4: a full S4(d_model={r0['H']}, d_state={r0['N']}, l_max={r0['L']}) forward+backward at "
           f"B={r0['B']}, L={r0['L']} completes within {S4_MEM_GIB} GiB.**", ""]
    for r in rows:
        if r.get("status") != "ok":
            out.append(f"- {r['impl']}: FAILED (exit {r.get('returncode')}): `{(r.get('reason') or '').strip()[-300:]}`")
            continue
        gib = r["process_peak_rss_mib"] / 1024
        out.append(f"- {r['impl']} (resolved to {r['label']}): median {fmt_t(r['median_s'])} per forward+backward "
                   f"(n={r['n']}), {r['B'] * r['L'] / r['median_s']:,.0f} tokens/s; peak RSS of the process "
                   f"{gib:.2f} GiB ({r['peak_mib']:.0f} MiB above the RSS before the step): "
                   f"{'completes within' if gib < S4_MEM_GIB else 'EXCEEDS'} {S4_MEM_GIB} GiB{s4_busy(r)}.")
    ok = {r["choice"].get("kernel"): r for r in rows if r.get("status") == "ok"}
    if "auto" in rows[0]["impl"] and rows[0].get("status") == "ok" and "cauchy" in ok and rows[0] is not ok["cauchy"]:
        a, c = rows[0], ok["cauchy"]
        out += ["", f"auto picked kernel={a['choice'].get('kernel')} (highest priority that passed its checks); with "
                    f"kernel=cauchy the same step takes {fmt_t(c['median_s'])}, "
                    f"{a['median_s'] / c['median_s']:.2f}× {'faster' if c['median_s'] < a['median_s'] else 'slower'}"
                    + (" (one of the two timed on a busy machine: the ratio is unreliable)." if s4_busy(a, c) else ".")]
    return out


def s4_headline(latest: dict[tuple, dict], L: int) -> list[str]:
    out = [f"## Headline: kernel step at L={L}", "",
           "| implementation | forward | forward+backward | peak MiB forward | peak MiB forward+backward |",
           "|---|---|---|---|---|"]
    for impl in S4_ORDER:
        t = [s4_get(latest, "kernel", impl, L, m) for m in MODES]
        mem = [s4_get(latest, "memory", impl, L, m) for m in MODES]
        if not any(s4_t(x) for x in t):
            continue
        cells = [f"{fmt_t(s4_t(x))}{' †' if x and x.get('note') else ''}" for x in t]
        cells += [f"{x['peak_mib']:.0f}" if x else "–" for x in mem]
        out.append(f"| {impl} | " + " | ".join(cells) + " |")
    layer = [r for r in latest.values() if r["kind"] == "layer" and r.get("status") == "ok"]
    for r in layer:
        out.append(f"| whole S4 layer, B={r['B']}, {r['label']} | – | {fmt_t(r['median_s'])} | – | "
                   f"{r['peak_mib']:.0f} (process {r['process_peak_rss_mib'] / 1024:.2f} GiB) |")
    return out


def s4_kernel_table(rows: list[dict]) -> list[str]:
    out = ["| implementation | median | IQR | n | speed-up vs naive | vs kernel_cauchy | foreign |",
           "|---|---|---|---|---|---|---|"]
    ok = {r["impl"]: r for r in rows if r.get("median_s")}
    for r in sorted(rows, key=lambda r: (r.get("status") == "skipped", S4_ORDER.index(r["impl"]))):
        if r.get("status") == "skipped":
            out.append(f"| {r['impl']} | skipped | | | | | |")
            continue
        naive, fast = ok.get(S4_NAIVE), ok.get(S4_FAST)
        sn = f"{naive['median_s'] / r['median_s']:.1f}×" if naive else "–"
        sf = f"{r['median_s'] / fast['median_s']:.2f}× the time" if fast else "–"
        busy = " (busy)" if r["foreign"] > BUSY else ""
        out.append(f"| {r['impl']}{' †' if r.get('note') else ''} | {fmt_t(r['median_s'])} | {fmt_t(r['q25_s'])} – "
                   f"{fmt_t(r['q75_s'])} | {r['n']} | {sn} | {sf} | {r['foreign']:.2f}{busy} |")
    notes = [f"- † {r['impl']}: {r['note']}." for r in rows if r.get("note")]
    notes += [f"- {r['impl']} skipped: {r['reason']}." for r in rows if r.get("status") == "skipped"]
    if any(r.get("foreign", 0) > BUSY for r in rows):
        notes.append(f"- Timed while other processes used > {BUSY} cores: absolute times are inflated; the "
                     "interleaved ratios are less affected but still less reliable.")
    return out + ([""] + notes if notes else [])


def s4_memory_table(latest: dict[tuple, dict]) -> list[str]:
    rows = [r for r in latest.values() if r["kind"] == "memory"]
    if not rows:
        return ["No memory rows."]
    impls = [i for i in S4_ORDER if any(r["impl"] == i for r in rows)]
    peak = {(r["impl"], r["L"], r["mode"]): r["peak_mib"] for r in rows}
    hnf = {r["L"]: r["hnf_bytes"] for r in rows}
    H = rows[0]["H"]
    out = ["Peak RSS of one kernel step above the RSS just before it (MiB), each in a fresh process. For scale: "
           "one complex64 (H, N, F) array (what a broadcast over the full state and all frequencies holds), and "
           "the (H, L) float32 kernel every implementation returns.", "",
           "| L | mode | " + " | ".join(impls) + " | one (H, N, F) complex64 | (H, L) float32 output |",
           "|---|---|" + "---|" * len(impls) + "---|---|"]
    for L in sorted(hnf):
        for mode in MODES:
            cells = [f"{peak[(i, L, mode)]:.0f}" if (i, L, mode) in peak else "–" for i in impls]
            out.append(f"| {L} | {mode} | " + " | ".join(cells) + f" | {hnf[L] / 2**20:.0f} | {H * L * 4 / 2**20:.0f} |")
    return out


def s4_profile(latest: dict[tuple, dict]) -> list[str]:
    rows = [r for r in latest.values() if r["kind"] == "profile"]
    if not rows:
        return []
    by = {r["impl"]: r for r in rows}
    fwd, fb = by.get("total forward"), by.get("total forward+backward")
    L = rows[0]["L"]
    out = [f"## Where kernel_cauchy spends its time (L={L}, CHUNK_ELEMENTS={rows[0].get('chunk_elements')})", "",
           "Each part timed on its own, interleaved like the tables (n rounds, medians).", "",
           "| part | median | share of forward | share of forward+backward | foreign |", "|---|---|---|---|---|"]
    for r in rows:
        backward_side = "backward" in r["impl"] or "recompute" in r["impl"]
        a = f"{100 * r['median_s'] / fwd['median_s']:.0f}%" if fwd and not backward_side else "–"
        b = f"{100 * r['median_s'] / fb['median_s']:.0f}%" if fb else "–"
        out.append(f"| {r['impl']} | {fmt_t(r['median_s'])} | {a} | {b} | {r['foreign']:.2f} |")
    table = {m: s4_t(s4_get(latest, "kernel", S4_FAST, L, m)) for m in MODES}
    if fwd and fb and table["fwd"] and table["fwdbwd"]:
        out += ["", f"Timed alone here, the forward takes {fmt_t(fwd['median_s'])} and forward+backward "
                    f"{fmt_t(fb['median_s'])}; interleaved with the other implementations (kernel tables) "
                    f"{fmt_t(table['fwd'])} and {fmt_t(table['fwdbwd'])}."]
    return out


def s4_load(path: Path) -> tuple[dict[tuple, dict], dict[str, dict], dict]:
    """``load``, but a rerun row moves to where it was written (the profile lists parts in run order)."""
    latest, runs, check = load(path)
    ordered: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        key = (row["workload"], row["impl"], row["threads"])
        if key in latest:
            ordered.pop(key, None)
            ordered[key] = latest[key]
    return ordered, runs, check


def s4_main(jsonl: Path, out_path: Path) -> None:
    latest, runs, check = s4_load(jsonl)
    Ls = sorted({r["L"] for r in latest.values() if r["kind"] == "kernel"})
    lines = s4_header(latest, runs, check)
    lines += ["## Targets", "", *s4_targets(latest, Ls[-1]), "", *s4_memory_verdict(latest), "",
              *s4_layer_verdict(latest), ""]
    lines += [*s4_headline(latest, Ls[-1]), "", *s4_profile(latest), ""]
    lines += ["## Kernel step alone: (H, L) from the parameters", ""]
    for workload, rows in group(latest, "kernel").items():
        lines += [f"### {workload}", "", *s4_kernel_table(rows), ""]
    lines += ["## Peak memory of the kernel step", "", *s4_memory_table(latest), ""]
    out_path.write_text("\n".join(lines))
    print(f"wrote {out_path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--s4", action="store_true", help="render the S4 benchmark (bench_s4.py) instead")
    p.add_argument("--jsonl", type=Path, default=None, help="default results/s4d.jsonl (results/s4.jsonl with --s4)")
    p.add_argument("--out", type=Path, default=None, help="default REPORT.md (REPORT_S4.md with --s4)")
    args = p.parse_args()
    if args.s4:
        return s4_main(args.jsonl or HERE / "results" / "s4.jsonl", args.out or HERE / "REPORT_S4.md")
    latest, runs, check = load(args.jsonl or HERE / "results" / "s4d.jsonl")
    Ls = sorted({r["L"] for r in latest.values() if r["kind"] in ("layer", "kernel")})
    lines = header(latest, runs, check)
    lines += ["## Targets", "", *verdict(latest, Ls[-1]), "", *memory_verdict_short(latest), ""]
    lines += ["## Whole layer", ""]
    blocks = {**group(latest, "layer"), **group(latest, "recurrent")}
    for workload, rows in sorted(blocks.items(), key=lambda kv: (kv[1][0]["L"], kv[1][0]["mode"], kv[1][0]["kind"])):
        lines += [f"### {workload}", "", *timing_table(rows), ""]
    lines += ["## Kernel step alone (H, L) from the parameters, no batch", ""]
    for workload, rows in group(latest, "kernel").items():
        lines += [f"### {workload}", "", *timing_table(rows), ""]
    lines += ["## Peak memory of the kernel step", "", *memory_section(latest), ""]
    out = args.out or HERE / "REPORT.md"
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
