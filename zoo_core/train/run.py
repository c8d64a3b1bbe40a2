"""``zoo train``: the whole protocol for one spec: seeds × learning-rate grid, selection, metrics.

Output folder::

    run.json                       what was run (spec, training settings, dataset, command)
    metrics.json                   per run: history (per epoch, with times), best epoch, val and test
                                   at the best epoch; per seed: the lr picked on validation; mean ± std
    curves.png                     training curves (needs matplotlib: zoo-core[plot])
    seed-<s>/lr-<lr>/checkpoint/   resumable state (atomic), best/ (save_pretrained), result.json

Every check that can fail on the input (unknown dataset, missing package, dataset needing a network
while offline, a spec whose task, classes or channels do not fit the dataset) runs before training.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from pydantic import ValidationError

from .. import __version__
from ..build import build_model
from ..datasets import Dataset, get_dataset
from ..errors import SpecError, ZooError
from ..footprint import check_training
from ..io.atomic import atomic_write_file
from ..nn.blocks import count_params
from ..spec import Spec, load_spec
from ..spec.errors import format_validation_error
from ..spec.training import TrainingSpec
from .ddp import DistContext, init_distributed
from .loop import RunContext, fit, higher_is_better, selection_metric
from .plot import plot_curves
from .progress import Progress
from .protocol import make_splits


def training_settings(spec: Spec, overrides: dict[str, Any] | None = None) -> TrainingSpec:
    """The spec's ``training:`` section with command-line overrides applied (validated again)."""
    base = spec.envelope.training.model_dump(exclude_unset=True) if spec.envelope.training is not None else {}
    data = {**base, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    try:
        return TrainingSpec.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, spec.positions, prefix=("training",), model=TrainingSpec) from None


log = logging.getLogger(__name__)


def check_model_fits(spec: Spec, cfg: TrainingSpec, dataset: Dataset) -> None:
    """What the task and the data need from the model, read from the spec before building: a next-token
    task needs a causal model (a non-causal core or block.bidirectional would read the token it predicts);
    padded batches are exact for every model (non-causal parts run each sequence on its valid steps)."""
    entries = [entry for entry, _ in spec.named.values()] or [spec.core]  # every core of a hybrid stack
    if spec.envelope.task.kind == "lm":
        readers = [f"core {e.name!r}" for e in entries if "causal" not in e.capabilities]
        if spec.envelope.model.block.bidirectional is not None:
            readers.append("model.block.bidirectional")
        if readers:
            raise SpecError(f"task kind 'lm' predicts each next token, but {' and '.join(readers)} reads the sequence "
                            "backwards too, so every step would see the token it must predict; use causal cores")
    if cfg.pack:
        env = spec.envelope
        if env.task.kind not in ("classification", "regression"):
            raise SpecError(f"training.pack packs whole sequences several to a row for a pooled task (one target per "
                            f"sequence); task kind {env.task.kind!r} has a target per step: leave pack off")
        if env.input.reshape is not None:
            raise SpecError("training.pack cannot combine with input.reshape (it groups raw steps across the packed "
                            "sequences' boundaries); leave one of them off")
        if not dataset.info.unequal_length:
            log.info("training.pack: %s has sequences of equal length, so there is no padding to save", dataset.info.name)
        elif env.model.block.norm in ("batch", "ema_batch"):
            log.warning("training.pack with block.norm %s: its batch statistics are taken over every step of a batch, "
                        "padding included, and packing changes how much padding there is — so packed training is not "
                        "the padded training (with a per-step norm, layer or rms, it is)", env.model.block.norm)
    if not dataset.info.unequal_length:
        return
    norms = spec.envelope.model.block.norm
    if norms in ("batch", "ema_batch"):
        log.warning("%s has sequences of unequal length: in training, block.norm %s takes its batch statistics over "
                    "the padded steps too (the pool and the loss ignore them)", dataset.info.name, norms)


def _fingerprint(spec: Spec, cfg: TrainingSpec, dataset: Dataset, world: int) -> dict[str, Any]:
    return {"spec": spec.resolved(), "training": cfg.model_dump(mode="json"), "dataset": dataset.info.name, "world_size": world}


def _prepare_output(out: Path, fingerprint: dict[str, Any], resume: bool, extra: dict[str, Any], dist: DistContext) -> None:
    run_json = out / "run.json"
    exists = run_json.is_file()
    dist.barrier()  # every rank looks before rank 0 writes
    if exists:
        if not resume:
            raise ZooError(f"{out} already holds a run; pass --resume to continue it, or choose a new output folder")
        stored = json.loads(run_json.read_text(encoding="utf-8"))
        if stored.get("fingerprint") != fingerprint:
            changed = sorted(k for k in fingerprint if stored.get("fingerprint", {}).get(k) != fingerprint[k])
            raise ZooError(f"{out} holds a run with different settings ({', '.join(changed)}); resume it with the same "
                           "spec and options, or choose a new output folder")
        return
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_file(run_json, (json.dumps({"fingerprint": fingerprint, **extra}, indent=1) + "\n").encode())
    dist.barrier()


