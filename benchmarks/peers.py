"""Peers and special cases: implementations the registry does not know, added to the generated
families as extra implementations (the straightforward S4D and Cauchy, s5-pytorch, mambapy,
transformers' slow path, LrcSSM's window variants), and the builders of the families that time
something other than one layer (kernels, scan ops, kernel_cauchy's parts, generation, training
steps, adaptive depth).

Every builder imports its model code lazily: ``python -m benchmarks list`` stays cheap.
Letters: B batch, L length, H channels (d_model), N state size, M = N/2 stored pairs.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.cases import Built, Family, Impl, Sizes, layer_built, op_backends, registry, zoo_layer
from benchmarks.harness import ROOT, Call, Row, rel


def _no_grad(f: Callable[[], object]) -> Call:
    def call() -> None:
        with torch.no_grad():
            f()
    return call


def kernel_call(fn: Callable[[], Tensor], params: nn.Module, H: int, L: int, mode: str) -> Call:
    """One kernel step (H, L) from a layer's parameters; fwdbwd backpropagates a fixed random
    cotangent into them."""
    torch.manual_seed(1)
    grad_k = torch.randn(H, L)  # (H, L)

    def fwdbwd() -> None:
        params.zero_grad(set_to_none=True)
        fn().backward(grad_k)

    return _no_grad(fn) if mode == "fwd" else fwdbwd


# ---------------------------------------------------------------------------------------
# S4D: the readable reference layer and its kernel
# ---------------------------------------------------------------------------------------
def _s4d_pair(s: Sizes) -> tuple[nn.Module, Any]:
    from zoo_s4d.core import S4D
    from zoo_s4d.reference import copy_from_zoo

    torch.manual_seed(0)
    zoo = S4D(d_model=s["H"], d_state=s["N"])
    return zoo, copy_from_zoo(zoo)


def s4d_straightforward() -> list[Impl]:
    """zoo_s4d.reference.StraightforwardS4D holding the seed-0 S4D's parameters."""
    return [Impl("straightforward", lambda s, mode: layer_built(_s4d_pair(s)[1], s, mode), origin="peer")]


def _diag_system(layer: Any) -> Any:
    """The zoo's kernel input for the reference layer's parameters: ZOH, w = 2·C·B̄ over P pairs."""
    from zoo_core.discretize import zoh
    from zoo_core.kernels.systems import DiagSystem

    A = torch.complex(-torch.exp(layer.log_A_real), layer.A_imag)  # (H, P)
    d = zoh(A, torch.view_as_complex(layer.B), torch.exp(layer.log_dt)[:, None], structure="diag")
    return DiagSystem(d.log_a, 2 * torch.view_as_complex(layer.C) * d.b)  # (H, P) each


def s4d_kernels() -> list[Impl]:
    """The straightforward (H, P, L) Vandermonde kernel, then every registered kernel backend
    that serves S4D's diagonal systems."""
    def sf(s: Sizes, mode: str) -> Built:
        layer = _s4d_pair(s)[1]
        fn = functools.partial(layer.kernel, s["L"])
        return Built(kernel_call(fn, layer, s["H"], s["L"], mode), layer, output=fn)

    def backend(entry: Any) -> Callable[[Sizes, str], Built]:
        def build(s: Sizes, mode: str) -> Built:
            layer, kernel = _s4d_pair(s)[1], entry.load()

            def fn() -> Tensor:
                return kernel(_diag_system(layer), s["L"])
            return Built(kernel_call(fn, layer, s["H"], s["L"], mode), layer, output=fn)
        return build

    out = [Impl("straightforward_kernel", sf, origin="peer")]
    return out + [Impl(f"kernel={n}", backend(e), requires=tuple(e.requires)) for n, e in op_backends("s4d", "kernel")]


def check_kernels(family: Family, tol: float = 1e-4) -> Row:
    """Every kernel implementation against the reference one: (H, L) outputs, float32, H=16."""
    errors: dict[str, float] = {}
    impls = [i for i in family.impls() if i.unavailable() is None]
    ref = next(i for i in impls if i.name == family.ref())
    for L in (37, 1000):
        s = {**family.sizes, "H": 16, "L": L}
        torch.manual_seed(L)
        want = _kernel_out(ref, s)
        for impl in impls:
            if impl is not ref and not (impl.skip and impl.skip(s, "fwd")):
                errors[f"{impl.name} L={L}"] = rel(_kernel_out(impl, s), want)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, (f"{family.name}: kernels disagree with {family.ref()} beyond {tol} relative: {bad}; "
                     "fix them or leave them out with --impls")
    return {"errors": errors}


