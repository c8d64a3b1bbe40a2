"""One training run (one seed, one learning rate): epochs, validation, early stopping, checkpoints.

Letters: B batch, L length, D channels, C classes, O outputs, V vocabulary.

Every epoch's shuffle and dropout draw from seeds derived from (run seed, epoch), so a run resumed
from the checkpoint after epoch k continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..build import backend_labels
from ..datasets import SplitData
from ..errors import ZooError
from ..io.atomic import atomic_write_file
from ..io.pretrained import load_weights_file, save_pretrained
from ..packing import pack_batch
from ..precision import autocast_for, grad_scaler
from ..spec.training import TrainingSpec
from .ddp import DistContext, shard
from .progress import Progress
from .state import load_checkpoint, save_checkpoint, sweep_run_folder


class TrainingDivergedError(ZooError, FloatingPointError):
    """The loss became NaN or infinite; the message names the epoch, step and batch."""

    exit_code = 1


class Interrupted(Exception):
    """Raised by a callback to stop a run after a completed epoch (tests; resuming continues it)."""


# losses and metrics -------------------------------------------------------------------------------
IGNORE = -100
"""A token target that is not scored (``lm`` tasks: positions without a target, e.g. MQAR's keys and
values, a selective-copy's input part, padding), as PyTorch's and HF's ``ignore_index``."""


def per_sample_loss(task: str, out: Tensor, y: Tensor) -> Tensor:
    """(B,) losses: cross-entropy (classification; lm: mean over the scored tokens, those not
    ``IGNORE``) or mean squared error."""
    if task == "classification":
        return F.cross_entropy(out, y, reduction="none")  # out (B, C), y (B,)
    if task == "lm":
        ce = F.cross_entropy(out.transpose(1, 2), y, reduction="none", ignore_index=IGNORE)  # out (B, L, V), y (B, L)
        scored = y != IGNORE
        if bool(scored.all()):
            return ce.mean(dim=1)
        return ce.sum(dim=1) / scored.sum(dim=1).clamp(min=1)
    return (out - y).pow(2).mean(dim=-1)  # out, y (B, O)


def higher_is_better(metric: str) -> bool:
    return metric == "accuracy"


def selection_metric(spec_metric: str, task: str) -> str:
    if spec_metric == "auto":
        return "accuracy" if task == "classification" else "loss"
    if spec_metric == "accuracy" and task not in ("classification", "lm"):
        raise ZooError(f"training.metric accuracy needs a classification or lm task, not {task!r}")
    return spec_metric


def call_model(model: nn.Module, x: Tensor, lengths: Tensor | None, seq_idx: Tensor | None = None) -> Tensor:
    if seq_idx is not None:
        return model(x, seq_idx=seq_idx)
    return model(x) if lengths is None else model(x, lengths=lengths)


class Objective(nn.Module):
    """What DDP wraps: the model's outputs that the loss sees (the final one, or one per period)."""

    def __init__(self, model: nn.Module, blockwise: bool) -> None:
        super().__init__()
        self.model = model
        self.blockwise = blockwise

    def forward(self, x: Tensor, lengths: Tensor | None = None, seq_idx: Tensor | None = None) -> tuple[Tensor, ...]:
        if self.blockwise:
            # blockwise: a SequenceModel (typed nn.Module here)
            return tuple(self.model.period_outputs(x, lengths=lengths, seq_idx=seq_idx))  # type: ignore[operator]
        return (call_model(self.model, x, lengths, seq_idx),)


def _batch(data: dict[str, Tensor], idx: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """Gather a batch; unequal-length data are cut to the batch's longest sequence."""
    x, y = data["X"][idx], data["y"][idx]
    lengths = data.get("lengths")
    if lengths is None:
        return x, y, None
    lengths = lengths[idx]
    longest = int(lengths.max())
    per_step = y.dim() >= 2 and not y.is_floating_point()  # lm token targets (n, T); not regression's (n, O)
    return x[:, :longest], (y[:, :longest] if per_step else y), lengths


def to_tensors(split: SplitData, device: torch.device) -> dict[str, Tensor]:
    out = {"X": torch.from_numpy(np.ascontiguousarray(split.X)).to(device), "y": torch.from_numpy(np.ascontiguousarray(split.y)).to(device)}
    if split.lengths is not None:
        out["lengths"] = torch.from_numpy(np.ascontiguousarray(split.lengths)).to(device)
    return out


@torch.no_grad()
def evaluate(model: nn.Module, data: dict[str, Tensor], task: str, batch_size: int) -> dict[str, float]:
    """Loss and task metrics over a whole split (eval mode; the final output only)."""
    was_training = model.training
    model.eval()
    n = int(data["X"].shape[0])
    total, correct, abs_err, scored = 0.0, 0, 0.0, 0
    for start in range(0, n, batch_size):
        x, y, lengths = _batch(data, torch.arange(start, min(start + batch_size, n), device=data["X"].device))
        out = call_model(model, x, lengths)
        per = per_sample_loss(task, out, y).double()
        if task == "lm":  # summed over scored tokens, divided by their count below
            per = per * (y != IGNORE).sum(dim=1)
        total += float(per.sum())
        if task == "classification":
            correct += int((out.argmax(dim=-1) == y).sum())
        elif task == "regression":
            abs_err += float((out - y).abs().double().mean(dim=-1).sum())
        elif task == "lm":  # token accuracy over the scored positions
            mask = y != IGNORE
            correct += int(((out.argmax(dim=-1) == y) & mask).sum())
            scored += int(mask.sum())
    model.train(was_training)
    metrics = {"loss": total / (n if task != "lm" else max(scored, 1))}
    if task == "classification":
        metrics["accuracy"] = correct / n
    elif task == "regression":
        metrics.update(rmse=math.sqrt(metrics["loss"]), mae=abs_err / n)
    else:
        metrics["bits_per_token"] = metrics["loss"] / math.log(2)
        if task == "lm":
            metrics["accuracy"] = correct / max(scored, 1)
    return metrics


def make_optimizer(model: nn.Module, cfg: TrainingSpec, lr: float) -> torch.optim.Optimizer:
    """Adam / AdamW over every parameter; with use_optim_hints, the cores' hinted groups apart."""
    hinted: dict[int, tuple[Any, Any]] = {}
    if cfg.use_optim_hints:
        for core in getattr(model, "cores", lambda: [])():
            for name, hint in getattr(core, "optim_hints", lambda: {})().items():
                hinted[id(core.get_parameter(name))] = (hint.lr, hint.weight_decay)
    groups: dict[tuple[Any, Any], list[Tensor]] = {}
    seen: set[int] = set()
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            groups.setdefault(hinted.get(id(p), (None, None)), []).append(p)
    param_groups = []
    for (g_lr, g_wd), params in groups.items():
        group: dict[str, Any] = {"params": params}
        if g_lr is not None:
            group["lr"] = g_lr
        if g_wd is not None:
            group["weight_decay"] = g_wd
        param_groups.append(group)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(param_groups, lr=lr, weight_decay=cfg.weight_decay)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across runs and platforms)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h >> 1


def global_batches(n: int, batch_size: int, drop_last: bool, seed: int) -> list[Tensor]:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    batches = list(order.split(batch_size))
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


@dataclass
class RunContext:
    """Everything one run needs besides the model."""

    task: str
    cfg: TrainingSpec
    seed: int
    lr: float
    directory: Path
    dist: DistContext
    progress: Progress
    blockwise: bool = False
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None


def _better(value: float, best: float | None, metric: str) -> tuple[bool, bool]:
    """(at least as good, strictly better); ties count as the later checkpoint, as the seed's code."""
    if best is None:
        return True, True
    if higher_is_better(metric):
        return value >= best, value > best
    return value <= best, value < best


def fit(model: nn.Module, train: SplitData, val: SplitData, test: SplitData, ctx: RunContext) -> dict[str, Any]:
    """Train one run to its end (or resume it), then score validation and test at the best epoch.

    Files in ``ctx.directory``: ``checkpoint/`` (resumable, atomic), ``best/`` (save_pretrained of
    the best validation epoch) and ``result.json`` (written last: a run with it is complete).

    The run's ``wall_s`` is its time in ``fit`` summed over every invocation that worked on it (the
    checkpoint carries the sum, so a resumed run is not timed from its resume; the part of an epoch
    lost to a kill is not counted). The returned dict adds ``earlier_wall_s``, the part of it spent
    before this invocation, so a caller can add it to its own clock; result.json does not hold it.
    """
    started = time.perf_counter()
    d, cfg, task = ctx.directory, ctx.cfg, ctx.task
    if ctx.dist.is_main:  # before anything is read: a swap killed between its renames is restored first
        sweep_run_folder(d)
    ctx.dist.barrier()
    result_path = d / "result.json"
    if result_path.is_file():
        done = json.loads(result_path.read_text(encoding="utf-8"))
        return {**done, "earlier_wall_s": _recorded_wall(done)}
    device = ctx.dist.device
    model.to(device)
    for line in backend_labels(model):  # bound for this device: a fallback shows here, not only in the speed
        ctx.progress.line(f"backend: {line}")
    metric = selection_metric(cfg.metric, task)
    tr, va, te = (to_tensors(s, device) for s in (train, val, test))
    eval_bs = cfg.eval_batch_size or cfg.batch_size
    n = len(train)
    if cfg.drop_last and n < cfg.batch_size:
        raise ZooError(f"training.batch_size {cfg.batch_size} exceeds the {n} training sequences, and drop_last leaves "
                       "no batch; lower the batch size or set training.drop_last: false")
    optimizer = make_optimizer(model, cfg, ctx.lr)
    state: dict[str, Any] = {"epochs_done": 0, "history": [], "best": None, "best_epoch": None, "since_best": 0, "finished": False}
    if (d / "checkpoint").is_dir():
        state = load_checkpoint(d / "checkpoint", model, optimizer)
        ctx.progress.line(f"resuming {d} after epoch {state['epochs_done']}")
    earlier = _recorded_wall(state)
    scaler = grad_scaler(cfg.precision, device)  # 16-mixed only: float16 gradients underflow unscaled
    if scaler is not None and state.get("grad_scaler"):
        scaler.load_state_dict(state["grad_scaler"])
    objective = Objective(model, ctx.blockwise)
    runner: nn.Module = objective
    if ctx.dist.enabled:
        runner = torch.nn.parallel.DistributedDataParallel(objective, device_ids=[device.index] if device.type == "cuda" else None)
    epoch = state["epochs_done"]
    while not state["finished"] and epoch < cfg.epochs:
        epoch += 1
        record = _train_epoch(model, runner, optimizer, tr, ctx, epoch, scaler)
        if scaler is not None:
            state["grad_scaler"] = scaler.state_dict()
        record.update({f"val_{k}": v for k, v in evaluate(model, va, task, eval_bs).items()})
        state["history"].append(record)
        state["epochs_done"] = epoch
        ok, strict = _better(record[f"val_{metric}"], state["best"], metric)
        if ok:
            state["best"], state["best_epoch"] = record[f"val_{metric}"], epoch
            if ctx.dist.is_main:
                save_pretrained(model, d / "best")
        state["since_best"] = 0 if strict else state["since_best"] + 1
        if cfg.early_stop is not None and state["since_best"] >= cfg.early_stop:
            state["finished"] = True
        if cfg.stop_at is not None and _better(record[f"val_{metric}"], cfg.stop_at, metric)[0]:
            state["finished"] = True  # reached the target: later epochs could at best tie it
        if epoch == cfg.epochs:
            state["finished"] = True
        # a new best/ is always followed by its checkpoint, so a resumed run never lags behind best/
        state["wall_s"] = earlier + time.perf_counter() - started
        if ctx.dist.is_main and (state["finished"] or ok or epoch % cfg.save_every == 0):
            save_checkpoint(d / "checkpoint", model, optimizer, state)
        ctx.dist.barrier()
        ctx.progress.end_epoch(_describe(epoch, cfg.epochs, record, metric))
        if ctx.on_epoch_end is not None:
            ctx.on_epoch_end(epoch, record)
    result = _finish(model, state, va, te, ctx, metric, eval_bs, wall=lambda: earlier + time.perf_counter() - started)
    return {**result, "earlier_wall_s": earlier}


def _recorded_wall(record: dict[str, Any]) -> float:
    """The wall a checkpoint's trainer state or a result.json holds; one written before zoo-core kept
    it falls back to its training epochs' sum (a lower bound: validation and evaluation are not in it)."""
    wall = record.get("wall_s")
    return float(wall) if wall is not None else float(sum(h["time_s"] for h in record.get("history", [])))


def _train_epoch(model: nn.Module, runner: nn.Module, optimizer: torch.optim.Optimizer, tr: dict[str, Tensor],
                 ctx: RunContext, epoch: int, scaler: torch.amp.GradScaler | None = None) -> dict[str, Any]:
    """One epoch. Under ``training.precision`` bf16-mixed/16-mixed the forward runs under autocast (the
    cores at float32 inside, ``zoo_core.precision``) and the loss in float32; 16-mixed scales the loss
    (``scaler``) and skips a step whose gradients overflowed, as ``torch.amp.GradScaler`` does."""
    cfg, world, rank = ctx.cfg, ctx.dist.world, ctx.dist.rank
    n = int(tr["X"].shape[0])
    batches = global_batches(n, cfg.batch_size, cfg.drop_last, derive_seed(ctx.seed, epoch, 0))
    torch.manual_seed(derive_seed(ctx.seed, epoch, 1 + rank))  # dropout
    model.train()
    ctx.progress.start_epoch(f"epoch {epoch}/{cfg.epochs}", len(batches))
    start, loss_sum, count = time.perf_counter(), 0.0, 0
    # lm targets scored at some positions only (-100 elsewhere: MQAR, selective copying) weigh each scored
    # token alike; decided once from the data, so every DDP rank takes the same branch
    token_weighted = ctx.task == "lm" and bool((tr["y"] == IGNORE).any())
    steps = {"valid": 0, "padded": 0, "packed": 0}  # what the batches hold, padded vs packed
    for step, batch in enumerate(batches):
        idx, weights = shard(batch, rank, world)
        x, y, lengths = _batch(tr, idx.to(tr["X"].device))
        optimizer.zero_grad(set_to_none=True)
        seq_idx = None
        if cfg.pack and lengths is not None:
            x, seq_idx, order = pack_batch(x, lengths)  # documents come back in row-major order: reorder the targets
            y, weights = y[order], weights[order.cpu()]
            steps["valid"] += int(lengths.sum())
            steps["padded"] += int(lengths.numel() * int(lengths.max()))
            steps["packed"] += int(seq_idx.numel())
        with autocast_for(cfg.precision, x.device):
            outs = runner(x, lengths if seq_idx is None else None, seq_idx)
        outs = [o.float() for o in outs]  # the loss in float32 (a no-op at precision 32)
        per = torch.stack([per_sample_loss(ctx.task, o, y) for o in outs]).mean(dim=0)  # (B_rank,)
        if token_weighted:  # the mean over the global batch's scored tokens (Zoology's), not over its sequences
            counts = (y != IGNORE).sum(dim=1).to(per) * weights.to(per)  # (B_rank,)
            loss = (per * counts).sum() * world / ctx.dist.all_reduce_sum(counts.sum().double()).clamp(min=1).to(per)
        else:
            loss = (per * weights.to(per)).sum() * (world / len(batch))
        (loss if scaler is None else scaler.scale(loss)).backward()
        total = ctx.dist.all_reduce_sum(loss.detach().double() / world)  # the global batch's mean loss
        if not torch.isfinite(total):
            raise TrainingDivergedError(
                f"the loss became {float(total)} at epoch {epoch}, step {step + 1} (lr {ctx.lr}, seed {ctx.seed}); "
                f"batch sequence indices {batch.tolist()[:16]}{' ...' if len(batch) > 16 else ''}. Lower the learning rate "
                "or set training.grad_clip")
        if scaler is not None:
            scaler.unscale_(optimizer)  # clip (and step) the true gradients
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        loss_sum += float(total) * len(batch)
        count += len(batch)
        ctx.progress.step(float(total))
    record: dict[str, Any] = {"epoch": epoch, "train_loss": loss_sum / max(count, 1), "time_s": time.perf_counter() - start,
                              "steps": len(batches)}
    if steps["valid"]:  # --pack: the share of padding in the batches, padded vs packed
        record["padding"] = {"padded": 1 - steps["valid"] / steps["padded"], "packed": 1 - steps["valid"] / steps["packed"],
                             "steps_padded": steps["padded"], "steps_packed": steps["packed"]}
    return record


def _describe(epoch: int, total: int, record: dict[str, Any], metric: str) -> str:
    val = record[f"val_{metric}"]
    pad = record.get("padding")
    packed = (f"  packed: padding {pad['padded']:.0%} -> {pad['packed']:.0%} of the steps "
              f"({pad['steps_padded']:,} -> {pad['steps_packed']:,})" if pad else "")
    return (f"epoch {epoch}/{total}  train_loss {record['train_loss']:.4f}  val_loss {record['val_loss']:.4f}  "
            f"val_{metric} {val:.4f}  ({record['time_s']:.2f} s){packed}")


def _finish(model: nn.Module, state: dict[str, Any], va: dict[str, Tensor], te: dict[str, Tensor], ctx: RunContext,
            metric: str, eval_bs: int, wall: Callable[[], float]) -> dict[str, Any]:
    """Reload the best epoch's weights, score validation and test, write result.json (``wall()``: the
    run's wall so far, across invocations)."""
    load_weights_file(model, ctx.directory / "best")
    times = [r["time_s"] for r in state["history"]]
    result = {
        "seed": ctx.seed,
        "lr": ctx.lr,
        "metric": metric,
        "best_epoch": state["best_epoch"],
        "epochs_run": state["epochs_done"],
        "stopped_early": state["epochs_done"] < ctx.cfg.epochs,
        "val": evaluate(model, va, ctx.task, eval_bs),
        "test": evaluate(model, te, ctx.task, eval_bs),
        "epoch_time_s": {"mean": float(np.mean(times)) if times else None, "total": float(np.sum(times))},
        "backends": backend_labels(model),
        "history": state["history"],
        "model_dir": str(ctx.directory / "best"),
    }
    result["wall_s"] = wall()  # after the evaluations, which are part of the run's cost
    if ctx.dist.is_main:
        atomic_write_file(ctx.directory / "result.json", (json.dumps(result, indent=1) + "\n").encode())
    ctx.dist.barrier()
    return result
