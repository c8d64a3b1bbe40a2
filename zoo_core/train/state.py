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
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import CheckpointError
from ..io.atomic import atomic_write_dir, recover_dir
from ..io.pretrained import load_weights_file, model_files

OPTIMIZER = "optimizer.safetensors"
TRAINER = "trainer.json"
RUN_FOLDERS = ("checkpoint", "best", "result.json")
"""What ``fit`` writes atomically in a run folder (the names whose leftovers a new start sweeps)."""

log = logging.getLogger(__name__)


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
    """Write the checkpoint folder atomically (see the module docstring).

    Every file is written straight into ``atomic_write_dir``'s staging folder (no scratch copy of
    the model beside it: on a small disk that copy turned a checkpoint that fits into disk-full),
    and a killed write leaves only a staging name that the next write, or ``sweep_run_folder``,
    deletes.
    """
    tensors, meta = flatten_optimizer(optimizer.state_dict())
    files: dict[str, Any] = {
        **model_files(model),
        OPTIMIZER: lambda p: save_file(tensors, str(p)),
        TRAINER: (json.dumps({"optimizer": meta, "trainer": trainer}, indent=1, sort_keys=True) + "\n").encode(),
    }
    return atomic_write_dir(Path(directory), files)


# tempfile.mkdtemp(prefix=".ckpt-") names of the scratch folders earlier versions wrote: 8 characters
# of tempfile's alphabet, holding at most the half-written model/ subfolder
_LEGACY_SCRATCH = re.compile(r"\.ckpt-[a-z0-9_]{8}")
_LEGACY_CONTENTS = {"model"}


def _is_legacy_scratch(path: Path) -> bool:
    """A ``.ckpt-*`` scratch folder of an earlier zoo-core, recognised by its name and contents."""
    if not _LEGACY_SCRATCH.fullmatch(path.name) or path.is_symlink() or not path.is_dir():
        return False
    try:
        return {p.name for p in path.iterdir()} <= _LEGACY_CONTENTS
    except OSError:
        return False


def sweep_run_folder(directory: str | Path, names: tuple[str, ...] = RUN_FOLDERS) -> list[str]:
    """Delete what killed checkpoint writes left in one run folder; returns what was removed or restored.

    Runs at the start of a run or resume: the atomic-write leftovers of ``names`` (staging and
    half-swapped folders of dead processes, recovered or removed by ``recover_dir``) and the
    ``.ckpt-XXXXXXXX`` scratch folders of earlier versions. Only names of our own patterns are
    touched; every other file or folder in the run folder is left as it is.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    before = set(os.listdir(directory))
    for name in names:
        recover_dir(directory / name)
    for entry in sorted(os.listdir(directory)):
        if _is_legacy_scratch(directory / entry):
            shutil.rmtree(directory / entry, ignore_errors=True)
    changed = sorted(before ^ set(os.listdir(directory)))
    if changed:
        log.info("%s: swept what interrupted checkpoint writes left: %s", directory, ", ".join(changed))
    return changed


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
