"""Render ``benchmarks/TASKS.md`` and its plots from the task sweeps' results and the published figures.

Run: ``python -m benchmarks.tasks.make_tables`` (after ``zoo sweep benchmarks/tasks/sweeps/X.yaml`` and
``python -m benchmarks.tasks.extrapolate benchmarks/tasks/sweeps/X.yaml``). Reads, per sweep file in
``benchmarks/tasks/sweeps/``: its results JSONL (``<sweep>.jsonl``), the extrapolation JSONL beside
it (``<sweep>-extrapolation.jsonl``, if any), ``benchmarks/tasks/published.yaml`` and a hand-written
``benchmarks/tasks/reading/<sweep>.md`` per task (if any). Writes ``benchmarks/TASKS.md`` and PNGs
under ``benchmarks/tasks/plots/``.

The per-cell selection (each seed's learning rate picked on validation, mean ± sample std over
seeds) is ``zoo_core.sweep.report.configs``, the plots ``report.plot_points``: the same numbers
``zoo sweep --report`` prints. Output is deterministic: rows in the sweep file's order, fixed float
formats, and the "as of" stamp is the newest result line's own time (not the clock), so a rerun on
the same results writes the same file.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from zoo_core.sweep.config import load_sweep
from zoo_core.sweep.report import Config, configs, plot_points
from zoo_core.sweep.results import latest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SWEEPS = ("induction-heads", "selective-copying", "mqar-small", "listops", "pixel-mnist", "pathfinder")  # the order of TASKS.md's sections
# Sweeps that vary one axis of a section's model, read into that section (not sections of their own):
# section -> (sweep, axis, the section's own value of it)
COMPANIONS = {"mqar-small": ("mqar-width", "width", "64")}

TITLES = {
    "induction-heads": "Induction heads",
    "selective-copying": "Selective copying",
    "mqar-small": "MQAR (multi-query associative recall), small",
    "listops": "ListOps (Long Range Arena), CPU lengths",
    "pixel-mnist": "Sequential and permuted MNIST (sMNIST, psMNIST)",
    "pathfinder": "Pathfinder 32 × 32 (Long Range Arena), LRA's difficulty and the easiest",
}
CARDS = {"induction-heads": "induction-heads", "selective-copying": "selective-copying", "mqar-small": "mqar",
         "listops": "listops", "pixel-mnist": "smnist",
         "pathfinder": "pathfinder"}
WHAT = {
    "induction-heads": "Random content tokens (14 of a 16-token vocabulary) hold one special token followed by a "
                       "token X; the sequence ends with the special token again and the model must output X (one "
                       "scored position; chance 1/14 = 7.1 %). Trained at length 64 (`induction-heads-short`), tested "
                       "at 64 … 65,536 steps (Mamba §4.1.2).",
    "selective-copying": "16 data tokens scattered among noise tokens must be output in order at 16 marker "
                         "positions at the end (16 scored positions per sequence; chance 1/14 = 7.1 %); trained and "
                         "tested at length 64 (`selective-copying-short`), tested longer at 128 … 4,096 (Mamba §4.1.1).",
    "mqar-small": "Key–value pairs followed by queries of some of the keys (placed by Zoology's power law); the "
                  "model must output each queried key's value (Zoology). Vocabulary 64, trained on (length, pairs) "
                  "(32, 2) and (64, 4), tested on (32, 2), (32, 4), (64, 8), (128, 16).",
    "listops": "Nested MAX/MIN/MED/SUM_MOD expressions of single digits in LRA's grammar (depth ≤ 10, ≤ 10 "
               "arguments), the label their value (10 classes), read as a token sequence and classified from the "
               "mean of the outputs; 101–299 tokens (`ListOps`; LRA's own lengths are `ListOps-LRA`).",
    "pixel-mnist": "Each MNIST digit read one grey value a step, 784 steps, row by row (sMNIST) or in one fixed "
                   "random order of the pixels (psMNIST), which spreads each stroke over the whole sequence; the "
                   "label (10 classes) classified from the mean of the outputs.",
    "pathfinder": "A 32 × 32 image of dashed curved paths and two round markers, read pixel by pixel (1,024 steps); "
                  "the label is whether one path joins the markers (`Pathfinder32-14`: paths of 14 paddles, LRA's "
                  "difficulty; `Pathfinder32-6`: 6, the easiest). Chance is 50 %; a rule reading only the two "
                  "markers' distance scores 65.5 % at 14 and 89.4 % at 6 (the card's shortcut).",
}
SCALE = {
    "induction-heads": "Mamba paper: 2 layers, D = 64 (Mamba) or 128 (the others), 25 epochs × 8,192 steps at batch "
                       "8 (~200K steps), fresh data every step. Here: length 64, 16,000 training sequences, at most 8 "
                       "epochs at batch 32 (≤ 4,000 steps), lr 3e-3, stopped once validation reaches 100 %.",
    "selective-copying": "Mamba paper: length 4,096, 400K steps at batch 64, lr 1e-4, fresh data every step. "
                         "Here: length 64, 16,000 training sequences, at most 8 epochs at batch 32 (≤ 4,000 steps), "
                         "lr 3e-3, stopped once validation reaches 100 %.",
    "mqar-small": "Zoology: vocabulary 8,192, lengths 64–512 with 4–64 pairs, widths 64–512, the best of 4 learning "
                  "rates. Here: vocabulary 64, lengths 32–128, width 64, one learning rate (3e-3), 6,000 training "
                  "sequences, at most 24 epochs at batch 32 (≤ 4,500 steps), stopped once validation reaches 100 %.",
    "listops": "LRA: 501–1,999 tokens, 96,000 training sequences, 6-layer models (LRU's setup), "
               "tens of epochs. Here: 101–299 tokens, 10,000 training sequences, the 2-block width-64 classifier "
               "(`benchmarks/tasks/specs/cls-2layer.yaml`), AdamW (weight decay 0.01), lr 3e-3, at most 6 epochs "
               "at batch 32 (≤ 1,900 steps), early stopping after 3.",
    "pixel-mnist": "The papers: deeper and wider models trained for many epochs (each source's appendix has its "
                   "setting). Here: the classic "
                   "50,000 / 10,000 / 10,000 split, the 2-block width-32 classifier "
                   "(`benchmarks/tasks/specs/pixel-2layer.yaml`), AdamW (weight decay 0.01), lr 3e-3, one epoch at "
                   "batch 32 (1,562 steps).",
    "pathfinder": "LRA: 160,000 training images; its Transformer 4 layers for 200 epochs (LRA App. A.3), the SSM "
                  "papers' 6-layer models (LRU's setup). Here: 8,000 / 1,000 / 1,000 "
                  "images, the 2-block width-32 classifier (`benchmarks/tasks/specs/pathfinder-2layer.yaml`), AdamW "
                  "(weight decay 0.01), lr 3e-3, 20 epochs at batch 32 (5,000 steps), no early stopping (the 50 % plateau "
                  "outlasts a patience of 5).",
}

# The LRA papers' rows (ListOps and Pathfinder alike): S4's own, S4D's and S5's as LRU cites them, LRU's, LRA's Transformer.
LRA_ROWS: dict[str, list[tuple[str, str | None, str]]] = {
    "s4": [("S4", None, "S4, LRA")],
    "s4d": [("S4D-LegS (paper results, as cited by LRU)", None, "S4D-LegS, LRA")],
    "s5": [("S5 (paper results, as cited by LRU)", None, "S5, LRA")],
    "lru": [("LRU", None, "LRU, LRA")],
    "attention": [("Transformer", None, "Transformer, LRA")],
}
# Our core label -> the published rows that report that model on the task: (model in published.yaml,
# a substring the entry's `setting` must hold (None: any), the name to print).
PUBLISHED_FOR: dict[str, dict[str, list[tuple[str, str | None, str]]]] = {
    "induction-heads": {
        "mamba": [("Mamba", "test length 256;", "Mamba, trained and tested at 256")],
        "attention": [("MHA-RoPE", "test length 256;", "MHA-RoPE, trained and tested at 256")],
    },
    "selective-copying": {
        "s4": [("No gate arch + S4 layer (= S4)", None, "S4, L = 4,096")],
        "mamba": [("Mamba arch + S6 layer (= Mamba)", None, "Mamba, L = 4,096")],
    },
    "mqar-small": {
        "attention": [("Attention", "model dimension 64;", "attention, d = 64, L = 64–512, vocab 8,192")],
        "mamba": [("Mamba", None, "Mamba, state 2e4–1e5, vocab 8,192")],
    },
    "listops": LRA_ROWS,
    "pathfinder": LRA_ROWS,
    "pixel-mnist": {
        "s4": [("S4", None, "S4")],
        "s5": [("S5", None, "S5, causal")],
        "attention": [("Transformer (baseline as cited by S4)", None, "Transformer, as cited by S4")],
    },
}
PUBLISHED_TASK = {"induction-heads": "induction-heads", "selective-copying": "selective-copying", "mqar-small": "mqar",
                  "listops": "ListOps-LRA", "pixel-mnist": ("sMNIST", "psMNIST"),
                  "pathfinder": ("Pathfinder32-6", "Pathfinder32-14-LRA")}  # LRA reports difficulty 14 only
# published rows beside the extrapolation table: (model in published.yaml, the name to print)
PUBLISHED_EXTRAPOLATION = {"induction-heads": [("Mamba", "Mamba (paper, 74K params)"),
                                               ("MHA-RoPE", "MHA-RoPE (paper, 137K)"),
                                               ("MHA-Abs", "MHA-Abs (paper, 137K)")]}


@dataclass
class Task:
    """Everything one section needs: the sweep's cells as planned, its rows, its extrapolation rows."""

    name: str
    sweep_file: str  # as the command is written (relative to the repository)
    specs: list[str]  # core labels in the sweep file's order
    seeds: dict[str, int]  # core label -> seeds the sweep asks for
    cells: int  # cells the sweep plans
    rows: list[dict[str, Any]] = field(default_factory=list)  # latest row per key
    extrapolation: list[dict[str, Any]] = field(default_factory=list)
    axes: list[str] = field(default_factory=list)
    dataset: str = ""  # the dataset the sweep trains on (its rows are grouped by it), e.g. induction-heads-short
    datasets: list[str] = field(default_factory=list)  # every dataset, where the sweep trains on several (a column each)
    companion: "Task | None" = None  # a sweep varying one axis of this one's model (COMPANIONS)

    @property
    def group(self) -> str:
        return self.dataset or self.name


