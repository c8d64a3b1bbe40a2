"""The GPU check of issue 16: kernel tests on CUDA, a Mamba model through the Triton backend, every
core built on CPU and moved to the GPU (one training step each), the Triton selective scan timed
against the chunked PyTorch path (and mamba-ssm where it imports), and the Triton diagonal scan
against the parallel PyTorch scan.

Run through ``benchmarks/gpu_check.sh`` on a machine with a GPU (it installs the project first and
says how to call it with the device tool); ``python benchmarks/gpu_check.py --dry-run`` runs the whole
flow on CPU under Triton's interpreter at tiny sizes (that is what CI-less machines can check).

Every phase appends to one JSON file (``$OUT/gpu_check.json`` when ``OUT`` is set, else
``benchmarks/results/gpu_check.json``), rewritten after each phase so a run stopped at its time limit
still returns what it measured. Phases past ``--budget-s`` seconds are skipped and say so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if "--dry-run" in sys.argv:  # Triton reads it when the kernels are decorated: before any import of them
    os.environ["TRITON_INTERPRET"] = "1"

SIZES = [(8, 4096, 128, 16), (16, 8192, 1536, 16)]  # (Bt, L, Di, N): issue 16's target, then a larger layer
DRY_SIZES = [(1, 16, 4, 4)]
DIAG_SIZES = [(32, 4096, 64, 64)]  # (B, L, H, N): issue 16's target for the other scans
DRY_DIAG_SIZES = [(1, 8, 2, 3)]


class Report:
    """The JSON result, written after every phase."""

    def __init__(self, path: Path) -> None:
        self.path, self.data = path, {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "phases": {}}
        path.parent.mkdir(parents=True, exist_ok=True)

    def put(self, phase: str, value: Any) -> None:
        self.data["phases"][phase] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)
        print(f"[gpu_check] {phase}: {json.dumps(value, default=str)[:600]}", flush=True)


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.cuda.is_available(), "triton_interpret": os.environ.get("TRITON_INTERPRET")}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"not importable: {exc}"
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    try:
        import mamba_ssm  # noqa: F401

        env["mamba_ssm"] = "importable"
    except Exception as exc:
        env["mamba_ssm"] = f"not importable: {type(exc).__name__}"
    return env


def pytest_phase(args: list[str], timeout: float) -> dict[str, Any]:
    """pytest in a subprocess; its summary line and failures."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"cmd": " ".join(cmd), "error": f"timed out after {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    return {"cmd": " ".join(cmd[3:]), "rc": proc.returncode, "summary": lines[-1] if lines else proc.stderr[-500:],
            "failures": [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:30], "seconds": round(time.perf_counter() - t0, 1)}


def model_check(device: str) -> dict[str, Any]:
    """A Mamba layer (and MambaSL's time-invariant switches) through ``backend='triton'`` against the
    naive backend: outputs and every parameter's gradient, float32; and what ``auto`` picks."""
    import torch

    from zoo_core.errors import BackendUnavailableError
    from zoo_mamba.core import Mamba

    out: dict[str, Any] = {"auto": Mamba(8, device=device).backend_choice.label()}
    if device != "cuda":  # the dry run: the backend must refuse CPU tensors, with its reason
        try:
            Mamba(8, backend="triton", device=device)
        except BackendUnavailableError as exc:
            return {**out, "refused_on_cpu": str(exc)}
        raise AssertionError("backend='triton' accepted a CPU model")
    for name, kw in {"mamba": {}, "mambasl": {"tv_dt": False, "tv_B": False, "tv_C": False, "use_D": False, "expand": 1}}.items():
        torch.manual_seed(0)
        ref = Mamba(8, d_state=5, backend="naive", device=device, **kw)
        fast = Mamba(8, d_state=5, backend="triton", device=device, **kw)
        fast.load_state_dict(ref.state_dict())
        x = torch.randn(3, 45, 8, device=device)
        errs = {}
        y_r, y_f = ref(x), fast(x)
        errs["y"] = ((y_f - y_r).norm() / y_r.norm()).item()
        g = torch.randn_like(y_r)
        (y_r * g).sum().backward()
        (y_f * g).sum().backward()
        for (n, p_r), p_f in zip(ref.named_parameters(), fast.parameters(), strict=True):
            errs[f"grad {n}"] = ((p_f.grad - p_r.grad).norm() / p_r.grad.norm().clamp_min(1e-30)).item()
        out[name] = {"max_rel_err": max(errs.values()), "ok": max(errs.values()) < 1e-4, "errors": errs}
    return out


def move_check(device: str) -> dict[str, Any]:
    """Every registered core in a small classifier built on CPU and then moved (``model.to(device)``,
    what ``zoo train`` and most users do): the backend each core binds after the move, and one forward
    and backward step there. A core that kept a CPU-only op after the move fails here (it did:
    S5, LRU, LinOSS and Mamba before 2026-12-04). The dry run moves to meta and only reads the labels."""
    import torch

    from zoo_core.build import build_model
    from zoo_core.corebase import CoreBase
    from zoo_core.plugins import get_registry
    from zoo_core.spec import load_spec

    target = device if device == "cuda" else "meta"
    out: dict[str, Any] = {}
    for name in sorted(get_registry().cores):
        core = {"kind": name, "n_heads": 2} if name.startswith("attention") else {"kind": name, "preset": "tiny"}
        try:
            spec = load_spec({"schema_version": 1, "name": f"{name}-moved", "task": {"kind": "classification", "classes": 3},
                              "input": {"channels": 4}, "model": {"d_model": 16, "depth": 2, "core": core}})
            model = build_model(spec, seed=0).to(target)
            labels = sorted({m.backend_choice.label() for m in model.modules() if isinstance(m, CoreBase)})
            row: dict[str, Any] = {"backends": labels}
            if target == "cuda":
                x = torch.randn(2, 64, 4, device=target)
                model(x).sum().backward()
                row["grad_finite"] = all(bool(torch.isfinite(q.grad).all()) for q in model.parameters() if q.grad is not None)
            out[name] = {**row, "ok": row.get("grad_finite", True)}
        except Exception as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    return out


def timeit(fn: Callable[[], Any], sync: Callable[[], None], repeats: int, warmup: int = 1) -> float:
    """Median milliseconds of ``repeats`` calls after ``warmup`` (the first compiles Triton's kernels)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def bench(device: str, sizes: list[tuple[int, int, int, int]], repeats: int, deadline: float) -> list[dict[str, Any]]:
    """Forward and forward+backward of each implementation at each size, float32; the Triton results'
    agreement with the chunked path at that size (relative error of y, h and the gradients)."""
    import torch

    from zoo_mamba import scan as S
    from zoo_mamba.triton_scan import selective_scan_triton

    impls: dict[str, Callable[..., Any]] = {"triton": selective_scan_triton, "chunked": S.selective_scan_chunked}
    try:
        S._cuda_kernel()
        if device == "cuda":
            impls["mamba-ssm"] = S.selective_scan_cuda
    except Exception:
        pass
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows: list[dict[str, Any]] = []
    for bt, L, di, n in sizes:
        size = {"Bt": bt, "L": L, "Di": di, "N": n}
        if time.perf_counter() > deadline:
            rows.append({**size, "skipped": "past the time budget"})
            continue
        g = torch.Generator(device=device).manual_seed(0)
        args = [torch.randn(bt, L, di, device=device, generator=g),
                torch.nn.functional.softplus(torch.randn(bt, L, di, device=device, generator=g) - 2),
                -torch.exp(torch.randn(di, n, device=device, generator=g) * 0.5),
                torch.randn(bt, L, n, device=device, generator=g), torch.randn(bt, L, n, device=device, generator=g),
                torch.randn(di, device=device, generator=g)]
        gy = torch.randn(bt, L, di, device=device, generator=g)
        results: dict[str, Any] = {}
        for name, fn in impls.items():
            if time.perf_counter() > deadline:
                results[name] = {"skipped": "past the time budget"}
                continue
            leaves = [a.clone().requires_grad_() for a in args]

            def fwd(fn: Callable[..., Any] = fn, args: list[Any] = args) -> Any:
                with torch.no_grad():
                    return fn(*args)

            def fwd_bwd(fn: Callable[..., Any] = fn, leaves: list[Any] = leaves, gy: Any = gy) -> Any:
                y, h = fn(*leaves)
                return torch.autograd.grad((y * gy).sum() + h.sum(), leaves)

            try:
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                reps = repeats if bt * L * di <= 8 * 4096 * 128 else max(1, (repeats + 1) // 2)  # the large size: fewer
                results[name] = {"fwd_ms": timeit(fwd, sync, reps), "fwd_bwd_ms": timeit(fwd_bwd, sync, reps), "repeats": reps}
                if device == "cuda":
                    results[name]["peak_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            except Exception as exc:
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        try:  # agreement at this size: the Triton kernel against the chunked path (both float32)
            leaves_t = [a.clone().requires_grad_() for a in args]
            leaves_c = [a.clone().requires_grad_() for a in args]
            y_t, h_t = selective_scan_triton(*leaves_t)
            y_c, h_c = S.selective_scan_chunked(*leaves_c)
            gt = torch.autograd.grad((y_t * gy).sum() + h_t.sum(), leaves_t)
            gc = torch.autograd.grad((y_c * gy).sum() + h_c.sum(), leaves_c)
            grads = zip("u delta A B C D".split(), zip(gt, gc, strict=True), strict=True)
            pairs = {"y": (y_t, y_c), "h": (h_t, h_c), **{f"grad {k}": v for k, v in grads}}
            results["triton_vs_chunked_rel_err"] = {k: ((a - b).norm() / b.norm()).item() for k, (a, b) in pairs.items()}
        except Exception as exc:
            results["triton_vs_chunked_rel_err"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        for base in ("chunked", "mamba-ssm"):
            t, b = results.get("triton", {}), results.get(base, {})
            if "fwd_ms" in t and "fwd_ms" in b:
                results[f"speedup_vs_{base}"] = {"fwd": round(b["fwd_ms"] / t["fwd_ms"], 3),
                                                 "fwd_bwd": round(b["fwd_bwd_ms"] / t["fwd_bwd_ms"], 3)}
        rows.append({**size, **results})
    return rows


def bench_diag(device: str, sizes: list[tuple[int, int, int, int]], repeats: int, deadline: float) -> list[dict[str, Any]]:
    """The diagonal scan (zoo-core's op ``scan``), real float32 and complex64, time-varying a: the Triton
    kernel against the parallel PyTorch scan (``scan``, auto's choice on GPUs before it) at (B, L, H, N)."""
    import torch

    from zoo_core.kernels.scan import scan_parallel
    from zoo_core.kernels.triton_diag import scan_triton

    impls: dict[str, Callable[..., Any]] = {"triton-diag": scan_triton, "parallel": scan_parallel}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows: list[dict[str, Any]] = []
    for bt, L, h, n in sizes:
        for dtype in (torch.float32, torch.complex64):
            size = {"B": bt, "L": L, "H": h, "N": n, "dtype": str(dtype).replace("torch.", "")}
            if time.perf_counter() > deadline:
                rows.append({**size, "skipped": "past the time budget"})
                continue
            g = torch.Generator(device=device).manual_seed(0)
            mag = torch.rand(bt, L, h, n, device=device, generator=g) * 0.2 + 0.79
            a = mag if not dtype.is_complex else torch.polar(mag, torch.rand(bt, L, h, n, device=device, generator=g))
            b = torch.randn(bt, L, h, n, device=device, generator=g, dtype=dtype)
            results: dict[str, Any] = {}
            for name, fn in impls.items():
                if time.perf_counter() > deadline:
                    results[name] = {"skipped": "past the time budget"}
                    continue
                leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]

                def fwd(fn: Callable[..., Any] = fn, ab: tuple[Any, Any] = (a, b)) -> Any:
                    with torch.no_grad():
                        return fn(*ab)

                def fwd_bwd(fn: Callable[..., Any] = fn, leaves: list[Any] = leaves) -> Any:
                    h_all, h_last = fn(*leaves)
                    return torch.autograd.grad(h_all.real.sum() + h_last.real.sum(), leaves)

                try:
                    if device == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    results[name] = {"fwd_ms": timeit(fwd, sync, repeats), "fwd_bwd_ms": timeit(fwd_bwd, sync, repeats)}
                    if device == "cuda":
                        results[name]["peak_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
                except Exception as exc:
                    results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            t, p = results.get("triton-diag", {}), results.get("parallel", {})
            if "fwd_ms" in t and "fwd_ms" in p:
                results["speedup_vs_parallel"] = {"fwd": round(p["fwd_ms"] / t["fwd_ms"], 3),
                                                  "fwd_bwd": round(p["fwd_bwd_ms"] / t["fwd_bwd_ms"], 3)}
            rows.append({**size, **results})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny sizes: the flow, not the figures")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default $OUT/gpu_check.json or benchmarks/results/gpu_check.json)")
    p.add_argument("--budget-s", type=float, default=360.0, help="skip phases that would start after this many seconds")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-tests", action="store_true")
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    deadline = t_start + a.budget_s
    out = a.out or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else ROOT / "benchmarks/results/gpu_check.json")
    report = Report(out)
    import torch

    report.put("environment", environment())
    device = "cpu" if a.dry_run else "cuda"
    if not a.dry_run and not torch.cuda.is_available():
        report.put("error", "no CUDA device: run with --dry-run on a CPU machine")
        return 1
    if not a.skip_tests:
        mamba_tests = "plugins/zoo-mamba/tests"
        if a.dry_run:  # the flow only: the in-process checks of the Triton tests (the interpreted cases are CI's)
            report.put("kernel_tests", pytest_phase([f"{mamba_tests}/test_triton_scan.py", "tests/kernels/test_triton_diag.py",
                                                     "-k", "backend or probe or auto"], 300))
        else:  # the reference cases compiled on the GPU (the interpreted run is CI's), then the conformance suite
            report.put("kernel_tests", pytest_phase([f"{mamba_tests}/test_triton_scan.py", "tests/kernels/test_triton_diag.py",
                                                     "-k", "not cpu-interpreted"], 240))
            report.put("mamba_plugin_tests", pytest_phase([f"{mamba_tests}/test_mamba_conformance.py", f"{mamba_tests}/test_scan.py",
                                                           "-x"], max(30.0, deadline - time.perf_counter() - 150)))
    try:
        report.put("model_check", model_check(device))
    except Exception as exc:
        report.put("model_check", {"error": f"{type(exc).__name__}: {exc}"[:1000]})
    try:
        report.put("move_check", move_check(device))
    except Exception as exc:
        report.put("move_check", {"error": f"{type(exc).__name__}: {exc}"[:1000]})
    report.put("bench", bench(device, DRY_SIZES if a.dry_run else SIZES, 1 if a.dry_run else a.repeats, deadline))
    report.put("bench_diag", bench_diag(device, DRY_DIAG_SIZES if a.dry_run else DIAG_SIZES, 1 if a.dry_run else 3, deadline))
    report.put("seconds", round(time.perf_counter() - t_start, 1))
    print(f"[gpu_check] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
