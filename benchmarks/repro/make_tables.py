"""Render benchmarks/REPRO.md from benchmarks/repro/results/{grid,adaptive}.jsonl.

    python -m benchmarks.repro.make_tables

Tables in the shape of the seed's Tables 2, 3, 5 and 8 (seed 001, "Reshape and Recur"), plus the
verdicts on the seed's claims, computed from the same rows (the thresholds are stated beside each).
Accuracy is in %, mean ± sample std over seeds; (n) = seeds when fewer than the table's usual 3.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "REPRO.md"
COLS = [("ABCDEF", "final"), ("AAAAAA", "final"), ("AAAAAA", "blockwise"), ("ABABAB", "final"),
        ("ABABAB", "blockwise"), ("ABCABC", "final"), ("ABCABC", "blockwise")]
SHORT = {"final": "F", "blockwise": "B"}
CMD = "python -m benchmarks.repro.run_grid"
SWEEP = "zoo sweep benchmarks/repro/sweeps/{}.yaml"  # one sweep file per suite of the former grid
COMMANDS = {  # what reproduces each table (resumable: a rerun skips finished cells)
    "jv-lru": [SWEEP.format("jv-lru")],
    "ethanol": [SWEEP.format(s) for s in ("ethanol-lru-raw", "ethanol-lru")],
    "acsf1": [SWEEP.format(s) for s in ("acsf1-lru-raw", "acsf1-lru")],
    "jv-cores": [SWEEP.format(s) for s in ("jv-cores", "jv-cores-new", "jv-cores-2026")],
    "adaptive": [f"{CMD} adaptive --suite jv-lru ethanol-lru acsf1-lru jv-cores jv-cores-2026"],
    "full": [SWEEP.format(s) for s in ("jv-lru-full", "acsf1-lru-full")],
}
# The seed's full protocol (5 seeds x the lr grid, picked on validation): suite -> (dataset, c, the
# 3-seed one-lr suite it is set beside). Kept out of the Table 2/3/5 grids, which are one lr each.
FULL = {"jv-lru-full": ("JapaneseVowels", 0), "acsf1-lru-full": ("ACSF1", 16)}


def pick_on_validation(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One seed's lr cells -> the run zoo train would keep: best validation accuracy, the first of equals in
    the grid's order (largest lr first)."""
    ordered = sorted(runs, key=lambda r: -r["lr"])
    return max(ordered, key=lambda r: r["val"]["accuracy"])  # max keeps the first of equals


def _full_protocol(every: list[dict[str, Any]]) -> Iterator[tuple[str, int, list[dict[str, Any]] | None, list[dict[str, Any]],
                                                                 list[dict[str, Any]], dict[str, int]]]:
    """Per full-protocol set: (dataset, c, base, at_1e3, picks, lrs picked × seeds); base is None when the
    set's sweep has not run. base: the 3-seed one-lr runs of the tables above, gathered as they are (every
    other suite's LRU ABCDEF L_final runs of that set at lr 1e-3)."""
    for suite, (dataset, c) in FULL.items():
        rows = [r for r in every if r.get("suite") == suite and r["pattern"] == "ABCDEF" and r["loss"] == "final"]
        base = [r for r in Grid([r for r in every if not r.get("variant") and r.get("suite") not in FULL])
                .get(dataset, "lru", "ABCDEF", "final", c) if r["lr"] == 1e-3]
        if not rows:
            yield dataset, c, None, [], [], {}
            continue
        by_seed: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_seed[r["seed"]].append(r)
        picks = [pick_on_validation(rs) for _, rs in sorted(by_seed.items())]
        lrs: dict[str, int] = defaultdict(int)
        for r in picks:
            lrs[f"{r['lr']:g}"] += 1
        yield dataset, c, base, [r for r in rows if r["lr"] == 1e-3], picks, dict(lrs)


