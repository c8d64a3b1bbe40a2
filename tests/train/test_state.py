"""Checkpoints without pickle: optimizer state through safetensors + JSON, bit for bit."""

from __future__ import annotations

import torch

from zoo_core.train.state import flatten_optimizer, unflatten_optimizer


def _opt():
    torch.manual_seed(0)
    real = torch.nn.Parameter(torch.randn(3, 2))
    cplx = torch.nn.Parameter(torch.randn(4, dtype=torch.complex64))
    opt = torch.optim.Adam([{"params": [real]}, {"params": [cplx], "lr": 1e-2, "weight_decay": 0.0}], lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        (real.pow(2).sum() + (cplx * cplx.conj()).real.sum()).backward()
        opt.step()
    return opt, real, cplx


def test_optimizer_round_trip_is_exact(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    opt, real, cplx = _opt()
    tensors, meta = flatten_optimizer(opt.state_dict())
    save_file(tensors, str(tmp_path / "o.safetensors"))
    (tmp_path / "o.json").write_text(json.dumps(meta))
    restored = unflatten_optimizer(load_file(str(tmp_path / "o.safetensors")), json.loads((tmp_path / "o.json").read_text()))
    opt2 = torch.optim.Adam([{"params": [real.detach().clone().requires_grad_()]},
                             {"params": [cplx.detach().clone().requires_grad_()]}], lr=5.0)
    opt2.load_state_dict(restored)
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"][1]["lr"] == b["param_groups"][1]["lr"] == 1e-2
    for pid in a["state"]:
        for k, v in a["state"][pid].items():
            assert torch.equal(v, b["state"][pid][k]), (pid, k)
    assert b["state"][1]["exp_avg"].is_complex()