# formatting ----------------------------------------------------------------------------------------
def pct(xs: list[float]) -> str:
    """Mean ± sample std in %; one value alone (no spread to estimate) without a ±."""
    m = statistics.mean(xs) * 100
    return f"{m:.1f} ± {statistics.stdev(xs) * 100:.1f}" if len(xs) > 1 else f"{m:.1f}"


def _source(e: dict[str, Any]) -> str:
    src = e.get("source") or {}
    paper = str(src.get("paper", "")).split(":")[0].split(" (")[0].strip()
    where = re.split(r"[;(,]", str(src.get("where", "")))[0].strip()
    arxiv = str(src.get("arxiv", "")).split(" ")[0]
    return f"{paper}, {where}" + (f", arXiv {arxiv}" if arxiv else "")


def _value(e: dict[str, Any]) -> float | None:
    v = e.get("value")
    if v is None:
        return None
    return float(v) * (100.0 if "fraction" in str(e.get("metric", "")) else 1.0)


def published_tasks(task: str) -> tuple[str, ...]:
    """The task name(s) ``published.yaml`` files this section's figures under (one per dataset of the sweep)."""
    t = PUBLISHED_TASK.get(task, task)
    return (t,) if isinstance(t, str) else tuple(t)


def published_cell(task: str, spec: str, published: list[dict[str, Any]]) -> str:
    """The published figure(s) for our core ``spec`` on ``task`` with their source, or an em dash. A section
    of several datasets names each figure's dataset: "sMNIST 99.6, psMNIST 98.7 (S4; source)"."""
    parts = []
    names = published_tasks(task)
    for model, must, shown in PUBLISHED_FOR.get(task, {}).get(spec, []):
        texts, found = [], []
        for name in names:
            es = [e for e in published if e["task"] == name and e["model"] == model
                  and (must is None or must in str(e.get("setting", "")))]
            vals = sorted(v for e in es if (v := _value(e)) is not None)
            if not vals:
                continue
            text = f"{vals[0]:.1f}" if vals[0] == vals[-1] else f"{vals[0]:.1f}–{vals[-1]:.1f}"
            approx = "~" if any("read off" in str(e.get("notes", "")) + str(e.get("setting", "")) + str(e.get("source", {}).get("where", ""))
                                or "fraction" in str(e.get("metric", "")) for e in es) else ""
            texts.append(f"{name} {approx}{text}" if len(names) > 1 else f"{approx}{text}")
            found.append(es[0])
        if texts:
            parts.append(f"{', '.join(texts)} ({shown}; {_source(found[0])})")
    return "; ".join(parts) or "—"


