"""The training loop: resume after an interruption (bit for bit), early stopping, the lr grid,
divergence, metrics JSON and the plot."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from zoo_core.errors import SpecError, ZooError
from zoo_core.train import loop
from zoo_core.train.loop import Interrupted, TrainingDivergedError
from zoo_core.train.progress import Progress
from zoo_core.train.run import train

from .conftest import tiny_spec

QUIET = Progress(quiet=True)


def _spec(tmp_path, **training):
    path = tiny_spec(tmp_path, classes=3, channels=2,
                     training={"dataset": "Synth3", "batch_size": 8, "epochs": 4, "lr": 1e-2, **training})
    text = path.read_text().replace("depth: 2", "depth: 2\n  block: {dropout: 0.2}")  # dropout: RNG must resume too
    path.write_text(text)
    return path


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def _cut_after_two(spec, out, registry):
    """Train until a callback interrupts the run after epoch 2; returns the run's folder."""
    def stop_after_two(epoch, record):
        if epoch == 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(spec, output=out, registry=registry, progress=QUIET, on_epoch_end=stop_after_two)
    return out / "seed-0" / "lr-0.01"


def test_resume_after_interruption_is_bit_for_bit(tmp_path, synth_registry):
    spec = _spec(tmp_path)
    full = train(spec, output=tmp_path / "full", registry=synth_registry, progress=QUIET)
    trial = _cut_after_two(spec, tmp_path / "cut", synth_registry)
    state = json.loads((trial / "checkpoint" / "trainer.json").read_text())["trainer"]
    assert state["epochs_done"] == 2 and not (trial / "result.json").exists()
    with pytest.raises(ZooError, match="--resume"):
        train(spec, output=tmp_path / "cut", registry=synth_registry, progress=QUIET)
    resumed = train(spec, output=tmp_path / "cut", registry=synth_registry, progress=QUIET, resume=True)
    a, b = _weights(tmp_path / "full/seed-0/lr-0.01/checkpoint"), _weights(trial / "checkpoint")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    a, b = _weights(tmp_path / "full/seed-0/lr-0.01/best"), _weights(trial / "best")
    assert all(torch.equal(a[k], b[k]) for k in a)
    hist = lambda m: [(h["train_loss"], h["val_loss"]) for h in m["seeds"][0]["runs"][0]["history"]]  # noqa: E731
    assert hist(full) == hist(resumed) and len(hist(full)) == 4
    assert resumed["seeds"][0]["test"] == full["seeds"][0]["test"]


@pytest.mark.parametrize("legacy", [False, True])
def test_resumed_run_keeps_the_wall_clock_of_its_earlier_invocations(tmp_path, synth_registry, legacy):
    """A resumed run's wall counts the epochs run before the resume: the checkpoint carries it (one
    written before zoo-core kept it falls back to its epochs' sum), metrics.json says which part was
    earlier, and a finished run read back counts wholly as earlier."""
    spec = _spec(tmp_path)
    trial = _cut_after_two(spec, tmp_path / "cut", synth_registry)
    record = json.loads((trial / "checkpoint" / "trainer.json").read_text())
    if legacy:
        del record["trainer"]["wall_s"]
        (trial / "checkpoint" / "trainer.json").write_text(json.dumps(record))
        before = sum(h["time_s"] for h in record["trainer"]["history"])
    else:
        before = record["trainer"]["wall_s"]
        assert before >= sum(h["time_s"] for h in record["trainer"]["history"]) > 0
    resumed = train(spec, output=tmp_path / "cut", registry=synth_registry, progress=QUIET, resume=True)
    run = resumed["seeds"][0]["runs"][0]
    assert resumed["earlier_wall_s"] == run["earlier_wall_s"] == before
    stored = json.loads((trial / "result.json").read_text())
    assert "earlier_wall_s" not in stored and stored["wall_s"] == run["wall_s"]
    assert run["wall_s"] >= before + sum(h["time_s"] for h in run["history"][2:])  # epochs 3 and 4 ran here
    assert run["wall_s"] - before <= resumed["wall_time_s"]
    again = train(spec, output=tmp_path / "cut", registry=synth_registry, progress=QUIET, resume=True)
    assert again["earlier_wall_s"] == run["wall_s"]
    fresh = train(spec, output=tmp_path / "fresh", registry=synth_registry, progress=QUIET)
    assert fresh["earlier_wall_s"] == 0.0 and fresh["seeds"][0]["runs"][0]["wall_s"] <= fresh["wall_time_s"]


def test_resume_refuses_changed_settings(tmp_path, synth_registry):
    train(_spec(tmp_path, epochs=1), output=tmp_path / "r", registry=synth_registry, progress=QUIET)
    with pytest.raises(ZooError, match="different settings"):
        train(_spec(tmp_path, epochs=2), output=tmp_path / "r", registry=synth_registry, progress=QUIET, resume=True)


