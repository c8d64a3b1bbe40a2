"""Saving and loading weights: checked safetensors reads, atomic folder writes, strict matching."""
