"""Registers the Mamba core, its selective-scan backends and the Mamba checkpoint converters.

Metadata only: model code is imported when a model is built (or a backend/converter is used).
"""

from __future__ import annotations

from zoo_core.hookspecs import RegisterBackend, RegisterCore, RegisterSimple, hookimpl
from zoo_core.plugin_registry import Problem

from .params import MambaParams

zoo_api = 1

CARD = """Mamba-1 (Gu & Dao 2024): a selective state space mixer. in_proj to (x, z), causal
depthwise conv1d + SiLU, x_proj to (Δ-rank, B, C), Δ = softplus(dt_proj(·)), A = −exp(A_log)
(S4D-real init), h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_t, y = C h + D x, gated by SiLU(z), out_proj.
B̄ = Δ·B as all the reference code computes (not the paper's zero-order hold). Parameter names equal
transformers' MambaMixer, so transformers and mamba_ssm checkpoints convert by renaming
(`zoo convert`). MambaSL's switches make Δ, B or C time-invariant and drop D (preset `mambasl`).
Backends: selective-naive (the loop, the reference), selective-chunked (`scan`: chunked, recomputing
backward, CPU-fast), selective-cuda (`cuda`: mamba-ssm's fused kernel on GPUs, when installed),
selective-triton (`triton`: Triton kernels on GPUs, every feature, after a run-time check; pip install zoo-mamba[triton]),
selective-cpu (`cpu`: the zoo's fused C++ kernel on CPUs, every feature, compiled on first use; needs g++ and ninja)."""

PRESETS = {
    "tiny": {"d_state": 3, "d_conv": 3, "expand": 2},  # odd sizes for tests
    "130m": {"d_state": 16, "d_conv": 4, "expand": 2},  # the mamba-130m mixer (d_model 768, 24 layers)
    # MambaSL (models.md §11), Heartbeat's best: time-invariant Δ, B and C, no D, expand 1.
    "mambasl": {"d_state": 16, "d_conv": 4, "expand": 1, "tv_dt": False, "tv_B": False, "tv_C": False, "use_D": False},
    # MambaSL, SelfRegulationSCP2's best: everything input-dependent, no D, expand 1.
    "mambasl-tv": {"d_state": 16, "d_conv": 4, "expand": 1, "use_D": False},
}


def _selective(p: Problem) -> str | None:
    if p.structure != "selective":
        return f"it computes Mamba's selective scan (structure 'selective'), not a {p.structure!r} recurrence"
    return None


def _cuda(p: Problem) -> str | None:
    reason = _selective(p)
    if reason is None and p.device != "cuda":
        reason = f"mamba-ssm's fused kernel runs on CUDA tensors only, not {p.device!r}"
    return reason


def _cuda_probe(p: Problem) -> str | None:
    from .scan import cuda_runtime_reason  # imports torch and mamba_ssm: only when asked

    return cuda_runtime_reason()


def _triton(p: Problem) -> str | None:
    # the device first: zoo-core's diagonal Triton scan shares the spec name 'triton' (see its _triton_diag)
    reason = None if p.device == "cuda" else f"the Triton kernels run on CUDA tensors only, not {p.device!r}"
    return reason or _selective(p)


def _triton_probe(p: Problem) -> str | None:
    try:
        from .triton_scan import triton_runtime_reason  # imports torch and triton: only when asked
    except Exception as exc:  # an installed but broken triton raises anything
        return f"triton does not import ({type(exc).__name__}: {exc}); pip install 'zoo-mamba[triton]'"
    return triton_runtime_reason()


def _cpu(p: Problem) -> str | None:
    reason = _selective(p)
    if reason is None and p.device != "cpu":
        reason = f"the fused C++ kernel runs on CPU tensors only, not {p.device!r}"
    if reason is None and p.dtype not in ("float32", "float64", "float16", "bfloat16"):
        reason = f"the fused C++ kernel computes in float32 or float64, not {p.dtype}"
    return reason


def _cpu_probe(p: Problem) -> str | None:
    from .cpu_kernel import unavailable_reason  # imports torch and builds the kernel once: only when asked

    return unavailable_reason()


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register("mamba", "zoo_mamba.core:Mamba", params=MambaParams, presets=PRESETS, card=CARD)


@hookimpl
def zoo_register_backends(register: RegisterBackend) -> None:
    register("selective-naive", "scan", "zoo_mamba.scan:selective_scan_naive", priority=0, supports=_selective,
             description="Mamba's selective scan, reference: the sequential loop under autograd, float32 accumulation")
    register("selective-chunked", "scan", "zoo_mamba.scan:selective_scan_chunked", priority=10, supports=_selective,
             aliases=("scan",), description="Mamba's selective scan in chunks with a recomputing backward (reverse scan "
                                            "per chunk); never holds B·L·D·N; spec name 'scan'")
    register("selective-cuda", "scan", "zoo_mamba.scan:selective_scan_cuda", priority=20, supports=_cuda,
             requires=("mamba_ssm",), probe=_cuda_probe, aliases=("cuda",),
             description="Mamba's selective scan by mamba-ssm's fused CUDA kernel (GPU tensors, after a run-time "
                         "check); optional: pip install mamba-ssm; spec name 'cuda'")
    register("selective-cpu", "scan", "zoo_mamba.cpu_kernel:selective_scan_cpu", priority=15, supports=_cpu, probe=_cpu_probe,
             aliases=("cpu",),
             description="Mamba's selective scan by the zoo's fused C++ kernel (CPU tensors; SIMD over channels, one pass "
                         "per step, backward from chunk-entry states); compiled on first use (g++, pip install ninja); "
                         "spec name 'cpu'")
    # Below mamba-ssm's kernel (20): where that one is installed and passes its check it stays auto's choice
    # until gpu_check.py's figures say otherwise; above the C++ CPU (15) and chunked (10) paths.
    register("selective-triton", "scan", "zoo_mamba.triton_scan:selective_scan_triton", priority=18, supports=_triton,
             requires=("triton",), probe=_triton_probe, aliases=("triton",),
             description="Mamba's selective scan by Triton kernels (CUDA tensors, after a run-time check; h0, final-state "
                         "gradient and packed documents included); optional: pip install zoo-mamba[triton]; spec name 'triton'")


@hookimpl
def zoo_register_converters(register: RegisterSimple) -> None:
    register("transformers-mamba", "zoo_mamba.convert:TRANSFORMERS",
             description="Hugging Face transformers MambaForCausalLM folders (config.json + model.safetensors)")
    register("mamba-ssm", "zoo_mamba.convert:MAMBA_SSM",
             description="state-spaces/mamba (mamba_ssm) MambaLMHeadModel folders (config.json + pytorch_model.bin, "
                         "read with torch's weights-only loader)")
