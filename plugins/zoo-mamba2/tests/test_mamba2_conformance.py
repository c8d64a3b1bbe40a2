from zoo_core.testing import ConformanceSuite


class TestMamba2(ConformanceSuite):
    """The tiny preset: 2 heads of head_dim 5 (d_model 5), 2 groups, chunk 4 (not dividing the suite's lengths)."""

    core = "mamba2"


class TestMamba2Variant(ConformanceSuite):
    """The other gate order, one group, heads given by head_dim, Δ clamped to limits, biases in the
    projections but none in the conv, a chunk of 3."""

    core = "mamba2"

    def make_case(self):
        case = super().make_case()
        case.params.update(n_groups=1, norm_before_gate=True, dt_limit_min=0.01, dt_limit_max=0.05, bias=True,
                           conv_bias=False, head_dim=2, n_heads=None, chunk_size=3)
        return case
