from zoo_core.testing import ConformanceSuite


class TestS4(ConformanceSuite):
    core = "s4"
