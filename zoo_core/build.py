"""Spec → SequenceModel, and the model summary ``zoo build`` prints."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .logs import log_once
from .nn.adaptive import AdaptiveConfig
from .nn.bidirectional import Bidirectional
from .nn.blocks import Block, LrcBlock, count_params, make_block, make_mlp_or_linear, make_norm
from .nn.model import SequenceModel
from .nn.pools import make_pool
from .nn.reshape import InputReshaper
from .nn.stack import Stack
from .plugin_registry import Registry
from .plugins import using_registry
from .spec import Spec, load_spec
from .stacking_policies import pattern

log = logging.getLogger(__name__)


def build_model(
    spec: Spec | str | os.PathLike[str] | Mapping[str, Any],
    *,
    registry: Registry | None = None,
    device: Any = None,
    dtype: Any = None,
    seed: int | None = None,
) -> SequenceModel:
    """Build the model a spec describes (a validated ``Spec``, a YAML path or a dict)."""
    if not isinstance(spec, Spec):
        spec = load_spec(spec, registry=registry)
    with using_registry(registry):  # cores resolve backends in the registry their spec was checked in
        return _assemble(spec, device=device, dtype=dtype, seed=seed)


def _warn_once(message: str) -> None:
    log_once(log, logging.WARNING, message, "%s", message)


def _is_meta(device: Any) -> bool:
    return device is not None and torch.device(device).type == "meta"


def _make_blocks(spec: Spec, kw: dict[str, Any]) -> list[Block | LrcBlock]:
    """One block per unique block of the schedule, each around the core its positions place (a
    hybrid stack mixes cores; validation made positions sharing a block agree). On the meta device
    a block is a copy of the first block with the same core: the shapes are what a real build makes,
    and a 4096-block spec is sized in milliseconds instead of re-running each core's init."""
    m = spec.envelope.model
    recipe = m.block.recipe()
    first: dict[str, Block | LrcBlock] = {}
    blocks: list[Block | LrcBlock] = []
    for name in spec.block_cores():
        if _is_meta(kw["device"]) and name in first:
            blocks.append(copy.deepcopy(first[name]))
            continue
        entry, params = spec.core_at(name)
        core = entry.instantiate(**params.model_dump(), **kw)
        bi = m.block.bidirectional
        if bi is not None:  # the reversed direction: the same core again (its own draw), or the one core both ways
            back = None if bi.shared else entry.instantiate(**params.model_dump(), **kw)
            core = Bidirectional(core, m.d_model, combine=bi.combine, shared=bi.shared, backward_core=back, **kw)
        block = make_block(m.block.layout, core, m.d_model, **recipe, **kw)
        first.setdefault(name, block)
        blocks.append(block)
    return blocks


