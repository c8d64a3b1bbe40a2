"""Resumable checkpoints without pickle: one folder, written atomically, holding

* ``model.safetensors`` + ``config.json``: the model exactly as ``save_pretrained`` writes it (so
  ``zoo eval`` and ``load_pretrained`` read a checkpoint like any saved model);
* ``optimizer.safetensors``: every tensor of the optimizer's state (complex ones as real views);
* ``trainer.json``: the optimizer's param groups and scalars, and the trainer's own state (epochs
  done, history, best score, patience counter).

The folder is replaced as a whole, so a crash leaves the previous checkpoint or the new one,
never a mix of two epochs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import CheckpointError
from ..io.atomic import atomic_write_dir
from ..io.pretrained import CONFIG, WEIGHTS, load_weights_file, save_pretrained

OPTIMIZER = "optimizer.safetensors"
TRAINER = "trainer.json"


def flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``optimizer.state_dict()`` -> (tensors by "state.<param>.<key>", JSON-able rest)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    complex_names = []
    for pid, entry in state["state"].items():
        for key, value in entry.items():
            name = f"state.{pid}.{key}"
            if isinstance(value, torch.Tensor):
                if value.is_complex():
                    complex_names.append(name)
                    value = torch.view_as_real(value)
                tensors[name] = value.detach().cpu().contiguous().clone()
            else:
                scalars[name] = value
    meta = {"param_groups": state["param_groups"], "scalars": scalars, "complex": complex_names}
    return tensors, meta


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    complex_names = set(meta.get("complex", []))
    for name, value in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = torch.view_as_complex(value) if name in complex_names else value
    for name, value in meta.get("scalars", {}).items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, trainer: dict[str, Any]) -> Path:
    """Write the checkpoint folder atomically (see the module docstring)."""
    directory = Path(directory)
    tensors, meta = flatten_optimizer(optimizer.state_dict())
    directory.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".ckpt-", dir=directory.parent))
    try:
        save_pretrained(model, scratch / "model")
        files: dict[str, Any] = {
            WEIGHTS: (scratch / "model" / WEIGHTS).read_bytes(),
            CONFIG: (scratch / "model" / CONFIG).read_bytes(),
            OPTIMIZER: lambda p: save_file(tensors, str(p)),
            TRAINER: (json.dumps({"optimizer": meta, "trainer": trainer}, indent=1, sort_keys=True) + "\n").encode(),
        }
        return atomic_write_dir(directory, files)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_checkpoint(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load weights (strictly) and optimizer state into the given objects; returns the trainer state."""
    directory = Path(directory)
    try:
        record = json.loads((directory / TRAINER).read_text(encoding="utf-8"))
        tensors = load_file(str(directory / OPTIMIZER))
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: the checkpoint is incomplete or corrupt ({exc}); delete it to start the run over") from None
    load_weights_file(model, directory)
    try:
        optimizer.load_state_dict(unflatten_optimizer(tensors, record["optimizer"]))
    except (KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{directory}: the optimizer state does not fit this model/optimizer ({exc})") from None
    return record["trainer"]
