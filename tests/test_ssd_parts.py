"""The pieces the SSD-style families share (zoo_core.params.resolve_heads, zoo_core.init.diag.
softplus_inverse_dt, zoo_core.nn.gated_norm.GatedRMSNorm), each against its definition written out."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zoo_core.init.diag import softplus_inverse_dt
from zoo_core.nn.gated_norm import GatedRMSNorm
from zoo_core.params import resolve_heads


@pytest.mark.parametrize(("d_inner", "head_dim", "n_heads", "want"), [
    (128, None, None, (2, 64)), (96, None, None, (3, 32)), (10, None, None, (5, 2)),
    (128, 16, None, (8, 16)), (128, None, 4, (4, 32)), (128, 32, 4, (4, 32)),
])
def test_resolve_heads_from_either_or_neither(d_inner, head_dim, n_heads, want):
    assert resolve_heads(d_inner, head_dim, n_heads) == want


def test_softplus_inverse_dt_starts_softplus_in_the_range_log_uniformly():
    torch.manual_seed(0)
    bias = softplus_inverse_dt(20000, 1e-3, 1e-1, 1e-4)
    dt = F.softplus(bias.double())
    assert bias.dtype == torch.get_default_dtype() and dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
    u = (dt.log() - math.log(1e-3)) / (math.log(1e-1) - math.log(1e-3))  # uniform on [0, 1] if log-uniform
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    floored = F.softplus(softplus_inverse_dt(1000, 1e-3, 1e-1, 5e-2).double())
    assert floored.min() >= 5e-2 * (1 - 1e-5)  # the floor clamps Δ₀
    assert softplus_inverse_dt(4, 1e-3, 1e-1, 1e-4, dtype=torch.float64).dtype == torch.float64


@pytest.mark.parametrize("norm_before_gate", [False, True])
def test_gated_rms_norm_equals_its_definition_per_group(norm_before_gate):
    torch.manual_seed(0)
    d, groups = 12, 3
    norm = GatedRMSNorm(d, d // groups, eps=1e-5, norm_before_gate=norm_before_gate, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, dtype=torch.float64))
    y, z = torch.randn(2, 5, d, dtype=torch.float64), torch.randn(2, 5, d, dtype=torch.float64)
    gate = z * torch.sigmoid(z)
    pre = y if norm_before_gate else y * gate
    parts = [p / torch.sqrt((p ** 2).mean(-1, keepdim=True) + 1e-5) for p in pre.split(d // groups, -1)]
    want = torch.cat(parts, -1) * norm.weight
    torch.testing.assert_close(norm(y, z), want * gate if norm_before_gate else want)
