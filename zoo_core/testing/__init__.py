"""The conformance suite every core passes, plus helpers for plugin authors.

A plugin opts in with::

    from zoo_core.testing import ConformanceSuite

    class TestMyCore(ConformanceSuite):
        core = "mycore"
"""

from .checks import CHECKS, ConformanceError, CoreCase, assert_close, assert_rel_close, case_from_registry, run_all
from .suite import ConformanceSuite

__all__ = [
    "CHECKS", "ConformanceError", "ConformanceSuite", "CoreCase", "assert_close", "assert_rel_close", "case_from_registry", "run_all",
]
