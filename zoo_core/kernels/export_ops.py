"""Chunked Python ops made opaque for ``torch.export``, so an exported forward keeps a dynamic length.

A chunked algorithm written in PyTorch (Mamba-2's SSD, Gated DeltaNet's chunk form, Mamba-3's
trapezoidal scan) pads L to a multiple of its chunk and reshapes it into chunks: traced, those
are divisibility guards on L that hold for one length, not all, and export pins L. Wrapped as a
``torch.library`` custom op with a fake that gives only the output shapes, it is one node with
symbolic sizes, and the exported program runs the same Python composition at run time.

Only ``torch.export`` takes this path (``torch.compiler.is_exporting()``): eager and
``torch.compile`` keep the traced composition, whose backward autograd derives and Inductor fuses.
An exported program is for inference; a backward through the op raises, naming the way out. An
export at one fixed length needs no opaque op: under ``fixed_length()`` the composition is traced
as in eager (so an ONNX file gets standard ops, where the opaque op has no ONNX translation).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

_fixed_length: ContextVar[bool] = ContextVar("zoo_fixed_length_export", default=False)  # per thread / task


EXPORT_ONLY: set[str] = set()  # the qualified names of the ops registered below ("zoo::ssd_chunked", ...)


def refuse_backward(op: Any, name: str) -> None:
    """Register ``op``'s autograd as a clear refusal (the op exists for exported inference only), and
    ``name`` as an export-only op (one a fixed-length export does without)."""
    EXPORT_ONLY.add(name)

    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(f"{name} is the export-only form of a chunked op or loop (an exported program is for inference); "
                           f"train the model eagerly or under torch.compile, where the op is differentiable")

    op.register_autograd(backward)


def exporting() -> bool:
    """True while ``torch.export`` traces (strict or not) for a dynamic length: the opaque forms' cue."""
    # is_exporting first: torch.compile (dynamo) cannot trace ContextVar.get, and needs it only while exporting
    return bool(torch.compiler.is_exporting()) and not _fixed_length.get()


@contextmanager
def fixed_length() -> Iterator[None]:
    """An export at one length: the ops trace their Python composition (``exporting()`` is False), in
    this thread (or task) only."""
    token = _fixed_length.set(True)
    try:
        yield
    finally:
        _fixed_length.reset(token)
