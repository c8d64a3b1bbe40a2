"""The shared test helpers are themselves tested: a check that cannot fail guards nothing."""
import pytest
import torch

from zoo_core.testing.helpers import assert_slice_backward_linear, slice_backward_elements


def _leaky_sum(L, *, by_slice):
    x = torch.randn(1, L, 3, requires_grad=True)
    h, ys = torch.zeros(1, 3), []
    steps = (x[:, t] for t in range(L)) if by_slice else x.unbind(1)
    for x_t in steps:
        h = 0.5 * h + x_t
        ys.append(h)
    return torch.stack(ys, 1), h


def test_slice_backward_elements_counts_each_slice_at_the_full_size():
    # 8 slices, each backward zero-fills the whole (1, 8, 3) input: 8 * 24
    assert slice_backward_elements(*_leaky_sum(8, by_slice=True)) == 8 * 24
    assert slice_backward_elements(*_leaky_sum(8, by_slice=False)) == 0


def test_a_loop_by_unbind_passes_and_a_slice_per_step_fails():
    assert_slice_backward_linear(lambda L: _leaky_sum(L, by_slice=False), 16)
    with pytest.raises(AssertionError, match=r"16\.0x for 4x the length\): take the loop's pieces by unbind"):
        assert_slice_backward_linear(lambda L: _leaky_sum(L, by_slice=True), 16)
