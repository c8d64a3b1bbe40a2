"""S4 kernel and layer benchmark: kernel_cauchy against the naive kernel, a straightforward
broadcast Cauchy and pykeops, plus a full S4 layer at B=8, L=16384.

Method (shared/reference/perf-baselines.md, helpers in ``_common.py``): per block, a quiet-machine
wait, one warm-up call per implementation, then ``--repeats`` interleaved rounds with rotating
order. ``kernel_dplr_naive`` at L ≥ ``--naive-slow-L`` is timed in the first ``--naive-repeats``
rounds only and warmed up at L=256 (one call there takes 10+ s). Peak memory: a fresh subprocess
per (implementation, L, mode), VmHWM reset after imports, parameters and a small warm-up, minus
the RSS then. The layer runs in its own subprocess too (wall time and peak RSS).

Letters: B batch, L length, H channels (d_model), N state size, M = N/2 stored pairs,
F = L/2 + 1 frequencies.

    python benchmarks/bench_s4.py                 # full sweep, ~20 min on 2 quiet cores
    python benchmarks/bench_s4.py --L 1024 --parts kernel --only kernel_cauchy straightforward_cauchy
    python benchmarks/make_report.py --s4         # -> benchmarks/REPORT_S4.md

pykeops is optional (``pip install pykeops``); without it, or when it fails its run-time check,
its rows are recorded as skipped with the reason.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Call, Foreign, Writer, _rss_kib, machine, rel, reset_peak_rss, summary, time_block, wait_quiet  # noqa: E402
from straightforward_cauchy import check_agreement, straightforward_cauchy  # noqa: E402

from zoo_core.kernels import dplr  # noqa: E402
from zoo_core.kernels.dplr import kernel_cauchy, kernel_dplr_naive  # noqa: E402
from zoo_core.kernels.keops import runtime_reason  # noqa: E402
from zoo_core.kernels.systems import DPLRSystem  # noqa: E402
from zoo_s4.core import S4  # noqa: E402

IMPLS = ("kernel_cauchy", "kernel_dplr_naive", "straightforward_cauchy", "kernel_cauchy_keops")
KernelFn = Callable[[DPLRSystem, int], Tensor]


# ---------------------------------------------------------------------------------------
# implementations
# ---------------------------------------------------------------------------------------
def kernel_fns(keops: bool = True) -> dict[str, KernelFn]:
    """The implementations by name; pykeops' only when asked for and past its run-time check."""
    fns: dict[str, KernelFn] = {"kernel_cauchy": kernel_cauchy, "kernel_dplr_naive": kernel_dplr_naive,
                                "straightforward_cauchy": straightforward_cauchy}
    if keops and runtime_reason() is None:
        from zoo_core.kernels.keops import kernel_cauchy_keops

        fns["kernel_cauchy_keops"] = kernel_cauchy_keops
    return fns


def keops_version() -> str | None:
    try:
        return importlib.metadata.version("pykeops")
    except importlib.metadata.PackageNotFoundError:
        return None


def s4_layer(H: int, N: int, L: int, backend: str = "cauchy") -> S4:
    torch.manual_seed(0)
    return S4(d_model=H, d_state=N, l_max=L, backend=backend)


def kernel_call(fn: KernelFn, layer: S4, L: int, mode: str) -> Call:
    """One kernel step from the layer's parameters; fwdbwd also backpropagates into them."""
    grad_k = torch.randn(layer.d_model, L)  # (H, L)

    def fwd() -> None:
        with torch.no_grad():
            fn(layer._trained_system(), L)

    def fwdbwd() -> None:
        layer.zero_grad(set_to_none=True)
        fn(layer._trained_system(), L).backward(grad_k)

    return fwd if mode == "fwd" else fwdbwd


# ---------------------------------------------------------------------------------------
# correctness at start-up
# ---------------------------------------------------------------------------------------
def check_all(fns: dict[str, KernelFn], tol: float = 1e-4) -> dict[str, float]:
    """straightforward vs kernel_cauchy (outputs, gradients); naive and keops vs kernel_cauchy."""
    errors = {f"straightforward_cauchy {k}": v for k, v in check_agreement(tol).items()}
    for L in (37, 1000):
        layer = s4_layer(16, 64, L)
        with torch.no_grad():
            want = kernel_cauchy(layer._trained_system(), L)
            for name in ("kernel_dplr_naive", "kernel_cauchy_keops"):
                if name in fns:
                    errors[f"{name} K L={L}"] = rel(fns[name](layer._trained_system(), L), want)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"S4 kernels disagree with kernel_cauchy beyond {tol} relative: {bad}"
    return errors


