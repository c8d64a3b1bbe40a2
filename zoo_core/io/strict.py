"""Strict matching of loaded tensors against what the model expects.

One error lists every missing, unexpected, wrong-shape and wrong-dtype tensor together
(reference/reliability.md §7 W6), so a user sees the whole mismatch at once instead of fixing it
one key at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from ..errors import CheckpointError

__all__ = ["compare_state"]

_LIMIT = 20

_HINT = (
    "The file was saved from a different architecture or spec. Build the model from the spec "
    "stored with the file (its config.json or safetensors metadata) and load it again."
)


def _listing(label: str, items: Sequence[str]) -> str:
    """``"  label (n): a, b, … and N more"``, or '' when there is nothing to list."""
    if not items:
        return ""
    shown = ", ".join(items[:_LIMIT])
    if len(items) > _LIMIT:
        shown += f", … and {len(items) - _LIMIT} more"
    return f"\n  {label} ({len(items)}): {shown}"


class Described(Protocol):
    """A tensor, or a header entry that only describes one (shape and dtype, no data)."""

    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def dtype(self) -> torch.dtype: ...


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def compare_state(
    expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    got: Mapping[str, Described],
    *,
    source: str,
) -> None:
    """Check that ``got`` holds exactly the tensors ``expected`` describes.

    Args:
        expected: tensor name to ``(shape, dtype)`` the model needs.
        got: tensors read from the file, or their header entries (shape and dtype only).
        source: the file, named in the error.

    Raises:
        CheckpointError: listing all missing keys, unexpected keys, wrong shapes (expected vs
            found) and wrong dtypes in one message; each list stops after 20 names.
    """
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    wrong_shape: list[str] = []
    wrong_dtype: list[str] = []
    for name in sorted(set(expected) & set(got)):
        shape, dtype = expected[name]
        want = tuple(int(d) for d in shape)
        found = tuple(got[name].shape)
        if want != found:
            wrong_shape.append(f"{name!r} (expected {_fmt_shape(want)}, found {_fmt_shape(found)})")
        if got[name].dtype != dtype:
            wrong_dtype.append(f"{name!r} (expected {dtype}, found {got[name].dtype})")
    if not (missing or unexpected or wrong_shape or wrong_dtype):
        return
    counts = [
        f"{len(items)} {label}"
        for items, label in (
            (missing, "missing"),
            (unexpected, "unexpected"),
            (wrong_shape, "wrong shape"),
            (wrong_dtype, "wrong dtype"),
        )
        if items
    ]
    body = (
        _listing("missing", [repr(n) for n in missing])
        + _listing("unexpected", [repr(n) for n in unexpected])
        + _listing("wrong shape", wrong_shape)
        + _listing("wrong dtype", wrong_dtype)
    )
    raise CheckpointError(f"{source} does not fit the model: {', '.join(counts)}{body}\n{_HINT}")
