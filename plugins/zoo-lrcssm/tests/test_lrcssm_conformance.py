from zoo_core.testing import ConformanceSuite


class TestLrcSSM(ConformanceSuite):
    """The tiny preset: D = 4 states for d_model = 5, so the Linear(D → H) output map is on."""

    core = "lrcssm"


class TestLrcSSMSymmetricStateOut(ConformanceSuite):
    """D = d_model (the output is the state itself, as in the paper) with the symmetric elastance."""

    core = "lrcssm"

    def make_case(self):
        case = super().make_case()
        case.params.update(d_state=None, elastance="symmetric")
        return case
