"""Length extrapolation of a task sweep's trained models: each finished cell's best model scored on
the longer (and shorter) test variants of its dataset.

Run: ``python -m benchmarks.tasks.extrapolate benchmarks/tasks/sweeps/induction-heads.yaml``
(``--max-length 4096 --limit 64 --budget 4GiB``). Results go to ``<sweep results>-extrapolation.jsonl``
beside the sweep's own JSONL, one line per cell × length; a line that is there is not computed
again, whatever the flags (resumable: kill it and run the same command; delete a cell's lines to
score it again with other settings). A ``failed`` line is retried.

Which test variants: every registered ``<dataset>-L<length>`` (zoo-synthetic registers them for
induction heads, 64 … 65,536 steps, and selective copying, 128 … 4,096; they share the base
dataset's training and validation sequences, so the model never saw a test sequence).

How a length is scored:

* **parallel** — the model's ordinary forward (``zoo_core.train.loop.evaluate``, what
  ``zoo eval --dataset`` runs) in the largest batch, halving from ``--batch``, whose estimated
  activation memory fits ``--budget``. The estimate is ``zoo_core.footprint.activation_bytes``
  (meta-device forwards in training mode, scaled linearly in length: an over-estimate for a
  no-grad forward, which is the safe side); for a core whose state grows with length (attention
  without a window) it is scaled once more by length / 256 for the quadratic score matrix. An
  out-of-memory error during the forward falls through to streaming.
* **streamed** — when even one sequence does not fit: the tokens go through the model chunk by
  chunk, carrying the recurrent state (``model.step`` token by token with ``--chunk 1``; by default
  ``model.forward_with_state`` over chunks of 256 tokens from the carried state, which is the same
  recurrence in fewer Python calls), and the logits are read only where the target is not -100.
  Memory is constant in length for a constant-state core. A core without ``step`` or with a
  growing state (attention without a window: its KV cache is as long as the sequence) is recorded
  ``not streamable`` past its parallel limit.

``--limit`` (sequences per length) defaults to the test split's size capped at 256: at 256
sequences a binomial accuracy near 50 % has a standard error of about 3 points on induction heads
(one scored token per sequence) and under 1 point on selective copying (16 per sequence), which
is finer than the differences the table is read for, while a full sweep's extrapolation (every
core × seed × length up to 65,536 steps) stays within a couple of CPU hours on a shared
two-core machine. The first ``limit`` sequences of the split are used (the split is generated
from a fixed seed, so every model sees the same ones).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoo_core.datasets import SplitData, get_dataset, list_datasets
from zoo_core.factory import load_pretrained
from zoo_core.footprint import activation_bytes, meta_model, parse_size
from zoo_core.spec import load_spec
from zoo_core.sweep.config import load_sweep
from zoo_core.sweep.execute import finished_on_disk
from zoo_core.sweep.results import append, latest, read_rows
from zoo_core.train.loop import IGNORE, evaluate, to_tensors

log = logging.getLogger("benchmarks.tasks.extrapolate")

DEFAULT_LIMIT_CAP = 256
DEFAULT_BUDGET = "4GiB"
DEFAULT_CHUNK = 256
PROBE_LENGTH = 256  # footprint's probe length: its activation estimate is linear in L from here
DONE = ("ok", "not streamable")  # statuses a rerun skips ("failed" is tried again)


def extrapolation_path(results: Path) -> Path:
    """``<sweep>.jsonl`` -> ``<sweep>-extrapolation.jsonl`` (beside it)."""
    return results.with_name(f"{results.stem}-extrapolation.jsonl")


def variants(dataset: str, names: list[str] | None = None) -> dict[int, str]:
    """Test length -> dataset: every registered ``<dataset>-L<length>`` and the base at its own
    length (the training length: the same test sequences as the sweep's, scored here on the same
    ``--limit`` as the others), sorted by length. Empty when the dataset has no length variants."""
    names = names if names is not None else [d.name for d in list_datasets()]
    pattern = re.compile(rf"^{re.escape(dataset)}-L(\d+)$")
    found = {int(m.group(1)): n for n in names if (m := pattern.match(n))}
    if found:
        base = get_dataset(dataset).info.length
        if base is not None and base not in found:
            found[int(base)] = dataset
    return dict(sorted(found.items()))


# scoring -------------------------------------------------------------------------------------------
@dataclass
class Score:
    accuracy: float
    scored: int  # target tokens scored
    how: str  # "parallel" or "streamed"
    batch: int
    chunk: int | None = None


def streamable(model: Any) -> tuple[bool, str]:
    """Whether every core can stream with a state that does not grow with length (and why not)."""
    for core in model.cores():
        name = type(core).__name__
        if "step" not in getattr(core, "capabilities", ()):
            return False, f"{name} has no step (capability 'step')"
        hp = getattr(core, "hparams", None)
        grows = hp.grows_state() if hp is not None else "growing_state" in getattr(core, "capabilities", ())
        if grows:
            return False, f"{name}'s streaming state grows with length (a KV cache without a window)"
    return True, ""


@torch.no_grad()
def streamed_accuracy(model: Any, X: torch.Tensor, y: torch.Tensor, *, batch: int, chunk: int) -> tuple[int, int]:
    """(correct, scored) over the positions whose target is not IGNORE, feeding the tokens through
    the recurrent state: ``model.step`` per token (chunk 1) or ``forward_with_state`` per chunk.

    All sequences must have the same length (the synthetic test splits do). Each batch stops after
    its last scored position: nothing after it can change a scored logit (the cores are causal)."""
    was = model.training
    model.eval()
    correct = scored = 0
    try:
        for start in range(0, X.shape[0], batch):
            xb, yb = X[start:start + batch], y[start:start + batch]
            mask = yb != IGNORE
            cols = mask.any(dim=0).nonzero()
            if not len(cols):
                continue
            end = int(cols.max()) + 1
            state = model.init_state(xb.shape[0], device=xb.device)
            for s in range(0, end, chunk):
                xc, yc, mc = xb[:, s:s + chunk], yb[:, s:s + chunk], mask[:, s:s + chunk]
                if chunk == 1:
                    out, state = model.step(xc[:, 0], state)
                    out = out[:, None]
                else:
                    out, state = model.forward_with_state(xc, state)
                if bool(mc.any()):
                    correct += int(((out.argmax(dim=-1) == yc) & mc).sum())
                    scored += int(mc.sum())
    finally:
        model.train(was)
    return correct, scored


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text or "not enough memory" in text


class MemoryModel:
    """Estimated bytes of a parallel eval forward at (batch, length), from the meta-device footprint."""

    def __init__(self, model: Any, grows: bool) -> None:
        spec = load_spec(model.spec)
        meta = meta_model(spec)
        one, _ = activation_bytes(spec, meta, 1, PROBE_LENGTH)
        two, _ = activation_bytes(spec, meta, 2, PROBE_LENGTH)
        self.per_sample = max(two - one, 1)
        self.shared = max(one - self.per_sample, 0)
        self.grows = grows

    def bytes(self, batch: int, length: int) -> int:
        scale = length / PROBE_LENGTH
        if self.grows:
            scale *= max(length / PROBE_LENGTH, 1.0)  # the score matrix is quadratic in length
        return math.ceil((self.shared + batch * self.per_sample) * scale)


def parallel_batch(mem: MemoryModel, length: int, budget: int, largest: int) -> int:
    """The largest batch (halving from ``largest``) whose estimate fits; 0 when one sequence does not."""
    b = largest
    while b >= 1:
        if mem.bytes(b, length) <= budget:
            return b
        b //= 2
    return 0


def score(model: Any, split: SplitData, *, mem: MemoryModel | None, budget: int, batch: int, chunk: int,
          force: str | None = None) -> Score | str:
    """Score one test split: parallel while it fits, else streamed; a string says why it cannot be."""
    data = to_tensors(split, next(model.parameters()).device)
    length = int(data["X"].shape[1])
    if split.lengths is not None and bool((torch.as_tensor(split.lengths) != length).any()):
        raise ValueError("unequal test lengths: extrapolate scores equal-length synthetic splits only")
    data.pop("lengths", None)
    b = batch if mem is None else parallel_batch(mem, length, budget, batch)
    if force == "parallel":
        b = max(b, 1)
    if b and force != "streamed":
        try:
            m = evaluate(model, data, "lm", b)
            scored = int((data["y"] != IGNORE).sum())
            return Score(m["accuracy"], scored, "parallel", b)
        except (RuntimeError, MemoryError) as exc:
            if not _is_oom(exc):
                raise
            log.warning("length %d: out of memory in parallel at batch %d; streaming", length, b)
    ok, why = streamable(model)
    if not ok:
        return f"not streamable: {why}; one sequence of {length} steps does not fit the parallel budget"
    correct, scored = streamed_accuracy(model, data["X"], data["y"], batch=batch, chunk=chunk)
    return Score(correct / max(scored, 1), scored, "streamed", batch, chunk)


# the sweep -----------------------------------------------------------------------------------------
def cells(results: Path, keep: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The sweep's finished cells (last row per key, status ok), sorted by key; ``keep`` (cell key ->
    config hash, as ``zoo sweep --report``): only the sweep file's cells made with its current settings."""
    return sorted((r for r in latest(results).values() if r.get("status") == "ok" and r.get("model_dir")
                   and (keep is None or keep.get(r["key"]) == r.get("config_hash"))), key=lambda r: r["key"])