def _assemble(spec: Spec, *, device: Any, dtype: Any, seed: int | None) -> SequenceModel:
    if seed is not None:
        torch.manual_seed(seed)
    env, m = spec.envelope, spec.envelope.model
    kw = {"device": device, "dtype": dtype}
    schedule = spec.policy.schedule(m.depth)
    blocks = _make_blocks(spec, kw)
    st = m.stacking
    if m.block.norm == "batch" and st.norms == "shared" and len(blocks) < len(schedule):
        _warn_once(
            f"{spec.filename}: model.block.norm 'batch' in a block reused across depth ({pattern(schedule)}) keeps one "
            "set of running statistics for every position it runs at, so eval mode normalises each position with "
            "their average (measured: shared LRU models at 34-51% test accuracy where ABCDEF reached 97%, "
            "benchmarks/REPRO.md). Use norm: ema_batch (block preset uea-ema, as the seed's JAX code) or "
            "model.stacking.norms: per_position"
        )
    stack = Stack(blocks, schedule, damping=st.damping,
                  damping_init=0.9 if st.damping_init is None else st.damping_init, norms=st.norms,
                  core_names=spec.block_cores())
    reshaper = None
    d_in = (env.input.channels or 0) + int(env.input.include_time)
    if env.input.reshape is not None:
        reshaper = InputReshaper(d_in, env.input.reshape.c)
        d_in = env.input.reshape.c
    if env.input.vocab_size is not None:
        encoder: nn.Module = nn.Embedding(env.input.vocab_size, m.d_model, **kw)
    else:
        encoder = make_mlp_or_linear(m.encoder.kind, d_in, m.d_model, hidden=m.encoder.hidden or m.d_model, **kw)
    out = {"classification": env.task.classes, "lm": env.input.vocab_size}.get(env.task.kind, env.task.outputs)
    assert out is not None, "the spec's validators require task.classes, input.vocab_size (lm) or task.outputs"
    head = make_mlp_or_linear(m.head.kind, m.d_model, out, hidden=m.head.hidden or m.d_model, bias=not m.tie_embeddings, **kw)
    if m.tie_embeddings:
        # N(0, 0.02) as mamba_ssm/GPT-2 start a tied embedding: nn.Embedding's N(0, 1) makes the tied head's
        # first logits ~√d_model wide (a first loss of ~38 nats for 84 characters instead of ln 84 = 4.4)
        assert isinstance(encoder, nn.Embedding), "tie_embeddings is validated to task kind lm, which reads tokens"
        nn.init.normal_(encoder.weight, std=0.02)
        head.weight = encoder.weight
    ad = st.adaptive
    adaptive = None if ad is None else AdaptiveConfig(ad.epsilon, ad.max_depth, ad.min_depth, ad.stop_at, ad.prediction)
    return SequenceModel(
        encoder=encoder,
        stack=stack,
        head=head,
        task=env.task.kind,
        pool=make_pool(env.pool),
        d_model=m.d_model,
        final_norm=make_norm(m.final_norm, m.d_model, eps=m.block.norm_eps, **kw),
        time_length=env.input.length if env.input.include_time else None,
        reshaper=reshaper,
        adaptive=adaptive,
        spec=spec.resolved(),
    )


def _fmt(n: int) -> str:
    return f"{n:,}" + (f" ({n / 1000:.1f}K)" if n >= 1000 else "")


def _head_weight_tied(model: SequenceModel) -> bool:
    weight = getattr(model.head, "weight", None)
    return weight is not None and any(p is weight for p in model.encoder.parameters())


def _core_kinds(model: SequenceModel) -> dict[str, str]:
    """Spec name of each core ('core' and a hybrid's model.cores) -> its registered kind."""
    m = model.spec.get("model", {})
    return {"core": m.get("core", {}).get("kind", "?"),
            **{name: c.get("kind", "?") for name, c in (m.get("cores") or {}).items()}}


def _layout_lines(model: SequenceModel) -> list[str]:
    """A hybrid stack's placement: per depth position, the core (spec name and kind) and the unique
    block it runs; consecutive positions with the same core are grouped."""
    m = model.spec.get("model", {})
    kinds = _core_kinds(model)
    stack = model.stack
    how = (f"pattern [{', '.join(m['pattern'])}]" if m.get("pattern") else
           "positions " + "; ".join(f"{n} at {', '.join(map(str, p))}" for n, p in (m.get("positions") or {}).items()))
    lines = [f"cores: {how}; {', '.join(f'{n} = {k}' for n, k in kinds.items())}"]
    runs: list[list[int]] = []
    for pos in range(stack.depth):
        if runs and stack.core_name(runs[-1][-1]) == stack.core_name(pos):
            runs[-1].append(pos)
        else:
            runs.append([pos])
    width = max(len(f"{n} ({k})") for n, k in kinds.items())
    for run in runs:
        name = stack.core_name(run[0])
        where = f"{run[0] + 1}" if len(run) == 1 else f"{run[0] + 1}-{run[-1] + 1}"
        blocks = pattern([stack.block_index(p) for p in run])
        label = f"{name} ({kinds.get(name, '?')})"
        lines.append(f"  position{'s' if len(run) > 1 else ' '} {where:<7} {label:<{width}}  block{'s' if len(run) > 1 else ''} {blocks}")
    return lines