def check_s4_kernels(family: Family, tol: float = 1e-4) -> Row:
    """check_kernels, and the straightforward Cauchy against kernel_cauchy in every parameter gradient."""
    from benchmarks.straightforward_cauchy import check_agreement

    got = check_kernels(family, tol)
    return {"errors": {**got["errors"], **{f"straightforward_cauchy gradients {k}": v
                                            for k, v in check_agreement(tol).items()}}}


def _kernel_out(impl: Impl, s: Sizes) -> Tensor:
    b = impl.build(s, "fwd")
    assert b.output is not None, f"{impl.name}: a kernel family's Built needs output"
    with torch.no_grad():
        return b.output()


# ---------------------------------------------------------------------------------------
# S4: the Cauchy kernel, its peers and its parts
# ---------------------------------------------------------------------------------------
def _s4_layer(s: Sizes, backend: Any = "cauchy") -> Any:
    from zoo_s4.core import S4

    torch.manual_seed(0)
    return S4(d_model=s["H"], d_state=s["N"], l_max=s["L"], backend=backend)


def _keops_skip(s: Sizes, mode: str) -> str | None:
    """pykeops may import and still fail to compile: its run-time check says so."""
    from zoo_core.kernels.keops import runtime_reason

    return runtime_reason()


def s4_kernels() -> list[Impl]:
    """Every registered kernel backend that serves S4's DPLR systems (kernel_cauchy, pykeops, the
    naive dense powers), then the straightforward broadcast Cauchy."""
    from benchmarks.straightforward_cauchy import straightforward_cauchy

    def build_fn(fn: Callable[..., Tensor]) -> Callable[[Sizes, str], Built]:
        def build(s: Sizes, mode: str) -> Built:
            layer = _s4_layer(s)

            def run() -> Tensor:
                return fn(layer._trained_system(), s["L"])
            return Built(kernel_call(run, layer, s["H"], s["L"], mode), layer, output=run)
        return build

    out = [Impl(f"kernel={n}", build_fn(e.load() if not e.requires else _lazy(e)), requires=tuple(e.requires),
                skip=_keops_skip if n == "keops" else None) for n, e in op_backends("s4", "kernel")]
    return out + [Impl("straightforward_cauchy", build_fn(straightforward_cauchy), origin="peer")]


def _lazy(entry: Any) -> Callable[..., Tensor]:
    """A backend whose optional package is imported only when it is called."""
    return lambda *a: entry.load()(*a)


def s4_cauchy_parts() -> list[Impl]:
    """kernel_cauchy's parts at one L, each timed alone: setup, the Cauchy sums + Woodbury forward,
    irfft, the whole forward, the sums' backward (and its recompute), the whole forward+backward."""
    def part(name: str) -> Impl:
        return Impl(name, lambda s, mode: Built(_parts(s)[name]), agrees=False)
    return [part(n) for n in PARTS]


PARTS = ("setup (cast, numerators, nodes)", "Cauchy sums + Woodbury, forward", "irfft", "total forward",
         "Cauchy sums backward (recompute + grads)", "  of which: recompute with autograd recording",
         "total forward+backward")


def _parts(s: Sizes) -> dict[str, Call]:
    from zoo_core.kernels import dplr
    from zoo_core.kernels.dplr import kernel_cauchy

    L, layer = s["L"], _s4_layer(s)

    def setup() -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        lam, p, b, c, dt = dplr._cast(layer._trained_system())  # (H, M) ×4, (H)
        v = torch.stack([c * b, c * p, p.conj() * b, p.conj() * p], 1)  # (H, S, M)
        one_m, one_p = dplr._nodes(L, lam.dtype, lam.device)  # (F), (F)
        return v, dt[:, None] * lam, dt, one_m, one_p

    with torch.no_grad():
        v, dlam, dt, one_m, one_p = setup()
        khat = dplr.cauchy_khat(v, dlam, dt, one_m, one_p)  # (H, F)
    leaves = [x.clone().requires_grad_() for x in (v, dlam, dt)]
    khat_g = dplr.cauchy_khat(*leaves, one_m, one_p)  # (H, F), saves its inputs only
    grad_khat = torch.randn_like(khat)  # (H, F)

    def khat_backward() -> None:
        torch.autograd.grad(khat_g, leaves, grad_khat, retain_graph=True)

    def recompute() -> None:  # what the backward redoes before its gradients: chunks, graph recorded
        with torch.enable_grad():
            for c in dplr._chunks(one_m.shape[0], *dlam.shape):
                dplr._khat_chunk(*leaves, one_m[c], one_p[c])

    return dict(zip(PARTS, (
        _no_grad(setup), _no_grad(lambda: dplr.cauchy_khat(v, dlam, dt, one_m, one_p)),
        _no_grad(lambda: torch.fft.irfft(khat, n=L)), _no_grad(lambda: kernel_cauchy(layer._trained_system(), L)),
        khat_backward, recompute,
        kernel_call(lambda: kernel_cauchy(layer._trained_system(), L), layer, s["H"], L, "fwdbwd"))))


