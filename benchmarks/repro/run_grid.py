"""Reproduce the seed's experiments (seed 001, "Reshape and Recur") where the data exists.

Trains a grid of (dataset, core, stacking pattern, loss, reshaping, seed) through
``zoo_core.train.train`` — the same code as ``zoo train`` — and appends one JSON row per finished
run to ``benchmarks/repro/results/grid.jsonl``; ``adaptive`` then evaluates the trained AAAAAA /
ABABAB models with ``zoo_core.train.evaluate_model(..., adaptive=True)`` (``zoo eval
--adaptive``) into ``results/adaptive.jsonl``. ``make_tables.py`` renders ``benchmarks/REPRO.md``.

Resumable: a run whose key (its settings) is already in the JSONL is skipped, and a run that was
interrupted resumes from its last checkpoint (``train(..., resume=True)``), so running the same
command again extends or finishes the grid. Each run's folder holds the exact spec it trained
(``spec.yaml``) and the equivalent ``zoo train`` command is recorded in its row.

Each worker process uses one intra-op thread (``torch.set_num_threads(1)``); ``--jobs`` (default
2) runs that many at once. ``--deadline-min`` stops launching new runs after that many minutes.

    python -m benchmarks.repro.run_grid probe --suite jv-lru          # one epoch per config: time it
    python -m benchmarks.repro.run_grid train --suite jv-lru --epochs 30
    python -m benchmarks.repro.run_grid adaptive --suite jv-lru
    python -m benchmarks.repro.make_tables
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = HERE / "results"
RUNS = HERE / "runs"  # checkpoints and best models (large; not meant for the repository)

# pattern -> stacking section (depth 6)
PATTERNS: dict[str, dict[str, Any]] = {
    "ABCDEF": {"policy": "independent"},
    "AAAAAA": {"policy": "periodic", "period": 1},
    "ABABAB": {"policy": "periodic", "period": 2},
    "ABCABC": {"policy": "periodic", "period": 3},
}
SEEDS = (2345, 3456, 4567)  # the first three of the seed paper's five (zoo_core.spec.training.PAPER_SEEDS)
# (pattern, loss): ABCDEF has one period, so its blockwise loss is its final loss (the seed's tables
# list ABCDEF under L_final only)
ALL_CONFIGS = [("ABCDEF", "final"), ("AAAAAA", "final"), ("AAAAAA", "blockwise"), ("ABABAB", "final"),
               ("ABABAB", "blockwise"), ("ABCABC", "final"), ("ABCABC", "blockwise")]


@dataclass(frozen=True)
class Suite:
    """One block of the grid: a base spec and the variants trained on it."""

    spec: str  # file under benchmarks/repro/specs/
    dataset: str
    core: str
    configs: tuple[tuple[str, str], ...]
    reshape: tuple[int | None, ...]  # None = the original input
    epochs: int
    early_stop: int | None
    seeds: tuple[int, ...] = SEEDS
    lr: float = 1e-3
    batch_size: int = 32
    variant: str = ""  # set when the spec differs from the core's usual one (keys and folders say so)


def _suites() -> dict[str, list[Suite]]:
    jv = lambda core, configs, reshape, epochs: Suite(f"{core}-japanesevowels.yaml", "JapaneseVowels", core,
                                                      tuple(configs), tuple(reshape), epochs, early_stop=15)
    reduced = [("ABCDEF", "final"), ("AAAAAA", "final"), ("AAAAAA", "blockwise")]
    return {
        # priority 1: the full Table 2 / Table 5 grid for LRU on JapaneseVowels, c = 24 (2 steps × 12 channels)
        "jv-lru": [jv("lru", ALL_CONFIGS, (None, 24), 60)],
        # priority 3: one long dataset; reshaping c = 16 makes 1751 steps into 110
        "ethanol-lru": [Suite("lru-ethanollevel.yaml", "EthanolLevel", "lru",
                              (("ABCDEF", "final"), ("AAAAAA", "final"), ("AAAAAA", "blockwise"), ("ABABAB", "blockwise")),
                              (16,), epochs=20, early_stop=8)],
        # the original 1751-step input costs ~17x more per epoch on CPU: one seed, 8 epochs, beside
        # the same run with c = 16 (equal epochs)
        "ethanol-lru-raw": [Suite("lru-ethanollevel.yaml", "EthanolLevel", "lru", (("ABCDEF", "final"),), (None, 16),
                                  epochs=8, early_stop=None, seeds=(SEEDS[0],))],
        # EthanolLevel learned nothing in 8-25 epochs (train loss stays at ln 4), so a second long set:
        # ACSF1 (UCR, 1 channel, length 1460, 10 classes, 200 sequences), c = 16 (92 model steps)
        "acsf1-lru": [Suite("lru-acsf1.yaml", "ACSF1", "lru", tuple(ALL_CONFIGS), (16,), epochs=60, early_stop=15)],
        "acsf1-lru-raw": [Suite("lru-acsf1.yaml", "ACSF1", "lru", (("ABCDEF", "final"),), (None, 16), epochs=60,
                                early_stop=15, seeds=(SEEDS[0],))],
        # priority 4: the other landed cores, reduced grid
        "jv-cores": [jv(core, reduced, (None,), 60) for core in ("s5", "s4d", "linoss", "s4")],
        # the cores that landed while the grid first ran (issue 5), same reduced grid
        "jv-cores-new": [jv(core, reduced, (None,), 60) for core in ("lrcssm", "mamba")],
        # the families of issue 13 (Mamba-2, RG-LRU, Gated DeltaNet, Mamba-3), same reduced grid
        "jv-cores-2026": [jv(core, reduced, (None,), 60) for core in ("mamba2", "rglru", "gdn", "mamba3")],
        # the `uea` block (PyTorch BatchNorm1d) instead of `uea-ema`: what shared norms do to shared blocks
        "jv-lru-torchbn": [Suite("lru-japanesevowels-torchbn.yaml", "JapaneseVowels", "lru", tuple(reduced), (None,), 60,
                                 early_stop=15, variant="torchbn")],
    }


SUITES = _suites()


# ---------------------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------------------
def run_key(s: Suite, pattern: str, loss: str, c: int | None, seed: int, epochs: int) -> str:
    return (f"{s.dataset}/{s.core}{'+' + s.variant if s.variant else ''}/{pattern}/{loss}/c{c or 0}/seed{seed}/lr{s.lr:g}/bs{s.batch_size}/"
            f"ep{epochs}/es{s.early_stop or 0}")


def make_spec(s: Suite, pattern: str, c: int | None) -> dict[str, Any]:
    base = yaml.safe_load((HERE / "specs" / s.spec).read_text(encoding="utf-8"))
    spec = copy.deepcopy(base)
    spec["name"] = f"{base['name']}-{pattern.lower()}" + (f"-c{c}" if c else "")
    spec["model"]["stacking"] = dict(PATTERNS[pattern])
    if c:
        spec["input"]["reshape"] = {"c": c}
    return spec


def run_dir(s: Suite, pattern: str, loss: str, c: int | None, seed: int, epochs: int, root: Path) -> Path:
    return root / s.dataset / (s.core + (f"+{s.variant}" if s.variant else "")) / f"{pattern}-{loss}-c{c or 0}-ep{epochs}" / f"seed{seed}"


def _train_one(job: dict[str, Any]) -> dict[str, Any]:
    """Worker: one (config, seed) through zoo_core.train.train; returns the JSONL row."""
    import torch

    torch.set_num_threads(1)
    from zoo_core.train import train
    from zoo_core.train.progress import Progress

    out = Path(job["run_dir"])
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(job["spec"], sort_keys=False), encoding="utf-8")
    overrides = {"seeds": [job["seed"]], "lr": job["lr"], "epochs": job["epochs"], "batch_size": job["batch_size"],
                 "early_stop": job["early_stop"], "loss": job["loss"], "dataset": job["dataset"]}
    command = ["zoo", "train", str(spec_path.relative_to(ROOT)), "--seeds", str(job["seed"]), "--lr", f"{job['lr']:g}",
               "--epochs", str(job["epochs"]), "--batch-size", str(job["batch_size"]), "--loss", job["loss"],
               "-o", str(out.relative_to(ROOT)), "--resume"]
    if job["early_stop"]:
        command[-3:-3] = ["--early-stop", str(job["early_stop"])]
    t0 = time.perf_counter()
    with open(out / "log.txt", "a", encoding="utf-8") as log:
        metrics = train(spec_path, output=out, overrides=overrides, resume=True, device="cpu",
                        progress=Progress(log, bar=False), command=command)
    seed = metrics["seeds"][0]
    run = seed["runs"][0]
    times = [h["time_s"] for h in run["history"]]
    return {
        "kind": "run", "key": job["key"], "suite": job["suite"], "dataset": job["dataset"], "core": job["core"],
        "variant": job.get("variant", ""),
        "pattern": job["pattern"], "loss": job["loss"], "c": job["c"], "seed": job["seed"], "lr": job["lr"],
        "epochs": job["epochs"], "batch_size": job["batch_size"], "early_stop": job["early_stop"],
        "params": metrics["params"], "test": seed["test"], "val": seed["val"], "best_epoch": seed["best_epoch"],
        "epochs_run": run["epochs_run"], "epoch_time_s": times, "train_loss": [h["train_loss"] for h in run["history"]],
        "val_accuracy_curve": [h.get("val_accuracy") for h in run["history"]],
        "wall_s": time.perf_counter() - t0, "run_dir": str(out.relative_to(ROOT)), "model_dir": seed["model_dir"],
        "split": seed["split"], "command": " ".join(command), "threads": torch.get_num_threads(),
        "when": dt.datetime.now().isoformat(timespec="seconds"), "loadavg1": os.getloadavg()[0],
    }


# ---------------------------------------------------------------------------------------
# grid driver
# ---------------------------------------------------------------------------------------
def done_keys(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    return {json.loads(ln)["key"] for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()}


def append(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def plan(suites: list[str], epochs: int | None, seeds: list[int] | None, root: Path,
         cores: list[str] | None = None) -> list[dict[str, Any]]:
    """Jobs seed-major (every config's first seed, then the second, ...): a grid cut short by the
    deadline still has whole seeds. ``cores`` keeps only those cores' suites (a family that has
    just landed can be trained while the others are still being written)."""
    jobs, keys = [], set()
    for name in suites:
        for s in SUITES[name]:
            if cores and s.core not in cores:
                continue
            ep = epochs or s.epochs
            for seed in seeds or s.seeds:
                for c in s.reshape:
                    for pattern, loss in s.configs:
                        if run_key(s, pattern, loss, c, seed, ep) in keys:  # the same run named by two suites
                            continue
                        keys.add(run_key(s, pattern, loss, c, seed, ep))
                        jobs.append({"key": run_key(s, pattern, loss, c, seed, ep), "suite": name, "dataset": s.dataset,
                                     "variant": s.variant,
                                     "core": s.core, "pattern": pattern, "loss": loss, "c": c, "seed": seed, "lr": s.lr,
                                     "epochs": ep, "batch_size": s.batch_size, "early_stop": s.early_stop,
                                     "spec": make_spec(s, pattern, c),
                                     "run_dir": str(run_dir(s, pattern, loss, c, seed, ep, root))})
    return jobs


def drive(jobs: list[dict[str, Any]], out: Path, workers: int, deadline_min: float | None) -> None:
    done = done_keys(out)
    todo = [j for j in jobs if j["key"] not in done]
    print(f"{len(jobs)} runs in the plan, {len(jobs) - len(todo)} already in {out.relative_to(ROOT)}, {len(todo)} to train",
          flush=True)
    start = time.perf_counter()
    pending: dict[Any, dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        queue = list(todo)
        while queue or pending:
            late = deadline_min is not None and time.perf_counter() - start > deadline_min * 60
            while queue and len(pending) < workers and not late:
                job = queue.pop(0)
                pending[pool.submit(_train_one, job)] = job
            if not pending:
                break
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                job = pending.pop(fut)
                try:
                    row = fut.result()
                except Exception as exc:  # a diverged or failed run is recorded, not retried blindly
                    row = {"kind": "failed", "key": job["key"], "error": f"{type(exc).__name__}: {exc}",
                           "when": dt.datetime.now().isoformat(timespec="seconds")}
                    print(f"FAILED {job['key']}: {row['error']}", flush=True)
                    append(out.with_name(out.stem + "-failed.jsonl"), row)
                    continue
                append(out, row)
                acc = row["test"].get("accuracy", float("nan"))
                print(f"[{(time.perf_counter() - start) / 60:5.1f} min] {row['key']}: test acc {acc:.4f}, "
                      f"{row['epochs_run']} epochs, {row['wall_s']:.0f} s", flush=True)
        if queue:
            print(f"deadline of {deadline_min} min reached: {len(queue)} runs left for the next call", flush=True)


def probe(suites: list[str], root: Path) -> None:
    """One epoch of every distinct (pattern, loss, c) per suite, one seed, timed (no JSONL row)."""
    jobs, seen = [], set()
    for j in plan(suites, 1, [SEEDS[0]], root / "probe"):
        k = (j["dataset"], j["core"], j["pattern"], j["loss"], j["c"])
        if k not in seen:
            seen.add(k)
            jobs.append(j)
    for j in jobs:
        row = _train_one(j)
        print(f"{j['dataset']:<15} {j['core']:<7} {j['pattern']} {j['loss']:<9} c={j['c'] or '-':<3} "
              f"epoch {row['epoch_time_s'][0]:6.2f} s  run {row['wall_s']:6.1f} s  params {row['params']}", flush=True)


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


def _adaptive_one(job: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    torch.set_num_threads(1)
    from zoo_core.train import evaluate_model

    rows = []
    for name, opts in ADAPTIVE_SETTINGS:
        for eps in EPSILONS:
            options = {**opts, "epsilon": eps}
            tag = f"{name}-eps{eps:g}"
            m = evaluate_model(ROOT / job["model_dir"], split="test", adaptive=True, adaptive_options=options, device="cpu",
                               output=ROOT / job["run_dir"] / f"adaptive-{tag}.json")
            rows.append({"kind": "adaptive", "key": f"{job['key']}/{tag}", "run_key": job["key"], "setting": name,
                         "epsilon": eps, "options": options, "dataset": job["dataset"], "core": job["core"],
                         "pattern": job["pattern"], "loss": job["loss"], "c": job["c"], "seed": job["seed"],
                         "fixed": m["fixed_depth"], "adaptive": {k: v for k, v in m["adaptive"].items() if k != "options"},
                         "command": (f"zoo eval {job['model_dir']} --adaptive --epsilon {eps:g} --stop-at {opts['stop_at']} "
                                     f"--max-depth {opts['max_depth']}" + (f" --min-depth {opts['min_depth']}" if "min_depth" in opts else "")),
                         "when": dt.datetime.now().isoformat(timespec="seconds")})
    return rows


def adaptive(suites: list[str], grid: Path, out: Path, workers: int) -> None:
    rows = [json.loads(ln) for ln in grid.read_text(encoding="utf-8").splitlines() if ln.strip()]
    done = {json.loads(ln)["run_key"] for ln in out.read_text(encoding="utf-8").splitlines() if ln.strip()} if out.is_file() else set()
    jobs = [r for r in rows if r["suite"] in suites and r["pattern"] in ("AAAAAA", "ABABAB") and r["key"] not in done]
    for r in jobs:  # model_dir is absolute in metrics; store it relative
        r["model_dir"] = os.path.relpath(r["model_dir"], ROOT)
    print(f"{len(jobs)} trained models to evaluate adaptively", flush=True)
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        for job, res in zip(jobs, pool.map(_adaptive_one, jobs)):
            for row in res:
                append(out, row)
            best = res[0]["adaptive"]
            print(f"{job['key']}: fixed {res[0]['fixed']['accuracy']:.4f}, any-block ε={EPSILONS[0]:g} "
                  f"{best['accuracy']:.4f} at depth {best['mean_depth']:.2f}, FLOPs ×{best['flops_ratio']:.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["train", "adaptive", "probe", "list"])
    ap.add_argument("--suite", nargs="+", default=["jv-lru"], choices=sorted(SUITES))
    ap.add_argument("--epochs", type=int, help="override the suite's epochs (part of each run's key)")
    ap.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds")
    ap.add_argument("--cores", nargs="+", help="only these cores of the suites (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="processes at once (one thread each)")
    ap.add_argument("--deadline-min", type=float, help="launch no new run after this many minutes")
    ap.add_argument("--results", type=Path, default=RESULTS / "grid.jsonl")
    ap.add_argument("--adaptive-results", type=Path, default=RESULTS / "adaptive.jsonl")
    ap.add_argument("--runs", type=Path, default=RUNS, help="where run folders (checkpoints, best models) go")
    args = ap.parse_args(argv)
    if args.action == "list":
        for j in plan(args.suite, args.epochs, args.seeds, args.runs, args.cores):
            print(j["key"])
    elif args.action == "probe":
        probe(args.suite, args.runs)
    elif args.action == "train":
        drive(plan(args.suite, args.epochs, args.seeds, args.runs.resolve(), args.cores), args.results.resolve(), args.jobs, args.deadline_min)
    else:
        adaptive(args.suite, args.results, args.adaptive_results, args.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
