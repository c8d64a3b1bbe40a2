"""Token generation for language models (task ``lm``): prefill in parallel, then decode with ``step``.

Letters: B batch, L prompt length, V vocabulary. The prompt goes through
``model.forward_with_state`` once (the parallel path); every new token then costs one
``model.step`` with the recurrent state, so memory per token is constant (no growing cache and no
re-reading of the prompt). Works for any stack whose cores declare the ``step`` capability.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from .errors import SpecError
from .logs import log_once
from .packing import Segments

log = logging.getLogger(__name__)

__all__ = ["generate", "filter_logits", "model_eos"]

MODEL_EOS: Literal["model"] = "model"
"""``generate``'s default ``eos_token_id``: the model's own (its spec's ``task.eos_token_id``)."""


def model_eos(model: Any) -> int | None:
    """The end-of-sequence token the model's spec records (``task.eos_token_id``; None if it has none)."""
    spec = getattr(model, "spec", None) or {}
    value = spec.get("task", {}).get("eos_token_id") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def filter_logits(logits: Tensor, *, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set the logits outside the top-k tokens and outside the top-p nucleus to −inf.

    Args:
        logits: (B, V).
        top_k: keep the k largest logits (ties at the k-th value are kept too); None keeps all.
        top_p: keep the smallest set of most likely tokens whose probability mass reaches top_p
            (at least one token); None or 1.0 keeps all.

    Returns:
        (B, V), a new tensor.
    """
    out = logits.clone()
    if top_k is not None and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]  # (B, 1)
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(-1) - probs  # mass of the strictly more likely tokens
        drop_sorted = before >= top_p  # the first token always stays (before = 0 < top_p)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def _check(model: Any, input_ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
           top_p: float | None, eos_token_id: int | None) -> int:
    """Validate the arguments; returns the vocabulary size."""
    if getattr(model, "task", None) != "lm":
        raise SpecError(f"generate needs a language model (task 'lm'); this model's task is {getattr(model, 'task', None)!r}")
    no_step = sorted({type(c).__name__ for c in model.cores() if "step" not in getattr(c, "capabilities", ())})
    if no_step:
        raise SpecError(f"generate decodes with step(), which {', '.join(no_step)} does not declare (capability 'step'); "
                        "use a core with a recurrent mode")
    vocab = int(model.head.out_features)
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[1] < 1 or input_ids.dtype != torch.long:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise SpecError(f"input_ids must be a (B, L) LongTensor with L ≥ 1 (a prompt of at least one token); got {shape}")
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
        raise SpecError(f"input_ids must lie in [0, {vocab}) (the vocabulary); "
                        f"got values from {int(input_ids.min())} to {int(input_ids.max())}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise SpecError(f"max_new_tokens must be an int ≥ 0, got {max_new_tokens!r}")
    if not temperature > 0:
        raise SpecError(f"temperature must be > 0 (use do_sample=False for greedy decoding), got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise SpecError(f"top_k must be an int ≥ 1 or None, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise SpecError(f"top_p must be in (0, 1] or None, got {top_p}")
    if eos_token_id is not None and not 0 <= eos_token_id < vocab:
        raise SpecError(f"eos_token_id must lie in [0, {vocab}), got {eos_token_id}")
    return vocab


def _choose(logits: Tensor, do_sample: bool, temperature: float, top_k: int | None, top_p: float | None,
            generator: torch.Generator | None) -> Tensor:
    """Next token (B,) from next-token logits (B, V)."""
    if not do_sample:
        return logits.argmax(-1)
    probs = torch.softmax(filter_logits(logits.float() / temperature, top_k=top_k, top_p=top_p), dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


Step = Callable[[Tensor, Any], tuple[Tensor, Any]]

# Per model, the compiled unbound ``step`` (called with the model first), or None where compiling failed.
# Kept beside the model, not on it: a deepcopy or a pickled model must not carry a function bound to
# the original, and the compiled function holds no reference to the model (the key is weak).
_COMPILED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _compiled_step(model: Any) -> Step | None:
    """``model.step`` under ``torch.compile`` (Inductor, one graph, static shapes), made once per model;
    None where it failed before. A new batch size compiles once more. Decoding a token is a few dozen
    small ops, so eager decoding on a CPU is bound by per-op dispatch, which the compiled graph removes
    (``benchmarks/REPORT_MAMBA.md``, family ``mamba/generate``)."""
    if model not in _COMPILED:
        _COMPILED[model] = torch.compile(type(model).step, fullgraph=True, dynamic=False)
    fn = _COMPILED[model]
    return None if fn is None else (lambda token, state: fn(model, token, state))


def _first_step(model: Any, compiled: Step, token: Tensor, state: Any) -> tuple[tuple[Tensor, Any], Step]:
    """One compiled step, and the step to go on with: the eager one, announced once, if compiling failed.

    A failure is blamed on compiling only if the eager step then succeeds; an error of the step itself
    (bad input, out of memory) is raised as eager decoding raises it, and compiling is tried again later."""
    try:
        return compiled(token, state), compiled
    except Exception as exc:  # noqa: BLE001 - a missing C++ compiler or an Inductor gap: decode eagerly, say why
        out = model.step(token, state)  # raises what eager decoding would: then it was not the compiler
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        log_once(log, logging.WARNING, ("compile", type(model).__name__, reason),
                 "generate(compile=True): compiling the decoding step failed, so decoding runs eagerly (several times "
                 "slower on a CPU): %s", reason)
        _COMPILED[model] = None  # not again for this model
        return out, model.step


def _growing(model: Any) -> list[str]:
    """The model's cores whose decoding state grows with every token (attention's KV cache), by class name."""
    return sorted({type(c).__name__ for c in model.cores() if (hp := getattr(c, "hparams", None)) is not None
                   and hp.grows_state()})


def _check_prompt_lengths(lengths: Tensor, input_ids: Tensor) -> Tensor:
    B, L = input_ids.shape
    if not isinstance(lengths, Tensor) or lengths.shape != (B,) or lengths.dtype not in (torch.int32, torch.int64):
        raise SpecError(f"prompt_lengths must be an integer tensor of shape ({B},), one length per prompt")
    if bool((lengths < 1).any()) or bool((lengths > L).any()):
        raise SpecError(f"prompt_lengths must lie in [1, {L}] (the padded prompt width), got {lengths.tolist()}")
    return lengths.long().to(input_ids.device)


@torch.no_grad()
def generate(
    model: Any,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None | Literal["model"] = MODEL_EOS,
    prompt_lengths: Tensor | None = None,
    compile: bool = False,
) -> Tensor:
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Greedy (``do_sample=False``, the most likely token, first index on ties) or sampled from
    softmax(logits / temperature) restricted to the top-k tokens and the top-p nucleus. The model
    runs in eval mode (dropout off) and is put back in its previous mode afterwards.

    Args:
        model: a ``SequenceModel`` with task ``lm`` whose cores declare ``step``.
        input_ids: (B, L) prompt tokens, L ≥ 1.
        max_new_tokens: how many tokens to add at most.
        do_sample, temperature, top_k, top_p: the decoding rule (temperature, top_k, top_p apply
            when sampling).
        generator: the random generator for sampling (reproducible draws).
        eos_token_id: a sequence that emits it is finished: later positions repeat eos, and
            generation stops early once every sequence has finished. The default, ``"model"``, is
            the model's own eos (``task.eos_token_id`` in its spec, which ``zoo convert`` carries
            over from transformers' configs, as transformers' ``generate`` stops there too); an int
            overrides it; ``None`` disables stopping.
        prompt_lengths: (B,) for prompts of unequal length, right-padded in ``input_ids``: prompt b is
            ``input_ids[b, :prompt_lengths[b]]``. They are prefilled as packed documents
            (``zoo_core.packing``), so the padding never enters a state, and each continues from its
            own last token — exactly as when run alone.
        compile: decode with ``model.step`` compiled by ``torch.compile`` (Inductor, one graph, static
            shapes), kept on the model for later calls: on a CPU about twice the tokens per second of eager
            decoding for small models (``benchmarks/REPORT_MAMBA.md``), after a one-time compile of tens of
            seconds (and once more per new batch size); the same tokens. If compiling fails (no C++
            compiler, an op Inductor cannot take) decoding runs eagerly and a warning says why, once.

    Returns:
        (B, L + n) LongTensor, ``input_ids`` (as given) followed by n ≤ max_new_tokens new tokens.

    Raises:
        SpecError: a model that is not a language model or cannot step, or bad arguments.
    """
    if eos_token_id == MODEL_EOS:
        eos_token_id = model_eos(model)
    elif isinstance(eos_token_id, str):
        raise SpecError(f"eos_token_id must be a token id, None (no stopping) or 'model' (the model's own), got {eos_token_id!r}")
    _check(model, input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id)
    was_training = model.training
    model.eval()
    try:
        out = [input_ids]
        if max_new_tokens == 0:
            return input_ids.clone()
        if prompt_lengths is None:
            logits, state = model.forward_with_state(input_ids)  # (B, L, V): the prompt in parallel
            next_logits = logits[:, -1]  # (B, V)
        else:
            lengths = _check_prompt_lengths(prompt_lengths, input_ids)
            seg = Segments.from_lengths(lengths, input_ids.shape[1])
            growing = _growing(model)
            if growing and len(set(lengths.tolist())) > 1:
                raise SpecError(f"{', '.join(growing)} keeps a KV cache as long as its prompt, so prompts of unequal "
                                "lengths cannot share one batched state; call generate once per group of equal-length "
                                "prompts (or give the attention a window)")
            logits, state = model.forward_with_state(input_ids, seq_idx=seg.seq_idx)  # one state per prompt
            next_logits = logits[torch.arange(len(lengths), device=logits.device), lengths - 1]
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        step: Step | None = model.step
        if compile:
            growing = _growing(model)
            if growing:  # a KV cache changes shape every token: a static graph would recompile at each one
                log_once(log, logging.WARNING, ("compile-growing", tuple(growing)),
                         "generate(compile=True): %s keeps a KV cache that grows every token, so the step is not "
                         "compiled (decoding runs eagerly); give the attention a window for a fixed-size state",
                         ", ".join(growing))
            else:
                step = _compiled_step(model)  # None: compiling failed before, eager; else tried on the first step
                step = model.step if step is None else None
        for i in range(max_new_tokens):
            token = _choose(next_logits, do_sample, temperature, top_k, top_p, generator)  # (B,)
            if eos_token_id is not None:
                token = token.masked_fill(done, eos_token_id)
                done = done | (token == eos_token_id)
            out.append(token[:, None])
            if i + 1 == max_new_tokens or (eos_token_id is not None and bool(done.all())):
                break
            if step is None:
                compiled = _compiled_step(model)
                assert compiled is not None  # checked before the loop  # narrows the type
                (next_logits, state), step = _first_step(model, compiled, token, state)
            else:
                next_logits, state = step(token, state)  # (B, V), one token at a time
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)
