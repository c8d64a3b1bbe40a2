"""A core's or a model's ``step`` and ``forward`` as ``torch.export`` programs of flat tensors.

Why a module: an exported program (and everything built on one: ONNX, ExecuTorch, an edge runtime)
takes and returns flat tensors, while a core's streaming state is a dict of tensors
(``zoo_core.protocols.State``) and a model's a ``ModelState``. ``StepModule`` is the one bridge:

    (x_t, *state tensors) -> (y_t, *new state tensors)

State order (stable, documented, what an exported file's inputs and outputs are named after):
the state's flat names sorted as strings. A core's names are its state keys (``"h"``, ``"conv"``,
...); a model's are ``ModelState.flatten()``'s (``"input.t"``, ``"layer0.h"``, ...). ``state_names``
returns them; the exported program's inputs are ``x_t`` then the state in that order, its outputs
``y_t`` then the new state in the same order.

Dynamic shapes: the batch (dim 0 of ``x`` / ``x_t`` and of every state tensor) is a ``Dim`` by default;
the forward's length (dim 1) only when asked, as only ops that trace without a Python loop over time
allow it (tests/test_compile_export.py lists, per core, which do). A core whose parallel forward holds
for lengths up to a bound only (S4: its kernel belongs to ``l_max``; past it C̃ is converted, which does
not trace for a symbolic length) says so with ``max_export_length``, and the length ``Dim`` stops there
(``length_bound``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from .kernels.export_ops import fixed_length
from .nn.model_state import ModelState

MAX_BATCH = 1 << 16  # upper bound of the exported batch Dim (export needs one; far above any use)
MAX_LENGTH = 1 << 20  # upper bound of the exported length Dim


def length_bound(module: nn.Module) -> int | None:
    """The longest length ``module``'s parallel forward exports for: the smallest ``max_export_length``
    among its submodules (a core's attribute, an int, where the forward holds up to a bound), or None.
    None too for a model that reshapes its input (``reshaper``): its cores see another length than the
    input's, so no bound on the input follows (export then finds whether the length can be dynamic)."""
    if getattr(module, "reshaper", None) is not None:
        return None
    bounds = [int(b) for m in module.modules() if (b := getattr(m, "max_export_length", None)) is not None]
    return min(bounds) if bounds else None


def flat_state(state: Mapping[str, Tensor] | ModelState) -> dict[str, Tensor]:
    """The state as one name -> tensor dict: a core's dict as is, a model's ``ModelState.flatten()``."""
    return state.flatten() if isinstance(state, ModelState) else dict(state)


def state_names(state: Mapping[str, Tensor] | ModelState) -> tuple[str, ...]:
    """The flat state's names in the exported order: sorted as strings."""
    return tuple(sorted(flat_state(state)))


class StepModule(nn.Module):
    """``module.step`` as ``(x_t, *state) -> (y_t, *new state)``, the state flat in ``names`` order.

    Args:
        module: a core (``SSMCore``) or a model, anything with ``step(x_t, state) -> (y_t, state)``.
        example_state: a state of ``module`` (its ``init_state(...)``): fixes the names and, for a
            model, the depth a flat state is rebuilt to.
        real: complex state tensors travel as their real views ``(..., 2)`` (``torch.view_as_real``),
            which the step of a core with ``real_stream = True`` takes and returns (ONNX has no complex
            tensors); otherwise as they are.
    """

    def __init__(self, module: nn.Module, example_state: Mapping[str, Tensor] | ModelState, *, real: bool = False) -> None:
        super().__init__()
        self.module = module
        self.real = real
        self.names: tuple[str, ...] = state_names(example_state)
        self.model_depth: int | None = example_state.depth if isinstance(example_state, ModelState) else None
        self.growing: list[str] = []  # state names whose size grows each step (set by zoo export: a KV cache)

    def unflatten(self, tensors: Sequence[Tensor]) -> dict[str, Tensor] | ModelState:
        """The ``step`` state from flat tensors in ``names`` order."""
        flat = dict(zip(self.names, tensors, strict=True))
        return flat if self.model_depth is None else ModelState.unflatten(flat, depth=self.model_depth)

    def flatten(self, state: Mapping[str, Tensor] | ModelState) -> tuple[Tensor, ...]:
        """A ``step`` state as flat tensors in ``names`` order (the exported program's inputs after x_t)."""
        flat = flat_state(state)
        if set(flat) != set(self.names):
            raise ValueError(f"state names {sorted(flat)} differ from the exported step's {list(self.names)}")
        return tuple(torch.view_as_real(flat[k]) if self.real and flat[k].is_complex() else flat[k] for k in self.names)

    def forward(self, x_t: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        step: Any = self.module.step  # a core's or a model's: typed by neither nn.Module nor one protocol
        y_t, new_state = step(x_t, self.unflatten(state))
        return (y_t, *self.flatten(new_state))


def _batch_dims(tensors: Sequence[Tensor], batch: int, dim: Any) -> list[dict[int, Any] | None]:
    """{0: dim} for each tensor whose leading size is the batch, None (static) for the rest."""
    return [{0: dim} if t.dim() > 0 and t.shape[0] == batch else None for t in tensors]


def export_step(module: nn.Module, x_t: Tensor, state: Mapping[str, Tensor] | ModelState, *,
                dynamic_batch: bool = True) -> tuple[ExportedProgram, StepModule]:
    """``torch.export`` of ``module.step`` at the example ``(x_t, state)``.

    Returns:
        The exported program (run it as ``program.module()(x_t, *wrapper.flatten(state))``) and the
        ``StepModule`` that names its state inputs and outputs (``wrapper.names``).
    """
    with torch.no_grad():
        step: Any = module.step
        step(x_t, state)  # fills the cores' cached constants (CoreBase.cached) with today's parameters
    wrapper = StepModule(module, state)
    args = (x_t, *wrapper.flatten(state))
    shapes: Any = None
    if dynamic_batch:
        dims = _batch_dims(args, x_t.shape[0], Dim("batch", min=1, max=MAX_BATCH))
        shapes = (dims[0], tuple(dims[1:]))  # as forward's signature: x_t, then *state as one tuple
    return torch.export.export(wrapper, args, dynamic_shapes=shapes), wrapper


def export_forward(module: nn.Module, x: Tensor, *, dynamic_batch: bool = True, dynamic_length: bool = False,
                   min_length: int = 2) -> ExportedProgram:
    """``torch.export`` of ``module(x)`` for x (B, L, ...), the batch and/or the length dynamic.

    ``min_length`` is the exported length Dim's lower bound (export specialises sizes 0 and 1); its upper
    bound is ``length_bound(module)`` where the module has one (x's length must not exceed it). At a
    fixed length the ops kept opaque for a dynamic one trace their composition
    (``zoo_core.kernels.export_ops.fixed_length``): standard ops only, as an ONNX converter needs.
    """
    dims: dict[int, Any] = {}
    if dynamic_batch:
        dims[0] = Dim("batch", min=1, max=MAX_BATCH)
    if dynamic_length:
        dims[1] = Dim("length", min=min_length, max=length_bound(module) or MAX_LENGTH)
        return torch.export.export(module, (x,), dynamic_shapes=({**dims},))
    with fixed_length():
        return torch.export.export(module, (x,), dynamic_shapes=({**dims},) if dims else None)


def load_program(path: str | Path) -> ExportedProgram:
    """``torch.export.load`` of a ``zoo export --format pt2`` file, the modules that register the zoo
    custom ops it calls imported first (its ``zoo.json`` names them as ``zoo.imports``: a program with
    an export-only op, such as LrcSSM's loop over time at a dynamic length, cannot be read back without
    them). Other pt2 files load as ``torch.export.load`` loads them."""
    import importlib
    import json
    import re
    import zipfile

    with zipfile.ZipFile(path) as archive:
        meta_name = next((n for n in archive.namelist() if n.endswith("extra/zoo.json")), None)
        meta = json.loads(archive.read(meta_name)) if meta_name else {}
    for module in json.loads(meta.get("zoo.imports", "[]")):
        # only the zoo's own modules: a file must not make its reader import anything else
        if not isinstance(module, str) or not re.fullmatch(r"zoo_[a-z0-9_]+(\.[a-z0-9_]+)*", module):
            raise ValueError(f"{path}: its zoo.json asks to import {module!r}, which is not a zoo module "
                             "(zoo_core or a zoo_* plugin); refusing to load it")
        importlib.import_module(module)
    return torch.export.load(str(path))