# ---------------------------------------------------------------------------------------
# scans: S5's peers, and the scan op alone on what a layer scans
# ---------------------------------------------------------------------------------------
def s5_peers() -> list[Impl]:
    """s5-pytorch (vmap over the batch, associative scan; no conjugate symmetry, its own init:
    time only) and the zoo S5 at twice the state (as many scanned complex states as s5-pytorch)."""
    def s5_pytorch(s: Sizes, mode: str) -> Built:
        import s5

        torch.manual_seed(0)
        return layer_built(s5.S5(width=s["H"], state_width=s["N"]), s, mode)

    return [Impl("s5-pytorch", s5_pytorch, agrees=False, origin="peer", requires=("s5",)),
            zoo_layer("s5", "scan-N128", {"scan": "scan"}, origin="peer", state_scale=2)]


def scan_inputs(core: str, layer: Any, x: Tensor) -> tuple[Tensor, Tensor, str]:
    """Exactly what a core's forward scans for input x: (a, b, structure). Reads the core's
    internals (they are not an API), so a rewritten core fails here with its name."""
    B, L, H = x.shape
    if core in ("s5", "s5-bidirectional"):
        from zoo_s5.core import _project

        a, b = layer.discrete()
        return a, _project(x, b), "diag"  # (P/2,), (B, L, P/2)
    if core == "lru":
        return layer.lam()[None, None], layer._Bu(x), "diag"  # (1, 1, P), (B, L, P)
    if core == "linoss":
        d = layer._discrete(layer.B)
        P = d.a.shape[0]
        W = d.b.permute(1, 2, 0, 3).reshape(H, 4 * P)
        return d.a, (x @ W).view(B, L, 2, P, 2), "block2x2"  # (P, 2, 2), (B, L, 2, P, 2)
    raise NotImplementedError(f"no scan-op inputs known for core {core!r}")


SCAN_OP_CORES = ("s5", "lru", "linoss")


def scan_ops(core: str) -> list[Impl]:
    """Every registered scan backend serving the core's problem, on the layer's own (a, b)."""
    def build_for(entry: Any) -> Callable[[Sizes, str], Built]:
        def build(s: Sizes, mode: str) -> Built:
            torch.manual_seed(0)
            layer = registry().core(core).instantiate(d_model=s["H"], d_state=s["N"], backend="naive")
            torch.manual_seed(2)
            with torch.no_grad():
                a, b, structure = scan_inputs(core, layer, torch.randn(s["B"], s["L"], s["H"]))
            return Built(_scan_call(entry.load(), a, b, structure, mode), info=lambda: {"shape_b": list(b.shape),
                                                                                       "dtype": str(b.dtype)})
        return build
    return [Impl(f"scan={n}", build_for(e), agrees=False) for n, e in op_backends(core, "scan")]


def _scan_call(fn: Callable[..., Any], a: Tensor, b: Tensor, structure: str, mode: str) -> Call:
    """The scan op alone, detached: forward, or forward+backward into a and b."""
    a, b = a.detach().clone(), b.detach().clone()
    torch.manual_seed(4)
    g = torch.randn_like(b)

    def run() -> Tensor:
        return fn(a, b, None, structure=structure)[0]

    def fwdbwd() -> None:
        a.grad = b.grad = None
        run().backward(g)

    if mode == "fwdbwd":
        a.requires_grad_(True)
        b.requires_grad_(True)
    return _no_grad(run) if mode == "fwd" else fwdbwd


# ---------------------------------------------------------------------------------------
# Mamba's selective scan op alone, beside the exp floor
# ---------------------------------------------------------------------------------------
SELECTIVE_NAIVE_MAX_L = 1024  # the naive loop: forward only, L ≤ this (autograd keeps every step)