# ---------------------------------------------------------------------------------------
# kernel timing and memory
# ---------------------------------------------------------------------------------------
def kernel_block(args: argparse.Namespace, out: Writer, fns: dict[str, KernelFn], L: int, mode: str,
                 keops_reason: str | None) -> None:
    workload = f"kernel L={L} {mode}"
    extra = {"kind": "kernel", "L": L, "mode": mode}
    if keops_reason is not None and selected(args, "kernel_cauchy_keops"):
        out.write({**extra, "workload": workload, "impl": "kernel_cauchy_keops", "status": "skipped",
                   "reason": keops_reason, "median_s": None})
    names = [n for n in IMPLS if n in fns and selected(args, n)]
    if not names:
        return
    layer = s4_layer(args.H, args.N, L)
    calls = {n: kernel_call(fns[n], layer, L, mode) for n in names}
    fewer, warm = {}, {}
    if "kernel_dplr_naive" in calls and L >= args.naive_slow_L:
        fewer["kernel_dplr_naive"] = args.naive_repeats
        warm["kernel_dplr_naive"] = kernel_call(kernel_dplr_naive, s4_layer(args.H, args.N, 256), 256, mode)
    print(f"{workload}: {', '.join(names)}", flush=True)
    times, foreign = time_block(calls, args.repeats, args.quiet_wait, fewer=fewer, warm=warm,
                                round_wait=args.round_wait)
    for name, ts in times.items():
        note = ("fewer repeats and warmed up at L=256: one call takes 10+ s" if name in fewer else None)
        out.write({**extra, "workload": workload, "impl": name, **summary(ts), "foreign": round(foreign, 3),
                   "status": "ok", "note": note})


