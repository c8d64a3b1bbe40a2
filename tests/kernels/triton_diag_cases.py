"""The Triton diagonal scan's reference cases, run as a script (not collected by pytest).

Why a script: Triton decides at a kernel's decoration whether it is interpreted, so
``TRITON_INTERPRET=1`` must be set before ``zoo_core.kernels.triton_diag`` is first imported; a fresh
process guarantees it. ``test_triton_diag.py`` runs it on CPU under the interpreter and, where CUDA is
available, compiled on the GPU.

Usage: ``python triton_diag_cases.py --device cpu|cuda``; prints one JSON object,
``{case: {"errors": {quantity: relative error}, "tol": tol} | {"error": message}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

TOL = 1e-10


def case(torch: Any, device: str, *, complex_a: bool, complex_b: bool, tv: bool = False, reset: bool = False, h0: bool = True,
         S: tuple[int, ...] = (3, 5), L: int = 13, B: int = 2, block_s: int | None = 8) -> dict[str, float]:
    """Values, final state and every gradient of scan_triton against scan_naive (float64 / complex128)."""
    from zoo_core.kernels.scan import scan_naive
    from zoo_core.kernels.triton_diag import scan_triton

    g = torch.Generator().manual_seed(0)
    da = torch.complex128 if complex_a else torch.float64
    db = torch.complex128 if complex_b else torch.float64
    a0 = torch.rand((1, 1, *S) if tv else (B, L, *S), generator=g, dtype=da) * 0.95
    b0 = torch.randn(B, L, *S, generator=g, dtype=db)
    h00 = torch.randn(B, *S, generator=g, dtype=db) if h0 else None
    r0 = (torch.rand(B, L, generator=g) < 0.25) if reset else None

    def run(fn: Callable[..., Any], dev: str) -> list[Any]:
        leaves = [x.to(dev).requires_grad_() for x in (a0, b0, h00) if x is not None]
        a, b = leaves[0], leaves[1]
        h_all, h_last = fn(a, b, leaves[2] if h0 else None, reset=None if r0 is None else r0.to(dev))
        gg = torch.Generator().manual_seed(1)
        ga = torch.randn(h_all.shape, generator=gg, dtype=h_all.dtype).to(dev)
        gl = torch.randn(h_last.shape, generator=gg, dtype=h_last.dtype).to(dev)
        loss = (h_all * ga.conj()).real.sum() + (h_last * gl.conj()).real.sum()
        grads = torch.autograd.grad(loss, leaves)
        return [x.detach().cpu() for x in (h_all, h_last, *grads)]

    ref = run(scan_naive, "cpu")
    out = run(lambda *x, **k: scan_triton(*x, **k, block_s=block_s), device)
    names = ["h_all", "h_last", "grad a", "grad b"] + (["grad h0"] if h0 else [])
    errors = {}
    for n, o, r in zip(names, out, ref, strict=True):
        if o.dtype != r.dtype or o.shape != r.shape:
            raise AssertionError(f"{n}: {o.dtype} {tuple(o.shape)} instead of {r.dtype} {tuple(r.shape)}")
        errors[n] = ((o - r).norm() / r.norm().clamp_min(1e-30)).item()
    return errors


def opcheck(torch: Any, device: str) -> dict[str, float]:
    import zoo_core.kernels.triton_diag  # noqa: F401  (registers the op)

    g = torch.Generator().manual_seed(0)
    for dt in (torch.float32, torch.complex64):
        a = (torch.rand(2, 7, 5, generator=g, dtype=dt) * 0.9).to(device).requires_grad_()
        b = torch.randn(2, 7, 5, generator=g, dtype=dt).to(device).requires_grad_()
        h0 = torch.randn(2, 5, generator=g, dtype=dt).to(device).requires_grad_()
        result = torch.library.opcheck(torch.ops.zoo_core.diag_scan_triton.default, (a, b, h0, None, 4))
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        if bad:
            raise AssertionError(f"opcheck ({dt}): {bad}")
    return {"opcheck": 0.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    if a.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("--device cpu needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
        return 2
    import torch

    d = a.device
    cases: dict[str, Callable[[], dict[str, float]]] = {}
    for cplx in (False, True):
        for tv in (False, True):
            for reset in (False, True):
                name = f"{'complex' if cplx else 'real'}-{'time-invariant' if tv else 'time-varying'}{'-reset' if reset else ''}"
                cases[name] = lambda c=cplx, t=tv, r=reset: case(torch, d, complex_a=c, complex_b=c, tv=t, reset=r)
    cases["real-a-complex-b-no-h0"] = lambda: case(torch, d, complex_a=False, complex_b=True, h0=False)
    cases["one-state-dim-L1"] = lambda: case(torch, d, complex_a=True, complex_b=True, S=(6,), L=1)
    cases["default-block-broadcast-S"] = lambda: case(torch, d, complex_a=False, complex_b=False, S=(2, 9), block_s=None, tv=True)
    cases["opcheck"] = lambda: opcheck(torch, d)
    report: dict[str, Any] = {}
    for name, fn in cases.items():
        try:
            report[name] = {"errors": fn(), "tol": TOL}
        except Exception as exc:
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