def mamba_scan_ops() -> list[Impl]:
    """Every registered selective-scan backend serving a CPU problem (chunked, the fused C++ kernel,
    the naive loop at short L), on input-dependent B, C, with D and no h0, at (B, L, Di = H, N); and
    the floor that bounds any of them: ``torch.exp`` over one (B, L, Di, N) float32 tensor (the
    scan evaluates exactly that many exps)."""
    def inputs(s: Sizes) -> list[Tensor]:
        g = torch.Generator().manual_seed(0)
        B, L, Di, N = s["B"], s["L"], s["H"], s["N"]
        u = torch.randn(B, L, Di, generator=g)
        delta = torch.nn.functional.softplus(torch.randn(B, L, Di, generator=g) - 4)  # Mamba's dt init range
        A = -torch.arange(1, N + 1, dtype=torch.float32).repeat(Di, 1)  # S4D-real, as Mamba initialises A
        return [u, delta, A, torch.randn(B, L, N, generator=g), torch.randn(B, L, N, generator=g), torch.ones(Di)]

    def build_for(entry: Any) -> Callable[[Sizes, str], Built]:
        def build(s: Sizes, mode: str) -> Built:
            fn, args = entry.load(), inputs(s)
            g = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(4))

            def run() -> Tensor:
                return fn(*args)[0]

            def fwdbwd() -> None:
                for a in args:
                    a.grad = None
                run().backward(g)

            if mode == "fwdbwd":
                for a in args:
                    a.requires_grad_(True)
            return Built(_no_grad(run) if mode == "fwd" else fwdbwd)
        return build

    def naive_skip(s: Sizes, mode: str) -> str | None:
        if mode != "fwd" or s["L"] > SELECTIVE_NAIVE_MAX_L:
            return f"python loop over L under autograd: timed for forward at L ≤ {SELECTIVE_NAIVE_MAX_L} only"
        return None

    def exp_floor(s: Sizes, mode: str) -> Built:
        X = torch.randn(s["B"] * s["L"] * s["H"] * s["N"], generator=torch.Generator().manual_seed(0))
        out = torch.empty_like(X)

        def call() -> None:
            torch.exp(X, out=out)
        return Built(call)

    out = [Impl(f"scan={n}", build_for(e), agrees=False, skip=naive_skip if n == "selective-naive" else None)
           for n, e in op_backends("mamba", "scan")]
    return out + [Impl("exp floor: torch.exp over (B, L, Di, N) f32", exp_floor, agrees=False, origin="peer",
                       skip=lambda s, m: None if m == "fwd" else "a floor for the forward: one exp per (b, t, d, n)")]


# ---------------------------------------------------------------------------------------
# Mamba: transformers' slow path, mambapy, generation
# ---------------------------------------------------------------------------------------
def mamba_peers() -> list[Impl]:
    """transformers' MambaMixer (its sequential torch path) and mambapy's MambaBlock (pscan), both
    loaded with the seed-0 zoo Mamba's weights (the state-dict keys are equal)."""
    def zoo(s: Sizes) -> nn.Module:
        torch.manual_seed(0)
        return registry().core("mamba").instantiate(d_model=s["H"], d_state=s["N"], backend="auto")

    def hf(s: Sizes, mode: str) -> Built:
        import transformers
        from transformers.models.mamba.modeling_mamba import MambaMixer

        m = MambaMixer(transformers.MambaConfig(hidden_size=s["H"], state_size=s["N"], conv_kernel=4, expand=2,
                                                num_hidden_layers=1), 0)
        m.load_state_dict(zoo(s).state_dict())
        return layer_built(m, s, mode)

    def mambapy(s: Sizes, mode: str) -> Built:
        import mambapy.mamba as mp

        m = mp.MambaBlock(mp.MambaConfig(d_model=s["H"], n_layers=1, d_state=s["N"], expand_factor=2, d_conv=4,
                                         pscan=True))
        m.load_state_dict(zoo(s).state_dict())
        return layer_built(m, s, mode)

    return [Impl("transformers", hf, origin="peer", requires=("transformers",)),
            Impl("mambapy", mambapy, origin="peer", requires=("mambapy",))]


