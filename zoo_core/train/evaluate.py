"""``zoo eval``: score a saved model on a dataset split, at fixed depth or with adaptive depth.

A model folder written by ``zoo train`` (``<run>/seed-<s>/lr-<lr>/best``) carries its run: the
protocol, seed and normalisation are read from ``<run>/run.json`` and ``../result.json`` so the
test split is the one the model was tested on; command-line options override them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..datasets import Dataset, SplitData, get_dataset
from ..errors import SpecError, ZooError
from ..factory import load_pretrained
from ..hub.pulling import resolve_folder
from ..io.atomic import atomic_write_file
from ..logs import log_once
from ..precision import autocast_for, parse_precision
from ..spec import load_spec
from .ddp import pick_device
from .loop import _batch, evaluate, per_sample_loss, to_tensors
from .protocol import make_splits

SPLITS = ("train", "val", "test")

log = logging.getLogger(__name__)


class SplitOverlapError(ZooError, ValueError):
    """The evaluated split holds sequences the model was trained on (its score would not be held out)."""

    exit_code = 2


# scoring arrays (the public path for data a user already holds) -----------------------------------


def _as_split(data: Any) -> SplitData:
    """SplitData from SplitData, ``load_uea_bundled``'s (X, y, lengths) or a plain (X, y) pair."""
    if isinstance(data, SplitData):
        return data
    if isinstance(data, tuple) and len(data) in (2, 3):
        X, y, *rest = (np.asarray(a.detach().cpu() if isinstance(a, torch.Tensor) else a) for a in data)
        return SplitData(X, y, rest[0] if rest else None)
    raise SpecError(f"data must be a SplitData or an (X, y[, lengths]) tuple, got {type(data).__name__}")


def _warn_if_padded(split: SplitData) -> None:
    """Scoring zero-padded sequences as if the padding were input is quietly wrong: say so, once."""
    X = split.X
    if split.lengths is not None or X.ndim != 3 or X.shape[1] < 2:
        return
    padded = int((np.abs(X[:, -1, :]).max(axis=-1) == 0).sum())  # sequences whose last step is all zeros
    if padded:
        log_once(log, logging.WARNING, "padded without lengths",
                 "%d of %d sequences end in all-zero steps, which looks like end padding, but no lengths were given: "
                 "the padding is scored as input (JapaneseVowels drops from 0.981 to 0.638). Pass the lengths "
                 "(load_uea_bundled and every dataset loader return them)", padded, len(split))


def evaluate_split(model: Any, data: Any, *, task: str | None = None, batch_size: int = 256) -> dict[str, float]:
    """Loss and task metrics of ``model`` on one split, masking each sequence's padding with its length.

    The public way to score arrays: ``evaluate_split(model, load_uea_bundled("japanesevowels"))``.
    Calling ``model(X)`` on a padded set without ``lengths=`` scores the padding too, which is why
    the lengths travel with the data here.

    Args:
        model: a SequenceModel (eval mode is used, then restored); its device is used.
        data: a ``SplitData``, or ``(X, y)`` / ``(X, y, lengths)``: X (n, L, D) or tokens (n, L),
            y (n,) classes / (n, O) targets / (n, L) tokens, lengths (n,) valid steps.
        task: the model's task by default.
        batch_size: sequences per forward pass.

    Returns:
        ``{"loss": ..., "accuracy" | "rmse", "mae" | "bits_per_token": ...}``.
    """
    split = _as_split(data)
    _warn_if_padded(split)
    task = task or getattr(model, "task", None)
    if task is None:
        raise SpecError("which task? pass task='classification', 'regression' or 'lm' (the model does not say)")
    device = next(iter(model.parameters())).device
    return evaluate(model, to_tensors(split, device), task, batch_size)


# evaluating on the sequences the model trained on ----------------------------------------------------
def _sequence_digests(split: SplitData) -> list[bytes]:
    """One digest per sequence: its valid steps (not the padding, not the label)."""
    out = []
    for i in range(len(split)):
        x = split.X[i] if split.lengths is None else split.X[i, : int(split.lengths[i])]
        out.append(hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=16).digest())
    return out


SPLIT_SETTINGS = ("protocol", "seed", "val_fraction")


def trained_split(ctx: dict[str, Any], stored: Any) -> dict[str, Any] | None:
    """The dataset, protocol, seed and val_fraction whose training split the model was fitted on (None: unknown).

    A ``zoo train`` run folder records them exactly; a saved model's spec records the settings of
    its ``training:`` section, which name one split only when they name one seed.
    """
    if "seed" in ctx and "protocol" in ctx:
        return {"dataset": ctx.get("dataset"), "protocol": ctx["protocol"], "seed": ctx["seed"],
                "val_fraction": ctx.get("val_fraction", 0.15 / 0.85)}
    if stored is None or stored.dataset is None:
        return None
    seeds = stored.seed_list()
    if len(seeds) != 1:
        log.warning("the model's spec trains %d seeds and does not say which one these weights are: "
                    "cannot check the evaluated split against the training split", len(seeds))
        return None
    return {"dataset": stored.dataset, "protocol": stored.protocol, "seed": seeds[0], "val_fraction": stored.val_fraction}


