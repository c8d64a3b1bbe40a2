"""Progress: a tqdm bar on a terminal, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
from typing import Any, TextIO


class Progress:
    """One bar (or line) per epoch; ``quiet`` for non-main ranks and tests."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False, bar: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar = (tty if bar is None else bar) and _tqdm() is not None
        self._bar: Any = None

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self._bar is not None:  # above the open bar, which tqdm redraws below it
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def start_epoch(self, label: str, total: int) -> None:
        if self.quiet or not self.bar:
            return
        self._bar = _tqdm()(total=total, desc=label, file=self.stream, leave=False, dynamic_ncols=True)

    def step(self, loss: float) -> None:
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def advance(self, n: int, status: str) -> None:
        """Move the open bar ``n`` items and show ``status`` beside it (a sweep: cells done/running/failed)."""
        if self._bar is not None:
            self._bar.update(n)
            self._bar.set_postfix_str(status)

    def end_epoch(self, text: str) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self.line(text)


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm
