import torch

from zoo_core.testing import ConformanceError, ConformanceSuite


class TestS5(ConformanceSuite):
    """ZOH (default), trunc_standard_normal C̃, two HiPPO-N blocks (the tiny preset)."""

    core = "s5"


class TestS5BilinearLecun(ConformanceSuite):
    """The other discretizer, the LinOSS codebase's C̃ init and clip_eigs through the same checks."""

    core = "s5"

    def make_case(self):
        case = super().make_case()
        case.params.update(discretizer="bilinear", c_init="lecun_normal", clip_eigs=True)
        return case


class TestS5Bidirectional(ConformanceSuite):
    """Every check; causality and the step/state checks skip because the core does not declare
    ``causal``, ``step`` or ``initial_state``."""

    core = "s5-bidirectional"

    def test_reverse_scan_sees_the_future(self):
        """Changing inputs from t=20 on changes outputs before t=20: the reverse scan is wired."""
        case = self.conformance_case()
        assert "causal" not in case.capabilities
        core = case.make()
        x = torch.randn(2, 33, case.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        x2 = x.clone()
        x2[:, 20:] += 10 * torch.randn_like(x2[:, 20:])
        leak = (core(x)[:, :20] - core(x2)[:, :20]).abs().amax()
        if not leak > 1e-6:
            raise ConformanceError("s5-bidirectional: the past did not see the future; is the reverse scan wired?")
