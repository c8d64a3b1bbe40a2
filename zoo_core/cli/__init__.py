"""The command lines: ``zoo`` (``zoo.py``), its hub and training command groups, and the one runner they share.

The top layer of zoo_core (see ``zoo_core/LAYERS.md``): it may import anything below, nothing imports it.
``main`` is re-exported because ``zoo = "zoo_core.cli:main"`` is the console entry point.
"""

from __future__ import annotations

from .zoo import main

__all__ = ["main"]