@functools.cache
def _lm_pair(d_model: int = 256, layers: int = 4, vocab: int = 1024) -> tuple[Any, Any]:
    """A random MambaForCausalLM and the zoo model converted from it (zoo_mamba's converter)."""
    import transformers

    from zoo_core.convert import convert_checkpoint

    torch.manual_seed(0)
    cfg = transformers.MambaConfig(hidden_size=d_model, num_hidden_layers=layers, vocab_size=vocab, state_size=16,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = transformers.MambaForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(Path(tmp) / "hf")
        zoo = convert_checkpoint(Path(tmp) / "hf", Path(tmp) / "zoo")[2].eval()
    return zoo, hf


def general_step_copy(model: Any) -> Any:
    """A copy of ``model`` whose ``step`` takes the general streaming path, what ran before the fused
    kernels: a forward hook (never called by ``step``) keeps ``SequenceModel.step`` off its lean plan and
    whole-step program (``zoo_core.nn.lean``: a hooked module is not plain)."""
    general = copy.deepcopy(model)  # the copy holds no plan (``SequenceModel.__getstate__`` drops it)
    general.register_forward_hook(lambda module, args, out: None)
    return general


@functools.cache
def _general_copy() -> Any:
    """The zoo LM on the general step. The generation target (issue 16: tokens/s ≥ 2× the zoo's before the
    kernels) is the ratio of ``zoo generate`` to this row."""
    return general_step_copy(_lm_pair()[0])


def _prompt(B: int) -> Tensor:
    return torch.randint(0, 1024, (B, 16), generator=torch.Generator().manual_seed(B))  # (B, 16)


def mamba_generate() -> list[Impl]:
    """Greedy decoding of L new tokens after a 16-token prompt: the zoo's generate against
    transformers' cached generate, on the same (converted) weights."""
    def zoo(s: Sizes, mode: str) -> Built:
        from zoo_core.generate import generate

        model, ids = _lm_pair()[0], _prompt(s["B"])
        return Built(lambda: generate(model, ids, s["L"]))  # tokens/s = B·L / median in the report

    def zoo_compiled(s: Sizes, mode: str) -> Built:
        from zoo_core.generate import generate

        model, ids = _lm_pair()[0], _prompt(s["B"])
        generate(model, ids, 2, compile=True)  # the one-time Inductor compile for this batch size, not timed
        return Built(lambda: generate(model, ids, s["L"], compile=True))

    def zoo_general(s: Sizes, mode: str) -> Built:
        from zoo_core.generate import generate

        model, ids = _general_copy(), _prompt(s["B"])
        return Built(lambda: generate(model, ids, s["L"]))

    def hf(s: Sizes, mode: str) -> Built:
        model, ids = _lm_pair()[1], _prompt(s["B"])
        mask = torch.ones_like(ids)
        return Built(lambda: model.generate(ids, attention_mask=mask, max_new_tokens=s["L"], do_sample=False,
                                            use_cache=True))

    return [Impl("zoo generate", zoo, requires=("transformers",)),
            Impl("zoo generate (general step)", zoo_general, requires=("transformers",)),
            Impl("zoo generate (compiled step)", zoo_compiled, requires=("transformers",)),
            Impl("transformers generate", hf, origin="peer", requires=("transformers",))]


def check_generate(family: Family) -> Row:
    """Both decoders produce the same tokens, and the zoo's decoding state does not grow."""
    from zoo_core.generate import generate

    zoo, hf = _lm_pair()
    ids = _prompt(2)
    a = generate(zoo, ids, 24)
    b = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, use_cache=True)
    assert torch.equal(a, b), "mamba/generate: the zoo and transformers decode different tokens on the same weights"
    assert torch.equal(generate(zoo, ids, 24, compile=True), a), "mamba/generate: the compiled step decodes other tokens"
    from zoo_core.nn.lean import plan_of, program_of

    general = _general_copy()
    assert torch.equal(generate(general, ids, 24), a), "mamba/generate: the general step decodes other tokens"
    assert plan_of(general) is None and program_of(zoo), \
        "mamba/generate: the general-step row did not take the general path (or the fused row did not take the plan)"
    with torch.no_grad():
        _, st = zoo.forward_with_state(ids)
        size0 = _state_bytes(st)
        for _ in range(256):
            _, st = zoo.step(ids[:, 0], st)
        size1 = _state_bytes(st)
    return {"errors": {"tokens differ (24 new, B=2)": 0.0, "state growth 16 → 272 tokens": size1 / size0 - 1},
            "state_bytes": [size0, size1]}


def _state_bytes(st: Any) -> int:
    """Bytes of a decoding state: its tensors, whether the state is a flat dict or a typed
    structure with ``flatten()`` (the model's streaming state)."""
    if isinstance(st, Tensor):
        return st.numel() * st.element_size()
    if hasattr(st, "flatten") and not isinstance(st, (dict, list, tuple)):
        st = st.flatten()
    if isinstance(st, dict):
        return sum(_state_bytes(v) for v in st.values())
    if isinstance(st, (list, tuple)):
        return sum(_state_bytes(v) for v in st)
    return 0


