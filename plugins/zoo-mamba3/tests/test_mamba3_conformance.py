"""The shared conformance suite on Mamba-3 (every backend against the sequential reference)."""

from zoo_core.testing import ConformanceSuite


class TestMamba3(ConformanceSuite):
    """The tiny preset: 2 heads of 5, 2 groups, d_state 4, chunk 4 (L = 37 crosses many chunk boundaries)."""

    core = "mamba3"


class TestMamba3EulerNoRope(ConformanceSuite):
    """The switches off: Euler discretisation, no rotary, no B/C norm or bias, one group, odd d_state."""

    core = "mamba3"

    def make_case(self):
        case = super().make_case()
        case.params.update(use_trapezoidal=False, use_rope=False, use_bc_norm=False, use_bc_bias=False,
                           ngroups=1, d_state=3, chunk_size=5)
        return case
