"""Adaptive depth at inference (seed 001 §2.1, §4.3, A.6).

Letters: B batch, O outputs. The trained block(s) are applied again and again; after each
checkpoint j (every block with ``stop_at: block``, every complete period with ``stop_at:
period``) the shared head reads a prediction p⁽ʲ⁾, and a sample stops as soon as

    ‖p⁽ʲ⁾ − p⁽ʲ⁻¹⁾‖₂ / ((‖p⁽ʲ⁾‖₂ + ‖p⁽ʲ⁻¹⁾‖₂) / 2) < ε

at a depth ≥ ``min_depth``, or at ``max_depth`` (which may exceed the training depth; positions
past it repeat the schedule). p⁽⁰⁾ is the head on the encoder output (no block applied yet), so a
sample can stop at the first checkpoint, as the seed's Table 8 depth ranges (1–12; 2, 4, …, 12)
allow. For classification p is the softmax probabilities by default (the model output of the
LinOSS codebase the seed builds on; ``prediction: logits`` compares raw logits); for regression
and per-step tasks it is the output itself. A sample's output is its p at the stopping depth.

Streaming (``SequenceModel.adaptive_step``) keeps one state per depth position up to
``max_depth`` and a running pool per checkpoint, applies the same rule at every step to the
predictions of the prefix seen so far, and so returns exactly what ``adaptive`` returns for that
prefix. It computes every position at every step (a position a sample skips now may be needed
later), so streaming saves no compute; only the parallel path drops stopped samples.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..flops import count_flops

if TYPE_CHECKING:
    from .model import SequenceModel


@dataclass(frozen=True)
class AdaptiveConfig:
    """Stopping rule settings (the spec's ``model.stacking.adaptive``; None max_depth = depth)."""

    epsilon: float = 0.01
    max_depth: int | None = None
    min_depth: int = 1
    stop_at: str = "period"
    prediction: str = "probabilities"

    def resolve(self, depth: int, period: int, **overrides: Any) -> AdaptiveConfig:
        """Apply call-time overrides (None = keep) and check the result against the stack."""
        cfg = replace(self, **{k: v for k, v in overrides.items() if v is not None})
        if cfg.max_depth is None:
            cfg = replace(cfg, max_depth=depth)
        assert cfg.max_depth is not None
        if not cfg.epsilon > 0:
            raise ValueError(f"adaptive epsilon must be > 0, got {cfg.epsilon}")
        if cfg.stop_at not in ("block", "period"):
            raise ValueError(f"adaptive stop_at must be 'block' or 'period', got {cfg.stop_at!r}")
        if cfg.prediction not in ("probabilities", "logits"):
            raise ValueError(f"adaptive prediction must be 'probabilities' or 'logits', got {cfg.prediction!r}")
        if cfg.min_depth < 1 or cfg.max_depth < 1:
            raise ValueError(f"adaptive depths must be ≥ 1, got min_depth={cfg.min_depth}, max_depth={cfg.max_depth}")
        if cfg.min_depth > cfg.max_depth:
            raise ValueError(f"adaptive min_depth {cfg.min_depth} exceeds max_depth {cfg.max_depth}")
        if cfg.stop_at == "period" and cfg.max_depth % period:
            raise ValueError(f"with stop_at: period, max_depth must be a multiple of the period {period}, got {cfg.max_depth}")
        return cfg

    def checkpoints(self, period: int) -> list[int]:
        """Depths (number of positions applied) where a prediction is read, 1..max_depth."""
        assert self.max_depth is not None
        step = 1 if self.stop_at == "block" else period
        return list(range(step, self.max_depth + 1, step))


@dataclass
class AdaptiveResult:
    """What ``SequenceModel.adaptive`` returns.

    output: like ``forward``'s, each sample's output at its stopping depth.
    depth: (B,) long, the number of block applications each sample used.
    flops: (B,) float, FLOPs counted for each sample (its share of every batched op it took part
        in, including the head read at each checkpoint); None when not counted (streaming).
    flops_fixed: FLOPs of one fixed-depth ``forward`` per sample (None when not counted).
    """

    output: Tensor
    depth: Tensor
    flops: Tensor | None = None
    flops_fixed: float | None = None

    @property
    def flops_ratio(self) -> float:
        """Mean adaptive FLOPs over fixed-depth FLOPs (the seed's Table 4 ratio)."""
        if self.flops is None or not self.flops_fixed:
            raise ValueError("FLOPs were not counted")
        return float(self.flops.mean()) / self.flops_fixed


def prediction(out: Tensor, task: str, kind: str) -> Tensor:
    """p compared by the stopping rule, flattened per sample (B, ·)."""
    if task == "classification" and kind == "probabilities":
        out = torch.softmax(out, dim=-1)
    return out.reshape(out.shape[0], -1)


def relative_change(p: Tensor, q: Tensor) -> Tensor:
    """‖p − q‖ / ((‖p‖ + ‖q‖) / 2) per sample (B,); 0 when both are zero."""
    diff = (p - q).norm(dim=-1)
    scale = (p.norm(dim=-1) + q.norm(dim=-1)) / 2
    return torch.where(diff == 0, torch.zeros_like(diff), diff / scale)


def stop_depths(preds: list[Tensor], checkpoints: list[int], cfg: AdaptiveConfig) -> Tensor:
    """The stopping rule on all predictions (p⁽⁰⁾, p at each checkpoint): index into checkpoints (B,).

    The reference: the parallel path decides incrementally, the streaming path with this.
    """
    B = preds[0].shape[0]
    chosen = torch.full((B,), len(checkpoints) - 1, dtype=torch.long, device=preds[0].device)
    done = torch.zeros(B, dtype=torch.bool, device=preds[0].device)
    for j, depth in enumerate(checkpoints):
        if depth < cfg.min_depth:
            continue
        stop = (relative_change(preds[j + 1], preds[j]) < cfg.epsilon) & ~done
        chosen[stop] = j
        done |= stop
    return chosen


def run_adaptive(model: SequenceModel, x: Tensor, lengths: Tensor | None, cfg: AdaptiveConfig,
                 *, count: bool = True) -> AdaptiveResult:
    """The parallel path: samples leave the batch as they stop, so later depths cost less."""
    B = x.shape[0]
    fc = count_flops() if count else None
    spent = torch.zeros(B, dtype=torch.float64)
    marks = [0]

    def charge(idx: Tensor) -> None:  # this stage's FLOPs, split over the samples that ran it
        if fc is not None and len(idx):
            spent[idx.cpu()] += (fc.total - marks[0]) / len(idx)
            marks[0] = fc.total

    checkpoints = cfg.checkpoints(model.stack.period)
    with torch.no_grad(), (fc if fc is not None else _null()):
        h, n = model.embed(x, lengths)  # (B, L, H)
        active = torch.arange(B, device=h.device)
        p_prev = prediction(model.readout(h, n), model.task, cfg.prediction)
        out: Tensor | None = None
        depth = torch.full((B,), cfg.max_depth or 0, dtype=torch.long, device=h.device)
        charge(active)
        layout = model.padding_layout(n, h.shape[1])  # non-causal parts must not see padding (None: nothing to do)
        for pos in range(cfg.max_depth or 0):
            h = model.stack.run_position(pos, h, layout)
            if pos + 1 not in checkpoints:
                charge(active)
                continue
            y = model.readout(h, n)
            p = prediction(y, model.task, cfg.prediction)
            if pos + 1 == cfg.max_depth:
                stop = torch.ones(len(active), dtype=torch.bool, device=h.device)
            elif pos + 1 >= cfg.min_depth:
                stop = relative_change(p, p_prev) < cfg.epsilon
            else:
                stop = torch.zeros(len(active), dtype=torch.bool, device=h.device)
            charge(active)
            if out is None:
                out = y.new_zeros((B, *y.shape[1:]))
            out[active[stop]] = y[stop]
            depth[active[stop]] = pos + 1
            keep = ~stop
            active, h, p_prev = active[keep], h[keep], p[keep]
            n = None if n is None else n[keep]
            if layout is not None:
                layout = model.padding_layout(n, h.shape[1])  # the samples still running
            if not len(active):
                break
    assert out is not None
    fixed = None
    if fc is not None:
        with torch.no_grad(), count_flops() as ff:
            model(x, lengths)
        fixed = ff.total / B
    return AdaptiveResult(out, depth, spent if fc is not None else None, fixed)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
