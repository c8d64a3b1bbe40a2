"""S4D layer and kernel benchmark: zoo backends side by side with a straightforward S4D.

Method (shared/reference/perf-baselines.md): one warm-up call per implementation, then
``--repeats`` rounds; each round runs every implementation of a block once, rotating the order,
so machine drift hits all alike. Each block first waits (≤ --quiet-wait s) for a quiet machine and records
``foreign``, the cores used by other processes while it ran. Peak memory of the kernel step is
measured in a fresh subprocess per (implementation, L, mode): peak RSS (VmHWM, reset through
/proc/self/clear_refs after imports, parameter creation and a small warm-up) minus the RSS then.

Letters: B batch, L length, H channels (d_model), N state size, P = N/2 conjugate pairs.

    python benchmarks/bench_s4d.py                      # full sweep, ~15 min on 2 quiet cores
    python benchmarks/bench_s4d.py --L 1024 --modes fwd --only straightforward zoo_vandermonde_fft
    python benchmarks/make_report.py                    # -> benchmarks/REPORT.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Call, Writer, _rss_kib, layer_call, machine, rel, summary, time_block  # noqa: E402
from straightforward_s4d import StraightforwardS4D, copy_from_zoo  # noqa: E402

from zoo_core.discretize import zoh  # noqa: E402
from zoo_core.kernels.kernel import kernel_naive, kernel_vandermonde  # noqa: E402
from zoo_core.kernels.systems import DiagSystem  # noqa: E402
from zoo_s4d.core import S4D  # noqa: E402

TOKENS = 16384  # default B = TOKENS // L: B·L·H·4 = 16 MiB of input, conv-path peak ≤ ~0.3 GiB
LAYER_BACKENDS = {
    "zoo_vandermonde_fft": {"kernel": "vandermonde", "conv": "fft"},
    "zoo_naive_kernel_fft": {"kernel": "naive", "conv": "fft"},
    "zoo_scan_parallel": {"scan": "scan"},
    "zoo_scan_naive": {"scan": "naive"},
}
SCAN_IMPLS = ("zoo_scan_parallel", "zoo_scan_naive")
NAIVE_SCAN_MAX_L = 1024  # zoo_scan_naive is a python loop over L: forward only, L ≤ this
KERNEL_IMPLS = ("straightforward_kernel", "kernel_vandermonde", "kernel_naive")


# ---------------------------------------------------------------------------------------
# implementations
# ---------------------------------------------------------------------------------------
def zoo_layers(H: int, N: int, names: list[str]) -> tuple[S4D, dict[str, nn.Module]]:
    """One zoo S4D per backend, all holding the parameters of the first; plus the reference."""
    torch.manual_seed(0)
    ref = S4D(d_model=H, d_state=N)
    layers: dict[str, nn.Module] = {"straightforward": copy_from_zoo(ref)}
    for name in names:
        layer = S4D(d_model=H, d_state=N, backend=LAYER_BACKENDS[name])
        layer.load_state_dict(ref.state_dict())
        layers[name] = layer
    return ref, layers


def zoo_system(layer: StraightforwardS4D) -> DiagSystem:
    """The zoo's kernel input for the layer's parameters: ZOH, w = 2·C·B̄ over P pairs."""
    A = torch.complex(-torch.exp(layer.log_A_real), layer.A_imag)  # (H, P)
    d = zoh(A, torch.view_as_complex(layer.B), torch.exp(layer.log_dt)[:, None], structure="diag")
    return DiagSystem(d.log_a, 2 * torch.view_as_complex(layer.C) * d.b)  # (H, P) each


def kernel_fn(name: str, layer: StraightforwardS4D) -> Callable[[int], Tensor]:
    if name == "straightforward_kernel":
        return layer.kernel
    fn = {"kernel_vandermonde": kernel_vandermonde, "kernel_naive": kernel_naive}[name]
    return lambda L: fn(zoo_system(layer), L)




def kernel_call(fn: Callable[[int], Tensor], layer: nn.Module, L: int, mode: str) -> Call:
    grad_k = torch.randn(layer.D.shape[0], L)  # (H, L)

    def fwd() -> None:
        with torch.no_grad():
            fn(L)

    def fwdbwd() -> None:
        layer.zero_grad(set_to_none=True)
        fn(L).backward(grad_k)

    return fwd if mode == "fwd" else fwdbwd


# ---------------------------------------------------------------------------------------
# correctness at start-up
# ---------------------------------------------------------------------------------------
def check_agreement(tol: float = 1e-4) -> dict:
    """Every zoo backend and kernel against the straightforward layer, float32, small sizes."""
    errors = {}
    for L in (37, 1000):  # an odd length on purpose
        ref, layers = zoo_layers(16, 64, list(LAYER_BACKENDS))
        x = torch.randn(2, L, 16)
        with torch.no_grad():
            want = layers["straightforward"](x)
            for name, layer in layers.items():
                if name != "straightforward":
                    errors[f"{name} L={L}"] = rel(layer(x), want)
            sf = layers["straightforward"]
            for name in KERNEL_IMPLS[1:]:
                errors[f"{name} L={L}"] = rel(kernel_fn(name, sf)(L), sf.kernel(L))
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"zoo S4D disagrees with the straightforward layer beyond {tol} relative: {bad}"
    return errors


# ---------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------
def write_block(out: Writer, workload: str, extra: dict, calls: dict[str, Call],
                args: argparse.Namespace) -> None:
    times, foreign = time_block(calls, args.repeats, args.quiet_wait)
    for name, ts in times.items():
        out.write({"kind": extra["kind"], "workload": workload, "impl": name, **extra, **summary(ts),
                   "foreign": round(foreign, 3), "status": "ok"})


# ---------------------------------------------------------------------------------------
# workloads
# ---------------------------------------------------------------------------------------
def layer_plan(L: int, mode: str, B: int, scan_B: int) -> list[tuple[str, int, list[str], dict[str, str]]]:
    """Blocks for one (L, mode): (kind, batch, implementations to time, skipped with reasons)."""
    naive_ok = L <= NAIVE_SCAN_MAX_L and mode == "fwd"
    run = ["straightforward", "zoo_vandermonde_fft", "zoo_naive_kernel_fft"]
    skipped = {}
    if naive_ok:
        run.append("zoo_scan_naive")
    else:
        skipped["zoo_scan_naive"] = (f"python loop over L: timed for forward at L ≤ {NAIVE_SCAN_MAX_L} "
                                     "only (its backward walks L autograd nodes)")
    if B == scan_B:
        return [("layer", B, run + ["zoo_scan_parallel"], skipped)]
    skipped["zoo_scan_parallel"] = (f"timed at B={scan_B} in the 'recurrent' block: at B·L={B * L} it "
                                    "materialises several (B, L, H, P) complex tensors (~10 GiB peak, "
                                    "~30 s forward, ~70 s forward+backward at L=1024)")
    rec = ["straightforward", "zoo_vandermonde_fft", "zoo_scan_parallel"] + (["zoo_scan_naive"] if naive_ok else [])
    return [("layer", B, run, skipped), ("recurrent", scan_B, rec, {})]


def layer_blocks(args: argparse.Namespace, out: Writer, L: int, mode: str) -> None:
    B = args.B or max(1, TOKENS // L)
    for kind, b, run, skipped in layer_plan(L, mode, B, args.scan_B):
        workload = f"{kind} B={b} L={L} {mode}"
        for name, reason in skipped.items():
            if selected(args, name):
                out.write({"kind": kind, "workload": workload, "impl": name, "L": L, "B": b,
                           "mode": mode, "status": "skipped", "reason": reason, "median_s": None})
        names = [n for n in run if selected(args, n)]
        if not names or (kind == "recurrent" and not any(n in SCAN_IMPLS for n in names)):
            continue
        _, layers = zoo_layers(args.H, args.N, [n for n in names if n != "straightforward"])
        torch.manual_seed(1)
        x = torch.randn(b, L, args.H)  # (B, L, H)
        calls = {n: layer_call(layers[n], x.clone(), mode) for n in names}
        print(f"{workload}: {', '.join(names)}", flush=True)
        write_block(out, workload, {"kind": kind, "L": L, "B": b, "mode": mode}, calls, args)


def kernel_block(args: argparse.Namespace, out: Writer, L: int, mode: str) -> None:
    names = [n for n in KERNEL_IMPLS if selected(args, n)]
    if not names:
        return
    _, layers = zoo_layers(args.H, args.N, [])
    layer = layers["straightforward"]
    calls = {n: kernel_call(kernel_fn(n, layer), layer, L, mode) for n in names}
    workload = f"kernel L={L} {mode}"
    print(f"{workload}: {', '.join(names)}", flush=True)
    write_block(out, workload, {"kind": "kernel", "L": L, "B": None, "mode": mode}, calls, args)


def memory_rows(args: argparse.Namespace, out: Writer, L: int, mode: str) -> None:
    for name in KERNEL_IMPLS:
        if not selected(args, name):
            continue
        cmd = [sys.executable, __file__, "--memory-child", name, str(L), mode,
               "--H", str(args.H), "--N", str(args.N), "--threads", str(args.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"memory child {name} L={L} {mode} failed:\n{res.stderr[-2000:]}")
        row = json.loads(res.stdout.strip().splitlines()[-1])
        out.write({"kind": "memory", "workload": f"memory kernel L={L} {mode}", "impl": name, "L": L,
                   "mode": mode, "status": "ok", "median_s": None, **row,
                   "vandermonde_bytes": args.H * (args.N // 2) * L * 8})
        print(f"  memory kernel L={L} {mode:<7} {name:<24} peak +{row['peak_mib']:.1f} MiB", flush=True)


def memory_child(name: str, L: int, mode: str, H: int, N: int) -> None:
    """Runs in a fresh process: peak RSS of one kernel step above the RSS just before it."""
    _, layers = zoo_layers(H, N, [])
    layer = layers["straightforward"]
    call = kernel_call(kernel_fn(name, layer), layer, L, mode)
    kernel_call(kernel_fn(name, layer), layer, 64, mode)()  # warm-up: lazy library init
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (peak RSS) to the current RSS
    before = _rss_kib("VmRSS")
    call()
    peak = _rss_kib("VmHWM")
    print(json.dumps({"peak_mib": (peak - before) / 1024, "rss_before_mib": before / 1024}))


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
    p.add_argument("--B", type=int, default=None, help=f"batch; default {TOKENS} // L (16/4/1)")
    p.add_argument("--scan-B", type=int, default=1,
                   help="batch of the recurrent (scan) backends, timed in their own block with "
                        "straightforward and zoo_vandermonde_fft beside them when it differs from B")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="implementations: straightforward, " + ", ".join(LAYER_BACKENDS) + ", "
                        + ", ".join(KERNEL_IMPLS))
    p.add_argument("--parts", nargs="+", default=["layer", "kernel", "memory"],
                   choices=["layer", "kernel", "memory"])
    p.add_argument("--quiet-wait", type=float, default=30.0,
                   help="seconds each block waits at most for a quiet machine (<0.25 foreign cores)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "s4d.jsonl")
    p.add_argument("--memory-child", nargs=3, metavar=("IMPL", "L", "MODE"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    if args.memory_child:
        name, L, mode = args.memory_child
        return memory_child(name, int(L), mode, args.H, args.N)
    t0 = time.perf_counter()
    run_id = uuid.uuid4().hex[:8]
    cmd = "python benchmarks/bench_s4d.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Writer(args.out, {"bench": "s4d", "run": run_id, "threads": args.threads, "H": args.H, "N": args.N})
    errors = check_agreement()
    out.write({"kind": "check", "workload": "agreement vs straightforward (relative L2, float32)",
               "impl": "all", "errors": errors, "median_s": None})
    print(f"agreement check passed: max relative error {max(errors.values()):.2e}", flush=True)
    for L in args.L:
        for mode in args.modes:
            if "layer" in args.parts:
                layer_blocks(args, out, L, mode)
            if "kernel" in args.parts:
                kernel_block(args, out, L, mode)
            if "memory" in args.parts:
                memory_rows(args, out, L, mode)
    total = time.perf_counter() - t0
    out.write({"kind": "run", "workload": "run", "impl": "-", "cmd": cmd, "machine": machine(),
               "interop_threads": torch.get_num_interop_threads(), "total_s": round(total, 1),
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "median_s": None})
    print(f"done in {total / 60:.1f} min; rows appended to {args.out}", flush=True)


if __name__ == "__main__":
    main()
