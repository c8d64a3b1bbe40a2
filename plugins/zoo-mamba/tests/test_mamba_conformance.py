from zoo_core.testing import ConformanceSuite


class TestMamba(ConformanceSuite):
    core = "mamba"


class TestMambaSL(ConformanceSuite):
    """MambaSL's switches: time-invariant Δ and B, input-dependent C, no D (x_proj emits C only)."""

    core = "mamba"

    def make_case(self):
        case = super().make_case()
        case.params.update(tv_dt=False, tv_B=False, use_D=False)
        return case


class TestMambaSLTimeInvariant(ConformanceSuite):
    """Everything time-invariant (no x_proj at all), as the MambaSL classification preset, at tiny sizes."""

    core = "mamba"

    def make_case(self):
        case = super().make_case()
        case.params.update(expand=1, tv_dt=False, tv_B=False, tv_C=False, use_D=False)
        return case