# ---------------------------------------------------------------------------------------
# Mamba-2: transformers' Mamba2Mixer torch path (its chunked SSD)
# ---------------------------------------------------------------------------------------
def mamba2_peers() -> list[Impl]:
    """transformers' Mamba2Mixer on its torch path (the chunked SSD of ``torch_forward``; no
    mamba_ssm kernels on CPU), loaded with the seed-0 zoo Mamba-2's weights (equal state-dict keys)."""
    def zoo(s: Sizes) -> nn.Module:
        torch.manual_seed(0)
        return registry().core("mamba2").instantiate(d_model=s["H"], d_state=s["N"], backend="auto")

    def hf(s: Sizes, mode: str) -> Built:
        import transformers
        from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

        ours = zoo(s)
        cfg = transformers.Mamba2Config(hidden_size=s["H"], state_size=s["N"], expand=2, conv_kernel=4,
                                        num_heads=ours.n_heads, head_dim=ours.head_dim, n_groups=ours.n_groups,
                                        chunk_size=ours.chunk_size, num_hidden_layers=1, layer_norm_epsilon=1e-5)
        m = Mamba2Mixer(cfg, 0)
        m.load_state_dict(ours.state_dict())
        return layer_built(m, s, mode)

    return [Impl("transformers", hf, origin="peer", requires=("transformers",))]


# ---------------------------------------------------------------------------------------
# RG-LRU: transformers' RecurrentGemma recurrent block
# ---------------------------------------------------------------------------------------
class _PositionsFed(nn.Module):
    """Calls a RecurrentGemmaRecurrentBlock as a (B, L, H) layer: positions 0..L−1 (one document),
    no cache (its prefill path: the linear-mode loop of ``_rnn_scan``)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: Tensor) -> Tensor:
        pos = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)  # (B, L)
        out: Tensor = self.block(x, pos, None, use_cache=False)[0]
        return out


def rglru_peers() -> list[Impl]:
    """transformers' RecurrentGemmaRecurrentBlock on CPU (its torch loop over L), loaded with the
    seed-0 zoo RG-LRU's weights through zoo_rglru.convert (the one change of value: Λ = −recurrent_param)."""
    def hf(s: Sizes, mode: str) -> Built:
        import transformers
        from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRecurrentBlock

        from zoo_rglru.convert import state_dict_to_transformers

        torch.manual_seed(0)
        ours = registry().core("rglru").instantiate(d_model=s["H"], backend="auto")
        cfg = transformers.RecurrentGemmaConfig(hidden_size=s["H"], lru_width=ours.lru_width,
                                                num_attention_heads=ours.num_heads, conv1d_width=ours.conv_width,
                                                num_hidden_layers=1, vocab_size=8, intermediate_size=8)
        block = RecurrentGemmaRecurrentBlock(cfg, 0)
        block.load_state_dict(state_dict_to_transformers(ours.state_dict()))
        return layer_built(_PositionsFed(block), s, mode)

    return [Impl("transformers", hf, origin="peer", requires=("transformers",))]


# ---------------------------------------------------------------------------------------
# LrcSSM: Newton's window variants
# ---------------------------------------------------------------------------------------
TUNE_WINDOWS: tuple[int | None, ...] = (None, 2**20, 2**19, 2**18, 2**17, 2**16)


def lrcssm_variant(name: str, backend: Any, window: int | None, agrees: bool = True) -> Impl:
    """The zoo LrcSSM with a window size other than its default (None: the whole sequence)."""
    def build(s: Sizes, mode: str) -> Built:
        torch.manual_seed(0)
        layer = registry().core("lrcssm").instantiate(d_model=s["H"], d_state=s["N"], backend=backend)
        layer.window_elems = window  # an instance attribute shadows the class default
        b = layer_built(layer, s, mode)
        b.info = lambda: newton_info(layer)
        return b
    return Impl(name, build, agrees=agrees, origin="peer")


def newton_info(layer: Any) -> Row:
    """The last solve's Newton sweeps (total, windows, most in one window), when it ran Newton."""
    res = getattr(layer, "last_solve", None)
    if res is None or getattr(getattr(layer, "backend_choice", None), "path", None) != "deer":
        return {"window_elems": getattr(layer, "window_elems", None)}
    return {"window_elems": layer.window_elems, "iterations": res.iterations, "windows": res.windows,
            "max_window_iterations": res.max_window_iterations, "residual": res.residual,
            "converged": res.converged}


def lrcssm_peers() -> list[Impl]:
    return [lrcssm_variant("deer one window", {"scan": "scan"}, None)]