def backend_labels(model: nn.Module) -> list[str]:
    """What each kind of core in ``model`` runs, as bound now (after any move to a device): one line per
    distinct choice, ``"<Core>: <path>: <op>=<backend> [<why>]"``, in module order. A training run records
    it beside its times, so a slow epoch can be told from a slower kernel (a fallback) after the fact."""
    seen: dict[str, None] = {}
    for module in model.modules():
        choice = getattr(module, "backend_choice", None)
        if choice is not None and not isinstance(module, Bidirectional):  # its cores are listed themselves
            seen[f"{type(module).__name__}: {choice.label()} [{choice.reason}]"] = None
    return list(seen)


def summary(model: SequenceModel) -> str:
    """Parameters per component, unique vs applied blocks, schedule, depth settings and backends."""
    spec = model.spec
    core = spec.get("model", {}).get("core", {})
    stack = model.stack
    blocks = stack.blocks
    kinds = _core_kinds(model)
    title = "+".join(dict.fromkeys(kinds[n] for n in stack.core_names if n in kinds)) if stack.hybrid else core.get("kind", "?")
    lines = [
        f"model: {spec.get('name') or title}  task={model.task}  pool={model.pool.name}  d_model={model.d_model}",
        f"stack: depth {stack.depth}, {len(blocks)} unique block(s), schedule {pattern(stack.schedule)}, period {stack.period}",
    ]
    if stack.hybrid:
        lines += _layout_lines(model)
    if model.reshaper is not None:
        r = model.reshaper
        lines.append(f"input: reshape {r.mode} c={r.c} (d={r.d}: {r.d} features per step -> {r.c} per model step)")
    alpha = "learned (sigmoid, per unique block)" if stack.damping_logit is not None else f"{stack.alpha_fixed:g}"
    lines.append(f"depth: damping α={alpha}, norms {stack.norms_mode}")
    bi = spec.get("model", {}).get("block", {}).get("bidirectional")
    if bi:
        both = "one core both ways" if bi.get("shared") else "a second core of the same settings backwards"
        lines.append(f"bidirectional: every core forward and time-reversed ({both}), combined by {bi.get('combine')}; "
                     "not causal (no streaming)")
    lines += ["parameters:", f"  encoder     {_fmt(count_params(model.encoder))}"]
    for i in range(len(blocks)):
        block = stack.block(i)
        uses = stack.schedule.count(i)
        label = f"{kinds.get(stack.core_names[i], '?')} core " if stack.hybrid else "core "
        lines.append(f"  block {pattern([i])}     {_fmt(count_params(block))}  ({label}{_fmt(count_params(block.core))}; applied {uses}x)")
    if stack.position_norms is not None:
        lines.append(f"  norms       {_fmt(count_params(stack.position_norms))}  (one set per depth position)")
    if stack.damping_logit is not None:
        lines.append(f"  damping     {_fmt(stack.damping_logit.numel())}")
    tied = _head_weight_tied(model)
    tied_weight = getattr(model.head, "weight", None) if tied else None  # counted once, with the encoder
    head = count_params(model.head) - (tied_weight.numel() if isinstance(tied_weight, torch.Tensor) else 0)
    lines.append(f"  final norm  {_fmt(count_params(model.final_norm))}")
    lines.append(f"  head        {_fmt(head)}" + ("  (weight tied to the embedding)" if tied else ""))
    lines.append(f"  total       {_fmt(count_params(model))}")
    applied = sum(count_params(blocks[i]) for i in stack.schedule)
    lines.append(f"  blocks: {_fmt(sum(count_params(b) for b in blocks))} unique, {_fmt(applied)} as applied over depth")
    chosen: dict[str, list[int]] = {}
    for i, unique in enumerate(blocks):
        choice = getattr(unique.core, "backend_choice", None)
        if choice is not None:
            chosen.setdefault(f"{choice.label()}  [{choice.reason}]", []).append(i)
    for text, idx in chosen.items():
        lines.append(f"backend (block{'s' if len(idx) > 1 else ''} {pattern(idx)}): {text}")
    return "\n".join(lines)
