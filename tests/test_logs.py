"""zoo_core.logs.log_once: once per key per logger per process, resettable, and the places that
announce a degraded path use it (so a test can reset them all in one call)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from zoo_core.logs import log_once, reset_log_once


def _messages(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_logs_once_per_key_with_lazy_arguments(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("zoo_test.once")
    with caplog.at_level(logging.INFO, logger=log.name):
        assert log_once(log, logging.INFO, "k", "picked %s for %d", "fft", 3)
        assert not log_once(log, logging.INFO, "k", "picked %s for %d", "naive", 4)  # same key, other text
        assert log_once(log, logging.WARNING, ("k", 2), "another key")
    assert _messages(caplog, log.name) == ["picked fft for 3", "another key"]
    assert [r.levelno for r in caplog.records if r.name == log.name] == [logging.INFO, logging.WARNING]


def test_keys_are_scoped_to_their_logger(caplog: pytest.LogCaptureFixture) -> None:
    a, b = logging.getLogger("zoo_test.a"), logging.getLogger("zoo_test.b")
    with caplog.at_level(logging.INFO):
        log_once(a, logging.INFO, "same", "from a")
        log_once(b, logging.INFO, "same", "from b")
    assert _messages(caplog, a.name) == ["from a"] and _messages(caplog, b.name) == ["from b"]


def test_reset_forgets_one_logger_or_all(caplog: pytest.LogCaptureFixture) -> None:
    a, b = logging.getLogger("zoo_test.ra"), logging.getLogger("zoo_test.rb")
    with caplog.at_level(logging.INFO):
        log_once(a, logging.INFO, "k", "a1")
        log_once(b, logging.INFO, "k", "b1")
        reset_log_once(a)
        log_once(a, logging.INFO, "k", "a2")
        log_once(b, logging.INFO, "k", "b2")  # b was not reset: stays quiet
        reset_log_once()
        log_once(b, logging.INFO, "k", "b3")
    assert _messages(caplog, a.name) == ["a1", "a2"] and _messages(caplog, b.name) == ["b1", "b3"]


def test_a_key_said_while_the_level_was_off_is_not_replayed(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("zoo_test.quiet")
    with caplog.at_level(logging.ERROR, logger=log.name):
        log_once(log, logging.INFO, "k", "muted")
    with caplog.at_level(logging.INFO, logger=log.name):
        log_once(log, logging.INFO, "k", "muted")
    assert _messages(caplog, log.name) == []


def test_padded_arrays_without_lengths_are_announced_once(caplog: pytest.LogCaptureFixture) -> None:
    """zoo_core.train.evaluate goes through log_once (its private flag is gone), and the root
    conftest's reset makes the warning visible again in every test that looks for it."""
    from zoo_core.datasets import SplitData
    from zoo_core.train.evaluate import _warn_if_padded

    X = np.ones((3, 4, 2), dtype=np.float32)
    X[:, -1] = 0  # every sequence ends in an all-zero step
    split = SplitData(X, np.zeros(3, dtype=np.int64))
    with caplog.at_level(logging.WARNING, logger="zoo_core.train.evaluate"):
        _warn_if_padded(split)
        _warn_if_padded(split)
        reset_log_once()
        _warn_if_padded(split)
    said = [m for m in _messages(caplog, "zoo_core.train.evaluate") if "looks like end padding" in m]
    assert len(said) == 2 and said[0].startswith("3 of 3 sequences")


def test_sizing_fallbacks_are_said_once_through_log_once(caplog: pytest.LogCaptureFixture) -> None:
    from zoo_core import footprint

    with caplog.at_level(logging.INFO, logger="zoo_core.footprint"):
        footprint._once("sizing fell back")
        footprint._once("sizing fell back")
        reset_log_once()
        footprint._once("sizing fell back")
    assert _messages(caplog, "zoo_core.footprint") == ["sizing fell back"] * 2


def test_shared_batchnorm_warning_goes_through_log_once(caplog: pytest.LogCaptureFixture) -> None:
    from zoo_core.build import build_model

    spec = {"schema_version": 1, "task": {"kind": "classification", "classes": 2}, "input": {"channels": 2},
            "model": {"d_model": 4, "depth": 2, "block": {"norm": "batch"}, "core": {"kind": "lru", "preset": "tiny"},
                      "stacking": {"policy": "periodic", "period": 1}}}
    with caplog.at_level(logging.WARNING, logger="zoo_core.build"):
        build_model(spec, seed=0)
        build_model(spec, seed=0)
    assert sum("keeps one set of running statistics" in m for m in _messages(caplog, "zoo_core.build")) == 1
    reset_log_once(logging.getLogger("zoo_core.build"))
    with caplog.at_level(logging.WARNING, logger="zoo_core.build"):
        build_model(spec, seed=0)
    assert sum("keeps one set of running statistics" in m for m in _messages(caplog, "zoo_core.build")) == 2
