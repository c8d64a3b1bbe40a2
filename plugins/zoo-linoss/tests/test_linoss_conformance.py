from zoo_core.testing import ConformanceSuite


class TestLinOSS(ConformanceSuite):
    """The default scheme, LinOSS-IM (implicit Euler), on the tiny preset."""

    core = "linoss"


class TestLinOSSIMEX(ConformanceSuite):
    """LinOSS-IMEX (symplectic Euler) through the same checks, on the tiny preset."""

    core = "linoss"
    preset = "tiny"

    def make_case(self):
        case = super().make_case()
        case.params.update(discretizer="linoss-imex")
        return case
