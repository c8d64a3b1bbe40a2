"""DDP: ``torchrun`` with two CPU processes (gloo, loopback) matches one process with the same
global batch, to float tolerance."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from zoo_core.train.progress import Progress
from zoo_core.train.run import train

from .conftest import tiny_spec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.requires("aeon")
def test_two_process_ddp_matches_single_process(tmp_path):
    # layer norm and no dropout: per-rank batch statistics or masks would differ by design
    spec = tiny_spec(tmp_path, training={"dataset": "BasicMotions", "epochs": 2, "batch_size": 8, "lr": 1e-2, "drop_last": False})
    single = train(spec, output=tmp_path / "single", progress=Progress(quiet=True))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "-m", "zoo_core.train", "train", str(spec), "-o", str(tmp_path / "ddp"), "--device", "cpu", "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    a = load_file(str(tmp_path / "single/seed-0/lr-0.01/checkpoint/model.safetensors"))
    b = load_file(str(tmp_path / "ddp/seed-0/lr-0.01/checkpoint/model.safetensors"))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
    h1 = single["seeds"][0]["runs"][0]["history"]
    h2 = ddp["seeds"][0]["runs"][0]["history"]
    assert [r["steps"] for r in h1] == [r["steps"] for r in h2] == [7, 7]  # 56 training sequences, global batch 8
    for r1, r2 in zip(h1, h2):
        assert r2["train_loss"] == pytest.approx(r1["train_loss"], rel=1e-4)
        assert r2["val_loss"] == pytest.approx(r1["val_loss"], rel=1e-4)
