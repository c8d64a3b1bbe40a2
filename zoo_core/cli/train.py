"""``zoo train`` and ``zoo eval``. Wire into the main CLI with ``register_cli(subparsers)``.

Torch is imported only when a command runs, so ``zoo --help`` stays fast. Standalone (and under
torchrun before the wiring exists): ``python -m zoo_core.train train spec.yaml ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..spec.training import PAPER_LR_GRID, PAPER_SEEDS
from ..train.progress import Progress
from .runner import add_memory_flags, run


def _floats(text: str) -> list[float]:
    if text == "paper":
        return list(PAPER_LR_GRID)
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None


def _ints(text: str) -> list[int]:
    if text == "paper":
        return list(PAPER_SEEDS)
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None


def cmd_train(args: argparse.Namespace) -> int:
    from ..train.run import train  # lazy: keeps safetensors, torch out of train

    lr = args.lr[0] if args.lr is not None and len(args.lr) == 1 else args.lr
    overrides: dict[str, Any] = {
        "dataset": args.dataset, "protocol": args.protocol, "lr": lr, "seeds": args.seeds, "epochs": args.epochs,
        "batch_size": args.batch_size, "early_stop": args.early_stop, "loss": args.loss, "normalize": args.normalize,
        "pack": True if args.pack else None, "stop_at": args.stop_at, "precision": args.precision,
    }
    output = args.output or str(Path("runs") / f"{Path(args.spec).stem}-{args.dataset or 'run'}")
    progress = Progress(quiet=args.quiet, bar=False if args.plain else None)
    metrics = train(args.spec, output=output, overrides=overrides, resume=args.resume, device=args.device,
                    progress=progress, command=[Path(sys.argv[0]).name, *sys.argv[1:]],
                    memory_budget=args.memory_budget, memory_check=args.memory_check)
    if _rank() == 0:
        _print_summary(metrics, output)
    return 0


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def _print_summary(metrics: dict[str, Any], output: str) -> None:
    m = metrics["metric"]
    for s in metrics["seeds"]:
        print(f"seed {s['seed']}: lr {s['lr']:g}, best epoch {s['best_epoch']}, val {m} {s['val'][m]:.4f}, test {m} {s['test'][m]:.4f}")
    t = metrics["summary"][f"test_{m}"]
    earlier = metrics.get("earlier_wall_s") or 0.0  # a resumed run: its epochs before this invocation
    took = f"{metrics['wall_time_s']:.1f} s" + (f" here, {metrics['wall_time_s'] + earlier:.1f} s in all" if earlier else "")
    print(f"{metrics['dataset']['name']}: test {m} {t['mean']:.4f} ± {t['std']:.4f} over {len(t['values'])} seed(s); "
          f"{metrics['params']:,} parameters; {took}")
    print(f"metrics: {Path(output) / 'metrics.json'}")


def cmd_eval(args: argparse.Namespace) -> int:
    from ..train.evaluate import evaluate_model  # lazy: keeps safetensors, torch out of train

    options = {"epsilon": args.epsilon, "max_depth": args.max_depth, "min_depth": args.min_depth, "stop_at": args.stop_at}
    if not args.adaptive and any(v is not None for v in options.values()):
        raise SpecError("--epsilon, --max-depth, --min-depth and --stop-at apply to --adaptive only")
    metrics = evaluate_model(args.model_dir, dataset=args.dataset, split=args.split, protocol=args.protocol, seed=args.seed,
                             adaptive=args.adaptive, adaptive_options={k: v for k, v in options.items() if v is not None},
                             batch_size=args.batch_size, device=args.device, output=args.output,
                             allow_overlap=args.allow_overlap, precision=args.precision)
    print(json.dumps(metrics, indent=2))
    return 0


def register_cli(sub: Any) -> None:
    """Add ``train`` and ``eval`` to the ``zoo`` subparsers."""
    s = sub.add_parser("train", help="train a spec on a registered dataset (the seed's protocol; torchrun for DDP)",
                       description="Train SPEC with its training: section; options override it. Under torchrun the "
                       "same command trains with DistributedDataParallel (global batch split across ranks).")
    s.add_argument("spec")
    s.add_argument("--dataset", help="a registered dataset (zoo list --kind datasets)")
    s.add_argument("--protocol", choices=("seed-split", "official"))
    s.add_argument("--seeds", type=_ints, help="comma-separated seeds, or 'paper' (2345,3456,4567,5678,6789)")
    s.add_argument("--lr", type=_floats, help="a learning rate, a comma-separated grid, or 'paper' (1e-3,1e-4,1e-5)")
    s.add_argument("--epochs", type=int)
    s.add_argument("--batch-size", type=int, help="the global batch")
    s.add_argument("--early-stop", type=int, help="patience in epochs")
    s.add_argument("--stop-at", type=float, metavar="VALUE",
                   help="also stop once the validation metric reaches VALUE (e.g. 1.0 accuracy)")
    s.add_argument("--loss", choices=("final", "blockwise"))
    s.add_argument("--normalize", choices=("none", "zscore"))
    s.add_argument("--pack", action="store_true",
                   help="pack unequal-length training sequences several to a row (less padding; reports what it saved)")
    s.add_argument("--precision", choices=("32", "bf16-mixed", "16-mixed"),
                   help="32 (default), bf16-mixed (bfloat16 autocast) or 16-mixed (float16 autocast + gradient scaler); "
                   "the cores compute their recurrences in float32 either way")
    s.add_argument("-o", "--output", help="run folder (default runs/<spec>-<dataset>)")
    s.add_argument("--resume", action="store_true", help="continue the run in --output where it stopped")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    s.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    s.add_argument("-q", "--quiet", action="store_true")

    add_memory_flags(s)
    s.set_defaults(fn=cmd_train)
    e = sub.add_parser("eval", help="score a saved model on a dataset split (optionally with adaptive depth)")
    e.add_argument("model_dir", metavar="MODEL",
                   help="a saved model folder or a reference: arch.tag, hf-hub:org/name[@rev], local-dir:path")
    e.add_argument("--dataset", help="default: the dataset the model was trained on")
    e.add_argument("--split", default="test", choices=("train", "val", "test"))
    e.add_argument("--protocol", choices=("seed-split", "official"), help="default: the training run's")
    e.add_argument("--seed", type=int, help="the split seed (default: the training run's)")
    e.add_argument("--adaptive", action="store_true", help="adaptive depth: stop when predictions settle")
    e.add_argument("--epsilon", type=float)
    e.add_argument("--max-depth", type=int)
    e.add_argument("--min-depth", type=int)
    e.add_argument("--stop-at", choices=("block", "period"))
    e.add_argument("--batch-size", type=int, default=256)
    e.add_argument("--device", default="auto")
    e.add_argument("-o", "--output", help="metrics JSON path (default: beside the model folder)")
    e.add_argument("--precision", choices=("32", "bf16-mixed", "16-mixed"), default="32",
                   help="score under autocast as zoo train --precision trains: what serving in half precision costs")
    e.add_argument("--allow-overlap", action="store_true",
                   help="score a split that holds sequences the model trained on (refused by default; warned and recorded)")
    e.set_defaults(fn=cmd_eval)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m zoo_core.train {train,eval} ...`` (the same as ``zoo train`` / ``zoo eval``)."""
    parser = argparse.ArgumentParser(prog="python -m zoo_core.train")
    parser.add_argument("-v", "--verbose", action="store_true")
    register_cli(parser.add_subparsers(dest="command", required=True))
    return run(parser, argv)
