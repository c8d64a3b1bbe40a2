"""Mamba on CPU: the whole mixer forward and forward+backward, zoo backends against transformers'
slow path and mambapy's parallel scan; token generation against transformers' cached generate.

Mixer: B=8, inner width Di ∈ {128, 1536} (d_model = Di/2, expand 2), N=16, d_conv 4,
L ∈ {256, 1024, 4096}. Implementations, all with the same weights (their state-dict keys are equal):
``zoo-scan`` (backend ``scan`` = selective-chunked, what auto picks on CPU), ``zoo-naive`` (the
reference loop), ``transformers`` (``MambaMixer``, its sequential torch path), ``mambapy``
(``mambapy.mamba.MambaBlock`` with ``pscan=True``, Blelloch scan padded to a power of two).
Forward under no_grad; forward+backward with a fixed cotangent into every parameter and the input.
An implementation whose call is predicted (its time at the previous L, scaled by the length ratio)
to exceed ``--max-call-s`` is skipped and the row says so. Peak memory: the rise of peak RSS over
one extra call (after ``malloc_trim`` and a VmHWM reset), in this process.

Generation: a MambaForCausalLM (d_model 256, 4 layers, vocab 1024) with random weights, converted
to the zoo with ``zoo_mamba``'s converter; greedy, prompt 16 tokens, 256 new tokens, B ∈ {1, 8};
tokens/s of ``zoo_core.generate.generate`` against ``model.generate(use_cache=True)``; both produce
the same tokens (checked). Constant memory: the zoo's state size after 16 and after 272 tokens.

    python benchmarks/bench_mamba.py              # everything (~15 min on 2 shared cores)
    python benchmarks/bench_mamba.py --report     # results/mamba.jsonl -> REPORT_MAMBA.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Writer, _rss_kib, layer_call, machine, reset_peak_rss, summary, time_block  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "mamba.jsonl"
IMPLS = ("zoo-scan", "zoo-naive", "transformers", "mambapy")
MODES = {"fwd": "forward", "fwdbwd": "forward+backward"}


def mixers(d_inner: int) -> dict[str, torch.nn.Module]:
    import mambapy.mamba as mp
    import transformers
    from transformers.models.mamba.modeling_mamba import MambaMixer

    from zoo_mamba.core import Mamba

    H = d_inner // 2
    torch.manual_seed(0)
    hf = MambaMixer(transformers.MambaConfig(hidden_size=H, state_size=16, conv_kernel=4, expand=2, num_hidden_layers=1), 0)
    with torch.no_grad():
        hf.init_mamba_weights()
    out = {"transformers": hf}
    for name, backend in (("zoo-scan", "scan"), ("zoo-naive", "naive")):
        out[name] = Mamba(H, d_state=16, d_conv=4, expand=2, backend=backend)
        out[name].load_state_dict(hf.state_dict())
    out["mambapy"] = mp.MambaBlock(mp.MambaConfig(d_model=H, n_layers=1, d_state=16, expand_factor=2, d_conv=4, pscan=True))
    out["mambapy"].load_state_dict(hf.state_dict())
    return out


def peak_mib(call) -> float:
    base = reset_peak_rss(trim=True)
    call()
    return (_rss_kib("VmHWM") - base) / 1024


def bench_mixers(w: Writer, args: argparse.Namespace) -> None:
    for d_inner in args.D:
        layers = mixers(d_inner)
        for mode in args.modes:
            last: dict[str, tuple[int, float]] = {}
            for L in args.L:
                torch.manual_seed(1)
                x = torch.randn(8, L, d_inner // 2)
                calls, workload = {}, f"mixer Di={d_inner} L={L} {mode}"
                for name in args.impls:
                    # transformers' backward slices its full (B, Di, L, N) tensors at every step: O(L²)
                    power = 2 if (name == "transformers" and mode == "fwdbwd") else 1
                    guess = last[name][1] * (L / last[name][0]) ** power if name in last else 0.0
                    if guess > args.max_call_s:
                        w.write({"kind": "result", "workload": workload, "impl": name, "status": "skipped",
                                 "reason": f"predicted {guess:.0f} s per call from L={last[name][0]} (> {args.max_call_s:.0f} s)"})
                        continue
                    calls[name] = layer_call(layers[name], x.detach().clone(), mode)
                times, foreign = time_block(calls, args.repeats, args.quiet_wait)
                ref = None
                for name, ts in times.items():
                    s = summary(ts)
                    last[name] = (L, s["median_s"])
                    if ref is None:
                        ref = s["median_s"]
                    w.write({"kind": "result", "workload": workload, "impl": name, "D": d_inner, "L": L, "mode": mode,
                             "foreign": foreign, "peak_mib": round(peak_mib(calls[name]), 1), **s})


def bench_generation(w: Writer, args: argparse.Namespace) -> None:
    import transformers

    from zoo_core.convert import convert_checkpoint
    from zoo_core.generate import generate

    torch.manual_seed(0)
    cfg = transformers.MambaConfig(hidden_size=256, num_hidden_layers=4, vocab_size=1024, state_size=16,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = transformers.MambaForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(Path(tmp) / "hf")
        zoo = convert_checkpoint(Path(tmp) / "hf", Path(tmp) / "zoo")[2].eval()
    new = args.new_tokens
    for B in (1, 8):
        ids = torch.randint(0, 1024, (B, 16), generator=torch.Generator().manual_seed(B))
        mask = torch.ones_like(ids)
        outs = {}
        calls = {
            "zoo generate": lambda: outs.__setitem__("zoo", generate(zoo, ids, new)),
            "transformers generate": lambda: outs.__setitem__("hf", hf.generate(ids, attention_mask=mask, max_new_tokens=new,
                                                                               do_sample=False, use_cache=True)),
        }
        times, foreign = time_block(calls, args.repeats, args.quiet_wait)
        same = bool(torch.equal(outs["zoo"], outs["hf"]))
        for name, ts in times.items():
            s = summary(ts)
            w.write({"kind": "result", "workload": f"generate B={B} prompt=16 new={new}", "impl": name, "B": B,
                     "tokens_per_s": round(B * new / s["median_s"], 1), "same_tokens": same, "foreign": foreign, **s})
    with torch.no_grad():
        _, st = zoo.forward_with_state(ids)
        size0 = sum(v.numel() * v.element_size() for v in st.values())
        for _ in range(256):
            _, st = zoo.step(ids[:, 0], st)
        size1 = sum(v.numel() * v.element_size() for v in st.values())
    w.write({"kind": "result", "workload": "generate state bytes (B=8)", "impl": "zoo generate",
             "after_16_tokens": size0, "after_272_tokens": size1})


def report() -> str:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    runs = [r for r in rows if r["kind"] == "run"]
    res = {}
    for r in rows:
        if r["kind"] == "result":
            res[(r["workload"], r["impl"])] = r
    out = ["# Mamba on CPU: mixer and generation (benchmarks/bench_mamba.py)", ""]
    if runs:
        m = runs[-1]["machine"]
        out += [f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs (shared with other jobs), torch {m['torch']}, "
                f"threads {runs[-1]['threads']}. Medians of {runs[-1]['repeats']} interleaved rounds; ratio = peer / zoo-scan.", ""]
    out += ["| workload | " + " | ".join(IMPLS) + " | best peer / zoo-scan | peak MiB (zoo-scan / best peer) |",
            "|---" * (len(IMPLS) + 3) + "|"]
    workloads = sorted({w for (w, _) in res if w.startswith("mixer")},
                       key=lambda s: (int(s.split("Di=")[1].split()[0]), s.split()[-1], int(s.split("L=")[1].split()[0])))
    for wl in workloads:
        cells, peers = [], []
        for impl in IMPLS:
            r = res.get((wl, impl))
            if r is None:
                cells.append("—")
            elif r.get("status") == "skipped":
                cells.append("skipped")
            else:
                cells.append(f"{r['median_s']:.3f} s")
                if impl in ("transformers", "mambapy"):
                    peers.append(r)
        ours = res.get((wl, "zoo-scan"))
        if ours and peers and "median_s" in ours:
            best = min(peers, key=lambda r: r["median_s"])
            ratio, mem = f"{best['median_s'] / ours['median_s']:.1f}× ({best['impl']})", f"{ours['peak_mib']} / {best['peak_mib']}"
        else:
            ratio, mem = "—", "—"
        out.append(f"| {wl} | " + " | ".join(cells) + f" | {ratio} | {mem} |")
    out += ["", "| generation | impl | median | tokens/s | same tokens |", "|---|---|---|---|---|"]
    for (wl, impl), r in sorted(res.items()):
        if wl.startswith("generate B="):
            out.append(f"| {wl} | {impl} | {r['median_s']:.3f} s | {r['tokens_per_s']} | {r['same_tokens']} |")
    st = res.get(("generate state bytes (B=8)", "zoo generate"))
    if st:
        out += ["", f"Zoo decoding state (B=8): {st['after_16_tokens']} bytes after 16 tokens, {st['after_272_tokens']} after 272."]
    skipped = [f"{wl} {impl}: {r['reason']}" for (wl, impl), r in sorted(res.items()) if r.get("status") == "skipped"]
    if skipped:
        out += ["", "Skipped (a peer that cannot finish a call within the limit):", *[f"* {s}" for s in skipped]]
    out += ["", *NOTES]
    return "\n".join(out) + "\n"


NOTES = [
    "Notes.",
    "",
    "* Every row above comes from the latest run of its workload (results/mamba.jsonl keeps all runs):",
    "  the final runs were taken on a quiet machine (`foreign` ≤ 0.04 cores), 3 interleaved rounds:",
    "  `--D 128 --repeats 3` (mixers and generation), then `--D 1536 --L 256 1024 --skip-generation`",
    "  and `--D 1536 --L 4096 --impls zoo-scan zoo-naive --skip-generation`.",
    "* Target (forward+backward at L=4096, ≥ 3× the faster peer, no more peak memory): met at Di=128",
    "  (3.0× mambapy, far less memory). At Di=1536, L=4096 the peers were not run: mambapy's peak at",
    "  Di=128 (≈2.7 GiB) scales with Di to ≈33 GiB, beyond this 24 GiB machine, and transformers is",
    "  skipped by the time rule; the nearest measured point, Di=1536 L=1024, is 4.3× mambapy.",
    "* At short L the naive loop is as fast as or faster than the chunked scan (Di=1536, L ≤ 1024):",
    "  `auto` still picks the chunked scan on CPU, which wins at L=4096 and holds one chunk in memory.",
    "* transformers' forward+backward is quadratic in L on CPU (its loop indexes the full",
    "  (B, Di, L, N) tensors at every step, and each slice's backward writes a full-size gradient), so it",
    "  is skipped once a call is predicted to exceed 60 s.",
    "* The generation rows with new=128 are from the first run, taken under foreign load (its B=1 median",
    "  mixes a 6.1 s and a 0.25 s round); the new=256 rows are the quiet ones.",
    "* The zoo's decoding state is the same size after 16 and after 272 tokens: constant memory per token.",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--D", type=int, nargs="+", default=[128, 1536])
    p.add_argument("--L", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=list(IMPLS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quiet-wait", type=float, default=3.0)
    p.add_argument("--max-call-s", type=float, default=60.0)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--skip-mixers", action="store_true")
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    if args.report:
        (HERE / "REPORT_MAMBA.md").write_text(report())
        return
    run = uuid.uuid4().hex[:8]
    w = Writer(RESULTS, {"run": run, "threads": torch.get_num_threads()})
    w.write({"kind": "run", "machine": machine(), "repeats": args.repeats, "argv": sys.argv[1:]})
    t0 = time.perf_counter()
    if not args.skip_mixers:
        bench_mixers(w, args)
    if not args.skip_generation:
        bench_generation(w, args)
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
