"""Mixed precision for every registered core (zoo_core.precision; docs/PRECISION.md has the figures):
bfloat16 input at L = 16384 finite and within 1e-2 of float32 (reliability.md N8), the long-L scan
check with bfloat16 activations, a few hundred JapaneseVowels steps under CPU bf16 autocast reaching
the float32 run's loss, and ``zoo train --precision`` (16-mixed with a gradient scaler that resumes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from zoo_core.plugins import get_registry
from zoo_core.precision import at_compute_precision, autocast_for, grad_scaler, parse_precision
from zoo_core.testing import case_from_registry
from zoo_core.testing.checks import HALF_RTOL
from zoo_core.train.loop import Interrupted
from zoo_core.train.progress import Progress
from zoo_core.train.run import train

CORES = sorted(n for n in get_registry().cores if not n.startswith("toy"))
WIDTH = {"attention": 8, "attention-bidirectional": 8, "gdn": 6}  # the conformance suites' widths
LOSS_MARGIN = (0.02, 0.25)  # |bf16 - fp32| final train loss <= abs + rel * fp32 (why 0.25: the GDN case below)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("name", CORES)
def test_bfloat16_at_16384_steps_is_finite_and_close_to_float32(name):
    case = case_from_registry(name, d_model=WIDTH.get(name, 5))
    core = case.make(dtype=torch.float32)
    x = torch.randn(1, 16384, case.d_model, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad():
        y = core(x)
        ref = core(x.float())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y_auto = core(x.float())
    assert y.dtype == torch.bfloat16 and bool(torch.isfinite(y).all())
    assert _rel(y, ref) <= HALF_RTOL[torch.bfloat16], f"{name}: bfloat16 at L=16384 off float32 by {_rel(y, ref):.2e}"
    assert bool(torch.isfinite(y_auto).all()) and _rel(y_auto, ref) <= HALF_RTOL[torch.bfloat16]


def _jv_spec(kind: str) -> dict:
    core = {"kind": kind, "n_heads": 2} if kind.startswith("attention") else {"kind": kind, "preset": "tiny"}
    return {"schema_version": 1, "name": f"{kind}-jv", "task": {"kind": "classification", "classes": 9},
            "input": {"channels": 12}, "model": {"d_model": 16, "depth": 1, "core": core},
            "training": {"dataset": "JapaneseVowels", "epochs": 10, "batch_size": 16, "lr": 3e-3}}


def _final_loss(out: Path) -> list[float]:
    result = json.loads(next(out.rglob("result.json")).read_text())
    return [h["train_loss"] for h in result["history"]]


@pytest.mark.parametrize("kind", [n for n in CORES if n != "attention-bidirectional" and n != "s5-bidirectional"])
def test_bf16_mixed_training_reaches_the_float32_loss(kind, tmp_path):
    """280 steps (10 epochs of 28 batches) on JapaneseVowels: the bf16-mixed run's training loss over its
    last three epochs lies within LOSS_MARGIN of the float32 run's, and both fell (the runs trained).
    Three epochs, not the last one: the two runs' trajectories part after a few steps, and one epoch's
    loss moves by more than the margin from epoch to epoch (GDN on an AMD EPYC: float32 0.31, 0.22,
    0.18 and bf16 0.25, 0.27, 0.26 over epochs 8-10, the means 0.235 and 0.256; on 2026-12-04, same CPU
    and code, float32 0.227, 0.260, 0.193 and bf16 0.330, 0.249, 0.241, the means 0.227 and 0.273: bf16
    a step behind, 0.047 apart, over a 10 % margin). A broken mixed path (no update, a wrong scale)
    stays near the first epoch's 2.1, far outside 25 %."""
    losses = {}
    for precision in ("32", "bf16-mixed"):
        train(_jv_spec(kind), output=tmp_path / precision, overrides={"precision": precision}, progress=Progress(quiet=True))
        losses[precision] = _final_loss(tmp_path / precision)
    ref, mixed = (sum(losses[p][-3:]) / 3 for p in ("32", "bf16-mixed"))
    assert ref < 0.8 * losses["32"][0] and mixed < 0.8 * losses["bf16-mixed"][0]
    assert abs(mixed - ref) <= LOSS_MARGIN[0] + LOSS_MARGIN[1] * ref, f"{kind}: bf16-mixed loss {mixed:.4f} vs float32 {ref:.4f}"


