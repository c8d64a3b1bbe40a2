"""zoo_core.protocols.require_state_keys: a carried state lacking a part is refused naming the core,
the missing parts, what every part is, the configuration when it decides, and how to make a state.
Each core that carries a multi-part state calls it (Mamba-2, Mamba-3, RG-LRU, Gated DeltaNet)."""

from __future__ import annotations

import re

import pytest
import torch

from zoo_core.protocols import require_state_keys

PARTS = {"conv": "(B, D, K−1)", "ssm": "(B, H, N)"}


def test_a_complete_state_passes_and_extra_parts_are_allowed() -> None:
    z = torch.zeros(1)
    require_state_keys("Core", {"conv": z, "ssm": z}, PARTS)
    require_state_keys("Core", {"conv": z, "ssm": z, "other": z}, PARTS)


def test_missing_parts_are_named_sorted_with_every_part_and_the_fix() -> None:
    with pytest.raises(ValueError) as err:
        require_state_keys("Core", {}, {"ssm": "(B, H, N)", "conv": "(B, D, K−1)", "angle": ""})
    msg = str(err.value)
    assert msg.startswith("Core state lacks ['angle', 'conv', 'ssm']: this core needs ")
    assert "ssm (B, H, N), conv (B, D, K−1) and angle;" in msg  # the parts in the core's order, described
    assert "core.init_state(batch)" in msg and "a state this core returned" in msg


def test_one_missing_part_and_the_configuration() -> None:
    with pytest.raises(ValueError, match=re.escape("Core state lacks ['ssm']: this core with use_rope=True needs "
                                                   "conv (B, D, K−1) and ssm (B, H, N); start from core.init_state")):
        require_state_keys("Core", {"conv": torch.zeros(1)}, PARTS, "use_rope=True")
    with pytest.raises(ValueError, match=re.escape("this core needs ssm (B, H, N); start")):
        require_state_keys("Core", {}, {"ssm": "(B, H, N)"})