def full_protocol_table(every: list[dict[str, Any]]) -> list[str]:
    """Per set: the 3-seed one-lr row of the tables above, the same 5-seed sweep at lr 1e-3 only, and the full
    protocol (each seed's lr picked on validation), so the effect of more seeds and of the lr pick read apart."""
    out = ["| dataset | input | protocol | test acc (%) | seeds | lr picked (× seeds) | val acc (%) |", "|---|---|---|---|---|---|---|"]
    for dataset, c, base, at_1e3, picks, lrs in _full_protocol(every):
        where = f"c = {c}" if c else "original"
        if base is None:
            out.append(f"| {dataset} | {where} | full protocol | not run yet | — | — | — |")
            continue
        for label, rs, lr_text in (("3 seeds, lr 1e-3 (tables above)", base, "1e-3 (fixed)"),
                                   ("5 seeds, lr 1e-3", at_1e3, "1e-3 (fixed)"),
                                   ("5 seeds, lr picked on validation (the seed's protocol)", picks,
                                    ", ".join(f"{k} × {v}" for k, v in sorted(lrs.items(), key=lambda kv: -float(kv[0]))))):
            if not rs:
                out.append(f"| {dataset} | {where} | {label} | — | 0 | — | — |")
                continue
            val = [100 * r["val"]["accuracy"] for r in rs]
            out.append(f"| {dataset} | {where} | {label} | {cell([acc(r) for r in rs], want=len(rs))} | {len(rs)} | {lr_text} "
                       f"| {statistics.mean(val):.2f} |")
    return out


def full_protocol_summary(every: list[dict[str, Any]]) -> list[str]:
    """What changed from the 3-seed, one-lr tables, one sentence per set that has run (from the same rows)."""
    out = []
    for dataset, c, base, _, picks, lrs in _full_protocol(every):
        if not base or not picks:
            continue
        b, f = [acc(r) for r in base], [acc(r) for r in picks]
        sd = statistics.stdev(b) if len(b) > 1 else 0.0
        shift = statistics.mean(f) - statistics.mean(b)
        chosen = ", ".join(f"{k} for {v} of {len(picks)} seeds" for k, v in sorted(lrs.items(), key=lambda kv: -float(kv[0])))
        same = " (so the full protocol is the 5-seed lr-1e-3 row)" if set(lrs) == {"0.001"} else ""
        size = "within one standard deviation of the 3-seed figure" if abs(shift) <= sd else "more than one standard deviation"
        out.append(f"- **{dataset}{f' (c = {c})' if c else ''}**: validation picked lr {chosen}{same}; the test mean moved "
                   f"{shift:+.2f} points from {len(b)} seeds to {len(picks)}, {size}.")
    return out



def load(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def stats(xs: list[float]) -> tuple[float, float, int]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0), len(xs)


def cell(xs: list[float], bold_over: float | None = None, want: int = 3) -> str:
    if not xs:
        return "—"
    m, s, n = stats(xs)
    text = f"{m:.2f} ± {s:.2f}" + (f" ({n})" if n < want else "")
    return f"**{text}**" if bold_over is not None and m > bold_over else text


def acc(r: dict[str, Any]) -> float:
    return 100 * r["test"]["accuracy"]


class Grid:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.by: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            self.by[(r["dataset"], r["core"], r["pattern"], r["loss"], r["c"] or 0, r["epochs"])].append(r)

    def get(self, dataset: str, core: str, pattern: str, loss: str, c: int, epochs: int | None = None) -> list[dict[str, Any]]:
        return [r for k, v in self.by.items() if k[:5] == (dataset, core, pattern, loss, c) and (epochs is None or k[5] == epochs)
                for r in v]

    def accs(self, *key: Any, epochs: int | None = None) -> list[float]:
        return [acc(r) for r in sorted(self.get(*key, epochs=epochs), key=lambda r: r["seed"])]

    def keys(self, dataset: str) -> list[tuple[str, int, int]]:
        """(core, c, epochs) present for a dataset."""
        return sorted({(k[1], k[4], k[5]) for k in self.by if k[0] == dataset}, key=lambda t: (t[0] != "lru", t[0], t[2], t[1]))


def table2(g: Grid, dataset: str, epochs: int, cores: tuple[str, ...] | None = None) -> list[str]:
    head = "| core | input | " + " | ".join(f"{p} {SHORT[lo]}" for p, lo in COLS) + " |"
    out = [head, "|---|---|" + "---|" * len(COLS)]
    for core, c, ep in g.keys(dataset):
        if ep != epochs or (cores is not None and core not in cores):
            continue
        base = g.accs(dataset, core, "ABCDEF", "final", c, epochs=ep)
        bm = statistics.mean(base) if base else None
        cells = [cell(g.accs(dataset, core, p, lo, c, epochs=ep), None if (p, lo) == COLS[0] else bm) for p, lo in COLS]
        out.append(f"| {core} | {'c = ' + str(c) if c else 'original'} | " + " | ".join(cells) + " |")
    return out


