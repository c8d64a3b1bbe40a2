"""The network guard itself, and an opt-in smoke test against the real Hub (skipped by default)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest


def test_guard_refuses_a_non_loopback_connection(loopback_only):
    with socket.socket() as s, pytest.raises(OSError, match="only connect to loopback"):
        s.connect(("10.255.255.1", 9))
    assert loopback_only  # recorded...
    loopback_only.clear()  # ...and cleared here so that this test itself passes


def test_guard_refuses_name_resolution(loopback_only):
    with pytest.raises(OSError, match="loopback names"):
        socket.getaddrinfo("huggingface.co", 443)
    loopback_only.clear()


def test_subprocess_guard(cli):
    done = subprocess.run([sys.executable, "-c", "import socket; socket.create_connection(('10.255.255.1', 9), timeout=0.1)"],
                          env={**os.environ, "ZOO_TEST_LOOPBACK_ONLY": "1",
                               "PYTHONPATH": os.path.join(os.path.dirname(__file__), "_guard")},
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode != 0 and "only loopback is allowed" in done.stderr


REAL = os.environ.get("ZOO_TEST_REAL_HUB") == "1"


@pytest.mark.skipif(not REAL, reason="set ZOO_TEST_REAL_HUB=1, HF_TOKEN_REAL and ZOO_TEST_REAL_HUB_REPO=user/name to run")
def test_real_hub_push_and_pull(tmp_path):
    """Push a tiny model to a scratch repo on huggingface.co, pull it back by commit, compare (network)."""
    script = textwrap.dedent("""
        import os, torch
        from zoo_core.build import build_model
        from zoo_core.hub import create_model, push_to_hub
        spec = {"schema_version": 1, "task": {"kind": "classification", "classes": 3}, "input": {"channels": 2},
                "model": {"d_model": 8, "depth": 1, "core": {"kind": "s4d", "preset": "tiny"}}}
        model = build_model(spec, seed=0).eval()
        repo = os.environ["ZOO_TEST_REAL_HUB_REPO"]
        res = push_to_hub(model, repo, private=True, commit_message="zoo smoke test")
        again = create_model(f"hf-hub:{repo}@{res.commit}", force_download=True)
        x = torch.randn(1, 5, 2)
        assert torch.equal(again(x), model(x))
        print("ok", res.commit)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ZOO_TEST_LOOPBACK"))}
    env.update(HF_TOKEN=os.environ["HF_TOKEN_REAL"], HF_HOME=str(tmp_path), ZOO_TEST_REAL_HUB_REPO=os.environ["ZOO_TEST_REAL_HUB_REPO"])
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