# ---------------------------------------------------------------------------------------
# Gated DeltaNet: fla's naive references as the recurrence of the same layer
# ---------------------------------------------------------------------------------------
class _FlaGatedDeltaOps:
    """Stands in for a GatedDeltaNet layer's bound ops: ``scan`` runs one of fla's naive references
    with the zoo op's signature (q already scaled, so scale=1; fla's chunked one takes g before beta)."""

    def __init__(self, fla: Any, which: str, chunk_size: int) -> None:
        self.fla, self.which, self.chunk = fla, which, chunk_size

    def scan(self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, h0: Tensor | None = None,
             *, chunk_size: int = 64) -> tuple[Tensor, Tensor]:
        if self.which == "recurrent":
            return self.fla.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=1.0, initial_state=h0,
                                                             output_final_state=True)
        return self.fla.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=self.chunk, scale=1.0,
                                                     initial_state=h0, output_final_state=True)


def gdn_peers() -> list[Impl]:
    """The zoo's Gated DeltaNet layer built from seed 0 (the family's parameters) with its gated-delta-rule
    op replaced by fla's pure-PyTorch references (fla-core's ``naive_recurrent_gated_delta_rule`` and
    ``naive_chunk_gated_delta_rule`` at the layer's chunk size): the same projections, convolutions, gates
    and norm around each, so the rows differ in the recurrence alone."""
    def with_fla(which: str) -> Callable[[Sizes, str], Built]:
        def build(s: Sizes, mode: str) -> Built:
            from zoo_gdn.fla_reference import load_fla_naive

            fla = load_fla_naive()
            torch.manual_seed(0)
            layer = registry().core("gdn").instantiate(d_model=s["H"], backend="auto")
            layer.ops = _FlaGatedDeltaOps(fla, which, layer.chunk_size)  # an instance attribute: forward calls it
            return layer_built(layer, s, mode)
        return build

    return [Impl("fla naive recurrent", with_fla("recurrent"), origin="peer", requires=("fla", "einops")),
            Impl("fla naive chunk", with_fla("chunk"), origin="peer", requires=("fla", "einops"))]


# ---------------------------------------------------------------------------------------
# Mamba-3 (SISO): no peer package runs it on CPU; the zoo's Mamba-2 at the same sizes, for scale
# ---------------------------------------------------------------------------------------
def mamba3_peers() -> list[Impl]:
    """The zoo's Mamba-2 layer (chunked SSD) with Mamba-3's head layout (d_state N, expand 2,
    headdim gcd(2H, 64)): what the trapezoid and the rotary cost over plain SSD. Other parameters
    and semantics, so compared on time only; the chunked-vs-sequential comparison is the family's
    own rows (the reference is the sequential recurrence)."""
    def mamba2(s: Sizes, mode: str) -> Built:
        torch.manual_seed(0)
        layer = registry().core("mamba2").instantiate(d_model=s["H"], d_state=s["N"], expand=2, backend="auto")
        return layer_built(layer, s, mode)

    if "mamba2" not in registry().cores:
        return []
    return [Impl("zoo mamba2 (chunked SSD)", mamba2, agrees=False, origin="peer")]


def lrcssm_tune() -> list[Impl]:
    """Window sizes and the scan inside Newton, beside the sequential loop (how the defaults were chosen)."""
    out = [lrcssm_variant("sequential", "naive", 2**18)]
    for w in TUNE_WINDOWS:
        out.append(lrcssm_variant(f"scan, window {'L' if w is None else f'2^{w.bit_length() - 1}'}",
                                  {"scan": "scan"}, w))
    return out + [lrcssm_variant("scan=naive, window 2^18", {"scan": "naive"}, 2**18),
                  lrcssm_variant("scan=naive, window L", {"scan": "naive"}, None)]


# ---------------------------------------------------------------------------------------
# depth recurrence (seed 001): training steps and adaptive depth
# ---------------------------------------------------------------------------------------
D_IN, CLASSES = 12, 9
DEPTH_CONFIGS = {"ABCDEF-final": ("independent", None, "final"), "AAAAAA-final": ("periodic", 1, "final"),
                 "AAAAAA-blockwise": ("periodic", 1, "blockwise")}


def depth_spec(policy: str, period: int | None, s: Sizes) -> dict[str, Any]:
    """The seed's configuration: LRU, state and width 64, depth 6, the uea-ema block, 12 → 9."""
    stacking: dict[str, Any] = {"policy": policy} if period is None else {"policy": policy, "period": period}
    return {"schema_version": 1, "task": {"kind": "classification", "classes": CLASSES}, "input": {"channels": D_IN},
            "model": {"d_model": s["H"], "depth": 6, "stacking": stacking, "block": {"preset": "uea-ema"},
                      "core": {"kind": "lru", "d_state": s["N"]}}}