def table5(g: Grid, dataset: str, core: str, c: int, epochs: int) -> list[str]:
    base, reshaped = g.accs(dataset, core, "ABCDEF", "final", 0, epochs=epochs), g.accs(dataset, core, "ABCDEF", "final", c, epochs=epochs)
    if not base or not reshaped:
        return []
    rm = statistics.mean(reshaped)
    cols = COLS[1:]
    out = ["| core | ABCDEF F (original) | ABCDEF F (c = %d) | " % c + " | ".join(f"{p} {SHORT[lo]} (c = {c})" for p, lo in cols) + " |",
           "|---|---|---|" + "---|" * len(cols)]
    cells = [cell(base), cell(reshaped, statistics.mean(base))] + [cell(g.accs(dataset, core, p, lo, c, epochs=epochs), rm) for p, lo in cols]
    out.append(f"| {core} | " + " | ".join(cells) + " |")
    return out


def table3(g: Grid, dataset: str, epochs: int) -> list[str]:
    out = ["| core | input | " + " | ".join(f"{p} params (K) | {p} epoch (s)" for p in ("ABCDEF", "AAAAAA", "ABABAB", "ABCABC")) + " |",
           "|---|---|" + "---|" * 8]
    for core, c, ep in g.keys(dataset):
        if ep != epochs:
            continue
        cells = []
        for p in ("ABCDEF", "AAAAAA", "ABABAB", "ABCABC"):
            rs = g.get(dataset, core, p, "final", c, epochs=ep)
            if not rs:
                cells += ["—", "—"]
                continue
            per_run = [statistics.median(r["epoch_time_s"]) for r in rs]
            cells += [f"{rs[0]['params'] / 1e3:.1f}", f"{statistics.median(per_run):.2f}"]
        out.append(f"| {core} | {'c = ' + str(c) if c else 'original'} | " + " | ".join(cells) + " |")
    return out


def adaptive_tables(ad: list[dict[str, Any]], eps: float) -> list[str]:
    groups: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in ad:
        if r["epsilon"] == eps:
            groups[(r["dataset"], r["core"], r["pattern"], r["loss"], r["c"] or 0)][r["setting"]].append(r)
    out = ["| dataset | core | model | loss | input | fixed depth 6 | any block (1–12) | avg depth | FLOPs × | "
           "full period (m … 12) | avg depth | FLOPs × | min depth 6 (6–12) | max depth 6 (1–6) | avg depth | FLOPs × |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(groups, key=lambda k: (k[0], k[1] != "lru", k[1], k[2], k[3], k[4])):
        s = groups[key]
        fixed = [100 * r["fixed"]["accuracy"] for r in sorted(s["any-block"], key=lambda r: r["seed"])]
        fm = statistics.mean(fixed) if fixed else None

        def col(name: str) -> list[str]:
            rs = sorted(s.get(name, []), key=lambda r: r["seed"])
            a = [100 * r["adaptive"]["accuracy"] for r in rs]
            d = [r["adaptive"]["mean_depth"] for r in rs]
            f = [r["adaptive"]["flops_ratio"] for r in rs]
            return [cell(a, fm), cell(d) if d else "—", f"{statistics.mean(f):.2f}" if f else "—"]

        a1, a2 = col("any-block"), col("full-period")
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {'c = ' + str(key[4]) if key[4] else 'original'} | "
                   f"{cell(fixed)} | {a1[0]} | {a1[1]} | {a1[2]} | {a2[0]} | {a2[1]} | {a2[2]} | "
                   f"{col('min-depth-6')[0]} | {' | '.join(col('max-depth-6'))} |")
    return out


def eps_sweep(ad: list[dict[str, Any]]) -> list[str]:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in ad:
        if r["setting"] == "any-block":
            groups[(r["dataset"], r["core"], r["pattern"], r["loss"], r["c"] or 0, r["epsilon"])].append(r)
    out = ["| dataset | core | model | loss | input | ε | fixed-6 acc | adaptive acc | avg depth | FLOPs × fixed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for k in sorted(groups, key=lambda k: (k[0], k[1] != "lru", k[1:])):
        rs = groups[k]
        out.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {'c = ' + str(k[4]) if k[4] else 'original'} | {k[5]:g} | "
                   f"{cell([100 * r['fixed']['accuracy'] for r in rs])} | {cell([100 * r['adaptive']['accuracy'] for r in rs])} | "
                   f"{statistics.mean(r['adaptive']['mean_depth'] for r in rs):.2f} | "
                   f"{statistics.mean(r['adaptive']['flops_ratio'] for r in rs):.2f} |")
    return out