def done_keys(path: Path) -> set[str]:
    return {r["key"] for r in read_rows(path) if r.get("status") in DONE and "key" in r}


def row_key(cell_key: str, length: int) -> str:
    return f"{cell_key}@L{length}"


def run(sweep_file: Path, *, max_length: int | None = None, limit: int | None = None, budget: int = parse_size(DEFAULT_BUDGET),
        batch: int = 64, chunk: int = DEFAULT_CHUNK, specs: list[str] | None = None, out: Path | None = None,
        force: str | None = None) -> Path:
    """Score every finished cell of the sweep on every test length; returns the JSONL's path."""
    sweep = load_sweep(sweep_file)
    out = out or extrapolation_path(sweep.results)
    run_results(sweep.results, sweep.output, out, max_length=max_length, limit=limit, budget=budget, batch=batch,
                chunk=chunk, specs=specs, force=force, keep={c.key: c.config_hash for c in sweep.cells})
    return out


def run_results(results: Path, output: Path, out: Path, *, max_length: int | None = None, limit: int | None = None,
                budget: int = parse_size(DEFAULT_BUDGET), batch: int = 64, chunk: int = DEFAULT_CHUNK,
                specs: list[str] | None = None, force: str | None = None, keep: dict[str, str] | None = None) -> int:
    """``run`` on a results JSONL whose ``model_dir`` entries are relative to ``output``; returns
    the number of lines appended to ``out`` (``force``: "parallel" or "streamed", for tests)."""
    done = done_keys(out)
    names = [d.name for d in list_datasets()]
    todo = [c for c in cells(results, keep) if specs is None or c["spec"] in specs]
    appended = 0
    for cell in todo:
        lengths = {L: n for L, n in variants(cell["dataset"], names).items() if max_length is None or L <= max_length}
        missing = [L for L in lengths if row_key(cell["key"], L) not in done]
        if not missing:
            continue
        model_dir = output / cell["model_dir"]
        if not model_dir.is_dir():  # the results JSONL is committed, the run folders are not
            print(f"{cell['key']}: skipped, its trained model {model_dir} is not on this machine "
                  f"(rerun the cell: zoo sweep trains again a finished cell whose folder is gone)", flush=True)
            continue
        run_dir = output / cell["run_dir"] if cell.get("run_dir") else None
        if run_dir is not None and not finished_on_disk(run_dir):  # `zoo sweep` is training it again right now
            print(f"{cell['key']}: skipped, its run folder {run_dir} holds no finished run (a training in progress or "
                  "cut off: its best model is not the one its results row reports); score it once zoo sweep has finished "
                  "it", flush=True)
            continue
        model = load_pretrained(model_dir).eval()
        ok, _ = streamable(model)
        grows = any((hp := getattr(c, "hparams", None)) is not None and hp.grows_state() for c in model.cores())
        try:
            mem: MemoryModel | None = MemoryModel(model, grows)
        except Exception as exc:  # noqa: BLE001 - an estimate that fails leaves the OOM catch as the guard
            log.warning("%s: no memory estimate (%s); parallel until out of memory", cell["key"], exc)
            mem = None
        for length in missing:
            split = get_dataset(lengths[length]).load("test")
            n = min(len(split), limit if limit is not None else DEFAULT_LIMIT_CAP)
            split = split.subset(np.arange(n))
            t0 = time.perf_counter()
            row: dict[str, Any] = {"key": row_key(cell["key"], length), "cell": cell["key"], "spec": cell["spec"],
                                   "dataset": cell["dataset"], "variant": lengths[length], "seed": cell["seed"],
                                   "lr": cell["lr"], "length": length, "sequences": n}
            try:
                res = score(model, split, mem=mem, budget=budget, batch=batch, chunk=chunk, force=force)
            except Exception as exc:  # noqa: BLE001 - one failed length is recorded and the rest go on
                row.update(status="failed", error=f"{type(exc).__name__}: {exc}".splitlines()[0])
            else:
                if isinstance(res, str):
                    row.update(status="not streamable", how=None, error=res)
                else:
                    row.update(status="ok", accuracy=res.accuracy, scored=res.scored, how=res.how, batch=res.batch,
                               chunk=res.chunk)
            row.update(seconds=round(time.perf_counter() - t0, 3), when=dt.datetime.now().isoformat(timespec="seconds"),
                       streamable=ok, budget_bytes=budget)
            append(out, row)
            appended += 1
            acc = "" if row.get("accuracy") is None else f"{row['accuracy']:.4f}"
            print(f"{row['key']}: {row['status']} {row.get('how') or ''} {acc} ({row['seconds']:.1f} s)", flush=True)
    return appended


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tasks.extrapolate", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path, help="a zoo sweep file (benchmarks/tasks/sweeps/induction-heads.yaml)")
    p.add_argument("--max-length", type=int, default=None, help="longest test length scored (default: all registered)")
    p.add_argument("--limit", type=int, default=None,
                   help=f"sequences per length (default: the test split's size, capped at {DEFAULT_LIMIT_CAP})")
    p.add_argument("--budget", default=DEFAULT_BUDGET, help=f"memory for a parallel forward (default {DEFAULT_BUDGET})")
    p.add_argument("--batch", type=int, default=64, help="largest batch (parallel) and the streaming batch")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="tokens per streamed call (1: model.step per token)")
    p.add_argument("--specs", default=None, help="only these core labels, comma-separated")
    p.add_argument("--output", type=Path, default=None, help="the JSONL (default: <sweep results>-extrapolation.jsonl)")
    p.add_argument("--how", choices=("auto", "parallel", "streamed"), default="auto",
                   help="auto: parallel within the budget, streamed beyond; the others force one way (to compare them)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    path = run(a.sweep, max_length=a.max_length, limit=a.limit, budget=parse_size(a.budget), batch=a.batch,
               chunk=a.chunk, specs=a.specs.split(",") if a.specs else None, out=a.output,
               force=None if a.how == "auto" else a.how)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