def test_early_stopping_ties_and_best_point(tmp_path, synth_registry):
    m = train(_spec(tmp_path, lr=1e-9, early_stop=2, epochs=10), output=tmp_path / "e", registry=synth_registry, progress=QUIET)
    run = m["seeds"][0]["runs"][0]
    accs = [h["val_accuracy"] for h in run["history"]]
    assert len(set(accs)) == 1  # a vanishing lr never changes the accuracy: every later epoch ties
    assert run["epochs_run"] == 3 and run["stopped_early"]  # epoch 1 sets the best, 2 and 3 do not improve strictly
    assert run["best_epoch"] == 3  # ties take the later checkpoint, as the seed's code


def test_stop_at_ends_a_run_once_validation_reaches_it(tmp_path, synth_registry):
    reached = train(_spec(tmp_path, stop_at=0.0, epochs=4), output=tmp_path / "s", registry=synth_registry, progress=QUIET)
    run = reached["seeds"][0]["runs"][0]
    assert run["epochs_run"] == 1 and run["best_epoch"] == 1  # any accuracy reaches 0.0
    never = train(_spec(tmp_path, stop_at=1.01, epochs=2), output=tmp_path / "n", registry=synth_registry, progress=QUIET)
    assert never["seeds"][0]["runs"][0]["epochs_run"] == 2  # an accuracy never reaches 1.01
    from zoo_core.spec.training import TrainingSpec
    assert "stop_at" not in TrainingSpec().model_dump() and TrainingSpec(stop_at=1.0).model_dump()["stop_at"] == 1.0


