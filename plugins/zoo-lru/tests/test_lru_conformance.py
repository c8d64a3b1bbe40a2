from zoo_core.testing import ConformanceSuite


class TestLRU(ConformanceSuite):
    core = "lru"


class TestLRUNarrowRing(ConformanceSuite):
    """A ring close to the unit circle with a small phase (the long-memory regime) through the same checks."""

    core = "lru"
    preset = "small"

    def make_case(self):
        case = super().make_case()
        case.params.update(r_min=0.9, r_max=0.999, max_phase=0.314)
        return case
