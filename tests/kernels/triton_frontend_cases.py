"""Run by ``test_triton_frontend.py`` in a fresh process without ``TRITON_INTERPRET``: each Triton kernel
of the zoo through Triton's front end (Python source to Triton IR) for an sm_90 target, no GPU needed.

The interpreter that runs the kernels on CPU in CI executes the Python directly and never meets the
compiler's rules (which globals a kernel may read, which annotations it resolves); this is the step
where a kernel that passes every interpreted test can still fail to compile on a GPU. Prints one JSON
object: case name to "ok" or the compiler's error.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource

POINTER_TYPES = {"keep_ptr": "*fp32", "slot_ptr": "*i32"}  # what the launchers pass; every other pointer float32


def to_ttir(fn: Any, constexprs: dict[str, Any]) -> str:
    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    options = backend.parse_options({})
    sig, const = {}, {}
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params, strict=True)):
        if param.is_constexpr:
            sig[name], const[(i,)] = "constexpr", constexprs[name]
        else:
            sig[name] = POINTER_TYPES.get(name, "*fp32") if name.endswith("_ptr") else "i32"
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    module = ASTSource(fn, sig, const).make_ir(target, options, backend.get_codegen_implementation(options),
                                                backend.get_module_map(), ctx)
    return str(module)


def main() -> None:
    from zoo_core.kernels.triton_diag import _diag_kernel
    from zoo_mamba.triton_scan import _bwd_kernel, _fwd_kernel

    assert isinstance(_diag_kernel, triton.runtime.JITFunction), "TRITON_INTERPRET is set: nothing would compile"
    cases: dict[str, tuple[Any, dict[str, Any]]] = {}
    for cplx in (False, True):
        for rev in (False, True):
            cases[f"diag-{'complex' if cplx else 'real'}{'-reverse' if rev else ''}"] = (
                _diag_kernel, {"REVERSE": rev, "IS_COMPLEX": cplx, "W": 2 if cplx else 1, "HAS_KEEP": rev, "BLOCK_S": 64})
    for static in (False, True):
        for extras in (False, True):
            flags = {"STATIC_B": static, "STATIC_C": static, "HAS_D": extras, "HAS_KEEP": extras, "HAS_ENDS": extras,
                     "CHUNK": 64, "BLOCK_D": 32, "BLOCK_N": 16}
            tag = f"{'static' if static else 'varying'}-BC{'-D-keep-ends' if extras else ''}"
            cases[f"selective-fwd-{tag}"] = (_fwd_kernel, flags)
            cases[f"selective-bwd-{tag}"] = (_bwd_kernel, {**flags, "HAS_GLAST": not extras})
    out = {}
    for name, (fn, constexprs) in cases.items():
        try:
            ttir = to_ttir(fn, constexprs)
            out[name] = "ok" if "tt.func" in ttir else f"no function in the IR: {ttir[:200]}"
        except Exception as exc:  # the compiler's message is the finding
            out[name] = f"{type(exc).__name__}: {exc}"[:2000]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
