"""Mamba-2 (SSD) for SSM Zoo: the core, its two SSD backends and the checkpoint converters."""
