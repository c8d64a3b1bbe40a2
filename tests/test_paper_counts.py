"""The seed's Table 3 (LRU, state 64, hidden 64, depth 6): `zoo build` on specs/paper reproduces the
parameter counts to the 0.1K shown (specs/paper/README.md has the arithmetic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo_core.build import build_model, summary
from zoo_core.nn.blocks import count_params

ROOT = Path(__file__).resolve().parents[1]

# Table 3 of "Reshape and Recur", thousands of parameters.
TABLE3 = {
    "heartbeat": {"abcdef": 154.6, "aaaaaa": 29.2, "ababab": 54.3, "abcabc": 79.4},
    "worms": {"abcdef": 151.3, "aaaaaa": 25.9, "ababab": 51.0, "abcabc": 76.0},
    "motor": {"abcdef": 154.8, "aaaaaa": 29.4, "ababab": 54.5, "abcabc": 79.6},
    "scp1": {"abcdef": 151.1, "aaaaaa": 25.7, "ababab": 50.8, "abcabc": 75.8},
    "scp2": {"abcdef": 151.2, "aaaaaa": 25.7, "ababab": 50.8, "abcabc": 75.9},
}
# Where the paper's figure is not reproduced by the principled architecture: ours, and why.
SLIPS = {("worms", "ababab"): (50.9, "50,949 parameters round to 50.9K; the paper's 51.0K is a double-rounding slip")}

CASES = [(d, p) for d in TABLE3 for p in TABLE3[d]]


@pytest.mark.parametrize("dataset,pattern", CASES)
def test_table3_count(dataset, pattern):
    model = build_model(ROOT / "specs" / "paper" / f"lru-{dataset}-{pattern}.yaml", seed=0)
    shown = round(count_params(model) / 1000, 1)
    expected = SLIPS.get((dataset, pattern), (TABLE3[dataset][pattern], ""))[0]
    assert shown == expected, f"{dataset} {pattern}: {count_params(model):,} parameters"
    assert f"({shown:.1f}K)" in summary(model).split("total")[1].splitlines()[0]


def test_one_block_is_norm_lru_glu():
    model = build_model(ROOT / "specs" / "paper" / "lru-heartbeat-aaaaaa.yaml", seed=0)
    block = model.stack.blocks[0]
    assert count_params(block.norm) == 128 and count_params(block.core) == 16_640 and count_params(block.out) == 8_320
    assert count_params(block) == 25_088


def test_motor_reads_all_64_channels():
    """Table 1 says 63 inputs; with 63 three of the four Motor counts miss by 0.1K."""
    model = build_model(ROOT / "specs" / "paper" / "lru-motor-abcdef.yaml", seed=0)
    assert model.encoder.in_features == 64 and model.time_length is None
