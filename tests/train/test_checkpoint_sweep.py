"""Checkpoints go through the atomic folder writer (no scratch copy), and what a killed write leaves
in a run folder is swept when the run starts or resumes: our own names only, never the user's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

from zoo_core.train import state as state_module
from zoo_core.train.progress import Progress
from zoo_core.train.run import train

from .conftest import tiny_spec

QUIET = Progress(quiet=True)
CONFTEST = Path(__file__).with_name("conftest.py")

# trains the spec in a child process and kills it (os._exit, no cleanup) inside the third checkpoint write
KILLED_RUN = textwrap.dedent("""
    import importlib.util, os, sys
    spec = importlib.util.spec_from_file_location("synth_conftest", sys.argv[1])
    conf = importlib.util.module_from_spec(spec); spec.loader.exec_module(conf)
    from zoo_core.plugins import entry_point_sources, inline_source, load_registry
    from zoo_core.train import state
    from zoo_core.train.progress import Progress
    from zoo_core.train.run import train
    real, calls = state.save_file, []
    def dying_save_file(tensors, path):
        calls.append(path)
        real(tensors, path)
        if len(calls) == 3:
            os._exit(9)  # a kill in the middle of the checkpoint: the staging folder is left behind
    state.save_file = dying_save_file
    registry = load_registry([*entry_point_sources(), inline_source("synth", conf.SynthPlugin)])
    train(sys.argv[2], output=sys.argv[3], registry=registry, progress=Progress(quiet=True))
""")


def _spec(tmp_path: Path) -> Path:
    return tiny_spec(tmp_path, classes=3, channels=2, training={"dataset": "Synth3", "batch_size": 8, "epochs": 4, "lr": 1e-2})


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _history(metrics: dict) -> list[tuple[float, float]]:
    return [(h["train_loss"], h["val_loss"]) for h in metrics["seeds"][0]["runs"][0]["history"]]


def test_checkpoints_write_no_scratch_copy_beside_the_staging_folder(tmp_path, monkeypatch):
    from zoo_core.build import build_model

    spec = json.loads(json.dumps({"schema_version": 1, "task": {"kind": "classification", "classes": 3}, "input": {"channels": 2},
                                  "model": {"d_model": 8, "depth": 1, "core": {"kind": "lru", "preset": "tiny"}}}))
    model = build_model(spec, seed=0)
    opt = torch.optim.Adam(model.parameters())
    seen: list[list[str]] = []
    real = state_module.save_file

    def watching(tensors: dict, path: str) -> None:
        seen.append(sorted(os.listdir(tmp_path)))  # what the run folder holds while the checkpoint is written
        real(tensors, path)

    monkeypatch.setattr(state_module, "save_file", watching)
    state_module.save_checkpoint(tmp_path / "checkpoint", model, opt, {"epochs_done": 0})
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith(".checkpoint.staging-"), seen
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]


def test_a_run_killed_inside_a_checkpoint_resumes_bit_for_bit_and_its_litter_is_swept(tmp_path, synth_registry):
    spec = _spec(tmp_path)
    full = train(spec, output=tmp_path / "full", registry=synth_registry, progress=QUIET)
    out = tmp_path / "cut"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", KILLED_RUN, str(CONFTEST), str(spec), str(out)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 9, done.stderr
    trial = out / "seed-0" / "lr-0.01"
    left = [p.name for p in trial.iterdir() if p.name.startswith(".checkpoint.staging-")]
    assert len(left) == 1, sorted(os.listdir(trial))  # the kill left its staging folder, as a real kill does

    dead = _dead_pid()
    ours = {  # what earlier kills left: our naming patterns, dead writers
        f".best.staging-{dead}-0badc0de": ["model.safetensors"],
        f".result.json.tmp-{dead}-12345678": None,
        ".ckpt-abcd_123": ["model"],  # the scratch folder of earlier versions (tempfile.mkdtemp)
        ".ckpt-zz99xx88": [],
    }
    users = {  # the user's: other names, or our pattern with contents we never write there, or a live writer
        ".ckpt-notes": ["todo.txt"],
        ".ckpt-abcd5678": ["mine.txt"],
        "notes": ["a.txt"],
        ".checkpoint.staging-notapid": ["x"],
        f".best.staging-{os.getppid()}-0000beef": ["model.safetensors"],  # a live writer (the parent process): kept
        "checkpoint-backup": ["trainer.json"],
    }
    for name, contents in {**ours, **users}.items():
        path = trial / name
        if contents is None:
            path.write_bytes(b"half")
            continue
        path.mkdir()
        for child in contents:
            (path / child).mkdir() if child == "model" else (path / child).write_text("mine")

    resumed = train(spec, output=out, registry=synth_registry, progress=QUIET, resume=True)
    present = set(os.listdir(trial))
    assert not present & {*ours, *left}, sorted(present)
    assert set(users) <= present and all((trial / n / c).exists() for n, cs in users.items() for c in cs or [])
    assert _history(resumed) == _history(full) and resumed["seeds"][0]["test"] == full["seeds"][0]["test"]
    a, b = load_file(str(tmp_path / "full/seed-0/lr-0.01/best/model.safetensors")), load_file(str(trial / "best/model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_killed_between_its_two_renames_is_restored_not_restarted(tmp_path, synth_registry):
    spec = _spec(tmp_path)
    full = train(spec, output=tmp_path / "full", registry=synth_registry, progress=QUIET)

    def stop_after_two(epoch: int, record: dict) -> None:
        if epoch == 2:
            from zoo_core.train.loop import Interrupted

            raise Interrupted

    out = tmp_path / "cut"
    try:
        train(spec, output=out, registry=synth_registry, progress=QUIET, on_epoch_end=stop_after_two)
    except Exception as exc:  # Interrupted
        assert type(exc).__name__ == "Interrupted"
    trial = out / "seed-0" / "lr-0.01"
    os.rename(trial / "checkpoint", trial / f".checkpoint.old-{_dead_pid()}-a1b2c3d4")  # killed between the renames
    ran: list[int] = []
    resumed = train(spec, output=out, registry=synth_registry, progress=QUIET, resume=True,
                    on_epoch_end=lambda epoch, record: ran.append(epoch))
    assert ran == [3, 4]  # resumed from epoch 2's checkpoint (restored), not started over
    assert _history(resumed) == _history(full)
    assert not [p for p in os.listdir(trial) if p.startswith(".checkpoint.")]