def training_overlap(ds: Dataset, trained: dict[str, Any], evaluated: SplitData) -> int:
    """How many evaluated sequences are also sequences of the training split ``trained`` names.

    Found from the data (a digest of every sequence's valid steps), not from the protocol names:
    another seed or val_fraction of the same protocol overlaps too, and a dataset's official splits
    may share identical sequences, so only the data says which sequences the model has seen.
    """
    train = make_splits(ds, normalize="none", **{k: trained[k] for k in SPLIT_SETTINGS}).train
    seen = set(_sequence_digests(train))
    return sum(d in seen for d in _sequence_digests(evaluated))


def check_overlap(ds: Dataset, where: str, split: str, evaluated: dict[str, Any], trained: dict[str, Any] | None,
                  allow: bool) -> dict[str, Any] | None:
    """Refuse (or, with ``allow``, warn loudly) when the evaluated split holds training sequences.

    ``evaluated`` holds the protocol, seed and val_fraction of the evaluation; the same settings as
    the training give the run's own held-out split, disjoint by construction, and are not checked.
    Returns the overlap record for the metrics, or None when nothing overlaps.
    """
    if trained is None or split == "train" or all(evaluated[k] == trained[k] for k in SPLIT_SETTINGS):
        return None
    if str(trained.get("dataset") or "").casefold() != ds.info.name.casefold():
        return None  # trained on another dataset: its training split names none of these sequences
    data = make_splits(ds, normalize="none", **evaluated)
    part = getattr(data, split)
    n = training_overlap(ds, trained, part)
    if n == 0:
        return None
    said = f"protocol {trained['protocol']}, seed {trained['seed']}"
    what = (f"{where}: {n} of the {len(part)} sequences of the {evaluated['protocol']} {split} split (seed {evaluated['seed']}) "
            f"of {ds.info.name} are sequences the model was trained on ({said}), so its score would not be held out")
    if not allow:
        raise SplitOverlapError(f"{what}. Evaluate with the protocol the model was trained with (--protocol "
                                f"{trained['protocol']} --seed {trained['seed']}: the default), or pass --allow-overlap "
                                "to score anyway (the result records the overlap)")
    log.warning("%s; scoring anyway (--allow-overlap): the number is NOT a held-out score", what)
    return {"sequences": n, "of": len(part), "trained_on": {k: trained[k] for k in ("dataset", *SPLIT_SETTINGS)}}


def run_context(model_dir: Path) -> dict[str, Any]:
    """Protocol settings of the ``zoo train`` run a model folder belongs to ({} if none)."""
    found: dict[str, Any] = {}
    result, run = model_dir.parent / "result.json", model_dir.parent.parent.parent / "run.json"
    if not result.is_file():  # not <run>/seed-<s>/lr-<lr>/best: nothing above it belongs to a run
        return found
    found["seed"] = json.loads(result.read_text(encoding="utf-8"))["seed"]
    if run.is_file():
        fp = json.loads(run.read_text(encoding="utf-8")).get("fingerprint", {})
        t = fp.get("training", {})
        found.update(dataset=fp.get("dataset"), protocol=t.get("protocol"), normalize=t.get("normalize"),
                     val_fraction=t.get("val_fraction"))
    return {k: v for k, v in found.items() if v is not None}


@torch.no_grad()
def adaptive_metrics(model: Any, data: dict[str, torch.Tensor], task: str, batch_size: int, **options: Any) -> dict[str, Any]:
    """Metrics of ``model.adaptive``: the task metrics, the mean depth and the FLOPs ratio to fixed depth."""
    if not callable(getattr(model, "adaptive", None)):
        raise SpecError("--adaptive needs SequenceModel.adaptive (depth-recurrent inference), which this zoo-core does not have")
    n = int(data["X"].shape[0])
    loss, correct, depth, flops, fixed = 0.0, 0, [], 0.0, 0.0
    for start in range(0, n, batch_size):
        x, y, lengths = _batch(data, torch.arange(start, min(start + batch_size, n), device=data["X"].device))
        res = model.adaptive(x, lengths=lengths, **{k: v for k, v in options.items() if v is not None})
        loss += float(per_sample_loss(task, res.output, y).double().sum())
        if task == "classification":
            correct += int((res.output.argmax(dim=-1) == y).sum())
        depth.append(torch.as_tensor(res.depth).double().reshape(-1))
        flops += float(torch.as_tensor(res.flops).double().sum())
        fixed += float(torch.as_tensor(res.flops_fixed).double().expand(len(y)).sum())
    depths = torch.cat(depth)
    out: dict[str, Any] = {"loss": loss / n, "mean_depth": float(depths.mean()), "min_depth": int(depths.min()),
                           "max_depth": int(depths.max()), "flops": flops, "flops_fixed": fixed, "flops_ratio": flops / fixed}
    if task == "classification":
        out["accuracy"] = correct / n
    elif task == "regression":
        out["rmse"] = math.sqrt(out["loss"])
    return out


