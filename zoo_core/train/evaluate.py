"""``zoo eval``: score a saved model on a dataset split, at fixed depth or with adaptive depth.

A model folder written by ``zoo train`` (``<run>/seed-<s>/lr-<lr>/best``) carries its run: the
protocol, seed and normalisation are read from ``<run>/run.json`` and ``../result.json`` so the
test split is the one the model was tested on; command-line options override them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from ..datasets import get_dataset
from ..errors import SpecError
from ..io.atomic import atomic_write_file
from ..io.pretrained import load_pretrained
from ..spec import load_spec
from .ddp import pick_device
from .loop import _batch, evaluate, per_sample_loss, to_tensors
from .protocol import make_splits

SPLITS = ("train", "val", "test")


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
        found.update(dataset=fp.get("dataset"), protocol=t.get("protocol"), normalize=t.get("normalize"), val_fraction=t.get("val_fraction"))
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
) -> dict[str, Any]:
    """Score a model on one split; returns the metrics and writes them as JSON.

    ``model_dir`` is a saved folder or any model reference (``arch.tag``, ``hf-hub:org/name``,
    ``local-dir:path``: pulled and sha256-checked first). The JSON goes to ``output``, or beside
    the model when it sits in a ``zoo train`` run folder; otherwise it is only returned.
    """
    if split not in SPLITS:
        raise SpecError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if not Path(model_dir).is_dir():
        from ..hub.api import pull

        model_dir = pull(str(model_dir)).path
    model_dir = Path(model_dir)
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
    splits = make_splits(ds, protocol=protocol, seed=seed, normalize=ctx.get("normalize", stored.normalize if stored else "none"),
                         val_fraction=ctx.get("val_fraction", stored.val_fraction if stored else 0.15 / 0.85))
    dev = pick_device(device)
    model.to(dev)
    data = to_tensors(getattr(splits, split), dev)
    metrics: dict[str, Any] = {"model": str(model_dir), "dataset": ds.info.name, "split": split, "protocol": protocol, "seed": seed,
                               "sequences": int(data["X"].shape[0]), "fixed_depth": evaluate(model, data, ds.info.task, batch_size)}
    if adaptive:
        metrics["adaptive"] = adaptive_metrics(model.eval(), data, ds.info.task, batch_size, **(adaptive_options or {}))
        metrics["adaptive"]["options"] = adaptive_options or {}
    if output is None and not ctx:
        return metrics  # a pulled or bundled model: nothing is written into the cache or the repository
    path = Path(output) if output else model_dir.parent / f"eval-{ds.info.name}-{split}{'-adaptive' if adaptive else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_file(path, (json.dumps(metrics, indent=1) + "\n").encode())
    metrics["written_to"] = str(path)
    return metrics
