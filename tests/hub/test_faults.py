"""Faults between the client and the Hub: every pull either succeeds with verified files or fails
clearly, and the cache never keeps a corrupted or partial file."""

from __future__ import annotations

import logging

import pytest
import torch

from zoo_core.errors import CheckpointError
from zoo_core.hub import HubConnectionError, create_model, pull, push_to_hub

WEIGHTS_GET = r"^/cdn-lfs/"  # the LFS bytes, served from the second host name


@pytest.fixture
def repo(hub, make_model):
    model = make_model(0)
    push_to_hub(model, "org/f")
    hub.clear()
    return model


def _cache(hf_home):
    return hf_home / "hub"


def _loads(model) -> bool:
    got = create_model("hf-hub:org/f")
    return all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), model.state_dict().values()))


def test_connection_dropped_once_is_retried(hub, repo, hf_home, check_cache):
    fault = hub.add_fault("drop", method="GET", path=WEIGHTS_GET)
    assert _loads(repo)
    assert fault.hits == 1 and hub.count("GET", WEIGHTS_GET) == 2
    assert check_cache(_cache(hf_home)) == []


def test_server_error_once_is_retried_by_the_zoo(hub, repo, hf_home, check_cache, caplog):
    fault = hub.add_fault("status", status=503, method="GET", path=WEIGHTS_GET)
    with caplog.at_level(logging.WARNING):
        assert _loads(repo)
    assert fault.hits == 1 and "retry" in caplog.text.lower()  # ours on 1.x/2.x; the client's own on 0.x
    assert check_cache(_cache(hf_home)) == []


@pytest.mark.slow  # about 70 s on 0.x clients, which back off on 5xx themselves; 0.1 s on 1.x/2.x
def test_server_error_always_fails_clearly(hub, repo, hf_home, check_cache):
    hub.add_fault("status", status=502, method="GET", path=WEIGHTS_GET, times=None)
    with pytest.raises(HubConnectionError, match="502"):
        pull("hf-hub:org/f")
    assert 3 <= hub.count("GET", WEIGHTS_GET) <= 18  # ZOO_HUB_RETRIES attempts (0.x clients also retry 5xx, 6x)
    assert check_cache(_cache(hf_home), resumable=True) == []
    assert not list(_cache(hf_home).glob("models--org--f/snapshots/*/model.safetensors"))


def test_truncated_body_never_lands_in_the_cache(hub, repo, hf_home, check_cache):
    fault = hub.add_fault("truncate", method="GET", path=WEIGHTS_GET, fraction=0.3)
    assert _loads(repo)
    assert fault.hits == 1 and check_cache(_cache(hf_home)) == []


def test_same_size_corruption_is_caught_evicted_and_downloaded_again(hub, repo, hf_home, check_cache, caplog):
    fault = hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET)
    with caplog.at_level(logging.WARNING, logger="zoo_core.hub"):
        assert _loads(repo)
    assert fault.hits == 1 and "removed from the cache" in caplog.text
    assert check_cache(_cache(hf_home)) == []


def test_corruption_every_time_is_refused_and_removed(hub, repo, hf_home, check_cache):
    hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET, times=None)
    with pytest.raises(CheckpointError, match="removed from the cache"):
        create_model("hf-hub:org/f")
    assert check_cache(_cache(hf_home)) == []
    lfs_blobs = [b for b in _cache(hf_home).glob("models--org--f/blobs/*") if len(b.name.split(".")[0]) == 64]
    assert lfs_blobs == []  # the weights' blob is gone, not kept wrong
    hub.clear()
    assert _loads(repo)  # healthy again: the next pull repairs it


@pytest.mark.slow  # the client itself retries a dropped connection 5 times, 1 s apart
def test_server_gone_mid_pull_then_back(hub, repo, hf_home, check_cache):
    hub.add_fault("gone", method="GET", path=WEIGHTS_GET)
    with pytest.raises(HubConnectionError):
        pull("hf-hub:org/f")
    assert check_cache(_cache(hf_home), resumable=True) == []
    assert not list(_cache(hf_home).glob("models--org--f/snapshots/*/model.safetensors"))
    hub.clear()  # the server is back
    assert _loads(repo) and check_cache(_cache(hf_home)) == []


def test_corrupted_blob_in_the_cache_is_caught_offline(hub, repo, hf_home, check_cache, monkeypatch):
    pull("hf-hub:org/f")
    blob = next(b for b in _cache(hf_home).glob("models--org--f/blobs/*") if len(b.name) == 64)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))  # bit rot after a good download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="go online"):
        pull("hf-hub:org/f")
    assert not blob.exists() and check_cache(_cache(hf_home)) == []
