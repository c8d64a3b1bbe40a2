"""Training and evaluation: ``zoo train`` / ``zoo eval`` (the seed paper's protocol, DDP under torchrun).

Public API: ``train`` (run.py), ``evaluate_model`` (evaluate.py), ``fit`` (loop.py, one run),
``make_splits`` (protocol.py). Modules import torch, so import them lazily from the CLI
(``zoo_core.cli.train`` holds ``zoo train`` / ``zoo eval``; this package never imports it back).
"""

from __future__ import annotations

from typing import Any

from .protocol import make_splits

__all__ = ["train", "evaluate_model", "make_splits"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from .run import train  # lazy: keeps safetensors, torch out of train

        return train
    if name == "evaluate_model":
        from .evaluate import evaluate_model  # lazy: keeps safetensors, torch out of train

        return evaluate_model
    if name == "make_splits":
        return make_splits
    raise AttributeError(name)
