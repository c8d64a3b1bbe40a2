"""Datasets that ship inside packages and load with no network (optional extra ``zoo-core[data]``).

The training harness's full dataset registry builds on this; here: the bundled UEA sets in aeon.
"""

from __future__ import annotations

from typing import Any

from .errors import ZooError

BUNDLED_UEA = {"basicmotions": "BasicMotions", "japanesevowels": "JapaneseVowels"}


class MissingDependencyError(ZooError, ImportError):
    """An optional dependency is not installed; the message names the install command."""

    exit_code = 2


def load_uea_bundled(name: str, split: str = "test") -> tuple[Any, Any]:
    """(X, y) numpy arrays: X shaped (n, length, channels) float32, y integer class ids."""
    try:
        import numpy as np
        from aeon.datasets import load_classification
    except ImportError:
        raise MissingDependencyError(
            "loading UEA datasets needs aeon: pip install 'zoo-core[data]' (or pip install aeon)"
        ) from None
    X, y = load_classification(BUNDLED_UEA[name], split=split)
    X = np.asarray(X, dtype=np.float32).transpose(0, 2, 1)  # (n, channels, length) -> (n, length, channels)
    classes = sorted(set(y.tolist()))
    return X, np.array([classes.index(v) for v in y], dtype=np.int64)


def describe(name: str) -> dict[str, Any]:
    return {"name": name, "source": f"aeon bundled UEA archive: {BUNDLED_UEA[name]}"}
