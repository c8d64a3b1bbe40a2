"""The seed reproduction's grid (seed 001, "Reshape and Recur") now runs on ``zoo sweep``.

Training: one sweep file per suite of the former grid, in ``benchmarks/repro/sweeps/`` (same specs,
stackings, losses, reshaping, seeds, lr, epochs, patience and batch as this module's old suites)::

    zoo sweep benchmarks/repro/sweeps/jv-lru.yaml            # resumable; --workers N, --ray auto
    python -m benchmarks.repro.make_tables                   # renders benchmarks/REPRO.md

What this module still does: ``rows()`` reads every suite's sweep results (``results/sweeps/<suite>.jsonl``)
beside the rows the former runner wrote (``results/grid.jsonl``, 168 runs) in the row shape
``make_tables`` reads, and ``adaptive`` evaluates the trained AAAAAA / ABABAB models with adaptive depth
(``zoo eval --adaptive``) into ``results/adaptive.jsonl`` — an evaluation of trained models, not a grid
of training runs, so it stays here::

    python -m benchmarks.repro.run_grid list --suite jv-lru      # the sweep's cells
    python -m benchmarks.repro.run_grid train --suite jv-lru     # says which zoo sweep command to run
    python -m benchmarks.repro.run_grid adaptive --suite jv-lru
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = HERE / "results"
SWEEPS = HERE / "sweeps"
SUITES = sorted(p.stem for p in SWEEPS.glob("*.yaml"))


def sweep_command(suites: list[str]) -> list[str]:
    return [f"zoo sweep {SWEEPS.relative_to(ROOT)}/{s}.yaml" for s in suites]


def legacy_key(dataset: str, core: str, variant: str, pattern: str, loss: str, c: int | None, seed: int, lr: float,
               batch: int, epochs: int, early_stop: int | None) -> str:
    """The former runner's key: a sweep row and a grid.jsonl row of the same run share it."""
    return (f"{dataset}/{core}{'+' + variant if variant else ''}/{pattern}/{loss}/c{c or 0}/seed{seed}/lr{lr:g}/bs{batch}/"
            f"ep{epochs}/es{early_stop or 0}")


def from_sweep(r: dict[str, Any], suite: str, output: Path) -> dict[str, Any]:
    """A ``zoo sweep`` row of a suite (spec label ``core[+variant]``, axes ``config`` = PATTERN-loss and ``c``)
    in the former grid.jsonl shape."""
    core, _, variant = r["spec"].partition("+")
    pattern, loss = r["axes"]["config"].split("-")
    c = int(r["axes"].get("c", "0")) or None
    t = r["training"]
    batch, epochs, es = t.get("batch_size", 32), t["epochs"], t.get("early_stop")
    return {
        "kind": "run", "key": legacy_key(r["dataset"], core, variant, pattern, loss, c, r["seed"], r["lr"], batch, epochs, es),
        "suite": suite, "dataset": r["dataset"], "core": core, "variant": variant, "pattern": pattern, "loss": loss, "c": c,
        "seed": r["seed"], "lr": r["lr"], "epochs": epochs, "batch_size": batch, "early_stop": es, "params": r["params"],
        "test": r["test"], "val": r["val"], "best_epoch": r["best_epoch"], "epochs_run": r["epochs_run"],
        "epoch_time_s": r["epoch_time_s"], "wall_s": r["wall_s"], "command": r["command"], "when": r["when"],
        "run_dir": os.path.relpath(output / r["run_dir"], ROOT),
        "model_dir": os.path.relpath(output / r["model_dir"], ROOT) if r.get("model_dir") else None,
    }


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


FULL_SUFFIX = "-full"  # the seed's full-protocol suites (benchmarks/repro/make_tables.py FULL)


def rows(suites: list[str] | None = None) -> list[dict[str, Any]]:
    """Every training row, former grid.jsonl first; a sweep row replaces the row of the same run, whichever
    suite trained it, except across a full-protocol suite (``*-full``): those retrain the 3-seed suites'
    lr-1e-3 runs for a table of their own, and must not take those suites' rows away."""
    from zoo_core.sweep import load_sweep
    from zoo_core.sweep.results import latest

    def identity(suite: str, key: str) -> tuple[str, str]:
        return (suite if suite.endswith(FULL_SUFFIX) else "", key)

    by = {identity(r["suite"], r["key"]): r for r in _jsonl(RESULTS / "grid.jsonl") if r.get("kind") == "run"}
    for suite in suites or SUITES:
        sweep = load_sweep(SWEEPS / f"{suite}.yaml", validate=False)
        for r in latest(sweep.results).values():
            if r.get("status") == "ok":
                row = from_sweep(r, suite, sweep.output)
                by[identity(suite, row["key"])] = row
    return [r for r in by.values() if suites is None or r["suite"] in suites]


