"""Spec → SequenceModel, and the model summary ``zoo build`` prints."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .blocks import Block, count_params, make_norm
from .model import SequenceModel
from .plugins import using_registry
from .registry import Registry
from .spec import Spec, load_spec
from .stack import Stack
from .stacking import pattern


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


def _assemble(spec: Spec, *, device: Any, dtype: Any, seed: int | None) -> SequenceModel:
    if seed is not None:
        torch.manual_seed(seed)
    env, m = spec.envelope, spec.envelope.model
    kw = {"device": device, "dtype": dtype}
    core_cls = spec.core.load()
    params = spec.core_params.model_dump()
    schedule = spec.policy.schedule(m.depth)
    blocks = [
        Block(core_cls(**params, **kw), m.d_model, **m.block.recipe(), **kw)
        for _ in range(spec.policy.num_blocks(m.depth))
    ]
    if env.input.vocab_size is not None:
        encoder: nn.Module = nn.Embedding(env.input.vocab_size, m.d_model, **kw)
    else:
        encoder = nn.Linear(env.input.channels + int(env.input.include_time), m.d_model, **kw)
    out = {"classification": env.task.classes, "lm": env.input.vocab_size}.get(env.task.kind, env.task.outputs)
    head = nn.Linear(m.d_model, out, bias=not m.tie_embeddings, **kw)
    if m.tie_embeddings:
        head.weight = encoder.weight
    return SequenceModel(
        encoder=encoder,
        stack=Stack(blocks, schedule),
        head=head,
        task=env.task.kind,
        pool=env.pool,
        d_model=m.d_model,
        final_norm=make_norm(m.final_norm, m.d_model, eps=m.block.norm_eps, **kw),
        time_length=env.input.length if env.input.include_time else None,
        spec=spec.resolved(),
    )


def _fmt(n: int) -> str:
    return f"{n:,}" + (f" ({n / 1000:.1f}K)" if n >= 1000 else "")


def summary(model: SequenceModel) -> str:
    """Parameters per component, unique vs applied blocks, schedule and chosen backends."""
    spec = model.spec
    core = spec.get("model", {}).get("core", {})
    blocks = model.stack.blocks
    lines = [
        f"model: {spec.get('name') or core.get('kind', '?')}  task={model.task}  pool={model.pool}  d_model={model.d_model}",
        f"stack: depth {model.stack.depth}, {len(blocks)} unique block(s), schedule {pattern(model.stack.schedule)}",
        "parameters:",
        f"  encoder     {_fmt(count_params(model.encoder))}",
    ]
    for i, block in enumerate(blocks):
        uses = model.stack.schedule.count(i)
        lines.append(f"  block {pattern([i])}     {_fmt(count_params(block))}  (core {_fmt(count_params(block.core))}; applied {uses}x)")
    tied = any(p is model.head.weight for p in model.encoder.parameters())
    head = count_params(model.head) - (model.head.weight.numel() if tied else 0)
    lines.append(f"  final norm  {_fmt(count_params(model.final_norm))}")
    lines.append(f"  head        {_fmt(head)}" + ("  (weight tied to the embedding)" if tied else ""))
    lines.append(f"  total       {_fmt(count_params(model))}")
    applied = sum(count_params(blocks[i]) for i in model.stack.schedule)
    lines.append(f"  blocks: {_fmt(sum(count_params(b) for b in blocks))} unique, {_fmt(applied)} as applied over depth")
    chosen: dict[str, list[int]] = {}
    for i, block in enumerate(blocks):
        choice = getattr(block.core, "backend_choice", None)
        if choice is not None:
            chosen.setdefault(f"{choice.label()}  [{choice.reason}]", []).append(i)
    for text, idx in chosen.items():
        lines.append(f"backend (block{'s' if len(idx) > 1 else ''} {pattern(idx)}): {text}")
    return "\n".join(lines)
