from zoo_core.testing import ConformanceSuite


class TestS4D(ConformanceSuite):
    core = "s4d"


class TestS4DBilinearLin(ConformanceSuite):
    """The other discretizer and spectrum through the same checks."""

    core = "s4d"
    preset = "tiny"

    def make_case(self):
        case = super().make_case()
        case.params.update(discretizer="bilinear", init="lin")
        return case