def model_split(model_dir: Path, *, dataset: str | None = None, split: str = "test", protocol: str | None = None,
                seed: int | None = None, device: str = "auto", allow_overlap: bool = False
                ) -> tuple[Any, Dataset, dict[str, torch.Tensor], str, int, dict[str, Any] | None]:
    """A saved model folder, loaded, with the split it is scored on (the protocol, seed and normalisation
    of its run or spec unless given): ``(model, dataset, data, protocol, seed, overlap)``, ``data`` the
    split's tensors (``X``, ``y``, ``lengths``) on ``device``. Refuses a split that overlaps its training
    (``check_overlap``) unless ``allow_overlap``."""
    ctx = run_context(model_dir)
    model = load_pretrained(model_dir)
    envelope = load_spec(model.spec).envelope
    stored = envelope.training
    name = dataset or ctx.get("dataset") or (stored.dataset if stored else None)
    if name is None:
        raise SpecError(f"{model_dir}: which dataset? pass --dataset (zoo list --kind datasets)")
    ds = get_dataset(name)
    ds.check_available()
    ds.check_spec(envelope, where=str(model_dir))
    protocol = protocol or ctx.get("protocol") or (stored.protocol if stored else "official")
    seed = seed if seed is not None else ctx.get("seed", stored.seed_list()[0] if stored else 0)
    val_fraction = ctx.get("val_fraction", stored.val_fraction if stored else 0.15 / 0.85)
    overlap = check_overlap(ds, str(model_dir), split, {"protocol": protocol, "seed": seed, "val_fraction": val_fraction},
                            trained_split(ctx, stored), allow_overlap)
    splits = make_splits(ds, protocol=protocol, seed=seed, normalize=ctx.get("normalize", stored.normalize if stored else "none"),
                         val_fraction=val_fraction)
    dev = pick_device(device)
    model.to(dev)
    return model, ds, to_tensors(getattr(splits, split), dev), protocol, seed, overlap


def evaluate_model(
    model_dir: str | Path,
    *,
    dataset: str | None = None,
    split: str = "test",
    protocol: str | None = None,
    seed: int | None = None,
    adaptive: bool = False,
    adaptive_options: dict[str, Any] | None = None,
    batch_size: int = 256,
    device: str = "auto",
    output: str | Path | None = None,
    allow_overlap: bool = False,
    precision: str = "32",
) -> dict[str, Any]:
    """Score a model on one split; returns the metrics and writes them as JSON.

    ``model_dir`` is a saved folder or any model reference (``arch.tag``, ``hf-hub:org/name``,
    ``local-dir:path``: pulled and sha256-checked first). The JSON goes to ``output``, or beside
    the model when it sits in a ``zoo train`` run folder; otherwise it is only returned.

    A split that holds sequences the model was trained on (another protocol or seed than its
    training's) is refused with ``SplitOverlapError`` unless ``allow_overlap``, which scores it with
    a warning and records the overlap in the metrics.

    ``precision`` scores under ``zoo train --precision``'s autocast (``bf16-mixed``, ``16-mixed``; the
    cores keep their recurrences in float32): what a model trained in float32 loses when served in half
    precision. It is recorded in the metrics and, when not 32, in the default file name.
    """
    if split not in SPLITS:
        raise SpecError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    try:  # before a reference is resolved (which may pull it)
        precision = parse_precision(precision)
    except ValueError as exc:
        raise SpecError(str(exc)) from None

    model_dir = resolve_folder(model_dir).path  # a folder (recovered if a save was killed mid-swap) or a reference
    model_dir = Path(model_dir)
    ctx = run_context(model_dir)
    model, ds, data, protocol, seed, overlap = model_split(model_dir, dataset=dataset, split=split, protocol=protocol,
                                                           seed=seed, device=device, allow_overlap=allow_overlap)
    on = next(iter(model.parameters())).device
    with autocast_for(precision, on):
        fixed = evaluate(model, data, ds.info.task, batch_size)
    metrics: dict[str, Any] = {"model": str(model_dir), "dataset": ds.info.name, "split": split, "protocol": protocol, "seed": seed,
                               "sequences": int(data["X"].shape[0]), "precision": precision, "fixed_depth": fixed}
    if overlap is not None:
        metrics["overlap_with_training"] = overlap
    if adaptive:
        with autocast_for(precision, on):
            metrics["adaptive"] = adaptive_metrics(model.eval(), data, ds.info.task, batch_size, **(adaptive_options or {}))
        metrics["adaptive"]["options"] = adaptive_options or {}
    if output is None and not ctx:
        return metrics  # a pulled or bundled model: nothing is written into the cache or the repository
    suffix = ("-adaptive" if adaptive else "") + ("" if precision == "32" else f"-{precision}")
    path = Path(output) if output else model_dir.parent / f"eval-{ds.info.name}-{split}{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_file(path, (json.dumps(metrics, indent=1) + "\n").encode())
    metrics["written_to"] = str(path)
    return metrics
