"""The conformance suite is only worth something if each check can fail: run every check on a
toy core broken in exactly the way that check targets, and see it fail; run all on the correct toy
and see them pass."""

from __future__ import annotations

import pytest

from zoo_core.testing import CHECKS, ConformanceError, ConformanceSuite, case_from_registry, run_all
from zoo_core.testing.toys import BROKEN


def test_every_check_has_a_broken_toy():
    assert set(BROKEN) == set(CHECKS)


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_check_fails_on_its_broken_core(check, toy_registry):
    case = case_from_registry(f"toy-broken-{check.replace('_', '-')}", registry=toy_registry)
    with pytest.raises(ConformanceError):
        CHECKS[check](case)


def test_correct_toy_passes_everything(toy_registry):
    results = run_all(case_from_registry("toy-diag", registry=toy_registry))
    assert results == {name: "ok" for name in CHECKS}


def test_run_all_reports_failures_without_stopping(toy_registry):
    results = run_all(case_from_registry("toy-broken-causality", registry=toy_registry))
    assert results["causality"].startswith("FAILED")
    assert results["shapes"] == "ok"


def test_suite_class_needs_a_core():
    class Incomplete(ConformanceSuite):
        pass

    with pytest.raises(TypeError, match="must set `core"):
        Incomplete().conformance_case()


@pytest.mark.usefixtures("toy_registry")
class TestToyThroughTheSuiteClass(ConformanceSuite):
    """The pytest-facing class, exercised on the correct toy core."""

    core = "toy-diag"


def test_step_without_causal_is_a_protocol_violation(toy_registry):
    """Streaming one token at a time is causal by construction: a core must declare both."""
    from zoo_core.testing.checks import check_protocol

    case = case_from_registry("toy-diag", registry=toy_registry)
    case.capabilities = frozenset({"step", "initial_state", "lti"})
    case.cls = type("StepOnly", (case.cls,), {"capabilities": case.capabilities})
    with pytest.raises(ConformanceError, match="'step' without 'causal'"):
        check_protocol(case)


def test_causality_is_checked_only_where_declared(toy_registry):
    """A bidirectional core declares no 'causal' and skips the check instead of inverting it by hand."""
    from zoo_core.testing.checks import Skip, check_causality

    case = case_from_registry("toy-broken-causality", registry=toy_registry)
    case.capabilities = frozenset({"lti"})
    with pytest.raises(Skip, match="'causal'"):
        check_causality(case)