def memory_rows(args: argparse.Namespace, out: Writer, fns: dict[str, KernelFn], L: int, mode: str) -> None:
    for name in [n for n in IMPLS if n in fns and selected(args, n)]:
        cmd = [sys.executable, __file__, "--memory-child", name, str(L), mode,
               "--H", str(args.H), "--N", str(args.N), "--threads", str(args.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"memory child {name} L={L} {mode} failed:\n{res.stderr[-2000:]}")
        row = json.loads(res.stdout.strip().splitlines()[-1])
        out.write({"kind": "memory", "workload": f"memory kernel L={L} {mode}", "impl": name, "L": L,
                   "mode": mode, "status": "ok", "median_s": None, **row,
                   "hnf_bytes": args.H * args.N * (L // 2 + 1) * 8})
        print(f"  memory kernel L={L} {mode:<7} {name:<24} peak +{row['peak_mib']:.1f} MiB", flush=True)


def memory_child(name: str, L: int, mode: str, H: int, N: int) -> None:
    """Runs in a fresh process: peak RSS of one kernel step above the RSS just before it."""
    fn = kernel_fns(keops=name == "kernel_cauchy_keops")[name]
    layer = s4_layer(H, N, L)
    call = kernel_call(fn, layer, L, mode)
    kernel_call(fn, s4_layer(H, N, 64), 64, mode)()  # warm-up: lazy library init, keops module load
    before = reset_peak_rss(trim=True)
    call()
    peak = _rss_kib("VmHWM")
    print(json.dumps({"peak_mib": (peak - before) / 1024, "rss_before_mib": before / 1024}))


# ---------------------------------------------------------------------------------------
# where kernel_cauchy spends its time
# ---------------------------------------------------------------------------------------
def profile_rows(args: argparse.Namespace, out: Writer, L: int) -> None:
    """Median times of kernel_cauchy's parts at one L: setup, Cauchy sums + Woodbury, irfft, backward."""
    layer = s4_layer(args.H, args.N, L)

    def setup() -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        lam, p, b, c, dt = dplr._cast(layer._trained_system())  # (H, M) ×4, (H)
        v = torch.stack([c * b, c * p, p.conj() * b, p.conj() * p], 1)  # (H, S, M)
        one_m, one_p = dplr._nodes(L, lam.dtype, lam.device)  # (F), (F)
        return v, dt[:, None] * lam, dt, one_m, one_p

    with torch.no_grad():
        v, dlam, dt, one_m, one_p = setup()
        khat = dplr._ChunkedKhat.apply(v, dlam, dt, one_m, one_p)  # (H, F)
    leaves = [x.clone().requires_grad_() for x in (v, dlam, dt)]
    khat_g = dplr._ChunkedKhat.apply(*leaves, one_m, one_p)  # (H, F), saves its inputs only
    grad_khat = torch.randn_like(khat)  # (H, F)

    def khat_backward() -> None:
        torch.autograd.grad(khat_g, leaves, grad_khat, retain_graph=True)

    def recompute() -> None:  # what the backward redoes before its gradients: chunks, graph recorded
        with torch.enable_grad():
            for c in dplr._chunks(one_m.shape[0], *dlam.shape):
                dplr._khat_chunk(*leaves, one_m[c], one_p[c])

    def no_grad(f: Callable[[], object]) -> Call:
        def call() -> None:
            with torch.no_grad():
                f()
        return call

    grad_k = torch.randn(args.H, L)

    def total_fwdbwd() -> None:
        layer.zero_grad(set_to_none=True)
        kernel_cauchy(layer._trained_system(), L).backward(grad_k)

    parts = {
        "setup (cast, numerators, nodes)": no_grad(setup),
        "Cauchy sums + Woodbury, forward": no_grad(lambda: dplr._ChunkedKhat.apply(v, dlam, dt, one_m, one_p)),
        "irfft": no_grad(lambda: torch.fft.irfft(khat, n=L)),
        "total forward": no_grad(lambda: kernel_cauchy(layer._trained_system(), L)),
        "Cauchy sums backward (recompute + grads)": khat_backward,
        "  of which: recompute with autograd recording": recompute,
        "total forward+backward": total_fwdbwd,
    }
    print(f"profile kernel_cauchy L={L}", flush=True)
    times, foreign = time_block(parts, args.repeats, args.quiet_wait, round_wait=args.round_wait)
    for name, ts in times.items():
        out.write({"kind": "profile", "workload": f"profile kernel_cauchy L={L}", "impl": name, "L": L,
                   "mode": "-", **summary(ts), "foreign": round(foreign, 3), "status": "ok",
                   "chunk_elements": dplr.CHUNK_ELEMENTS})


# ---------------------------------------------------------------------------------------
# the whole layer
# ---------------------------------------------------------------------------------------
def layer_rows(args: argparse.Namespace, out: Writer) -> None:
    """S4 forward+backward at B, L in a subprocess: auto, and cauchy too when auto picks another."""
    B, L = args.layer_B, args.layer_L
    backends = list(args.layer_backends)
    compare = backends == ["auto"]
    for backend in backends:
        cmd = [sys.executable, __file__, "--layer-child", str(B), str(L), backend, "--H", str(args.H),
               "--N", str(args.N), "--threads", str(args.threads), "--repeats", str(args.layer_repeats)]
        print(f"layer B={B} L={L} fwdbwd backend={backend} (subprocess)", flush=True)
        wait_quiet(args.quiet_wait)
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        row = {"kind": "layer", "workload": f"layer B={B} L={L} fwdbwd", "impl": f"S4 backend={backend}",
               "L": L, "B": B, "mode": "fwdbwd", "returncode": res.returncode, "process_wall_s": round(wall, 1)}
        if res.returncode != 0:
            out.write({**row, "status": "failed", "median_s": None, "reason": res.stderr[-3000:]})
            continue
        got = json.loads(res.stdout.strip().splitlines()[-1])
        out.write({**row, **got, "status": "ok"})
        if compare and backend == "auto" and got["choice"].get("kernel") != "cauchy":
            backends.append("cauchy")


def layer_child(B: int, L: int, backend: str, H: int, N: int, repeats: int) -> None:
    """Fresh process: one S4 layer, forward+backward at (B, L, H); times and peak RSS."""
    t0 = time.perf_counter()
    layer = s4_layer(H, N, L, backend)
    build_s = time.perf_counter() - t0
    torch.manual_seed(1)
    x = torch.randn(B, L, H, requires_grad=True)  # (B, L, H)
    grad_y = torch.randn(B, L, H)  # (B, L, H)

    def step(u: Tensor, g: Tensor) -> None:
        layer.zero_grad(set_to_none=True)
        u.grad = None
        layer(u).backward(g)

    small = x[:1, :64].detach().requires_grad_()
    step(small, grad_y[:1, :64])  # warm-up: the full L-kernel and its backward, a short convolution
    setup_peak = _rss_kib("VmHWM")  # this process's peak so far (exec starts a fresh count)
    before = reset_peak_rss(trim=True)
    meter = Foreign()
    meter.start()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step(x, grad_y)
        times.append(time.perf_counter() - t)
        if len(times) == 1:
            first_peak = _rss_kib("VmHWM")
    foreign = meter.stop()
    process_peak = max(setup_peak, _rss_kib("VmHWM"))
    print(json.dumps({"choice": layer.backend_choice.as_setting(), "label": layer.backend_choice.label(),
                      "build_s": round(build_s, 2), **summary(times), "foreign": round(foreign, 3),
                      "peak_mib": (first_peak - before) / 1024, "rss_before_mib": before / 1024,
                      "peak_rss_mib": first_peak / 1024, "process_peak_rss_mib": process_peak / 1024,
                      "input_mib": B * L * H * 4 / 2**20}))


# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------
def selected(args: argparse.Namespace, name: str) -> bool:
    return not args.only or name in args.only


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--L", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--H", type=int, default=256)
    p.add_argument("--N", type=int, default=64, help="state size N (N/2 complex pairs stored)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--naive-repeats", type=int, default=3,
                   help="timed rounds of kernel_dplr_naive at L ≥ --naive-slow-L")
    p.add_argument("--naive-slow-L", type=int, default=16384)
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", help="implementations: " + ", ".join(IMPLS))
    p.add_argument("--parts", nargs="+", default=["kernel", "memory", "profile", "layer"],
                   choices=["kernel", "memory", "profile", "layer"])
    p.add_argument("--profile-L", type=int, default=16384)
    p.add_argument("--layer-B", type=int, default=8)
    p.add_argument("--layer-L", type=int, default=16384)
    p.add_argument("--layer-repeats", type=int, default=3)
    p.add_argument("--layer-backends", nargs="+", default=["auto"],
                   help="S4 backend settings for the layer rows; the default 'auto' adds 'cauchy' when auto "
                        "picks another kernel")
    p.add_argument("--quiet-wait", type=float, default=30.0,
                   help="seconds each block waits at most for a quiet machine (<0.25 foreign cores)")
    p.add_argument("--round-wait", type=float, default=30.0,
                   help="seconds each timed round also waits at most for a quiet machine (0: only per block)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "s4.jsonl")
    p.add_argument("--memory-child", nargs=3, metavar=("IMPL", "L", "MODE"), help=argparse.SUPPRESS)
    p.add_argument("--layer-child", nargs=3, metavar=("B", "L", "BACKEND"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    if args.memory_child:
        name, L, mode = args.memory_child
        return memory_child(name, int(L), mode, args.H, args.N)
    if args.layer_child:
        B, L, backend = args.layer_child
        return layer_child(int(B), int(L), backend, args.H, args.N, args.repeats)
    t0 = time.perf_counter()
    run_id = uuid.uuid4().hex[:8]
    cmd = "python benchmarks/bench_s4.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Writer(args.out, {"bench": "s4", "run": run_id, "threads": args.threads, "H": args.H, "N": args.N})
    keops_reason = runtime_reason()  # compiles on a first run (tens of seconds), cached afterwards
    fns = kernel_fns()
    errors = check_all(fns)
    out.write({"kind": "check", "workload": "agreement vs kernel_cauchy (relative L2, float32)",
               "impl": "all", "errors": errors, "keops_reason": keops_reason, "median_s": None})
    print(f"agreement check passed: max relative error {max(errors.values()):.2e}; "
          f"keops: {keops_reason or 'available'}", flush=True)
    for L in args.L:
        for mode in args.modes:
            if "kernel" in args.parts:
                kernel_block(args, out, fns, L, mode, keops_reason)
            if "memory" in args.parts:
                memory_rows(args, out, fns, L, mode)
    if "profile" in args.parts:
        profile_rows(args, out, args.profile_L)
    if "layer" in args.parts:
        layer_rows(args, out)
    total = time.perf_counter() - t0
    out.write({"kind": "run", "workload": "run", "impl": "-", "cmd": cmd, "machine": machine(),
               "interop_threads": torch.get_num_interop_threads(), "total_s": round(total, 1),
               "keops_reason": keops_reason, "keops_version": keops_version(),
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "median_s": None})
    print(f"done in {total / 60:.1f} min; rows appended to {args.out}", flush=True)


if __name__ == "__main__":
    main()
