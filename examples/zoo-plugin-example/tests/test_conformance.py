from zoo_core.testing import ConformanceSuite


class TestEMA(ConformanceSuite):
    core = "ema"
