"""benchmarks/tasks: the extrapolation evaluation (streamed = parallel, the memory fallback, resuming)
and TASKS.md's rendering from a fixture results file (no training)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.tasks import extrapolate as ex
from benchmarks.tasks import make_tables as mt
from zoo_core.build import build_model
from zoo_core.datasets import SplitData
from zoo_core.io.pretrained import save_pretrained
from zoo_core.train.loop import IGNORE, evaluate
from zoo_core.train.plot import plot_available

V = 16


def _model(kind: str = "lru", **core: object) -> torch.nn.Module:
    spec = {"schema_version": 1, "task": {"kind": "lm"}, "input": {"vocab_size": V},
            "model": {"d_model": 8, "depth": 2, "block": {"norm": "rms", "activation": "gelu", "output": "glu"},
                      "final_norm": "rms", "core": {"kind": kind, "preset": "tiny", **core}}}
    return build_model(spec, seed=0).eval()


def _split(model: torch.nn.Module, n: int = 6, length: int = 41) -> SplitData:
    """Random tokens; targets at a few late positions, half of them the model's own greedy choice
    (so the accuracy is strictly between 0 and 1 and any mismatch of streamed logits shows)."""
    g = torch.Generator().manual_seed(1)
    X = torch.randint(0, V, (n, length), generator=g)
    with torch.no_grad():
        pred = model(X).argmax(-1)
    y = torch.full_like(X, IGNORE)
    for j, t in enumerate((length - 9, length - 5, length - 1)):
        y[:, t] = pred[:, t] if j % 2 == 0 else torch.randint(0, V, (n,), generator=g)
    return SplitData(X.numpy(), y.numpy(), None)


@pytest.mark.parametrize("chunk", [1, 7])
def test_streamed_equals_parallel(chunk: int) -> None:
    model = _model()
    split = _split(model)
    data = {"X": torch.from_numpy(split.X), "y": torch.from_numpy(split.y)}
    parallel = evaluate(model, data, "lm", 4)["accuracy"]
    correct, scored = ex.streamed_accuracy(model, data["X"], data["y"], batch=4, chunk=chunk)
    assert scored == 18
    assert 0 < parallel < 1
    assert correct / scored == pytest.approx(parallel)


def test_budget_too_small_streams_and_agrees() -> None:
    model = _model()
    split = _split(model)
    mem = ex.MemoryModel(model, grows=False)
    par = ex.score(model, split, mem=mem, budget=10**12, batch=4, chunk=5)
    st = ex.score(model, split, mem=mem, budget=1, batch=4, chunk=5)
    assert isinstance(par, ex.Score) and isinstance(st, ex.Score)
    assert (par.how, st.how) == ("parallel", "streamed")
    assert st.accuracy == pytest.approx(par.accuracy)


def test_growing_state_is_not_streamable() -> None:
    model = _model("attention", n_heads=2)
    ok, why = ex.streamable(model)
    assert not ok and "grows" in why
    res = ex.score(model, _split(model), mem=ex.MemoryModel(model, grows=True), budget=1, batch=4, chunk=5)
    assert isinstance(res, str) and res.startswith("not streamable")


def test_variants_lists_the_lengths_and_the_base() -> None:
    names = ["induction-heads", "induction-heads-L64", "induction-heads-L1024", "induction-heads-paper", "mqar-small"]
    assert ex.variants("induction-heads", names) == {64: "induction-heads-L64", 256: "induction-heads",
                                                     1024: "induction-heads-L1024"}
    assert ex.variants("mqar-small", names) == {}


def test_run_is_resumable(tmp_path: Path) -> None:
    model = _model()
    save_pretrained(model, tmp_path / "runs" / "lru" / "best")
    results = tmp_path / "ih.jsonl"
    row = {"key": "lru/induction-heads/seed-0/lr-0.001", "status": "ok", "spec": "lru", "dataset": "induction-heads",
           "seed": 0, "lr": 0.001, "model_dir": "lru/best"}
    results.write_text(json.dumps(row) + "\n" + json.dumps({**row, "key": "x", "status": "failed"}) + "\n")
    out = tmp_path / "ih-extrapolation.jsonl"
    kw: dict[str, Any] = {"max_length": 128, "limit": 3, "batch": 2, "chunk": 16}
    assert ex.run_results(results, tmp_path / "runs", out, **kw) == 2  # L64, L128 (the base, 256, is past max_length)
    lines = out.read_text().splitlines()
    assert [json.loads(x)["length"] for x in lines] == [64, 128]
    assert all(json.loads(x)["status"] == "ok" and json.loads(x)["sequences"] == 3 for x in lines)
    assert ex.run_results(results, tmp_path / "runs", out, **kw) == 0  # all done: nothing again
    other = tmp_path / "other.jsonl"  # a row made with other settings than the sweep file's now: not scored
    assert ex.run_results(results, tmp_path / "runs", other, **kw, keep={str(row["key"]): "another-hash"}) == 0
    out.write_text(lines[0] + "\n")  # one length lost (a kill): only it runs again
    assert ex.run_results(results, tmp_path / "runs", out, **kw) == 1
    assert json.loads(out.read_text().splitlines()[1])["key"].endswith("@L128")
    streamed = tmp_path / "streamed.jsonl"
    ex.run_results(results, tmp_path / "runs", streamed, **kw, force="streamed")
    acc = [json.loads(x)["accuracy"] for x in out.read_text().splitlines()]
    assert [json.loads(x)["accuracy"] for x in streamed.read_text().splitlines()] == pytest.approx(acc)
    assert np.isfinite(acc).all()
    # a row whose run folder holds no finished run (the sweep training the cell again) is not scored from its
    # half-trained best model; once the run has finished it is
    running = tmp_path / "running.jsonl"
    results.write_text(json.dumps({**row, "run_dir": "lru"}) + "\n")
    assert ex.run_results(results, tmp_path / "runs", running, **kw) == 0 and not running.exists()
    (tmp_path / "runs" / "lru" / "metrics.json").write_text("{}")
    (tmp_path / "runs" / "lru" / "seed-0" / "lr-0.001").mkdir(parents=True)
    (tmp_path / "runs" / "lru" / "seed-0" / "lr-0.001" / "result.json").write_text("{}")
    assert ex.run_results(results, tmp_path / "runs", running, **kw) == 2
    # a committed results row whose run folder is not on this machine is skipped, and says so; nothing written
    gone = tmp_path / "gone.jsonl"
    results.write_text(json.dumps({**row, "model_dir": "lru/not-here"}) + "\n")
    assert ex.run_results(results, tmp_path / "runs", gone, **kw) == 0
    assert not gone.exists()


# TASKS.md ------------------------------------------------------------------------------------------
def _row(spec: str, seed: int, acc: float, lr: float = 1e-3, val: float | None = None) -> dict:
    return {"key": f"{spec}/toy/seed-{seed}/lr-{lr:g}", "status": "ok", "spec": spec, "dataset": "toy", "seed": seed,
            "lr": lr, "axes": {}, "metric": "accuracy", "test": {"accuracy": acc}, "val": {"accuracy": acc if val is None else val},
            "wall_s": 10.0 + seed, "params": 1234, "epoch_time_s": [2.0, 3.0, 4.0], "when": f"2026-01-0{seed + 1}T10:00:00"}


def _ext(spec: str, seed: int, length: int, acc: float | None, how: str = "parallel", status: str = "ok") -> dict:
    return {"key": f"{spec}/toy/seed-{seed}/lr-0.001@L{length}", "spec": spec, "seed": seed, "length": length,
            "status": status, "accuracy": acc, "how": how, "sequences": 8 if length < 4096 else 4, "when": "2026-01-05T00:00:00"}


def _fixture_task() -> "mt.Task":
    rows = [_row("a", 0, 0.5), _row("a", 1, 0.6), _row("a", 2, 0.7), _row("b", 0, 0.2), _row("b", 1, 0.4),
            _row("a", 0, 0.99, lr=1e-4, val=0.1)]  # a worse lr on validation: not picked, whatever its test score
    ext = [_ext("a", s, L, 0.1 * (s + 1)) for s in range(3) for L in (64, 256)]
    ext += [_ext("a", s, 4096, 0.5, how="streamed") for s in range(3)] + [_ext("b", 0, 4096, None, status="not streamable")]
    return mt.Task("toy", "benchmarks/tasks/sweeps/toy.yaml", ["a", "b", "c"], {"a": 3, "b": 3, "c": 3}, 9, rows, ext)


PUBLISHED = [{"task": "toy", "model": "Paper-A", "metric": "accuracy (%)", "value": 97.0, "setting": "length 4096",
              "source": {"paper": "Someone, Paper: a title", "where": "Table 1 (p. 3)", "arxiv": "1234.5678"}}]


def test_tables_render_deterministically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(mt.PUBLISHED_FOR, "toy", {"a": [("Paper-A", None, "A")]})
    monkeypatch.setitem(mt.PUBLISHED_TASK, "toy", "toy")
    reading = tmp_path / "reading"
    reading.mkdir()
    (reading / "toy.md").write_text("Core a beats b here.\n")
    kw: dict[str, Any] = {"reading_dir": reading, "plot_dir": tmp_path / "plots", "doc_dir": tmp_path, "train_lengths": {"toy": 256}}
    text = mt.render([_fixture_task()], PUBLISHED, **kw)
    assert text == mt.render([_fixture_task()], PUBLISHED, **kw)  # reruns write the same file
    lines = text.splitlines()
    assert "| a | 60.0 ± 10.0 (3) | 1,234 | 3.0 | 97.0 (A; Someone, Paper, Table 1, arXiv 1234.5678) |" in lines
    assert "| b | 30.0 ± 14.1 (2, partial: 2 of 3 seeds) | 1,234 | 3.0 | — |" in lines
    assert "| c | not run yet | — | — | — |" in lines
    assert "| core | 64 | **256 (train)** | 4,096 |" in lines
    assert "| a | 20.0 ± 10.0 (3) | 20.0 ± 10.0 (3) | 50.0 ± 0.0 (3)ˢ |" in lines
    assert "| b | — | — | not streamable |" in lines
    assert "| *sequences per length* | 8 | 8 | 4 |" in lines
    assert "- toy: 6 of 9 cells finished; 9 extrapolation scores." in lines  # the lr-1e-4 row is a sixth cell
    assert "the newest result line is from 2026-01-05 00:00:00" in text
    assert "Core a beats b here." in lines
    if plot_available():
        assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["toy-accuracy-vs-wall.png", "toy-extrapolation.png"]
        assert "![toy-extrapolation](plots/toy-extrapolation.png)" in lines


def test_missing_reading_says_so(tmp_path: Path) -> None:
    text = mt.render([_fixture_task()], [], reading_dir=tmp_path / "none", plot_dir=tmp_path / "plots", doc_dir=tmp_path)
    assert "still to be written" in text and "### Reading: toy" in text


def test_a_sweep_named_apart_from_its_dataset_finds_its_rows(tmp_path: Path) -> None:
    """The induction-heads sweep trains on induction-heads-short: rows are grouped by their dataset."""
    task = _fixture_task()
    task.rows = [{**r, "dataset": "toy-short"} for r in task.rows]
    kw: dict[str, Any] = {"reading_dir": tmp_path, "plot_dir": tmp_path / "plots", "doc_dir": tmp_path}
    assert "| a | not run yet |" in mt.render([task], [], **kw)  # looked up under the sweep's name: nothing
    task.dataset = "toy-short"
    assert "| a | 60.0 ± 10.0 (3) | 1,234 | 3.0 | — |" in mt.render([task], [], **kw).splitlines()


def test_a_companion_sweep_adds_a_width_table_beside_the_main_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mqar-width's cells (width 32, 128) are read into mqar-small's section, its own cells the width-64 column."""
    monkeypatch.setitem(mt.COMPANIONS, "toy", ("toy-width", "width", "64"))
    task = _fixture_task()
    wide = [{**_row(spec, 0, acc), "key": f"{spec}/toy/width={w}/seed-0/lr-0.001", "axes": {"width": w}}
            for spec, w, acc in (("a", "32", 0.25), ("a", "128", 0.75), ("b", "128", 0.5))]
    task.companion = mt.Task("toy-width", "benchmarks/tasks/sweeps/toy-width.yaml", ["a", "b"], {"a": 1, "b": 1}, 4, wide)
    kw: dict[str, Any] = {"reading_dir": tmp_path, "plot_dir": tmp_path / "plots", "doc_dir": tmp_path}
    lines = mt.render([task], [], **kw).splitlines()
    assert "| core | 32 | **64 (main table)** | 128 |" in lines
    assert "| a | 25.0 (1) | 60.0 ± 10.0 (3) | 75.0 (1) |" in lines
    assert "| b | — | 30.0 ± 14.1 (2) | 50.0 (1) |" in lines
    assert "- toy-width (read into toy): 3 of 4 cells finished." in lines
    assert "| a | 60.0 ± 10.0 (3) | 1,234 | 3.0 | — |" in lines  # the main table keeps only the section's own cells
    if plot_available():
        assert (tmp_path / "plots" / "toy-accuracy-vs-width.png").is_file()
    task.companion = None  # no companion: no width table
    assert "by model width" not in mt.render([task], [], **kw)


