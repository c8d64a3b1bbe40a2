"""``python -m zoo_core.cli``: the same as ``zoo``."""

import sys

from .zoo import main

sys.exit(main())
