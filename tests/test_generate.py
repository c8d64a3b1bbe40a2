"""zoo_core.generate: prefill + step decoding equals the parallel forward, greedy equals re-running
the whole prefix, sampling follows the filtered distribution, eos stops, memory per token is fixed."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from zoo_core import generate as G
from zoo_core.build import build_model
from zoo_core.errors import SpecError
from zoo_core.generate import filter_logits, generate
from zoo_core.logs import reset_log_once
from zoo_core.testing.helpers import cores_with

V = 23


def lm_spec(core: dict) -> dict:
    return {"schema_version": 1, "task": {"kind": "lm"}, "input": {"vocab_size": V},
            "model": {"d_model": 12, "depth": 2, "block": {"norm": "rms", "activation": "identity", "output": "none"},
                      "final_norm": "rms", "tie_embeddings": True, "core": core}}


CORES = cores_with("step")  # generation streams: every core that steps, a new plugin's included


def _model(name: str, dtype=torch.float64):
    return build_model(lm_spec({"kind": name, "preset": "tiny"}), seed=0).to(dtype).eval()


def _prompt(B=3, L=7, seed=0):
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(CORES))
def test_step_decoding_equals_parallel_forward(name):
    """Logits from one prefill + step per token equal the parallel forward over the whole sequence."""
    model = _model(name)
    seq = _prompt(2, 17)
    with torch.no_grad():
        full = model(seq)  # (B, L, V)
        logits, state = model.forward_with_state(seq[:, :6])
        outs = [logits]
        for t in range(6, seq.shape[1]):
            y, state = model.step(seq[:, t], state)
            outs.append(y[:, None])
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(CORES))
def test_greedy_equals_rerunning_the_whole_prefix(name):
    model = _model(name)
    prompt = _prompt()
    out = generate(model, prompt, 12)
    assert out.shape == (3, 7 + 12) and out.dtype == torch.long and torch.equal(out[:, :7], prompt)
    seq = prompt
    with torch.no_grad():
        for _ in range(12):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


def test_prefill_once_then_one_step_per_token(monkeypatch):
    """The prompt is read once in parallel; each new token costs one step with a fixed-size state."""
    model = _model("mamba")
    calls = {"prefill": [], "step": 0, "sizes": set()}
    prefill, step = model.forward_with_state, model.step

    def count_prefill(x, state=None):
        calls["prefill"].append(tuple(x.shape))
        return prefill(x, state)

    def count_step(x, state):
        calls["step"] += 1
        calls["sizes"].add(tuple((k, tuple(v.shape)) for k, v in sorted(state.flatten().items())))
        return step(x, state)

    monkeypatch.setattr(model, "forward_with_state", count_prefill)
    monkeypatch.setattr(model, "step", count_step)
    generate(model, _prompt(2, 5), 40)
    assert calls["prefill"] == [(2, 5)] and calls["step"] == 39
    assert len(calls["sizes"]) == 1  # the same state shapes at every token: constant memory


def test_sampling_is_reproducible_and_top_k_1_is_greedy():
    model = _model("s4d")
    prompt = _prompt()
    a = generate(model, prompt, 10, do_sample=True, temperature=1.3, generator=torch.Generator().manual_seed(5))
    b = generate(model, prompt, 10, do_sample=True, temperature=1.3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    greedy = generate(model, prompt, 10)
    assert torch.equal(generate(model, prompt, 10, do_sample=True, top_k=1, generator=torch.Generator().manual_seed(1)), greedy)
    assert torch.equal(generate(model, prompt, 10, do_sample=True, top_p=1e-6, generator=torch.Generator().manual_seed(1)), greedy)
    many = [generate(model, prompt, 10, do_sample=True, temperature=5.0, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    assert not all(torch.equal(m, greedy) for m in many)  # sampling at a high temperature does move


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    keep = lambda out: torch.isfinite(out)[0].tolist()  # noqa: E731
    assert keep(filter_logits(logits, top_k=2)) == [False, True, False, True]
    assert keep(filter_logits(logits, top_p=0.8)) == [False, True, False, True]  # 0.5 + 0.3 reaches 0.8
    assert keep(filter_logits(logits, top_p=0.81)) == [False, True, True, True]
    assert keep(filter_logits(logits, top_p=0.3)) == [False, True, False, False]  # at least the top token
    assert keep(filter_logits(logits, top_k=3, top_p=0.95)) == [False, True, True, True]
    assert keep(filter_logits(logits)) == [True] * 4
    kept = filter_logits(logits, top_k=2)
    torch.testing.assert_close(kept[0, [1, 3]], logits[0, [1, 3]])  # kept values are unchanged


def test_sampled_frequencies_follow_the_filtered_softmax():
    """Draws from temperature 2, top-k 3 match softmax(logits/2) renormalised over the top 3."""
    from zoo_core.generate import _choose

    logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0]]).expand(4000, -1)
    g = torch.Generator().manual_seed(0)
    tokens = _choose(logits, True, 2.0, 3, None, g)
    freq = torch.bincount(tokens, minlength=5).double() / tokens.numel()
    p = torch.softmax(torch.tensor([2.0, 0.5, -1.0, 1.0, 0.0], dtype=torch.float64) / 2, 0)
    p[[2, 4]] = 0
    p /= p.sum()
    assert freq[2] == 0 and freq[4] == 0
    assert (freq - p).abs().max() < 4 * math.sqrt(0.25 / 4000)


def test_eos_finishes_sequences_and_stops_early():
    model = _model("s4d")
    prompt = _prompt()
    greedy = generate(model, prompt, 15)
    eos = int(greedy[0, 7 + 2])  # the token sequence 0 emits third
    out = generate(model, prompt, 15, eos_token_id=eos)
    for b in range(3):
        new = out[b, 7:]
        hits = (new == eos).nonzero()
        if len(hits):
            first = int(hits[0])
            assert torch.equal(new[:first + 1], greedy[b, 7:7 + first + 1]) and bool((new[first:] == eos).all())
        else:
            assert torch.equal(new, greedy[b, 7:7 + new.shape[0]])
    every = generate(model, prompt[:1], 15, eos_token_id=int(greedy[0, 7]))
    assert every.shape == (1, 8)  # the first new token is eos: stop at once


def test_mode_is_restored_and_zero_tokens_returns_the_prompt():
    model = _model("s4d").train()
    prompt = _prompt()
    assert torch.equal(generate(model, prompt, 0), prompt)
    generate(model, prompt, 3)
    assert model.training


def test_bad_arguments_are_refused(monkeypatch):
    model = _model("s4d")
    prompt = _prompt()
    for kwargs, match in [
        ({"temperature": 0.0, "do_sample": True}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"eos_token_id": V}, "eos_token_id"),
    ]:
        with pytest.raises(SpecError, match=match):
            generate(model, prompt, 3, **kwargs)
    with pytest.raises(SpecError, match="max_new_tokens"):
        generate(model, prompt, -1)
    with pytest.raises(SpecError, match="LongTensor"):
        generate(model, prompt.float(), 3)
    with pytest.raises(SpecError, match="LongTensor"):
        generate(model, prompt[:, :0], 3)
    with pytest.raises(SpecError, match=r"\[0, 23\)"):
        generate(model, prompt + V, 3)
    seq = build_model({"schema_version": 1, "task": {"kind": "sequence", "outputs": 2}, "input": {"channels": 2},
                       "model": {"d_model": 4, "depth": 1, "core": {"kind": "s4d", "preset": "tiny"}}}, seed=0)
    with pytest.raises(SpecError, match="task 'lm'"):
        generate(seq, prompt, 3)
    monkeypatch.setattr(type(model.cores()[0]), "capabilities", frozenset({"lti"}))
    with pytest.raises(SpecError, match="capability 'step'"):
        generate(model, prompt, 3)


def test_the_models_own_eos_is_the_default_and_the_spec_checks_it():
    from zoo_core.spec import load_spec

    plain = _model("s4d")
    prompt = _prompt()
    greedy = generate(plain, prompt, 15, eos_token_id=None)
    eos = int(greedy[0, 7 + 2])
    spec = lm_spec({"kind": "s4d", "preset": "tiny"})
    spec["task"] = {"kind": "lm", "eos_token_id": eos, "bos_token_id": 0}
    model = build_model(spec, seed=0).to(torch.float64).eval()
    assert torch.equal(generate(model, prompt, 15), generate(plain, prompt, 15, eos_token_id=eos))  # its eos by default
    assert torch.equal(generate(model, prompt, 15, eos_token_id=None), greedy)  # None: no stopping
    for task, match in (({"kind": "lm", "eos_token_id": V}, "outside the vocabulary"),
                        ({"kind": "classification", "classes": 3, "eos_token_id": 1}, "does not take task.eos_token_id")):
        with pytest.raises(SpecError, match=match):
            load_spec({**spec, "task": task})


@pytest.mark.parametrize("name", sorted(CORES))
def test_right_padded_prompts_generate_as_each_prompt_alone(name):
    """prompt_lengths: unequal prompts prefilled as packed documents (padding of any token never
    reaches a state, transformers #48256's pitfall), each continued from its own last token."""
    model = _model(name)
    prompt = _prompt(3, 9, seed=4)
    lengths = torch.tensor([9, 4, 1])
    padded = prompt.clone()
    padded[1, 4:] = 7
    padded[2, 1:] = 0
    if any(c.hparams.grows_state() for c in model.cores()):  # a KV cache per prompt has the prompt's length
        with pytest.raises(SpecError, match="call generate once per group of equal-length prompts"):
            generate(model, padded, 6, prompt_lengths=lengths, eos_token_id=None)
        return
    out = generate(model, padded, 6, prompt_lengths=lengths, eos_token_id=None)
    assert out.shape == (3, 9 + 6) and torch.equal(out[:, :9], padded)
    for b, n in enumerate(lengths.tolist()):
        alone = generate(model, prompt[b : b + 1, :n], 6, eos_token_id=None)
        assert torch.equal(out[b, 9:], alone[0, n:]), (b, out[b], alone)
    with pytest.raises(SpecError, match="prompt_lengths must lie in"):
        generate(model, padded, 2, prompt_lengths=torch.tensor([9, 0, 1]))


def test_generation_builds_no_autograd_graph():
    model = _model("mamba")
    seen = []
    step = model.step

    def spy(*a, **k):
        seen.append(torch.is_grad_enabled())
        return step(*a, **k)

    model.step = spy
    out = generate(model, _prompt(2, 4), 3, eos_token_id=None)
    assert seen and not any(seen) and not out.requires_grad


def test_a_packed_prefill_gives_each_document_its_own_state():
    """model.forward_with_state(x, seq_idx=...) -> one stream per document, each continuing as alone."""
    model = _model("mamba")
    seq = _prompt(1, 12, seed=9)
    seq_idx = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]])
    with torch.no_grad():
        logits, state = model.forward_with_state(seq, seq_idx=seq_idx)
        assert state.t.tolist() == [5, 3, 4] and logits.shape == (1, 12, V)
        nxt = torch.tensor([3, 5, 8])
        stepped, _ = model.step(nxt, state)
        for d, (s, e) in enumerate([(0, 5), (5, 8), (8, 12)]):
            solo = model(torch.cat([seq[:, s:e], nxt[d : d + 1, None]], 1))
            torch.testing.assert_close(logits[0, s:e], solo[0, :-1])
            torch.testing.assert_close(stepped[d], solo[0, -1])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mamba", "s4d"])