def depth_train() -> list[Impl]:
    """One optimiser step (zero_grad, forward, cross-entropy, backward, Adam) per configuration."""
    def build_for(name: str) -> Callable[[Sizes, str], Built]:
        def build(s: Sizes, mode: str) -> Built:
            import torch.nn.functional as F

            from zoo_core.nn.blocks import count_params
            from zoo_core.build import build_model

            policy, period, loss = DEPTH_CONFIGS[name]
            model = build_model(depth_spec(policy, period, s), seed=0).train()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            g = torch.Generator().manual_seed(0)
            x = torch.randn(s["B"], s["L"], D_IN, generator=g)  # (B, L, D)
            y = torch.randint(0, CLASSES, (s["B"],), generator=g)  # (B,)

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                outs = model.period_outputs(x) if loss == "blockwise" else [model(x)]
                torch.stack([F.cross_entropy(o, y) for o in outs]).mean().backward()
                opt.step()

            return Built(step, info=lambda: {"params": count_params(model)})
        return build
    return [Impl(n, build_for(n), agrees=False) for n in DEPTH_CONFIGS]


def trained_models(patterns: tuple[str, ...] = ("AAAAAA", "ABABAB")) -> list[Row]:
    """The trained JapaneseVowels LRU models of benchmarks/repro (blockwise loss, original input):
    grid.jsonl's and the zoo sweep suites' (benchmarks/repro/sweeps), through run_grid.rows()."""
    from benchmarks.repro.run_grid import rows as repro_rows

    rows = repro_rows()
    return [r for r in rows if r["dataset"] == "JapaneseVowels" and r["core"] == "lru" and r["pattern"] in patterns
            and r["loss"] == "blockwise" and not r["c"] and (ROOT / r["model_dir"]).is_dir()]


ADAPTIVE = {"fixed-6": None,
            "adaptive": {"stop_at": "block", "max_depth": 12},
            "fixed-2 (AA)": {"stop_at": "block", "max_depth": 2, "min_depth": 2}}


def depth_adaptive(r: Row) -> list[Impl]:
    """One trained model on its own seed's test split: fixed depth 6, adaptive (stop after any
    block, at most 12, ε = sizes["eps_milli"] / 1000) and exactly two blocks (the seed's "AA");
    accuracy, mean depth and counted FLOPs go into the row, latency is timed with counting off."""
    return [Impl(k, _adaptive_build(r, k), agrees=False) for k in ADAPTIVE]


@functools.cache
def _adaptive_data(model_dir: str, seed: int) -> tuple[Any, Tensor, Tensor, Tensor, float]:
    from zoo_core.datasets import get_dataset
    from zoo_core.flops import count_flops
    from zoo_core.factory import load_pretrained
    from zoo_core.train.loop import to_tensors
    from zoo_core.train.protocol import make_splits

    model = load_pretrained(ROOT / model_dir).eval()
    test = to_tensors(make_splits(get_dataset("JapaneseVowels"), protocol="seed-split", seed=seed,
                                  val_fraction=0.15 / 0.85).test, torch.device("cpu"))
    x, y, n = test["X"], test["y"], test["lengths"]
    with torch.no_grad(), count_flops() as fc:
        model(x, lengths=n)
    return model, x, y, n, fc.total / len(y)


def _adaptive_build(r: Row, k: str) -> Callable[[Sizes, str], Built]:
    def build(s: Sizes, mode: str) -> Built:
        model, x, y, n, fixed_flops = _adaptive_data(r["model_dir"], r["seed"])
        eps = s.get("eps_milli", 10) / 1000
        opts = ADAPTIVE[k]

        def info() -> Row:
            base = {"pattern": r["pattern"], "seed": r["seed"], "sequences": len(y), "model_dir": r["model_dir"]}
            if opts is None:
                with torch.no_grad():
                    acc = float((model(x, lengths=n).argmax(-1) == y).double().mean())
                return {**base, "accuracy": acc, "mean_depth": 6.0, "flops_per_seq": fixed_flops, "flops_ratio": 1.0}
            rr = model.adaptive(x, lengths=n, epsilon=eps, **opts)
            return {**base, "accuracy": float((rr.output.argmax(-1) == y).double().mean()),
                    "mean_depth": float(rr.depth.double().mean()), "flops_per_seq": float(rr.flops.mean()),
                    "flops_ratio": float(rr.flops.mean()) / fixed_flops, "options": {"epsilon": eps, **opts}}

        if opts is None:
            return Built(_no_grad(lambda: model(x, lengths=n)), info=info)
        return Built(lambda: model.adaptive(x, lengths=n, count_flops=False, epsilon=eps, **opts), info=info)
    return build
