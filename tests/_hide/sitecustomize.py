"""Hide optional extras from this interpreter, as if they were not installed: ``ZOO_TEST_HIDE=aeon,matplotlib``.

Why: the suite must pass on a machine without an extra (skipping, with the reason, what needs it),
and the development venv has them all. Uninstalling them to check is slow and error-prone; this
makes ``importlib.util.find_spec`` return None and ``import`` raise ModuleNotFoundError for the
named top-level modules (and their submodules). The root conftest runs it in the pytest process and
puts this folder first on PYTHONPATH, so subprocesses (``zoo`` commands, torchrun) hide them too.
Distribution metadata (``importlib.metadata``) still lists them: nothing in the zoo reads it for extras.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class HidingFinder:
    """Wraps a meta-path finder and refuses to find the hidden top-level modules."""

    def __init__(self, inner: Any, hidden: frozenset[str]) -> None:
        self.inner, self.hidden = inner, hidden

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.partition(".")[0] in self.hidden:
            return None
        return self.inner.find_spec(fullname, path, target)

    def __getattr__(self, name: str) -> Any:  # invalidate_caches, find_distributions, ...
        return getattr(self.inner, name)


def hide(names: list[str]) -> None:
    """Hide ``names`` from every meta-path finder of this interpreter (idempotent)."""
    hidden = frozenset(n for n in names if n)
    if not hidden:
        return
    sys.meta_path[:] = [f if isinstance(f, HidingFinder) else HidingFinder(f, hidden) for f in sys.meta_path]
    for name in [m for m in sys.modules if m.partition(".")[0] in hidden]:
        del sys.modules[name]


hide(os.environ.get("ZOO_TEST_HIDE", "").split(","))