def test_compiled_decoding_gives_the_same_tokens_and_is_kept_beside_the_model(name, caplog):
    """generate(compile=True): Inductor compiles the step once per model (kept for later calls, not on the
    model: a deepcopy does not share it), the same greedy tokens, and no fallback."""
    import copy
    torch._dynamo.reset()
    model = _model(name, torch.float32)
    prompt = _prompt()
    want = generate(model, prompt, 10)
    with caplog.at_level(logging.WARNING, logger="zoo_core.generate"):
        assert torch.equal(generate(model, prompt, 10, compile=True), want)
        compiled = G._COMPILED[model]
        assert compiled is not None  # compiled, not fallen back to eager
        assert torch.equal(generate(model, prompt, 10, compile=True), want) and G._COMPILED[model] is compiled
    assert not [r for r in caplog.records if "compil" in r.getMessage()]
    twin = copy.deepcopy(model)
    assert twin not in G._COMPILED and "_zoo_compiled_step" not in vars(twin)


def _broken_compile(fn, **kw):
    def run(*a, **k):
        raise RuntimeError("InductorError: no working C++ compiler (test)")
    return run


def test_a_failed_compile_decodes_eagerly_and_says_why_once(monkeypatch, caplog):
    monkeypatch.setattr(torch, "compile", _broken_compile)
    reset_log_once()
    model = _model("mamba")
    prompt = _prompt()
    want = generate(model, prompt, 6)
    with caplog.at_level(logging.WARNING, logger="zoo_core.generate"):
        assert torch.equal(generate(model, prompt, 6, compile=True), want)
        assert G._COMPILED[model] is None  # eager from now on for this model
        assert torch.equal(generate(model, prompt, 6, compile=True), want)
    said = [r.getMessage() for r in caplog.records if "compiling the decoding step failed" in r.getMessage()]
    assert len(said) == 1 and "no working C++ compiler (test)" in said[0]


def test_an_error_of_the_step_itself_is_not_blamed_on_compiling(monkeypatch, caplog):
    monkeypatch.setattr(torch, "compile", _broken_compile)
    reset_log_once()
    model = _model("mamba")

    def step(token, state):
        raise MemoryError("out of memory (test)")

    monkeypatch.setattr(model, "step", step)
    with caplog.at_level(logging.WARNING, logger="zoo_core.generate"), pytest.raises(MemoryError, match="out of memory"):
        generate(model, _prompt(), 6, compile=True)
    assert not [r for r in caplog.records if "compil" in r.getMessage()]
    assert G._COMPILED[model] is not None  # compiling is not given up for an error of the step


def test_a_growing_kv_cache_is_decoded_eagerly_and_says_why(caplog):
    reset_log_once()
    model = _model("attention")
    prompt = _prompt()
    want = generate(model, prompt, 5)
    with caplog.at_level(logging.WARNING, logger="zoo_core.generate"):
        assert torch.equal(generate(model, prompt, 5, compile=True), want)
    assert any("KV cache that grows" in r.getMessage() for r in caplog.records) and model not in G._COMPILED
