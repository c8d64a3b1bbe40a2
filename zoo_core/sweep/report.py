"""``zoo sweep --report``: Markdown tables and PNG plots from a sweep's ``results.jsonl``.

Per dataset, one table row per configuration (spec × axis labels): the test metric at the learning
rate picked on validation for each seed (the seed paper's protocol, with every lr its own cell),
mean ± sample std over seeds, the number of seeds, the lrs picked, parameters and wall-clock. Plots:
the test metric against wall-clock per spec, and against every axis whose labels are all numbers
(width, state size, test length, ...); ``plot_points`` draws any such series.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..train.plot import plot_available
from .results import latest

Point = tuple[float, float, float]  # x, mean y, std y


@dataclass
class Config:
    """One table row: a spec with one label per axis, on one dataset; ``picks`` = one row per seed."""

    dataset: str
    spec: str
    axes: dict[str, str]
    picks: list[dict[str, Any]] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)  # per seed: every lr cell's wall time, summed

    @property
    def metric(self) -> str:
        return str(self.picks[0]["metric"])

    def values(self) -> list[float]:
        return [float(r["test"][self.metric]) for r in self.picks]

    def label(self, skip: str | None = None) -> str:
        return " ".join([self.spec, *(f"{a}={b}" for a, b in self.axes.items() if a != skip)])


def _better(metric: str, a: float, b: float) -> bool:
    return a > b if metric == "accuracy" else a < b


def cell_wall(row: dict[str, Any]) -> float:
    """A finished cell's wall-clock over all the invocations that trained it (``cell_wall_s``).

    Rows written before zoo-core recorded it hold only the last invocation's ``wall_s``, which for a
    cell resumed from its checkpoint leaves out the epochs run before; for those the sum of the
    training epochs stands in where it is larger (still a lower bound: validation is not in it).
    """
    if row.get("cell_wall_s") is not None:
        return float(row["cell_wall_s"])
    return max(float(row["wall_s"]), float(sum(row.get("epoch_time_s") or [])))


def configs(rows: list[dict[str, Any]]) -> dict[str, list[Config]]:
    """Dataset -> configurations, each seed's lr chosen on validation (the first of equals, as zoo train)."""
    cells: dict[tuple[str, str, tuple[tuple[str, str], ...], int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("status") == "ok":
            cells[(r["dataset"], r["spec"], tuple(r["axes"].items()), r["seed"])].append(r)
    out: dict[tuple[str, str, tuple[tuple[str, str], ...]], Config] = {}
    for (dataset, spec, axes, _seed), rs in cells.items():
        rs = sorted(rs, key=lambda r: -r["lr"])  # zoo train's order: the grid as listed, largest first
        pick = rs[0]
        for r in rs[1:]:
            if _better(pick["metric"], r["val"][pick["metric"]], pick["val"][pick["metric"]]):
                pick = r
        c = out.setdefault((dataset, spec, axes), Config(dataset, spec, dict(axes)))
        c.picks.append(pick)
        c.walls.append(sum(cell_wall(r) for r in rs))
    by: dict[str, list[Config]] = defaultdict(list)
    for c in out.values():
        c.picks.sort(key=lambda r: r["seed"])
        # one table per dataset and selection metric: accuracy and loss never share a column
        by[c.dataset if c.metric == "accuracy" else f"{c.dataset} ({c.metric})"].append(c)
    return dict(by)


def _fmt(metric: str, xs: list[float]) -> str:
    scale, digits = (100.0, 2) if metric == "accuracy" else (1.0, 4)
    m = statistics.mean(xs) * scale
    s = statistics.stdev(xs) * scale if len(xs) > 1 else 0.0
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def table(cs: list[Config]) -> list[str]:
    """A Markdown table of one dataset's configurations."""
    axes = list(dict.fromkeys(a for c in cs for a in c.axes))
    metric = cs[0].metric
    unit = " (%)" if metric == "accuracy" else ""
    head = ["spec", *axes, f"test {metric}{unit}", "seeds", "lr picked", "params", "wall-clock / seed (s)", "epoch (s)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def order(c: Config) -> tuple[str, list[tuple[float, str]]]:  # numeric labels in numeric order
        return c.spec, [(_number(c.axes.get(a, "")) or 0.0, c.axes.get(a, "")) for a in axes]

    for c in sorted(cs, key=order):
        epochs = [t for r in c.picks for t in r.get("epoch_time_s") or []]
        lrs = ", ".join(dict.fromkeys(f"{r['lr']:g}" for r in c.picks))
        cells = [c.spec, *(c.axes.get(a, "—") for a in axes), _fmt(metric, c.values()), str(len(c.picks)), lrs,
                 f"{c.picks[0]['params']:,}", f"{statistics.mean(c.walls):.0f}",
                 f"{statistics.median(epochs):.2f}" if epochs else "—"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def numeric_axes(cs: list[Config]) -> list[str]:
    axes = dict.fromkeys(a for c in cs for a in c.axes)
    return [a for a in axes if all(_number(c.axes[a]) is not None for c in cs if a in c.axes)]


def plot_points(series: dict[str, list[Point]], path: Path, *, xlabel: str, ylabel: str, title: str = "",
                logx: bool = False) -> Path | None:
    """One line with error bars per series (points sorted by x); None when matplotlib is not installed."""
    if not plot_available():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    # tab10 repeats its colours after ten series (a twelve-core table had two blue and two orange
    # lines): past ten take tab20's, and vary the marker too so a shared colour still tells apart
    cmap = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")  # listed maps: cmap(k) is colour k
    markers = "osD^vP*Xh<>p"
    for i, (name, pts) in enumerate(sorted(series.items())):
        pts = sorted(pts)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker=markers[i % len(markers)],
                    color=cmap(i % cmap.N), capsize=3, label=name)
    if logx:
        ax.set_xscale("log")
        xs = sorted({p[0] for pts in series.values() for p in pts})
        if 0 < len(xs) <= 8:  # a few settings (widths, lengths): label them, not powers of ten
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path


def _point(x: float, c: Config) -> Point:
    ys = c.values()
    return x, statistics.mean(ys), statistics.stdev(ys) if len(ys) > 1 else 0.0


def plots(dataset: str, cs: list[Config], out: Path) -> list[Path]:
    """Test metric vs wall-clock (one series per spec), and vs each numeric axis."""
    metric = cs[0].metric
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in dataset)
    made = []
    wall: dict[str, list[Point]] = defaultdict(list)
    for c in cs:
        wall[c.spec].append(_point(statistics.mean(c.walls), c))
    made.append(plot_points(wall, out / f"{safe}-{metric}-vs-wall.png", xlabel="wall-clock per seed (s)",
                            ylabel=f"test {metric}", title=f"{dataset}: test {metric} vs wall-clock", logx=True))
    for axis in numeric_axes(cs):
        series: dict[str, list[Point]] = defaultdict(list)
        for c in cs:
            if axis in c.axes:
                series[c.label(skip=axis)].append(_point(float(c.axes[axis]), c))
        made.append(plot_points(series, out / f"{safe}-{metric}-vs-{axis}.png", xlabel=axis, ylabel=f"test {metric}",
                                title=f"{dataset}: test {metric} vs {axis}"))
    return [p for p in made if p is not None]


def render_report(results: Path, out: Path, *, title: str, keep: Mapping[str, str] | None = None) -> tuple[Path, list[Path]]:
    """Write ``out/report.md`` and the PNGs beside it; returns their paths. ``keep`` (cell key -> config
    hash): report only rows of those cells made with those settings (a sweep file's cells as they are
    now), so a row left by an older grid or other settings never competes for the lr pick."""
    rows = list(latest(results).values())
    ignored = 0
    if keep is not None:
        kept = [r for r in rows if keep.get(r.get("key", "")) == r.get("config_hash")]
        ignored, rows = len(rows) - len(kept), kept
    out.mkdir(parents=True, exist_ok=True)
    by = configs(rows)
    failed = [r for r in rows if r.get("status") != "ok"]
    other = (f" {ignored} row(s) of cells no longer in the sweep, or made with other settings, are left out."
             if ignored else "")
    lines = [f"# {title}", "", f"From `{results}`: {len(rows) - len(failed)} finished cells, {len(failed)} failed.{other} "
             "Test metric at the learning rate picked on validation for each seed; mean ± sample std over seeds; "
             "wall-clock = every lr cell of a seed, summed, averaged over seeds.", ""]
    pngs: list[Path] = []
    for dataset in sorted(by):
        lines += [f"## {dataset}", "", *table(by[dataset]), ""]
        made = plots(dataset, by[dataset], out)
        pngs += made
        lines += [f"![{p.stem}]({p.name})" for p in made] + ([""] if made else [])
    if not plot_available():
        lines += ["(no plots: matplotlib is not installed; pip install 'zoo-core[plot]')", ""]
    if failed:
        lines += ["## Failed cells", "", *(f"- `{r['key']}`: {(r.get('error') or '').splitlines()[0]}" for r in failed), ""]
    md = out / "report.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    return md, pngs
