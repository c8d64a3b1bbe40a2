"""Every benchmark family: one ``<core>/layer`` per registered core (generated), the kernel and
scan-op families of the cores that have those ops, plus the peers and special cases.

Sizes that earlier reports used are kept per core in ``LAYER_SIZES``; a core the zoo does not know
yet (a new plugin) gets ``GENERIC`` and is benchmarked all the same.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from benchmarks import peers
from benchmarks.cases import (
    Family,
    Impl,
    Sizes,
    check_layers,
    layer_choices,
    reference_name,
    registry,
    zoo_layer,
)
from benchmarks.stream import stream_families

# A core without sizes of its own (a new plugin, S5's bidirectional variant) is timed at these and
# reported in REPORT_CORES.md.
GENERIC: dict[str, Any] = {"lengths": (1024, 4096), "sizes": {"B": 8, "H": 64, "N": 64}}
NAIVE_SCAN_MAX_L = 1024  # S4D's python-loop backend: forward only, L ≤ this (its backward walks L nodes)
LAYER_SIZES: dict[str, dict[str, Any]] = {
    "s4d": {"lengths": (1024, 4096, 16384), "sizes": {"H": 256, "N": 64}, "batch_for": lambda L: max(1, 16384 // L),
            "report": "REPORT.md", "peer": "straightforward", "memory": False,
            "defaults": ("straightforward", "kernel=vandermonde conv=fft", "kernel=naive conv=fft", "scan=naive",
                         "scan=scan")},
    "s4": {"lengths": (16384,), "sizes": {"B": 8, "H": 256, "N": 64}, "modes": ("fwdbwd",), "report": "REPORT_S4.md",
           "defaults": ("auto", "kernel=cauchy conv=fft")},
    "s5": {"lengths": (1024, 4096, 16384), "sizes": {"B": 32, "H": 64, "N": 64}, "report": "REPORT_SCAN.md"},
    "lru": {"lengths": (1024, 4096, 16384), "sizes": {"B": 32, "H": 64, "N": 64}, "report": "REPORT_SCAN.md"},
    "linoss": {"lengths": (1024, 4096, 16384), "sizes": {"B": 32, "H": 64, "N": 64}, "report": "REPORT_SCAN.md"},
    "mamba": {"lengths": (256, 1024, 4096), "sizes": {"B": 8, "H": 64, "N": 16}, "report": "REPORT_MAMBA.md",
              "peer": "scan=selective-chunked", "check_sizes": {"N": 16}},
    "lrcssm": {"lengths": (256, 1024, 4096), "sizes": {"H": 64, "N": 64}, "batches": (4, 32), "threads": 1,
               "report": "REPORT_LRCSSM.md", "peer": "sequential"},
    # Gated DeltaNet: 4 heads, K 16, V 32 (the core's defaults; N is unused), chunk 64; peer: fla's naive chunked op
    "gdn": {"report": "REPORT_FAMILIES.md", "lengths": (1024, 4096), "sizes": {"B": 8, "H": 64, "N": 16}, "peer": "fla naive chunk"},
    # Mamba-2: 2 heads of 64 (head_dim gcd(2H, 64)), one group, chunk 256; the peer is transformers' torch path
    "mamba2": {"report": "REPORT_FAMILIES.md", "lengths": (256, 1024, 4096), "sizes": {"B": 8, "H": 64, "N": 64}, "peer": "transformers"},
    # attention: the explicit softmax (naive, the reference and peer column) against sdpa; 4 heads of 16, no window
    "attention": {"report": "REPORT_FAMILIES.md", "lengths": (1024, 4096), "sizes": {"B": 8, "H": 64, "N": 64}, "peer": "attention=naive"},
    # Mamba-3 (SISO): the chunked scan against the sequential reference (the peer column); 2 heads of 64
    "mamba3": {"report": "REPORT_FAMILIES.md", "lengths": (1024, 4096), "sizes": {"B": 8, "H": 64, "N": 64}, "peer": "scan=mamba3-sequential"},
    # RG-LRU (Hawk block): lru_width = H = 64, one head (the core's defaults; N is unused); peer: transformers' block
    "rglru": {"report": "REPORT_FAMILIES.md", "lengths": (1024, 4096), "sizes": {"B": 8, "H": 64, "N": 64}, "peer": "transformers"},
}
LAYER_PEERS: dict[str, Callable[[], list[Impl]]] = {
    "s4d": peers.s4d_straightforward, "s5": peers.s5_peers, "mamba": peers.mamba_peers, "lrcssm": peers.lrcssm_peers,
    "gdn": peers.gdn_peers,
    "mamba2": peers.mamba2_peers,
    "mamba3": peers.mamba3_peers,
    "rglru": peers.rglru_peers,
}


def _s4d_skip(s: Sizes, mode: str, name: str) -> str | None:
    """S4D's recurrent backends in the big-batch table: the loop is forward-only at short L, the
    parallel scan materialises several (B, L, H, P) complex tensors (timed at B=1 instead)."""
    if name == "scan=naive" and (mode != "fwd" or s["L"] > NAIVE_SCAN_MAX_L):
        return (f"python loop over L: timed for forward at L ≤ {NAIVE_SCAN_MAX_L} only (its backward walks L "
                "autograd nodes)")
    if name.startswith("scan=") and name != "scan=naive" and s["B"] > 1:
        return (f"timed at B=1 in s4d/recurrent: at B·L={s['B'] * s['L']} it materialises several (B, L, H, P) "
                "complex tensors (~10 GiB peak)")
    return None


# Cores whose whole layer is also timed under torch.compile (Inductor fusing the elementwise work around
# the scan op): issue 16's whole-layer target, against today's auto on CPU (the loop; Mamba's chunked scan).
COMPILED_LAYERS = ("s5", "lru", "linoss", "mamba")


def layer_family(core: str) -> Family:
    """``<core>/layer``: every backend combination the registry serves for the core, plus its peers."""
    conf = {**GENERIC, **LAYER_SIZES.get(core, {})}

    def impls() -> list[Impl]:
        out = []
        for name, backend in layer_choices(core):
            skip = (lambda s, m, n=name: _s4d_skip(s, m, n)) if core == "s4d" else None
            out.append(zoo_layer(core, name, backend, skip=skip))
        if core in COMPILED_LAYERS:
            out.append(zoo_layer(core, "auto + torch.compile", "auto", compiled=True))
        return out + (LAYER_PEERS[core]() if core in LAYER_PEERS else [])

    def ref() -> str:
        return reference_name(core)

    return Family(f"{core}/layer", "layer", conf.get("report", "REPORT_CORES.md"), impls,
                  lengths=tuple(conf["lengths"]), sizes=conf["sizes"], modes=conf.get("modes", ("fwd", "fwdbwd")),
                  batches=conf.get("batches", ()), batch_for=conf.get("batch_for"), reference=ref,
                  peer=conf.get("peer", ref), memory=conf.get("memory", True), defaults=conf.get("defaults"),
                  floors=_layer_floors, doc=f"one {core} layer, every registered backend combination"
                  + (" and its peers" if core in LAYER_PEERS else ""),
                  extra={k: conf[k] for k in ("threads", "check_sizes") if k in conf})


def _layer_floors(s: Sizes) -> dict[str, float]:
    return {"(B, L, H) f32 input": s["B"] * s["L"] * s["H"] * 4}


def special_families() -> list[Family]:
    """Families that time something other than a layer: kernels, scan ops, parts, generation,
    LrcSSM's window tuning, the depth-recurrence training step and adaptive depth."""
    cores = set(registry().cores)
    out: list[Family] = []
    if "s4d" in cores:
        s4d = layer_family("s4d")
        out.append(replace(s4d, name="s4d/recurrent", batches=(1,), batch_for=None,
                           defaults=("straightforward", "kernel=vandermonde conv=fft", "scan=scan", "scan=naive"),
                           doc="S4D's recurrent backends at B=1, beside the straightforward and FFT layers"))
        out.append(Family("s4d/kernel", "kernel", "REPORT.md", peers.s4d_kernels, lengths=(1024, 4096, 16384),
                          sizes={"B": 0, "H": 256, "N": 64}, reference="straightforward_kernel",
                          peer="straightforward_kernel", check=peers.check_kernels,
                          floors=lambda s: {"one (H, N/2, L) complex64": s["H"] * (s["N"] // 2) * s["L"] * 8,
                                            "(H, L) float32 output": s["H"] * s["L"] * 4},
                          doc="S4D's kernel step alone, (H, L) from the parameters"))
    if "s4" in cores:
        out.append(Family("s4/kernel", "kernel", "REPORT_S4.md", peers.s4_kernels, lengths=(1024, 4096, 16384),
                          sizes={"B": 0, "H": 256, "N": 64}, reference="kernel=cauchy", peer="kernel=naive",
                          check=peers.check_s4_kernels,
                          floors=lambda s: {"one (H, N, F) complex64": s["H"] * s["N"] * (s["L"] // 2 + 1) * 8,
                                            "(H, L) float32 output": s["H"] * s["L"] * 4},
                          doc="S4's kernel step alone: every DPLR kernel backend and a straightforward Cauchy"))
        out.append(Family("s4/cauchy-parts", "parts", "REPORT_S4.md", peers.s4_cauchy_parts, lengths=(16384,),
                          sizes={"B": 0, "H": 256, "N": 64}, modes=("fwd",), memory=False,
                          doc="where kernel_cauchy spends its time: its parts timed alone"))
    for core in peers.SCAN_OP_CORES:
        if core in cores:
            out.append(Family(f"{core}/scan-op", "scanop", "REPORT_SCAN.md", lambda c=core: peers.scan_ops(c),
                              lengths=(4096,), sizes={"B": 32, "H": 64, "N": 64}, memory=False, peer="scan=naive",
                              floors=lambda s, c=core: {"read b, write h": 2 * s["B"] * s["L"] * STATE_BYTES[c]},
                              doc=f"the scan op alone on exactly what a {core} layer scans"))
    if "mamba" in cores:
        out.append(Family("mamba/selective-scan", "scanop", "REPORT_MAMBA.md", peers.mamba_scan_ops, lengths=(4096,),
                          sizes={"B": 8, "H": 128, "N": 16}, memory=False, peer="scan=selective-chunked",
                          check=lambda f: {"errors": {}, "note": "held to the naive loop by the backends' own tests"},
                          floors=lambda s: {"one (B, L, Di, N) f32": s["B"] * s["L"] * s["H"] * s["N"] * 4},
                          doc="Mamba's selective scan op alone (H = Di), every CPU backend beside the exp floor"))
        out.append(Family("mamba/generate", "generate", "REPORT_MAMBA.md", peers.mamba_generate, lengths=(256,),
                          sizes={"H": 256, "N": 16}, batches=(1, 8), modes=("fwd",), memory=False,
                          check=peers.check_generate, reference="transformers generate", peer="transformers generate",
                          doc="greedy generation of L new tokens (16-token prompt), zoo vs transformers"))
    if "lrcssm" in cores:
        out.append(Family("lrcssm/tune", "tune", "REPORT_LRCSSM.md", peers.lrcssm_tune, lengths=(4096,),
                          sizes={"H": 64, "N": 64}, batches=(4, 32), memory=False, reference="sequential",
                          peer="sequential", check=lambda f: {"errors": {}, "note": "variants of lrcssm/layer"},
                          extra={"threads": 1}, doc="LrcSSM's Newton window size and inner scan"))
    if "lru" in cores:
        out.append(Family("depth/train", "train", "REPORT_DEPTH.md", peers.depth_train, lengths=(128, 512),
                          sizes={"B": 32, "H": 64, "N": 64}, modes=("step",), prime=True, warm_L=16,
                          peer="ABCDEF-final", extra={"threads": 1},
                          doc="one optimiser step of ABCDEF vs AAAAAA (seed 001's depth recurrence)"))
        out += adaptive_families()
    return out + stream_families(cores)


def adaptive_families(models: list[dict[str, Any]] | None = None) -> list[Family]:
    """``depth/adaptive/<pattern>-seed<seed>``: one per trained JapaneseVowels model of
    benchmarks/repro (none trained here: one empty family that says how to train them)."""
    needs = "zoo sweep benchmarks/repro/sweeps/jv-lru.yaml"
    found = peers.trained_models() if models is None else models
    base = Family("depth/adaptive", "adaptive", "REPORT_DEPTH.md", lambda: [], lengths=(0,),
                  sizes={"B": 0, "H": 64, "N": 64, "eps_milli": 10}, modes=("infer",), memory=False,
                  peer="fixed-6", extra={"threads": 1, "needs": needs},
                  doc="adaptive vs fixed depth on the trained JapaneseVowels models of benchmarks/repro")
    if not found:
        return [base]
    return [replace(base, name=f"depth/adaptive/{r['pattern']}-seed{r['seed']}",
                    impls=lambda r=r: peers.depth_adaptive(r)) for r in found]


STATE_BYTES = {"s5": 32 * 8, "lru": 64 * 8, "linoss": 256 * 4}  # scanned bytes per (b, t) at d_state=64


def families() -> dict[str, Family]:
    """Every family by name: one layer family per registered core, then the special ones."""
    out = {f.name: f for f in (layer_family(core) for core in sorted(registry().cores))}
    return out | {f.name: f for f in special_families()}


def select(pattern: str) -> list[Family]:
    """Families matching a glob ("s4d*", "*/layer") or a core name ("s5" = "s5/*")."""
    fams = families()
    pats = [pattern] if any(c in pattern for c in "*?[") else [pattern, f"{pattern}/*"]
    return [f for name, f in fams.items() if any(fnmatch.fnmatchcase(name, p) for p in pats)]


def family_check(family: Family) -> Callable[[Family], dict[str, Any]] | None:
    """The agreement check run before a family is timed."""
    if family.check is not None:
        return family.check
    return check_layers if family.kind == "layer" else None

