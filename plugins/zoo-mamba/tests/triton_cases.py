"""The Triton selective scan's reference cases, run as a script (not collected by pytest).

Why a script: Triton decides at a kernel's decoration whether it is interpreted (``TRITON_INTERPRET=1``
then runs it on CPU tensors), so the variable must be set before ``zoo_mamba.triton_scan`` is first
imported: a fresh process is the one place where that holds whatever else pytest imported before.
``test_triton_scan.py`` runs it under the interpreter on CPU and, where CUDA is available, on the GPU
without the interpreter; ``benchmarks/gpu_check.py`` runs it on the GPU.

Usage: ``python triton_cases.py --device cpu|cuda [--only NAME ...]``; prints one JSON object,
``{case: {"errors": {quantity: relative error}, "tol": tol} | {"error": message}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

F64_TOL, F32_TOL = 1e-10, 1e-5


def make(torch: Any, device: str, Bt: int = 2, L: int = 37, Di: int = 5, N: int = 3, *, static_B: bool = False,
         static_C: bool = False, D: bool = True, h0: bool = True, dtype: Any = None, seed: int = 0) -> dict[str, Any]:
    """Random inputs of the scan (float64 unless told), each requiring a gradient."""
    dtype = dtype or torch.float64
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    args = {
        "u": r(Bt, L, Di), "delta": torch.nn.functional.softplus(r(Bt, L, Di) - 1), "A": -torch.exp(r(Di, N) * 0.5),
        "B": r(Di, N) if static_B else r(Bt, L, N), "C": r(Di, N) if static_C else r(Bt, L, N),
        "D": r(Di) if D else None, "h0": r(Bt, Di, N) if h0 else None,
    }
    return {k: None if v is None else v.to(device=device, dtype=dtype).requires_grad_() for k, v in args.items()}


def outputs(torch: Any, fn: Callable[..., Any], args: dict[str, Any], *, use_y: bool = True, **packed: Any) -> dict[str, Any]:
    """y, the final state(s) and the gradient of every input for fixed random cotangents (float64 on CPU)."""
    y, h = fn(**args, **packed)
    g = torch.Generator().manual_seed(1)
    gy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y)
    gh = torch.randn(h.shape, generator=g, dtype=torch.float64).to(h)
    names = [k for k, v in args.items() if v is not None]
    loss = (h * gh).sum() + ((y * gy).sum() if use_y else 0)
    grads = torch.autograd.grad(loss, [args[k] for k in names], allow_unused=True)  # unused: C, D without y's cotangent
    grads = tuple(torch.zeros_like(args[k]) if gr is None else gr for k, gr in zip(names, grads, strict=True))
    out = {"y": y, "h_last": h, **{f"grad {k}": v for k, v in zip(names, grads, strict=True)}}
    return {k: v.detach().double().cpu() for k, v in out.items()}


def compare(torch: Any, ref: dict[str, Any], out: dict[str, Any]) -> dict[str, float]:
    if set(ref) != set(out):
        raise AssertionError(f"different results: {sorted(ref)} vs {sorted(out)}")
    return {k: ((out[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-30)).item() for k in ref}


def cases(torch: Any, device: str) -> dict[str, Callable[[], tuple[dict[str, float], float]]]:
    """Each case: inputs → (relative error per quantity, tolerance). Odd sizes throughout: L not a
    multiple of the chunk, Di not a multiple of BLOCK_D, N not a power of two."""
    from zoo_mamba.scan import selective_scan_naive
    from zoo_mamba.triton_scan import selective_scan_triton

    def vs_naive(chunk: int | None = 8, block_d: int | None = 4, dtype: Any = None, tol: float = F64_TOL,
                 packed: Callable[[Any], dict[str, Any]] | None = None, use_y: bool = True,
                 **kw: Any) -> Callable[[], tuple[dict[str, float], float]]:
        def run() -> tuple[dict[str, float], float]:
            ref_args = make(torch, "cpu", **kw)
            args = make(torch, device, dtype=dtype, **kw)
            extra = {} if packed is None else packed(ref_args["u"])
            ref = outputs(torch, selective_scan_naive, ref_args, use_y=use_y, **extra)
            def fn(**a: Any) -> tuple[Any, Any]:
                y, h = selective_scan_triton(**a, chunk=chunk, block_d=block_d)
                if y.dtype != a["u"].dtype or h.dtype != a["u"].dtype or y.device != a["u"].device:
                    raise AssertionError(f"results in {y.dtype}/{h.dtype} on {y.device} for {a['u'].dtype} inputs")
                return y, h

            out = outputs(torch, fn, args, use_y=use_y, **{k: v.to(device) for k, v in extra.items()})
            return compare(torch, ref, out), tol

        return run

    def docs(u: Any, last: bool = True) -> dict[str, Any]:
        g = torch.Generator().manual_seed(2)
        starts = torch.rand(u.shape[:2], generator=g) < 0.2
        ends = torch.rand(u.shape[:2], generator=g) < 0.2
        ends[:, -1] = last  # the row's last step ends its document (as packing does), or not
        ends[0, 3] = True
        return {"starts": starts, "ends": ends}

    def opcheck() -> tuple[dict[str, float], float]:
        """torch.library.opcheck: schema, fake implementation, autograd registration."""
        import zoo_mamba.triton_scan  # noqa: F401  (registers the op)

        a = make(torch, device, Bt=2, L=11, Di=3, N=2, dtype=torch.float32)
        result = torch.library.opcheck(torch.ops.zoo_mamba.selective_scan_triton.default,
                                       (a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["h0"], None, None, 0, 4, 2))
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        if bad:
            raise AssertionError(f"opcheck: {bad}")
        return {"opcheck": 0.0}, 0.0

    return {
        "input-dependent": vs_naive(L=27),
        "length-1": vs_naive(L=1),
        "one-chunk-default-blocks": vs_naive(chunk=None, block_d=None, L=21, Di=7),
        "two-chunks-default": vs_naive(chunk=None, block_d=None, L=67, Di=3, N=4, Bt=1),
        "chunk-1": vs_naive(chunk=1, L=9),
        "static-B-C-no-D-no-h0": vs_naive(static_B=True, static_C=True, D=False, h0=False, L=19),
        "static-B-h0": vs_naive(static_B=True, L=19),
        "static-C-no-D": vs_naive(static_C=True, D=False, h0=False, L=19),
        "N-1-block-8": vs_naive(N=1, L=13, Di=9, block_d=8),
        "N-16": vs_naive(N=16, L=13, Di=6),
        "packed": vs_naive(packed=docs, L=23),
        "packed-not-last-static": vs_naive(packed=lambda u: docs(u, last=False), L=21, static_B=True, static_C=True),
        "final-state-only": vs_naive(use_y=False, L=19),
        "packed-ends-only": vs_naive(packed=docs, use_y=False, L=19, D=False),
        "float32": vs_naive(dtype=torch.float32, tol=F32_TOL, L=23),
        "opcheck": opcheck,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", nargs="*", default=None)
    a = p.parse_args(argv)
    if a.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("--device cpu needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
        return 2
    import torch

    todo = cases(torch, a.device)
    report: dict[str, Any] = {}
    for name, fn in todo.items():
        if a.only and name not in a.only:
            continue
        try:
            t0 = time.perf_counter()
            errors, tol = fn()
            report[name] = {"errors": errors, "tol": tol, "seconds": round(time.perf_counter() - t0, 2)}
        except Exception as exc:
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
