"""LrcSSM: the quasi-DEER / Newton parallel path against its own sequential loop.

One layer ``LrcSSM(d_model=64, d_state=64)`` (the paper's hidden = state = 64), float32, default init,
B ∈ {4, 32} (4 is the reference scripts' batch size), L ∈ {256, 1024, 4096}, forward
(``torch.no_grad()``) and forward+backward (a fixed random cotangent into every parameter and the
input). Implementations, all on the same parameters:

- ``sequential``: ``backend: naive``, the python loop over L (the reference);
- ``deer``: ``backend: auto`` (= ``deer``): Newton with zoo_core's parallel scan, in windows of
  about 2^18 state entries (``LrcSSM.window_elems``), then one differentiable Newton step;
- ``deer scan=naive``: the same Newton with zoo_core's sequential linear scan inside;
- ``deer one window``: the parallel scan over the whole sequence at every sweep (the reference's
  scheme plus the settled prefix).

The ``tune`` part times the window size and the scan inside Newton at L=4096; that is how the
defaults were chosen. Every timed deer row records its Newton sweeps (total, windows, most in
one window).

Method (shared/reference/perf-baselines.md, helpers in ``_common.py``): per table a quiet-machine
wait, one warm-up call per implementation, then ``--repeats`` interleaved rounds in rotating order;
median and IQR; ``foreign`` = cores other processes used meanwhile.

    python benchmarks/bench_lrcssm.py                    # check, tune, layer (~10 min on a quiet machine)
    python benchmarks/bench_lrcssm.py --parts layer --B 4 --L 4096
    python benchmarks/bench_lrcssm.py --report           # results/lrcssm.jsonl -> benchmarks/REPORT_LRCSSM.md
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Call, Writer, layer_call, load_rows, machine, rel, summary, time_block  # noqa: E402

HERE = Path(__file__).resolve().parent
H = D = 64
MODES = {"fwd": "forward", "fwdbwd": "forward+backward"}
IMPLS = {  # name -> (backend, window_elems override or "default")
    "sequential": ("naive", "default"),
    "deer": ("auto", "default"),
    "deer scan=naive": ({"scan": "naive"}, "default"),
    "deer one window": ("scan", None),
}
TUNE_WINDOWS = [None, 2**20, 2**19, 2**18, 2**17, 2**16]


def make_layer(backend, window_elems="default", *, seed: int = 0):  # type: ignore[no-untyped-def]
    from zoo_lrcssm.core import LrcSSM

    torch.manual_seed(seed)
    layer = LrcSSM(d_model=H, d_state=D, backend=backend)
    if window_elems != "default":
        layer.window_elems = window_elems  # instance attribute shadows the class default
    return layer


def make_call(layer: torch.nn.Module, B: int, L: int, mode: str) -> Call:
    torch.manual_seed(2)
    return layer_call(layer, torch.randn(B, L, H), mode)  # x (B, L, H)


def solve_info(layer) -> dict:  # type: ignore[no-untyped-def]
    s = getattr(layer, "last_solve", None)
    if s is None or layer.backend_choice.path != "deer":
        return {}
    return {"iterations": s.iterations, "windows": s.windows, "max_window_iterations": s.max_window_iterations,
            "residual": s.residual, "converged": s.converged}


# ---------------------------------------------------------------------------------------
# correctness at start-up
# ---------------------------------------------------------------------------------------
def check_agreement(tol: float = 1e-4) -> dict:
    """Every deer variant against the sequential loop: outputs, input and parameter gradients
    (float32, B=2, L ∈ {37, 1000}, relative L2)."""
    errors = {}
    for L in (37, 1000):
        torch.manual_seed(3)
        x, g = torch.randn(2, L, H), torch.randn(2, L, H)
        got = {}
        for name, (backend, window) in IMPLS.items():
            layer = make_layer(backend, window)
            xi = x.clone().requires_grad_(True)
            layer(xi).backward(g)
            with torch.no_grad():
                y = layer(x)
            got[name] = [y, xi.grad] + [p.grad for p in layer.parameters()]
        for name in list(IMPLS)[1:]:
            errors[f"{name} L={L}"] = max(rel(a, b) for a, b in zip(got[name], got["sequential"]))
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"deer disagrees with the sequential loop beyond {tol} relative: {bad}"
    return errors


# ---------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------
def run_block(args: argparse.Namespace, out: Writer, kind: str, B: int, L: int, mode: str,
              impls: dict[str, tuple]) -> None:
    workload = f"{kind} B={B} L={L} {mode}"
    layers = {name: make_layer(backend, window) for name, (backend, window) in impls.items()}
    calls = {name: make_call(layer, B, L, mode) for name, layer in layers.items()}
    print(f"{workload}: {', '.join(calls)}", flush=True)
    times, foreign = time_block(calls, args.repeats, args.quiet_wait, round_wait=args.round_wait)
    for name, ts in times.items():
        layer = layers[name]
        out.write({"kind": kind, "workload": workload, "impl": name, "B": B, "L": L, "mode": mode,
                   "window_elems": layer.window_elems, "backend": layer.backend_choice.label(),
                   **solve_info(layer), **summary(ts), "foreign": round(foreign, 3), "status": "ok"})


def tune_impls() -> dict[str, tuple]:
    impls: dict[str, tuple] = {"sequential": ("naive", "default")}
    for w in TUNE_WINDOWS:
        impls[f"scan, window {'L' if w is None else f'2^{w.bit_length() - 1}'}"] = ("scan", w)
    impls["scan=naive, window 2^18"] = ({"scan": "naive"}, 2**18)
    impls["scan=naive, window L"] = ({"scan": "naive"}, None)
    return impls


# ---------------------------------------------------------------------------------------
# report (results/lrcssm.jsonl -> REPORT_LRCSSM.md)
# ---------------------------------------------------------------------------------------
def fmt_t(s: float | None) -> str:
    if s is None:
        return "–"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _iters(r: dict) -> str:
    if "iterations" not in r:
        return "–"
    return f"{r['iterations']} ({r['windows']} × ≤{r['max_window_iterations']})"


def analysis(layer: dict, tune: list[dict]) -> list[str]:
    """Target status and where the time goes, from the measured rows."""
    out = ["", "## Target: deer faster than the sequential loop at L ≥ 1024", ""]
    for (B, L, mode, impl), r in sorted(layer.items()):
        seq = layer.get((B, L, mode, "sequential"))
        if impl != "deer" or L < 1024 or not seq:
            continue
        ratio = seq["median_s"] / r["median_s"]
        verdict = "met" if ratio > 1 else "NOT met"
        out.append(f"- B={B}, L={L}, {MODES[mode]}: {fmt_t(seq['median_s'])} → {fmt_t(r['median_s'])}, "
                   f"**{ratio:.2f}×** ({verdict})")
    per_step = {}
    for B in sorted({k[0] for k in layer}):
        seq, deer = layer.get((B, 4096, "fwd", "sequential")), layer.get((B, 4096, "fwd", "deer"))
        if seq and deer and deer.get("iterations"):
            per_step[B] = (1e6 * seq["median_s"] / 4096, 1e6 * deer["median_s"] / 4096,
                           1e9 * deer["median_s"] / (deer["iterations"] * 4096 * B * D / deer["windows"]))
    if not per_step:
        return out
    out += ["", "## Why B = 32 is different", "",
            "Forward, L = 4096, per time step (µs), and the cost of one Newton sweep per state entry:", "",
            "| B | B·D | sequential loop, µs/step | deer, µs/step | deer, ns per state entry per sweep |",
            "|---|---|---|---|---|"]
    for B, (s_us, d_us, ns) in per_step.items():
        out.append(f"| {B} | {B * D} | {s_us:.1f} | {d_us:.1f} | {ns:.1f} |")
    out += ["",
            "- The sequential loop is **dispatch-bound**: each step is ~13 small PyTorch ops on a (B, D) slice, "
            "a few µs each whatever B·D is, so going from B·D = 256 to 2048 costs it little (forward and, "
            "through L autograd nodes per op, backward).",
            "- Newton is **work-bound**: every sweep evaluates the cell *and* its Jacobian (about 27 fused "
            "elementwise passes, 3 sigmoids and a tanh) and runs the chunked log-depth scan (another 20–30 passes) "
            "over all B·W·D entries of its window, and a window needs 3 sweeps at the default init (the third only "
            "confirms the change is below 1e-4), plus the differentiable step in training. Its cost is linear in "
            "B·L·D at a fixed rate per entry (last column, the same for both batch sizes once the windows keep the "
            "working set in cache).",
            "- So the crossover is in B·D: at B = 4 (the reference's batch size) Newton wins in both modes from "
            "L = 256 on; at B = 32 it loses the forward by 2–3× and is about even in forward+backward, where the "
            "loop's backward through 13·L autograd nodes is what Newton saves. With one of the two cores busy "
            "with other sessions (`foreign` ≈ 1) these runs used one intra-op thread; the loop's tiny ops "
            "cannot use a second core, Newton's full-window passes can, so a quiet 2-core run should move the "
            "crossover up (not measured: the machine was never quiet).",
            "- What was tried to make it so: (1) the settled prefix (a sweep starts at the first unsettled step) — "
            "at this init all steps settle together, so it saves nothing here but bounds the sweeps by W; "
            "(2) **windows** of ~2^18 state entries, which keep a sweep's temporaries small: at B = 32, "
            "L = 4096 a full-length sweep works on 32 MB temporaries, and one elementwise multiply on such a fresh "
            "tensor took ~40 ms here against ~0.2 ms at 4 MB (most likely fresh mmap'd allocations page-faulted on "
            "first touch); the one-window variant is 3× slower (`deer one window`); (3) `torch.split` instead of slices in the differentiable step "
            "(slices' backward zero-fills a full (B, L, D) gradient per window); (4) the scan inside Newton: "
            "zoo_core's parallel scan is 2–3× faster than its sequential scan at B = 4 and ~10% slower at "
            "B = 32, so the parallel one is the CPU default; (5) fused multiply-adds in the Jacobian.",
            "- What would change it: a fused kernel per sweep (one pass instead of ~60; torch.compile or a C++/Triton "
            "op), or a custom autograd.Function with the reference's adjoint (one reverse scan, no autograd graph "
            "through the scan) instead of the differentiable Newton step the brief asks for; on a GPU the "
            "sweep's passes are cheap and the loop's L sequential launches are not, which is what DEER is for.",
            "- Recommendation: `auto` keeps Newton (training at small batches is where it pays: 6× at B = 4); "
            "for CPU inference at large B·D, `backend: naive` is faster."]
    return out


def report(path: Path, dest: Path) -> None:
    latest, runs, check = load_rows(path)
    rows = [r for r in latest.values() if r["kind"] in ("layer", "tune") and r.get("status") == "ok"]
    used = [r for rid, r in runs.items() if rid in {x["run"] for x in rows}]
    run = used[-1] if used else {}
    m = run.get("machine", {})
    lines = [
        "# LrcSSM: quasi-DEER / Newton against the sequential loop", "",
        "Generated by `python benchmarks/bench_lrcssm.py --report` from `benchmarks/results/lrcssm.jsonl`. "
        "Benchmarks, not timed tests: compare ratios within a table.", "",
        "## Machine and command", "",
        f"- CPU: {m.get('cpu', '?')}, {m.get('logical_cpus', '?')} logical CPUs ({', '.join(m.get('simd', []))}), "
        f"{m.get('mem_gib', '?')} GiB RAM; torch {m.get('torch', '?')}, Python {m.get('python', '?')}",
        f"- intra-op threads {run.get('threads', '?')} (other sessions shared the 2 cores: see `foreign`)",
        f"- `LrcSSM(d_model={H}, d_state={D})`, default init, float32, tol 1e-4 (the float32 default)",
        "", "```bash", *[r["cmd"].strip() for r in used], "python benchmarks/bench_lrcssm.py --report", "```", "",
    ]
    if check:
        worst = max(check["errors"].values())
        lines += [f"Start-up check: every deer variant agrees with the sequential loop to {worst:.1e} relative "
                  "(max over the output and every parameter and input gradient; float32, B=2, L ∈ {37, 1000}).", ""]
    lines += ["## Headline: parallel (deer) vs its own sequential loop", "",
              "Speed-up = sequential time / deer time (> 1: deer is faster). Newton sweeps: total (windows × "
              "most sweeps in one window).", "",
              "| B | L | mode | sequential | deer | speed-up | Newton sweeps | deer scan=naive | deer one window | foreign |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    layer = {(r["B"], r["L"], r["mode"], r["impl"]): r for r in rows if r["kind"] == "layer"}
    keys = sorted({k[:3] for k in layer}, key=lambda k: (k[0], list(MODES).index(k[2]), k[1]))
    for B, L, mode in keys:
        seq, deer = layer.get((B, L, mode, "sequential")), layer.get((B, L, mode, "deer"))
        other = [layer.get((B, L, mode, n)) for n in ("deer scan=naive", "deer one window")]
        if not (seq and deer):
            continue
        ratio = seq["median_s"] / deer["median_s"]
        lines.append(f"| {B} | {L} | {mode} | {fmt_t(seq['median_s'])} | {fmt_t(deer['median_s'])} | "
                     f"**{ratio:.2f}×** | {_iters(deer)} | "
                     + " | ".join(fmt_t(o["median_s"]) if o else "–" for o in other)
                     + f" | {deer['foreign']:.2f} |")
    tune = [r for r in rows if r["kind"] == "tune"]
    if tune:
        lines += ["", "## Tuning at L=4096: window size and the scan inside Newton", "",
                  "| B | mode | implementation | median | IQR | Newton sweeps | foreign |", "|---|---|---|---|---|---|---|"]
        for r in sorted(tune, key=lambda r: (r["B"], list(MODES).index(r["mode"]), r["median_s"])):
            lines.append(f"| {r['B']} | {r['mode']} | {r['impl']} | {fmt_t(r['median_s'])} | "
                         f"{fmt_t(r['q25_s'])}–{fmt_t(r['q75_s'])} | {_iters(r)} | {r['foreign']:.2f} |")
    lines += analysis(layer, tune)
    dest.write_text("\n".join(lines) + "\n")
    print(f"wrote {dest}")


# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--L", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--B", type=int, nargs="+", default=[4, 32])
    p.add_argument("--tune-L", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--parts", nargs="+", default=["check", "tune", "layer"], choices=["check", "tune", "layer"])
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=list(IMPLS))
    p.add_argument("--quiet-wait", type=float, default=30.0, help="wait ≤ this long for a quiet machine per table")
    p.add_argument("--round-wait", type=float, default=0.0, help="and ≤ this long before every round")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=HERE / "results" / "lrcssm.jsonl")
    p.add_argument("--report", action="store_true", help="render --out into --report-out and exit")
    p.add_argument("--report-out", type=Path, default=HERE / "REPORT_LRCSSM.md")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.report:
        report(args.out, args.report_out)
        return
    torch.set_num_threads(args.threads)
    run = uuid.uuid4().hex[:8]
    out = Writer(args.out, {"run": run, "threads": args.threads})
    t0 = time.perf_counter()
    if "check" in args.parts:
        errors = check_agreement()
        out.write({"kind": "check", "workload": "check", "impl": "all", "errors": errors, "median_s": None})
        print(f"check: worst relative difference {max(errors.values()):.1e}", flush=True)
    if "tune" in args.parts:
        for B in args.B:
            for mode in args.modes:
                run_block(args, out, "tune", B, args.tune_L, mode, tune_impls())
    if "layer" in args.parts:
        impls = {n: IMPLS[n] for n in args.impls}
        for B in args.B:
            for L in args.L:
                for mode in args.modes:
                    run_block(args, out, "layer", B, L, mode, impls)
    out.write({"kind": "run", "workload": "run", "impl": "-", "median_s": None, "machine": machine(),
               "cmd": "python benchmarks/bench_lrcssm.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "total_s": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    main()