def test_lr_grid_picks_on_validation_and_metrics_json(tmp_path, synth_registry):
    m = train(_spec(tmp_path, lr=[1e-2, 1e-6], epochs=2, seeds=[2345, 3456]), output=tmp_path / "g",
              registry=synth_registry, progress=QUIET, command=["zoo", "train"])
    written = json.loads((tmp_path / "g" / "metrics.json").read_text())
    assert written["seeds"] == json.loads(json.dumps(m["seeds"]))
    for s in written["seeds"]:
        best = max(s["runs"], key=lambda r: r["val"]["accuracy"])
        assert s["lr"] == best["lr"] and s["test"] == best["test"] and len(s["runs"]) == 2
        assert all(len(r["history"]) == 2 and r["history"][0]["time_s"] > 0 for r in s["runs"])
    assert written["summary"]["test_accuracy"]["values"] == [s["test"]["accuracy"] for s in written["seeds"]]
    assert written["params"] > 0 and written["command"] == ["zoo", "train"] and written["seeds"][0]["split"]["sizes"]["train"] == 56
    if written["plot"]:
        assert (tmp_path / "g" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_non_finite_loss_names_epoch_and_step(tmp_path, synth_registry, monkeypatch):
    real = loop.per_sample_loss
    monkeypatch.setattr(loop, "per_sample_loss", lambda task, out, y: real(task, out, y) * float("nan"))
    with pytest.raises(TrainingDivergedError, match="epoch 1, step 1"):
        train(_spec(tmp_path), output=tmp_path / "n", registry=synth_registry, progress=QUIET)


def test_plain_progress_lines(tmp_path, synth_registry):
    import io

    stream = io.StringIO()
    train(_spec(tmp_path, epochs=2), output=tmp_path / "p", registry=synth_registry, progress=Progress(stream))
    lines = stream.getvalue().splitlines()
    assert any(line.startswith("epoch 2/2  train_loss") for line in lines) and "\r" not in stream.getvalue()


def test_language_model_on_a_stream_split_by_source(tmp_path, synth_registry):
    spec = {"schema_version": 1, "task": {"kind": "lm"}, "input": {"vocab_size": 5},
            "model": {"d_model": 8, "depth": 2, "core": {"kind": "lru", "preset": "tiny"}},
            "training": {"dataset": "SynthLM", "protocol": "official", "epochs": 3, "batch_size": 8, "lr": 3e-2}}
    m = train(spec, output=tmp_path / "lm", registry=synth_registry, progress=QUIET)
    run = m["seeds"][0]["runs"][0]
    assert m["metric"] == "loss" and run["test"]["bits_per_token"] > 0
    assert run["history"][-1]["val_loss"] < run["history"][0]["val_loss"]  # it learns the cycle
    assert m["seeds"][0]["split"]["sizes"] == {"train": 24, "val": 8, "test": 8}  # the dataset's own validation split


def test_plot_is_skipped_with_a_note_without_matplotlib(tmp_path, synth_registry, monkeypatch):
    import io

    from zoo_core.train import run as run_module

    monkeypatch.setattr("zoo_core.train.plot.plot_available", lambda: False)
    stream = io.StringIO()
    m = run_module.train(_spec(tmp_path, epochs=1), output=tmp_path / "np", registry=synth_registry, progress=Progress(stream))
    assert m["plot"] is None and not (tmp_path / "np" / "curves.png").exists()
    assert "matplotlib is not installed" in stream.getvalue()


def test_lm_targets_marked_ignore_are_not_scored():
    """Token tasks with targets at some positions only (MQAR queries, a selective copy's output part):
    IGNORE positions add nothing to the loss or the token accuracy."""
    import torch

    from zoo_core.train.loop import IGNORE, evaluate, per_sample_loss

    out = torch.randn(2, 5, 7)
    y = torch.randint(0, 7, (2, 5))
    y[0, :3] = IGNORE
    per = per_sample_loss("lm", out, y)
    ref0 = torch.nn.functional.cross_entropy(out[0, 3:], y[0, 3:])
    torch.testing.assert_close(per[0], ref0)
    torch.testing.assert_close(per[1], torch.nn.functional.cross_entropy(out[1], y[1]))
    garbage = out.clone()
    garbage[0, :3] = 1e4  # what the ignored positions predict does not matter
    torch.testing.assert_close(per_sample_loss("lm", garbage, y), per)

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return out[: x.shape[0]]

    y2 = out.argmax(-1).clone()
    y2[1, 4] = (y2[1, 4] + 1) % 7  # one wrong among the 2 + 5 scored
    y2[0, :3] = IGNORE
    m = evaluate(Fixed(), {"X": torch.zeros(2, 5, dtype=torch.long), "y": y2}, "lm", batch_size=2)
    assert m["accuracy"] == pytest.approx(6 / 7)


def test_token_classification_trains_on_token_input(tmp_path, synth_registry):
    """A classification dataset of tokens (ListOps-style: vocab_size, no channels) trains an embedding model."""
    spec = {"schema_version": 1, "task": {"kind": "classification", "classes": 3}, "input": {"vocab_size": 6},
            "model": {"d_model": 8, "depth": 1, "core": {"kind": "lru", "preset": "tiny"}, "pool": "last"},
            "training": {"dataset": "SynthTokens", "protocol": "official", "epochs": 2, "batch_size": 10, "lr": 3e-2}}
    m = train(spec, output=tmp_path / "tok", registry=synth_registry, progress=QUIET)
    run = m["seeds"][0]["runs"][0]
    assert 0 <= run["test"]["accuracy"] <= 1 and m["seeds"][0]["split"]["sizes"] == {"train": 30, "val": 9, "test": 9}
    bad = {**spec, "input": {"channels": 1}}
    with pytest.raises(SpecError, match="input.vocab_size is None but 'SynthTokens' uses 6 tokens"):
        train(bad, output=tmp_path / "bad", registry=synth_registry, progress=QUIET)


def test_unequal_length_batches_cut_token_targets_not_regression_targets():
    """_batch cuts an lm's per-step targets with the inputs, never a regression's (n, O), even when O = T."""
    import torch

    from zoo_core.train.loop import _batch

    lengths = torch.tensor([3, 2, 5])
    reg = {"X": torch.zeros(3, 5, 2), "y": torch.randn(3, 5), "lengths": lengths}
    x, y, _ = _batch(reg, torch.tensor([0, 1]))
    assert x.shape == (2, 3, 2) and y.shape == (2, 5)
    lm = {"X": torch.zeros(3, 5, dtype=torch.long), "y": torch.zeros(3, 5, dtype=torch.long), "lengths": lengths}
    x, y, _ = _batch(lm, torch.tensor([0, 1]))
    assert x.shape == (2, 3) and y.shape == (2, 3)


def test_lm_training_weighs_each_scored_token_alike():
    """With targets at some positions only, the batch loss is the mean over the batch's scored tokens
    (Zoology's), so a query in a short row weighs what one in a long row does; evaluation agrees."""
    import torch

    from zoo_core.train.loop import IGNORE, evaluate, per_sample_loss

    out = torch.randn(2, 6, 5)
    y = torch.full((2, 6), IGNORE)
    y[0, 5] = 1  # one scored token
    y[1, :] = torch.tensor([0, 1, 2, 3, 4, 0])  # six
    per = per_sample_loss("lm", out, y)
    counts = (y != IGNORE).sum(1).to(per)
    token_mean = torch.nn.functional.cross_entropy(out.reshape(-1, 5), y.reshape(-1), ignore_index=IGNORE)
    torch.testing.assert_close((per * counts).sum() / counts.sum(), token_mean)

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return out[: x.shape[0]]

    m = evaluate(Fixed(), {"X": torch.zeros(2, 6, dtype=torch.long), "y": y}, "lm", batch_size=2)
    assert m["loss"] == pytest.approx(float(token_mean), rel=1e-6)


def test_a_run_records_the_backends_its_cores_ran(tmp_path, synth_registry):
    """result.json (and so metrics.json and a sweep's row) names each core's bound path and ops with the
    reason, as bound after the move to the run's device, so a slow epoch can be told from a fallback."""
    m = train(_spec(tmp_path, epochs=1), output=tmp_path / "b", registry=synth_registry, progress=QUIET)
    (line,) = m["seeds"][0]["runs"][0]["backends"]  # the two blocks' LRU cores bound the same
    assert line.startswith("LRU: ") and "=" in line and line.endswith("]"), line
    stored = json.loads((tmp_path / "b" / "seed-0" / "lr-0.01" / "result.json").read_text())
    assert stored["backends"] == [line]
