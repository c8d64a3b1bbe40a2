"""``zoo sweep``: grids of ``zoo train`` runs (specs × datasets × axes × seeds × learning rates).

``config`` reads the strict sweep file into cells, ``execute`` runs one cell as a ``zoo train``
subprocess, ``runner`` schedules the unfinished cells on local workers (or ``ray_backend`` on Ray)
and appends ``results.jsonl`` (``results``), ``report`` renders tables and plots from it, ``cli``
holds the command line. Nothing here imports torch: the cells' subprocesses do.
"""

from __future__ import annotations

from .config import Cell, Sweep, load_sweep
from .report import render_report
from .runner import Summary, run_sweep

__all__ = ["Cell", "Sweep", "Summary", "load_sweep", "render_report", "run_sweep"]
