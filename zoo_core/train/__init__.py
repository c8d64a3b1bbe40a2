"""Training and evaluation: ``zoo train`` / ``zoo eval`` (the seed paper's protocol, DDP under torchrun).

Public API: ``train`` (run.py), ``evaluate_model`` (evaluate.py), ``fit`` (loop.py, one run),
``make_splits`` (protocol.py), ``register_cli`` (cli.py). Modules import torch, so import them
lazily from the CLI.
"""

from __future__ import annotations

from typing import Any

__all__ = ["train", "evaluate_model", "make_splits", "register_cli"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from .run import train

        return train
    if name == "evaluate_model":
        from .evaluate import evaluate_model

        return evaluate_model
    if name == "make_splits":
        from .protocol import make_splits

        return make_splits
    if name == "register_cli":
        from .cli import register_cli

        return register_cli
    raise AttributeError(name)