def verdicts(g: Grid, ad: list[dict[str, Any]]) -> list[str]:
    """The seed's claims, each checked against the rows with the rule stated beside it."""
    out = []
    jv = ("JapaneseVowels", "lru")
    ep = 60
    # 1. sharing loses little: AAAAAA within one std of ABCDEF (or better), per c and loss
    for c in (0, 24):
        base = g.accs(*jv, "ABCDEF", "final", c, epochs=ep)
        if not base:
            continue
        bm, bs, _ = stats(base)
        for p in ("AAAAAA", "ABABAB", "ABCABC"):
            for lo in ("final", "blockwise"):
                xs = g.accs(*jv, p, lo, c, epochs=ep)
                if not xs:
                    continue
                m, s, n = stats(xs)
                rel = "better than" if m > bm else ("within one std of" if bm - m <= bs else "below (by more than one std)")
                out.append(f"- JapaneseVowels LRU, {'c = ' + str(c) if c else 'original input'}: {p} {lo} "
                           f"{m:.2f} ± {s:.2f} vs ABCDEF {bm:.2f} ± {bs:.2f} → {rel} the baseline.")
    return out


def norm_table(g: Grid, bn: Grid) -> list[str]:
    """uea-ema (the grid) vs uea (PyTorch BatchNorm1d, shared by the positions a block runs at)."""
    out = ["| block | config | test acc (%) | final train loss | best epoch | params |", "|---|---|---|---|---|---|"]
    for label, grid in (("uea (torch BatchNorm1d)", bn), ("uea-ema (EMA batch norm)", g)):
        for p, lo in COLS[:3]:
            rs = grid.get("JapaneseVowels", "lru", p, lo, 0, epochs=60)
            if not rs:
                continue
            out.append(f"| {label} | {p} {SHORT[lo]} | {cell([acc(r) for r in rs])} | "
                       f"{statistics.mean(r['train_loss'][-1] for r in rs):.3f} | "
                       f"{', '.join(str(r['best_epoch']) for r in sorted(rs, key=lambda r: r['seed']))} | {rs[0]['params']:,} |")
    return out


def claims_counts(g: Grid, exclude: tuple[str, ...] = ("EthanolLevel",)) -> dict[str, Any]:
    """Counts as the seed's A.3.1: configs better than, or within one std of, their ABCDEF baseline
    (datasets in ``exclude``, where nothing was learned, left out)."""
    better = within = total = 0
    for (dataset, core, pattern, loss, c, ep), rows in g.by.items():
        if pattern == "ABCDEF" or dataset in exclude:
            continue
        base = g.accs(dataset, core, "ABCDEF", "final", c, epochs=ep)
        if len(base) < 2:
            continue
        bm, bs, _ = stats(base)
        m = statistics.mean(acc(r) for r in rows)
        total += 1
        better += m > bm
        within += m > bm or bm - m <= bs
    return {"better": better, "within": within, "total": total}


def main() -> None:
    from benchmarks.repro.run_grid import rows as training_rows  # grid.jsonl and the suites' zoo sweep results

    every = training_rows()
    rows = [r for r in every if not r.get("variant") and r.get("suite") not in FULL]
    ad = load(HERE / "results" / "adaptive.jsonl")
    g = Grid(rows)
    from benchmarks.repro.prose import render  # the hand-written text around the tables

    OUT.write_text(render(g, ad, rows, {
        "table2": table2, "table5": table5, "table3": table3, "adaptive": adaptive_tables, "eps_sweep": eps_sweep,
        "verdicts": verdicts, "counts": claims_counts, "cell": cell, "stats": stats, "commands": COMMANDS,
        "full_protocol": lambda: full_protocol_table(every), "full_summary": lambda: full_protocol_summary(every),
        "norm_table": lambda: norm_table(g, Grid([r for r in every if r.get("variant") == "torchbn"])),
    }), encoding="utf-8")
    print(f"wrote {OUT.relative_to(HERE.parent.parent)}")


if __name__ == "__main__":
    main()