def test_a_sweep_of_two_datasets_gets_a_column_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pixel-mnist trains every core on sMNIST and psMNIST: one accuracy column per dataset, each partial on its
    own, and the published figures named by their dataset."""
    monkeypatch.setitem(mt.PUBLISHED_FOR, "toy", {"a": [("Paper-A", None, "A")]})
    monkeypatch.setitem(mt.PUBLISHED_TASK, "toy", ("toy", "toy-p"))
    task = _fixture_task()
    task.rows += [{**_row("a", s, acc), "key": f"a/toy-p/seed-{s}/lr-0.001", "dataset": "toy-p"}
                  for s, acc in ((0, 0.25), (1, 0.35))]
    task.dataset, task.datasets, task.extrapolation = "toy", ["toy", "toy-p"], []
    published = PUBLISHED + [{**PUBLISHED[0], "task": "toy-p", "value": 90.0}]
    kw: dict[str, Any] = {"reading_dir": tmp_path, "plot_dir": tmp_path / "plots", "doc_dir": tmp_path}
    lines = mt.render([task], published, **kw).splitlines()
    assert "| core | toy test accuracy (%) | toy-p test accuracy (%) | params | s / epoch | published (source) |" in lines
    assert ("| a | 60.0 ± 10.0 (3) | 30.0 ± 7.1 (2, partial: 2 of 3 seeds) | 1,234 | 3.0 | "
            "toy 97.0, toy-p 90.0 (A; Someone, Paper, Table 1, arXiv 1234.5678) |") in lines
    assert "| b | 30.0 ± 14.1 (2, partial: 2 of 3 seeds) | not run yet | 1,234 | 3.0 | — |" in lines
    assert "| c | not run yet | not run yet | — | — | — |" in lines
    if plot_available():
        assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["toy-toy-accuracy-vs-wall.png",
                                                                         "toy-toy-p-accuracy-vs-wall.png"]


@pytest.mark.parametrize("sweep_file", sorted((Path(__file__).parents[1] / "benchmarks/tasks/sweeps").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_committed_task_sweep_builds_its_models(sweep_file: Path) -> None:
    """A sweep file in the repository loads, and each core's merged spec builds (one cell per core)."""
    from zoo_core.sweep.config import load_sweep

    sweep = load_sweep(sweep_file)
    assert sweep.cells
    for cell in {c.spec_label: c for c in sweep.cells}.values():
        model = build_model(cell.spec, seed=0)
        assert sum(p.numel() for p in model.parameters()) > 0, cell.key


