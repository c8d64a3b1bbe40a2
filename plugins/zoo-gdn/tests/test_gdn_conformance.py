from zoo_core.testing import ConformanceSuite
from zoo_core.testing.checks import CoreCase


class TestGatedDeltaNet(ConformanceSuite):
    """Every conformance check on the tiny preset: one head, K 5, V 7, chunk 8 (L = 37 spans 5 chunks)."""

    core = "gdn"


class TestGatedDeltaNetVariants(ConformanceSuite):
    """Two heads (head_dim auto: K = V = 3), no output gate, conv biases, β ∈ (0, 2), chunks of 5 (L = 37 is
    not a multiple): the checks these switches can break (the maths, streaming, backends, gradients, depth
    sharing); the structural ones (schema, hints, dtypes, save/load, L = 4096) run once, above."""

    core = "gdn"
    d_model = 6

    def make_case(self) -> CoreCase:
        case = super().make_case()
        case.params.update(num_heads=2, head_dim="auto", expand_k=1.0, expand_v=1.0, use_gate=False, conv_bias=True,
                           allow_neg_eigval=True, chunk_size=5)
        return case


for _check in ("protocol", "shapes", "dtypes", "stability", "determinism", "params_schema", "optim_hints",
               "half_precision", "backendless", "save_load", "long_step", "state_size"):
    setattr(TestGatedDeltaNetVariants, f"test_{_check}", None)  # not collected: run by TestGatedDeltaNet
