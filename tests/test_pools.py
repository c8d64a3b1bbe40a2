"""Pools: each pool's parallel read honours lengths, and its streaming commit/read reproduces it on
every prefix, including a step read without being committed; models get their pool at build time."""

from __future__ import annotations

import pytest
import torch

from zoo_core.build import build_model
from zoo_core.errors import UsageError
from zoo_core.nn.pools import POOLS, LastPool, MeanLogitsPool, MeanPool, Pool, make_pool

F64 = torch.float64


def _head() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5, dtype=F64), torch.nn.Tanh(), torch.nn.Linear(5, 3, dtype=F64))


def _stream(pool, hn, head, *, extra=None):
    """Commit hn (B, n, H) one step at a time from a zero state; the read after the last commit."""
    state = pool.init_state(hn.shape[0], hn.shape[2], head, device=None, dtype=F64)
    for t in range(hn.shape[1]):
        state = pool.commit(state, hn[:, t : t + 1], head)
    return pool.stream_read(state, hn[:, -1:], extra, head)


@pytest.mark.parametrize("name", ["mean", "last", "mean_logits"])
def test_streamed_pool_equals_the_parallel_read_with_lengths(name):
    pool, head = make_pool(name), _head()
    hn = torch.randn(3, 7, 4, dtype=F64)
    lengths = torch.tensor([7, 2, 5])
    with torch.no_grad():
        padded = pool.read(hn, lengths, head)  # (B, O): steps past a length never reach the pool
        for b, n in enumerate(lengths.tolist()):
            alone = pool.read(hn[b : b + 1, :n], None, head)
            torch.testing.assert_close(padded[b : b + 1], alone, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(_stream(pool, hn[b : b + 1, :n], head), alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["mean", "last", "mean_logits"])
def test_an_uncommitted_step_is_read_but_not_kept(name):
    pool, head = make_pool(name), _head()
    hn = torch.randn(2, 4, 4, dtype=F64)
    with torch.no_grad():
        state = pool.init_state(2, 4, head, device=None, dtype=F64)
        state = pool.commit(state, hn[:, :3], head)
        with_extra = pool.stream_read(state, None, hn[:, 3], head)
        torch.testing.assert_close(with_extra, pool.read(hn, None, head), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(pool.stream_read(state, None, None, head), pool.read(hn[:, :3], None, head))
        assert int(state.count[0]) == 3  # reading the extra step changed nothing


def test_the_per_step_pool_keeps_nothing_and_reads_every_step():
    pool, head = make_pool("none"), _head()
    hn = torch.randn(2, 5, 4, dtype=F64)
    assert pool.per_step and pool.init_state(2, 4, head, device=None, dtype=F64) is None
    with torch.no_grad():
        torch.testing.assert_close(pool.read(hn, torch.tensor([5, 2]), head), head(hn))
        y = pool.stream_read(None, hn[:, :1], None, head)
    assert pool.step_output(y).shape == (2, 3)


def test_pools_are_chosen_when_the_model_is_built():
    def spec(task, pool):
        return {"schema_version": 1, "task": task, "input": {"channels": 2},
                "model": {"d_model": 4, "depth": 1, "pool": pool, "core": {"kind": "s4d", "preset": "tiny"}}}

    cls = {"kind": "classification", "classes": 2}
    expected = {"mean": MeanPool, "last": LastPool, "mean_logits": MeanLogitsPool}
    for name, kind in expected.items():
        model = build_model(spec(cls, name), seed=0)
        assert type(model.pool) is kind and str(model.pool) == name
    assert type(build_model(spec({"kind": "sequence", "outputs": 2}, "none"), seed=0).pool) is Pool
    assert sorted(POOLS) == ["last", "mean", "mean_logits", "none"]


def test_an_unknown_pool_or_a_missing_running_state_says_what_to_do():
    with pytest.raises(UsageError, match="unknown pool 'max'; choose one of"):
        make_pool("max")
    with pytest.raises(UsageError, match="init_state"):
        make_pool("mean").stream_read(None, None, None, _head())