def _length_of(e: dict[str, Any]) -> int | None:
    m = re.search(r"test length (\d+)", str(e.get("setting", "")))
    return int(m.group(1)) if m else None


# sections ------------------------------------------------------------------------------------------
def results_table(task: Task, by: dict[str, list[Config]], published: list[dict[str, Any]]) -> list[str]:
    """One row per core: its test accuracy (one column per dataset where the sweep trains on several), the
    parameter count, the median epoch time over every dataset's runs and the published figures."""
    groups = task.datasets if len(task.datasets) > 1 else [task.group]
    cs = {(g, c.spec): c for g in groups for c in by.get(g, []) if not c.axes}
    accs = (["test accuracy (%), mean ± std (seeds)"] if len(groups) == 1
            else [f"{g} test accuracy (%)" for g in groups])
    head = ["core", *accs, "params", "s / epoch", "published (source)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec in task.specs:
        pub = published_cell(task.name, spec, published)
        mine = [cs.get((g, spec)) for g in groups]
        done = [c for c in mine if c is not None]
        if not done:
            out.append(f"| {spec} | " + " | ".join(["not run yet"] * len(groups)) + f" | — | — | {pub} |")
            continue
        want = task.seeds.get(spec, 0)
        cells = []
        for c in mine:
            if c is None:
                cells.append("not run yet")
                continue
            n = len(c.picks)
            partial = f", partial: {n} of {want} seeds" if want and n < want else ""
            cells.append(f"{pct(c.values())} ({n}{partial})")
        epochs = [t for c in done for r in c.picks if on_cpu(r) for t in r.get("epoch_time_s") or []]  # this machine's clock
        per_epoch = f"{statistics.median(epochs):.1f}" if epochs else "—"
        out.append(f"| {spec} | " + " | ".join(cells) + f" | {done[0].picks[0]['params']:,} | {per_epoch} | {pub} |")
    return out


def extrapolation_cells(task: Task) -> tuple[list[int], dict[str, dict[int, str]], dict[str, list[tuple[float, float, float]]]]:
    """Lengths, core -> length -> table text, and core -> plot points (length, mean, std)."""
    by: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in task.extrapolation:
        by[(r["spec"], int(r["length"]))].append(r)
    lengths = sorted({L for _, L in by})
    text: dict[str, dict[int, str]] = defaultdict(dict)
    points: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for (spec, L), rs in sorted(by.items()):
        ok = [r for r in sorted(rs, key=lambda r: r["seed"]) if r.get("status") == "ok"]
        if ok:
            accs = [float(r["accuracy"]) for r in ok]
            streamed = "ˢ" if any(r.get("how") == "streamed" for r in ok) else ""
            text[spec][L] = f"{pct(accs)} ({len(accs)}){streamed}"
            points[spec].append((float(L), statistics.mean(accs), statistics.stdev(accs) if len(accs) > 1 else 0.0))
        elif any(r.get("status") == "not streamable" for r in rs):
            text[spec][L] = "not streamable"
        else:
            text[spec][L] = "failed"
    return lengths, dict(text), dict(points)


def extrapolation_table(task: Task, published: list[dict[str, Any]], train_length: int | None) -> list[str]:
    lengths, text, _ = extrapolation_cells(task)
    if not lengths:
        return []
    def col(L: int) -> str:
        return f"**{L:,} (train)**" if L == train_length else f"{L:,}"
    out = ["| core | " + " | ".join(col(L) for L in lengths) + " |", "|" + "---|" * (len(lengths) + 1)]
    for spec in task.specs:
        if spec in text:
            out.append(f"| {spec} | " + " | ".join(text[spec].get(L, "—") for L in lengths) + " |")
    seqs: dict[int, set[int]] = defaultdict(set)
    for r in task.extrapolation:
        if r.get("sequences") is not None:
            seqs[int(r["length"])].add(int(r["sequences"]))
    if seqs:
        out.append("| *sequences per length* | " + " | ".join("/".join(str(n) for n in sorted(seqs.get(L, set()))) or "—"
                                                          for L in lengths) + " |")
    for model, shown in PUBLISHED_EXTRAPOLATION.get(task.name, []):
        es = {_length_of(e): e for e in published if e["task"] == PUBLISHED_TASK[task.name] and e["model"] == model}
        if not es:
            continue
        cells = []
        for L in lengths:
            e = es.get(L)
            v = None if e is None else _value(e)
            cells.append("—" if e is None else ("OOM" if v is None else f"{v:.1f}"))
        out.append(f"| *{shown}* | " + " | ".join(cells) + " |")
    return out


def axis_points(task: Task, by: dict[str, list[Config]]) -> tuple[str, list[str], dict[str, dict[str, Config]]]:
    """The companion sweep's axis, its values in order (the section's own included) and core -> value -> Config.
    ("", [], {}) without a companion. The section's own cells (no axes) are its value of the axis."""
    if task.companion is None or task.name not in COMPANIONS:
        return "", [], {}
    _, axis, own = COMPANIONS[task.name]
    table: dict[str, dict[str, Config]] = defaultdict(dict)
    for c in by.get(task.group, []):
        if not c.axes:
            table[c.spec][own] = c
        elif set(c.axes) == {axis}:
            table[c.spec][c.axes[axis]] = c
    values = sorted({v for row in table.values() for v in row} | {own}, key=float)
    return axis, values, dict(table)


def axis_table(task: Task, by: dict[str, list[Config]]) -> list[str]:
    """Test accuracy (%) of each core at each value of the companion's axis, mean ± std (seeds)."""
    axis, values, table = axis_points(task, by)
    if not table or task.companion is None:
        return []
    own = COMPANIONS[task.name][2]
    head = " | ".join(f"**{v} (main table)**" if v == own else v for v in values)
    out = [f"| core | {head} |", "|" + "---|" * (len(values) + 1)]
    for spec in dict.fromkeys(task.specs + task.companion.specs):
        row = table.get(spec, {})
        if row:
            out.append(f"| {spec} | " + " | ".join(f"{pct(row[v].values())} ({len(row[v].picks)})" if v in row else "—"
                                                   for v in values) + " |")
    return out


def on_cpu(row: dict[str, Any]) -> bool:
    """Whether a cell ran on a CPU (one thread here). A seed run on a GPU (benchmarks/tasks/device_sweep.sh;
    its row says "device": "cuda:0") counts in the accuracy, not in the clock columns and plots."""
    return str(row.get("device", "cpu")).startswith("cpu")


def cpu_walls(c: Config) -> list[float]:
    """The seeds' walls that ran on a CPU (``on_cpu``)."""
    return [w for w, pick in zip(c.walls, c.picks, strict=True) if on_cpu(pick)]


def plots(task: Task, by: dict[str, list[Config]], plot_dir: Path) -> list[Path]:
    made: list[Path | None] = []
    several = len(task.datasets) > 1
    for g in task.datasets if several else [task.group]:
        cs = [c for c in by.get(g, []) if not c.axes]
        if not cs:
            continue
        wall = {c.spec: [(statistics.mean(cpu_walls(c)), statistics.mean(c.values()),
                          statistics.stdev(c.values()) if len(c.picks) > 1 else 0.0)] for c in cs if cpu_walls(c)}
        name = f"{task.name}-{g}" if several else task.name
        made.append(plot_points(wall, plot_dir / f"{name}-accuracy-vs-wall.png", xlabel="training wall-clock per seed (s)",
                                ylabel="test accuracy", title=f"{g if several else task.name}: test accuracy vs wall-clock", logx=True))
    _, _, points = extrapolation_cells(task)
    if points:
        made.append(plot_points(points, plot_dir / f"{task.name}-extrapolation.png", xlabel="test length (steps)",
                                ylabel="test accuracy", title=f"{task.name}: accuracy vs test length", logx=True))
    for axis in (a for a in task.axes if a in ("width", "d_model")):
        series: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for c in by.get(task.group, []):
            if axis in c.axes:
                v = c.values()
                series[c.spec].append((float(c.axes[axis]), statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0))
        if series:
            made.append(plot_points(dict(series), plot_dir / f"{task.name}-accuracy-vs-{axis}.png", xlabel=axis,
                                    ylabel="test accuracy", title=f"{task.name}: accuracy vs {axis}"))
    axis, _, table = axis_points(task, by)
    if table:
        pts = {spec: [(float(v), statistics.mean(c.values()), statistics.stdev(c.values()) if len(c.picks) > 1 else 0.0)
                      for v, c in sorted(row.items(), key=lambda kv: float(kv[0]))] for spec, row in table.items()}
        made.append(plot_points(pts, plot_dir / f"{task.name}-accuracy-vs-{axis}.png", xlabel=f"model {axis} (d_model)",
                                ylabel="test accuracy", title=f"{task.name}: accuracy vs model {axis}", logx=True))
    return [p for p in made if p is not None]


def _stamp(rows: list[dict[str, Any]]) -> str:
    whens = sorted(str(r["when"]) for r in rows if r.get("when"))
    return whens[-1].replace("T", " ") if whens else "no results yet"


def render(tasks: list[Task], published: list[dict[str, Any]], *, reading_dir: Path, plot_dir: Path,
           doc_dir: Path, train_lengths: dict[str, int] | None = None) -> str:
    """TASKS.md's text (and the PNGs into ``plot_dir``); links are relative to ``doc_dir``."""
    train_lengths = train_lengths or {}
    plot_dir.mkdir(parents=True, exist_ok=True)
    every = [r for t in tasks for r in t.rows + t.extrapolation]
    lines = [
        "# Tasks on which sequence models differ",
        "",
        "<!-- generated by `python -m benchmarks.tasks.make_tables` from benchmarks/tasks/results/*.jsonl and "
        "benchmarks/tasks/published.yaml; edit those (or benchmarks/tasks/reading/<task>.md), not this file -->",
        "",
        "On the UEA/UCR sets every core lands within noise of the others (`benchmarks/REPRO.md`). These synthetic "
        "tasks are built to separate them: recall of a token seen long before (induction heads, MQAR) and copying "
        "only the tokens that matter among noise (selective copying), which a time-invariant state space model "
        "cannot do by construction and an input-dependent one can (Mamba §3.1); ListOps (Long Range Arena) asks for "
        "hierarchical structure over a few hundred steps, sequential MNIST for evidence gathered over 784 steps, "
        "in reading order or permuted, and Pathfinder for tracing a path through 1,024 pixels. Each task is a dataset of the zoo-synthetic or "
        "zoo-longrange plugin; its card (definition, the paper's parameters, what changed for a CPU) is linked "
        "in its section.",
        "",
        "**The common model.** Every core is compared in the same network, `benchmarks/tasks/specs/lm-2layer.yaml`: "
        "tokens embedded, two pre-RMSNorm residual blocks of width 64 (the Mamba paper's synthetic-task depth and "
        "width), each the core then a GELU and a GLU output map, a final RMSNorm and a per-step head; only the "
        "positions with a target are scored (the others are −100). The sweep files set each core's own settings "
        "(state size 16 for S4, S4D, S5, LRU, LinOSS, LrcSSM and Mamba, the `small` presets for Mamba-2/3, "
        "RG-LRU and GDN, four heads with RoPE for attention). ListOps, a classification task, uses the same blocks "
        "with the outputs mean-pooled into one label (`benchmarks/tasks/specs/cls-2layer.yaml`); sMNIST and psMNIST "
        "use that classifier at width 32 on the one grey value per step (`benchmarks/tasks/specs/pixel-2layer.yaml`: "
        "at 784 steps width 64 costs 1.7–3.5× as much per update here), and Pathfinder the same with 2 labels "
        "(`benchmarks/tasks/specs/pathfinder-2layer.yaml`).",
        "",
        "**The protocol.** Each core × seed is one `zoo train` run: Adam, lr 3e-3, gradient clipping 1.0, batch 32, "
        "at most 8 epochs of ~500 steps (MQAR: 24 of ~190; ListOps: AdamW, 6 of ~310; sMNIST/psMNIST: AdamW, one of 1,562; Pathfinder: AdamW, 20 of 250, no early stopping) with early stopping after 3 "
        "(MQAR: 6) epochs without "
        "improvement or as soon as validation reaches 100 % (`training.stop_at`), the model of the best validation "
        "token accuracy kept and scored on the test split (`training.protocol: official`: the generator's own "
        "train/val/test). Induction heads and selective copying train at length 64 (the `-short` variants: a "
        "quarter of the cost per step of length 256, so ~4,000 updates fit a cell; at length 256 and ~1,250 "
        "updates every core but RG-LRU stayed at chance). The table gives the test token accuracy over the scored positions (ListOps, sMNIST, psMNIST, Pathfinder: label accuracy), mean ± sample std over "
        "the seeds (the count in brackets), the parameter count, and the median seconds per epoch (one thread of a "
        "shared two-core CPU, several runs at a time: a rough cost, not a speed benchmark; seeds run on a GPU count in "
        "the accuracy only). Published figures come "
        "from `benchmarks/tasks/published.yaml` (each with its source; `benchmarks/tasks/PUBLISHED.md` is the "
        "digest); they are at the papers' scale, listed in each section, which is much larger than ours.",
        "",
        "**Reproduce.** Per task `X` (induction-heads, selective-copying, mqar-small, listops, pixel-mnist, pathfinder):",
        "",
        "```",
        "zoo sweep benchmarks/tasks/sweeps/X.yaml                        # resumable: finished cells are skipped",
        "python -m benchmarks.tasks.extrapolate benchmarks/tasks/sweeps/X.yaml   # longer test lengths; resumable",
        "python -m benchmarks.tasks.make_tables                          # this file and benchmarks/tasks/plots/",
        "```",
        "",
        "A clone has the results files but not the run folders, so the first command trains every cell again; "
        "`zoo sweep benchmarks/tasks/sweeps/X.yaml --missing` runs only the cells its results file lacks.",
        "",
        f"**Status** (the newest result line is from {_stamp(every)}):",
        "",
    ]
    for t in tasks:
        done = sum(1 for r in t.rows if r.get("status") == "ok")
        failed = sum(1 for r in t.rows if r.get("status") != "ok")
        ext = sum(1 for r in t.extrapolation if r.get("status") == "ok")
        lines.append(f"- {t.name}: {done} of {t.cells} cells finished" + (f", {failed} failed" if failed else "")
                     + (f"; {ext} extrapolation scores" if t.extrapolation else "") + ".")
        if t.companion is not None:
            co = t.companion
            lines.append(f"- {co.name} (read into {t.name}): {sum(1 for r in co.rows if r.get('status') == 'ok')} of "
                         f"{co.cells} cells finished.")
    lines += ["", "Rows with fewer seeds than the sweep asks for are marked partial; cores without a finished "
              "cell are listed as not run yet. Everything here is regenerated as the sweeps finish.", ""]
    by = configs([r for t in tasks for r in t.rows + (t.companion.rows if t.companion else [])])
    for t in tasks:
        card = f"docs/tasks/{CARDS.get(t.name, t.name)}.md"
        lines += [f"## {TITLES.get(t.name, t.name)}", "",
                  f"{WHAT.get(t.name, '')} Card: [`{card}`]({_rel(ROOT / card, doc_dir)}). "
                  f"Sweep: `{t.sweep_file}`.", "", f"Scale: {SCALE.get(t.name, '')}", "",
                  *results_table(t, by, published), ""]
        ext_rows = extrapolation_table(t, published, train_lengths.get(t.name))
        if ext_rows:
            lines += [f"### {TITLES.get(t.name, t.name)}: accuracy (%) by test length", "",
                      "Each core's best model per seed scored on the test variants at each length "
                      "(`python -m benchmarks.tasks.extrapolate`; at most 256 sequences per length), mean ± std "
                      "(seeds). ˢ: streamed through the recurrent state (the parallel forward did not fit the "
                      "memory budget); not streamable: a state that grows with length (attention's KV cache) past "
                      "the parallel limit. Rows in italics: the paper's figures at its own scale.", "", *ext_rows, ""]
        width_rows = axis_table(t, by)
        if width_rows and t.companion is not None:
            axis = COMPANIONS[t.name][1]
            lines += [f"### {TITLES.get(t.name, t.name)}: accuracy (%) by model {axis}", "",
                      f"The same model at other widths (`{t.companion.sweep_file}`; the main table's cells are its "
                      f"width-{COMPANIONS[t.name][2]} column), mean ± std (seeds). A fixed-state core's state grows "
                      "with the width; attention's cache grows with the sequence instead (Zoology's Figure 2 axis).",
                      "", *width_rows, ""]
        pngs = plots(t, by, plot_dir)
        lines += [f"![{p.stem}]({_rel(p, doc_dir)})" for p in pngs] + ([""] if pngs else [])
        reading = reading_dir / f"{t.name}.md"
        lines += [f"### Reading: {TITLES.get(t.name, t.name)}", ""]
        lines += ([reading.read_text(encoding="utf-8").strip(), ""] if reading.is_file()
                  else ["*The reading of this table is still to be written "
                        f"(`{_rel(reading, ROOT)}`).*", ""])
    return "\n".join(lines).rstrip() + "\n"


def _rel(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(path, start).replace(os.sep, "/")


# loading -------------------------------------------------------------------------------------------
def load_task(sweep_file: Path) -> Task:
    """A Task from a sweep file: its planned cells, its results and its extrapolation results."""
    from .extrapolate import extrapolation_path

    sw = load_sweep(sweep_file)
    specs = list(dict.fromkeys(c.spec_label for c in sw.cells))
    seeds = {s: len({c.seed for c in sw.cells if c.spec_label == s}) for s in specs}
    axes = list(dict.fromkeys(a for c in sw.cells for a in c.axes))
    keep = {c.key: c.config_hash for c in sw.cells}  # as zoo sweep --report: only the file's cells as they are now
    rows = sorted((r for r in latest(sw.results).values() if keep.get(r.get("key", "")) == r.get("config_hash")),
                  key=lambda r: r["key"])
    ok = {r["key"] for r in rows}
    ext = sorted((r for r in latest(extrapolation_path(sw.results)).values() if r.get("cell") in ok), key=lambda r: r["key"])
    datasets = list(dict.fromkeys(c.dataset for c in sw.cells))
    dataset = datasets[0] if datasets else sw.name
    return Task(sw.name, _rel(sweep_file.resolve(), ROOT), specs, seeds, len(sw.cells), rows, ext, axes, dataset,
                datasets)


def train_length(dataset: str) -> int | None:
    try:
        from zoo_core.datasets import get_dataset

        length = get_dataset(dataset).info.length
        return int(length) if length is not None else None
    except Exception:  # noqa: BLE001 - only labels a column: a dataset that cannot be read is left unlabelled
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tasks.make_tables", description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", nargs="*", type=Path, default=[HERE / "sweeps" / f"{s}.yaml" for s in SWEEPS])
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "TASKS.md")
    p.add_argument("--plots", type=Path, default=HERE / "plots")
    p.add_argument("--published", type=Path, default=HERE / "published.yaml")
    p.add_argument("--reading", type=Path, default=HERE / "reading")
    a = p.parse_args(argv)
    tasks = [load_task(f) for f in a.sweeps]
    for t in tasks:
        companion = HERE / "sweeps" / f"{COMPANIONS[t.name][0]}.yaml" if t.name in COMPANIONS else None
        if companion is not None and companion.is_file():
            t.companion = load_task(companion)
    published = yaml.safe_load(a.published.read_text(encoding="utf-8")) or []
    lengths = {t.name: L for t in tasks if t.extrapolation and (L := train_length(t.rows[0]["dataset"] if t.rows else t.name))}
    text = render(tasks, published, reading_dir=a.reading, plot_dir=a.plots, doc_dir=a.output.parent, train_lengths=lengths)
    a.output.write_text(text, encoding="utf-8")
    print(f"wrote {a.output} and {a.plots}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