def test_16_mixed_trains_with_a_gradient_scaler_that_resumes(tmp_path):
    """float16 autocast scales the loss; the scaler's state is in the checkpoint, so a run stopped after
    epoch 2 and resumed ends exactly where the uninterrupted run does."""
    spec = _jv_spec("s4d")
    whole, part = tmp_path / "whole", tmp_path / "part"
    settings = {"precision": "16-mixed", "epochs": 4}
    train(spec, output=whole, overrides=settings, progress=Progress(quiet=True))

    def stop_after_two(epoch: int, record: dict) -> None:
        if epoch == 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(spec, output=part, overrides=settings, progress=Progress(quiet=True), on_epoch_end=stop_after_two)
    trainer = json.loads(next(part.rglob("checkpoint/trainer.json")).read_text())["trainer"]
    assert trainer["grad_scaler"]["scale"] > 1  # the loss was scaled (65536 at the start, halved on overflow)
    edited = tmp_path / "edited"  # the same checkpoint with another scale: resuming must read it
    shutil.copytree(part, edited)
    trainer_file = next(edited.rglob("checkpoint/trainer.json"))
    record = json.loads(trainer_file.read_text())
    record["trainer"]["grad_scaler"]["scale"] = 2.0
    trainer_file.write_text(json.dumps(record))
    for folder in (part, edited):
        train(spec, output=folder, overrides=settings, resume=True, progress=Progress(quiet=True))
    final = json.loads(next(edited.rglob("checkpoint/trainer.json")).read_text())["trainer"]["grad_scaler"]
    assert final["scale"] == 2.0  # resumed from the checkpoint's scale (grows only after 2000 clean steps)
    assert _final_loss(part) == _final_loss(whole)
    assert _final_loss(whole)[-1] < 0.8 * _final_loss(whole)[0]


def test_precision_names_and_the_scaler():
    assert parse_precision("bf16-mixed") == "bf16-mixed"
    with pytest.raises(ValueError, match="32, bf16-mixed, 16-mixed"):
        parse_precision("bf16")
    assert grad_scaler("bf16-mixed", "cpu") is None and grad_scaler("32", "cpu") is None
    assert isinstance(grad_scaler("16-mixed", "cpu"), torch.amp.GradScaler)
    with autocast_for("bf16-mixed", "cpu"):
        assert torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast_for("32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")


def test_the_decorator_serves_a_core_without_corebase():
    """A third-party core (SSMCore only) gets the same behaviour by decorating its methods."""

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 3))

        @at_compute_precision
        def forward(self, x):
            assert x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
            return x @ self.w

    core = Plain()
    assert core(torch.randn(2, 3).bfloat16()).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert core(torch.randn(2, 3)).dtype == torch.float32


def test_cli_rejects_an_unknown_precision(capsys):
    from zoo_core.cli.zoo import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "specs/lru-jv.yaml", "--precision", "bf16"])
    assert exc.value.code == 2 and "bf16-mixed" in capsys.readouterr().err


def test_cores_still_run_on_the_meta_device_and_by_keyword():
    """footprint's dry runs build on meta, where autocast does not exist; keyword calls reach the input too."""
    core = get_registry().core("s4d").load()(d_model=4, d_state=8, device="meta")
    assert core(torch.empty(2, 9, 4, device="meta")).shape == (2, 9, 4)
    real = get_registry().core("s4d").load()(d_model=4, d_state=8)
    y, _ = real.step(x_t=torch.randn(2, 4).bfloat16(), state=real.init_state(2))
    assert y.dtype == torch.bfloat16


@pytest.mark.parametrize("spec", ["specs/s4d-basicmotions.yaml", "specs/lru-jv.yaml"])
def test_footprint_still_measures_on_meta(spec):
    """The precision wrapper must not break footprint's meta-device forwards (it fell back to the bound)."""
    from zoo_core.build import build_model
    from zoo_core.footprint import activation_bytes
    from zoo_core.spec import load_spec

    loaded = load_spec(spec)
    model = build_model(loaded, device="meta")
    _, method = activation_bytes(loaded, model, 8, 64)
    assert method.startswith("peak of meta-device forwards"), method


def test_zoo_eval_scores_a_float32_model_under_bf16_autocast(tmp_path, no_network):
    """``zoo eval --precision bf16-mixed``: the bundled LRU tag scored under bfloat16 autocast, recorded as such,
    within a few points of its float32 score (its recurrence stays in float32)."""
    from zoo_core.cli.zoo import main
    from zoo_core.errors import SpecError
    from zoo_core.train import evaluate_model

    full = evaluate_model("lru-aaaaaa.japanesevowels", device="cpu", output=tmp_path / "fp32.json")
    assert main(["eval", "lru-aaaaaa.japanesevowels", "--device", "cpu", "--precision", "bf16-mixed",
                 "-o", str(tmp_path / "bf16.json")]) == 0
    half = json.loads((tmp_path / "bf16.json").read_text())
    assert half["precision"] == "bf16-mixed" and full["precision"] == "32"
    assert abs(half["fixed_depth"]["accuracy"] - full["fixed_depth"]["accuracy"]) < 0.05
    with pytest.raises(SpecError, match="bf16-mixed"):
        evaluate_model("lru-aaaaaa.japanesevowels", device="cpu", precision="bf16")
