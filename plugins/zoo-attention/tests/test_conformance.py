"""The shared conformance suite on every configuration whose streaming differs: the growing KV
cache (no window), the ring buffer (window, also shorter than the suite's lengths), without RoPE,
and the bidirectional variant (causality and streaming checks skip: it declares neither)."""

from zoo_core.testing import ConformanceSuite


class TestAttention(ConformanceSuite):
    """2 query heads sharing 1 key/value head, RoPE, growing cache."""

    core = "attention"
    d_model = 8

    def make_case(self):
        case = super().make_case()
        case.params.update(n_heads=2, n_kv_heads=1)
        return case


class TestAttentionWindow(ConformanceSuite):
    """A window of 5: the ring buffer wraps many times in every streaming check (constant state)."""

    core = "attention"
    d_model = 8

    def make_case(self):
        case = super().make_case()
        case.params.update(window=5, n_heads=4, n_kv_heads=2, bias=True)
        return case


class TestAttentionNoRope(ConformanceSuite):
    """Odd head_dim without RoPE (8 heads of 1 channel, no grouping)."""

    core = "attention"
    d_model = 8

    def make_case(self):
        case = super().make_case()
        case.params.update(n_heads=8, n_kv_heads=None, rope=False)
        return case


class TestAttentionBidirectional(ConformanceSuite):
    core = "attention-bidirectional"
    d_model = 8

    def make_case(self):
        case = super().make_case()
        case.params.update(n_heads=2, n_kv_heads=1)
        return case


class TestAttentionBidirectionalWindow(ConformanceSuite):
    core = "attention-bidirectional"
    d_model = 8

    def make_case(self):
        case = super().make_case()
        case.params.update(window=4)
        return case
