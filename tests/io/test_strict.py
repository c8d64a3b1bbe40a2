"""Strict state matching (reliability.md §7.A W6)."""

from __future__ import annotations

import pytest
import torch

from zoo_core.errors import CheckpointError
from zoo_core.io.strict import compare_state

SOURCE = "ckpt/model.safetensors"


def _expected() -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {
        "embed.weight": ((10, 4), torch.float32),
        "blocks.0.A_log": ((4, 8), torch.float32),
        "blocks.0.D": ((4,), torch.float32),
        "head.weight": ((4, 10), torch.float32),
    }


def test_exact_match_passes() -> None:
    got = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in _expected().items()}
    compare_state(_expected(), got, source=SOURCE)


def test_torch_size_shapes_accepted() -> None:
    got = {"w": torch.zeros(2, 3)}
    compare_state({"w": (torch.Size([2, 3]), torch.float32)}, got, source=SOURCE)


def test_all_four_mismatch_classes_reported_together() -> None:
    got = {
        "embed.weight": torch.zeros(10, 4),
        "blocks.0.A_log": torch.zeros(4, 16),  # wrong shape
        "blocks.0.D": torch.zeros(4, dtype=torch.float16),  # wrong dtype
        "blocks.0.extra": torch.zeros(1),  # unexpected
        # "head.weight" missing
    }
    with pytest.raises(CheckpointError) as info:
        compare_state(_expected(), got, source=SOURCE)
    message = str(info.value)
    assert message.startswith(SOURCE)
    assert "1 missing, 1 unexpected, 1 wrong shape, 1 wrong dtype" in message
    assert "missing (1): 'head.weight'" in message
    assert "unexpected (1): 'blocks.0.extra'" in message
    assert "'blocks.0.A_log' (expected (4, 8), found (4, 16))" in message
    assert "'blocks.0.D' (expected torch.float32, found torch.float16)" in message
    assert "spec stored with the file" in message


def test_one_key_can_be_wrong_in_shape_and_dtype() -> None:
    with pytest.raises(CheckpointError) as info:
        compare_state({"w": ((2,), torch.float32)}, {"w": torch.zeros(3, dtype=torch.int64)}, source=SOURCE)
    assert "1 wrong shape, 1 wrong dtype" in str(info.value)


def test_lists_are_truncated_after_20() -> None:
    expected = {f"layer.{i:02d}": ((1,), torch.float32) for i in range(25)}
    got = {f"stray.{i:02d}": torch.zeros(1) for i in range(21)}
    with pytest.raises(CheckpointError) as info:
        compare_state(expected, got, source=SOURCE)
    message = str(info.value)
    assert "25 missing, 21 unexpected" in message
    assert "'layer.19', … and 5 more" in message and "'layer.20'" not in message
    assert "'stray.19', … and 1 more" in message and "'stray.20'" not in message


def test_hostile_names_are_shown_quoted() -> None:
    with pytest.raises(CheckpointError) as info:
        compare_state({}, {"": torch.zeros(1), "../x": torch.zeros(1)}, source=SOURCE)
    assert "unexpected (2): '', '../x'" in str(info.value)


def test_empty_checkpoint_lists_everything_missing() -> None:
    with pytest.raises(CheckpointError, match="4 missing"):
        compare_state(_expected(), {}, source=SOURCE)
