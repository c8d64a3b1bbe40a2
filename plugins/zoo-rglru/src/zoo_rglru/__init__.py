"""RG-LRU / Hawk recurrent block for SSM Zoo. Importing this package has no side effects;
registration is in ``plugin``."""

__version__ = "0.1.0"