def test_rows_run_elsewhere_are_merged_by_key_and_never_replace_a_local_row(tmp_path: Path, capsys: Any) -> None:
    """benchmarks/tasks/merge_results.py (rows back from device_sweep.sh): new finished cells appended as
    they are; failed ones skipped; a key the local file holds kept, and named when its settings differ."""
    from benchmarks.tasks import merge_results as mr

    def row(key: str, status: str = "ok", h: str = "a", acc: float = 0.5) -> dict[str, Any]:
        return {"key": key, "status": status, "config_hash": h, "metric": "accuracy", "test": {"accuracy": acc}, "device": "cuda:0"}

    local, returned = tmp_path / "local.jsonl", tmp_path / "returned.jsonl"
    local.write_text(json.dumps(row("s4/P/seed-0", acc=0.9)) + "\n" + '{"key": "cut sh')  # a killed writer's half line
    returned.write_text("".join(json.dumps(r) + "\n" for r in [row("s4/P/seed-0", h="b"), row("s4/P/seed-1"),
                                                                row("s5/P/seed-1", status="failed")]))
    assert mr.main([str(returned), str(local)]) == 0
    from zoo_core.sweep.results import read_rows

    rows = read_rows(local)  # the half line skipped, and ended: the appended rows start on lines of their own
    assert '"cut sh\n{' in local.read_text()
    assert [(r["key"], r["test"]["accuracy"]) for r in rows] == [("s4/P/seed-0", 0.9), ("s4/P/seed-1", 0.5)]
    out = capsys.readouterr().out
    assert "kept the local s4/P/seed-0: the returned one ran other settings (b)" in out and "1 cell(s) added" in out
    assert mr.main([str(returned), str(local)]) == 0 and len(read_rows(local)) == 2  # idempotent