# ---------------------------------------------------------------------------------------
# adaptive depth on trained models
# ---------------------------------------------------------------------------------------
# (name, options): the seed's Table 8 columns and an ε sweep for the FLOPs / accuracy trade-off
ADAPTIVE_SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("any-block", {"stop_at": "block", "max_depth": 12}),
    ("full-period", {"stop_at": "period", "max_depth": 12}),
    ("min-depth-6", {"stop_at": "period", "max_depth": 12, "min_depth": 6}),
    ("max-depth-6", {"stop_at": "period", "max_depth": 6}),
]
EPSILONS = (0.01, 0.1)


def append(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def _adaptive_one(job: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    torch.set_num_threads(1)
    from zoo_core.train import evaluate_model

    out = []
    for name, opts in ADAPTIVE_SETTINGS:
        for eps in EPSILONS:
            options = {**opts, "epsilon": eps}
            tag = f"{name}-eps{eps:g}"
            m = evaluate_model(ROOT / job["model_dir"], split="test", adaptive=True, adaptive_options=options, device="cpu",
                               output=ROOT / job["run_dir"] / f"adaptive-{tag}.json")
            cmd = f"zoo eval {job['model_dir']} --adaptive --epsilon {eps:g} --stop-at {opts['stop_at']} --max-depth {opts['max_depth']}"
            if "min_depth" in opts:
                cmd += f" --min-depth {opts['min_depth']}"
            out.append({"kind": "adaptive", "key": f"{job['key']}/{tag}", "run_key": job["key"], "setting": name,
                        "epsilon": eps, "options": options, "dataset": job["dataset"], "core": job["core"],
                        "pattern": job["pattern"], "loss": job["loss"], "c": job["c"], "seed": job["seed"],
                        "fixed": m["fixed_depth"], "adaptive": {k: v for k, v in m["adaptive"].items() if k != "options"},
                        "command": cmd, "when": dt.datetime.now().isoformat(timespec="seconds")})
    return out


def adaptive(suites: list[str], out: Path, workers: int) -> None:
    done = {r["run_key"] for r in _jsonl(out)}
    jobs = [r for r in rows(suites) if r["pattern"] in ("AAAAAA", "ABABAB") and r["key"] not in done]
    for r in jobs:  # the former rows hold model_dir absolute
        r["model_dir"] = os.path.relpath(ROOT / r["model_dir"], ROOT)
    print(f"{len(jobs)} trained models to evaluate adaptively", flush=True)
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        for job, res in zip(jobs, pool.map(_adaptive_one, jobs), strict=True):
            for row in res:
                append(out, row)
            best = res[0]["adaptive"]
            print(f"{job['key']}: fixed {res[0]['fixed']['accuracy']:.4f}, any-block ε={EPSILONS[0]:g} "
                  f"{best['accuracy']:.4f} at depth {best['mean_depth']:.2f}, FLOPs ×{best['flops_ratio']:.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["train", "adaptive", "list"])
    ap.add_argument("--suite", nargs="+", default=["jv-lru"], choices=SUITES)
    ap.add_argument("--jobs", type=int, default=2, help="adaptive: processes at once (one thread each)")
    ap.add_argument("--adaptive-results", type=Path, default=RESULTS / "adaptive.jsonl")
    args = ap.parse_args(argv)
    if args.action == "train":
        print("The grid's training runs on zoo sweep now (resumable; --workers N, --ray auto):\n  "
              + "\n  ".join(sweep_command(args.suite)) + "\nthen: python -m benchmarks.repro.make_tables")
        return 2
    if args.action == "list":
        from zoo_core.sweep import load_sweep

        for suite in args.suite:
            for cell in load_sweep(SWEEPS / f"{suite}.yaml", validate=False).cells:
                print(f"{suite}\t{cell.key}")
        return 0
    adaptive(args.suite, args.adaptive_results, args.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