def _stats(values: list[float]) -> dict[str, Any]:
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, "values": values}


def train(
    spec_path: str | os.PathLike[str] | dict[str, Any],
    *,
    output: str | os.PathLike[str],
    overrides: dict[str, Any] | None = None,
    resume: bool = False,
    device: str = "auto",
    progress: Progress | None = None,
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None,
    command: list[str] | None = None,
    registry: Any = None,
    memory_budget: str | None = None,
    memory_check: bool = True,
) -> dict[str, Any]:
    """Run the protocol the spec's ``training:`` section (plus ``overrides``) describes; returns metrics.

    ``memory_budget`` (e.g. ``"32GiB"``; default ``$ZOO_MEMORY_BUDGET``, else the available memory)
    bounds the estimated training memory, checked before anything is built; ``memory_check=False`` skips it.
    """
    started = time.perf_counter()
    spec = load_spec(spec_path, registry=registry)
    cfg = training_settings(spec, overrides)
    if cfg.dataset is None:
        raise SpecError(f"{spec.filename}: no dataset: set training.dataset in the spec or pass --dataset (zoo list --kind datasets)")
    dataset = get_dataset(cfg.dataset, registry)
    dataset.check_available()
    dataset.check_spec(spec.envelope, where=spec.filename)
    check_model_fits(spec, cfg, dataset)
    check_training(spec, batch=cfg.batch_size, length=dataset.info.length, budget=memory_budget, check=memory_check)
    task = dataset.info.task
    metric = selection_metric(cfg.metric, task)
    all_splits = {seed: make_splits(dataset, protocol=cfg.protocol, seed=seed, val_fraction=cfg.val_fraction,
                                    normalize=cfg.normalize) for seed in cfg.seed_list()}  # loads (or fails to fetch) the data
    # everything above can fail on the input; nothing has trained or been written yet
    dist = init_distributed(device)
    progress = progress or Progress(quiet=not dist.is_main)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    out = Path(output)
    fingerprint = _fingerprint(spec, cfg, dataset, dist.world)
    extra = {"command": command, "zoo_core": __version__, "torch": torch.__version__, "device": str(dist.device)}
    _prepare_output(out, fingerprint, resume, extra, dist)
    seeds = []
    for seed in cfg.seed_list():
        splits = all_splits[seed]
        runs = []
        for lr in cfg.lr_grid():
            progress.line(f"{dataset.info.name}: seed {seed}, lr {lr:g}  "
                          f"(train {len(splits.train)}, val {len(splits.val)}, test {len(splits.test)})")
            model = build_model(spec, seed=seed)
            ctx = RunContext(task=task, cfg=cfg, seed=seed, lr=lr, directory=out / f"seed-{seed}" / f"lr-{lr:g}", dist=dist,
                             progress=progress, blockwise=cfg.loss == "blockwise", on_epoch_end=on_epoch_end)
            runs.append(fit(model, splits.train, splits.val, splits.test, ctx))
        pick = (max if higher_is_better(metric) else min)(runs, key=lambda r: r["val"][metric])  # first of equals
        seeds.append({"seed": seed, "lr": pick["lr"], "best_epoch": pick["best_epoch"], "val": pick["val"], "test": pick["test"],
                      "model_dir": pick["model_dir"], "split": splits.info, "runs": runs})
    params = count_params(build_model(spec, seed=0))
    summary = {f"test_{k}": _stats([s["test"][k] for s in seeds]) for k in seeds[0]["test"]}
    summary.update({f"val_{k}": _stats([s["val"][k] for s in seeds]) for k in seeds[0]["val"]})
    epoch_times = [t for s in seeds for r in s["runs"] for t in (h["time_s"] for h in r["history"])]
    metrics = {
        "name": spec.envelope.name, "spec": str(spec.filename), "command": command, "dataset": dataset.info.as_dict(),
        "task": task, "metric": metric, "training": cfg.model_dump(mode="json"), "params": params,
        "world_size": dist.world, "device": str(dist.device), "seeds": seeds, "summary": summary,
        "epoch_time_s": _stats(epoch_times) if epoch_times else None, "wall_time_s": time.perf_counter() - started,
        # the runs' time in earlier invocations (a resumed run, or one already finished): wall_time_s is this one's
        "earlier_wall_s": sum(r["earlier_wall_s"] for s in seeds for r in s["runs"]),
    }
    if dist.is_main:
        png = plot_curves([r for s in seeds for r in s["runs"]], out / "curves.png", metric=metric,
                          title=f"{spec.envelope.name or spec.filename} on {dataset.info.name}")
        metrics["plot"] = str(png) if png else None
        if png is None:
            progress.line("note: matplotlib is not installed, so no curves.png (pip install 'zoo-core[plot]')")
        atomic_write_file(out / "metrics.json", (json.dumps(metrics, indent=1) + "\n").encode())
    return metrics
