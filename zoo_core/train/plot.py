"""Training curves as a PNG (matplotlib is the optional extra ``zoo-core[plot]``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot_curves(runs: list[dict[str, Any]], path: str | Path, *, metric: str, title: str = "") -> Path | None:
    """Train loss, validation loss and the validation metric per epoch, one line per run.

    Returns the path written, or None when matplotlib is not installed.
    """
    if not plot_available():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["train_loss", "val_loss"] + ([f"val_{metric}"] if metric != "loss" else [])
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for run in runs:
            hist = run["history"]
            ax.plot([r["epoch"] for r in hist], [r[key] for r in hist], label=f"seed {run['seed']}, lr {run['lr']:g}")
            if run.get("best_epoch") and key.startswith("val_"):
                best = next(r for r in hist if r["epoch"] == run["best_epoch"])
                ax.plot([best["epoch"]], [best[key]], "o", color=ax.lines[-1].get_color())
        ax.set_xlabel("epoch")
        ax.set_title(key.replace("_", " "))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path
