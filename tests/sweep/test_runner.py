"""The scheduler on stand-in cells (tests/sweep/conftest.py::FAKE_TRAIN): parallel workers, one JSONL
line per cell, failures recorded without stopping the sweep, resume, the folder lock, the report."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from zoo_core.cli.zoo import main as zoo
from zoo_core.errors import ZooError
from zoo_core.sweep import load_sweep, render_report, run_sweep
from zoo_core.sweep.results import append, latest, read_rows
from zoo_core.sweep.runner import folder_lock
from zoo_core.train.progress import Progress

from .conftest import write_sweep

BODY = {"output": "out", "seeds": [1, 2], "lrs": [0.1, 0.5, 0.2]}


def _starts(sweep_out: Path) -> dict[str, int]:
    return {str(p.parent.relative_to(sweep_out)): len(p.read_text()) for p in sweep_out.rglob("starts.txt")}


def test_cells_run_on_workers_and_a_failed_cell_is_recorded_without_stopping_the_sweep(tmp_path: Path, fake_train: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, BODY), validate=False)
    log = io.StringIO()
    summary = run_sweep(sweep, workers=2, progress=Progress(log, bar=False))
    rows = read_rows(sweep.results)
    assert len(rows) == 6 and {r["key"] for r in rows} == {c.key for c in sweep.cells}
    failed = [r for r in rows if r["status"] == "failed"]
    assert sorted(r["lr"] for r in failed) == [0.5, 0.5] and summary.failed == failed
    assert failed[0]["error"].splitlines()[0] == "exit code 2: zoo train: error: the fake run diverged (lr 0.5)"
    assert "Traceback" in failed[0]["error"] and "log.txt" in failed[0]["error"]  # the log's tail, and where the rest is
    ok = next(r for r in rows if r["key"] == "tiny/BasicMotions/seed-2/lr-0.2")
    assert ok["test"]["accuracy"] == pytest.approx(0.9) and ok["params"] == 800 and ok["epochs_run"] == 1
    assert ok["command"].startswith("OMP_NUM_THREADS=1 zoo train ") and ok["command"].endswith("--resume --device auto")
    assert ok["run_dir"] == "tiny/BasicMotions/seed-2/lr-0.2" and (sweep.output / ok["run_dir"] / "spec.yaml").is_file()
    assert ok["wall_s"] > 0 and ok["epoch_time_s"] == [0.01] and ok["config_hash"] == sweep.cells[-1].config_hash
    assert ok["cell_wall_s"] == pytest.approx(ok["wall_s"] + 2.5, abs=2e-3)  # the fake's seed 2 "resumed" after 2.5 s
    text = log.getvalue()
    assert "6 cells, 0 finished before, 6 to run (2 local worker(s))" in text
    assert "[6/6: 4 done, 0 running, 2 failed, ETA" in text and "FAILED: exit code 2" in text


def test_a_rerun_skips_finished_cells_and_retries_failed_or_incomplete_ones(tmp_path: Path, fake_train: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, BODY), validate=False)
    run_sweep(sweep, workers=2, progress=Progress(quiet=True))
    (sweep.output / "tiny/BasicMotions/seed-1/lr-0.1/seed-1/lr-0.1/result.json").unlink()  # its run is not complete
    with sweep.results.open("a") as f:
        f.write('{"key": "tiny/Basic')  # a line cut short by a kill
    log = io.StringIO()
    summary = run_sweep(sweep, workers=2, progress=Progress(log, bar=False))
    assert "3 to run (1 of them have a results row but no finished run folder here: trained again; --missing" in log.getvalue()
    assert summary.skipped == 3 and sorted(r["key"] for r in summary.rows) == [
        "tiny/BasicMotions/seed-1/lr-0.1", "tiny/BasicMotions/seed-1/lr-0.5", "tiny/BasicMotions/seed-2/lr-0.5"]
    starts = _starts(sweep.output)
    assert starts["tiny/BasicMotions/seed-2/lr-0.2"] == 1 and starts["tiny/BasicMotions/seed-1/lr-0.1"] == 2
    rows = read_rows(sweep.results)
    assert len(rows) == 6 + 3 and len(latest(sweep.results)) == 6  # the cut line skipped; the next one on its own line
    append(sweep.results, {"key": "x"})
    assert read_rows(sweep.results)[-1] == {"key": "x"}


def test_missing_trusts_the_results_file_on_a_fresh_clone_and_still_retries_failed_cells(
        tmp_path: Path, fake_train: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fresh clone has the committed results.jsonl but not the ignored run folders: by default every
    finished cell trains again (said so); with --missing only the cells without an ok row run."""
    import shutil

    path = write_sweep(tmp_path, {"output": "out", "seeds": [1, 2], "lrs": [0.1, 0.5]})
    sweep = load_sweep(path, validate=False)
    run_sweep(sweep, workers=2, progress=Progress(quiet=True))  # lr 0.1 ok, lr 0.5 failed
    shutil.rmtree(sweep.output / "tiny")
    assert zoo(["sweep", str(path), "--missing", "--list"]) == 0
    listed = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["tiny/BasicMotions/seed-1/lr-0.5", "tiny/BasicMotions/seed-2/lr-0.5"]
    log = io.StringIO()
    summary = run_sweep(sweep, workers=2, progress=Progress(log, bar=False), missing=True)
    assert "4 cells, 2 finished before, 2 to run (2 local worker(s))" in log.getvalue()
    assert summary.skipped == 2 and sorted(r["key"] for r in summary.rows) == listed
    assert set(_starts(sweep.output)) == {"tiny/BasicMotions/seed-1/lr-0.5", "tiny/BasicMotions/seed-2/lr-0.5"}
    log = io.StringIO()
    run_sweep(sweep, workers=2, only=lambda c: c.lr == 0.1, progress=Progress(log, bar=False))  # the default: trained again
    assert "2 to run (2 of them have a results row but no finished run folder here: trained again; --missing would skip them)" \
        in log.getvalue()
    assert _starts(sweep.output)["tiny/BasicMotions/seed-1/lr-0.1"] == 1


def test_a_finished_cell_with_other_settings_is_an_error_naming_the_way_out(tmp_path: Path, fake_train: Path) -> None:
    path = write_sweep(tmp_path, {"output": "out", "lrs": [0.1]})
    run_sweep(load_sweep(path, validate=False), progress=Progress(quiet=True))
    changed = write_sweep(tmp_path, {"output": "out", "lrs": [0.1], "training": {"epochs": 2}})
    with pytest.raises(ZooError, match=r"cell tiny/BasicMotions/seed-0/lr-0.1 finished earlier with other settings.*delete its folder"):
        run_sweep(load_sweep(changed, validate=False), progress=Progress(quiet=True))


def test_two_sweeps_cannot_write_one_folder_at_once(tmp_path: Path, fake_train: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {"output": "out"}), validate=False)
    with folder_lock(sweep.output), pytest.raises(ZooError, match=r"another zoo sweep \(pid \d+\) is running in"):
        run_sweep(sweep, progress=Progress(quiet=True))
    run_sweep(sweep, progress=Progress(quiet=True))  # released


def test_the_report_picks_each_seeds_lr_on_validation(tmp_path: Path, fake_train: Path) -> None:
    body = {"output": "out", "seeds": [1, 2], "lrs": [0.1, 0.2],
            "axes": {"width": {"8": {}, "16": {"model": {"d_model": 16}}}}}
    sweep = load_sweep(write_sweep(tmp_path, body), validate=False)
    run_sweep(sweep, workers=2, progress=Progress(quiet=True))
    md, pngs = render_report(sweep.results, tmp_path / "report", title="t")
    text = md.read_text()
    # lr 0.2 tests higher but validates 0.3 lower: lr 0.1 is picked for both seeds (test 0.7, 0.8)
    assert "| spec | width | test accuracy (%) | seeds | lr picked | params |" in text
    assert "| tiny | 8 | 75.00 ± 7.07 | 2 | 0.1 | 800 |" in text.split("| tiny | 16 | 75.00 ± 7.07 | 2 | 0.1 | 1,600 |")[0]
    if pngs:  # matplotlib installed
        assert {p.name for p in pngs} == {"BasicMotions-accuracy-vs-wall.png", "BasicMotions-accuracy-vs-width.png"}


def test_zoo_sweep_lists_runs_reports_and_exits_1_when_a_cell_failed(tmp_path: Path, fake_train: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path, {"output": "out", "lrs": [0.1, 0.5]})
    assert zoo(["sweep", str(path), "--list"]) == 0
    assert "tiny/BasicMotions/seed-0/lr-0.5\tOMP_NUM_THREADS=1 zoo train " in capsys.readouterr().out
    assert zoo(["sweep", str(path), "--plain", "--only", "*lr-0.1"]) == 0
    assert "1 cells: 0 finished before, 1 finished now, 0 failed" in capsys.readouterr().out
    assert zoo(["sweep", str(path), "--plain"]) == 1
    out = capsys.readouterr().out
    assert "2 cells: 1 finished before, 0 finished now, 1 failed" in out and "failed: tiny/BasicMotions/seed-0/lr-0.5: exit code 2" in out
    assert zoo(["sweep", "--report", str(tmp_path / "out")]) == 0
    assert "## Failed cells" in capsys.readouterr().out
    assert json.loads((tmp_path / "out/results.jsonl").read_text().splitlines()[0])["status"] == "ok"
    assert zoo(["sweep", "--report", str(tmp_path / "nowhere.yaml")]) == 2


def test_report_keeps_only_the_sweeps_current_cells_and_never_mixes_metrics(tmp_path):
    """A row left by an older grid (another lr, other settings) never competes for the lr pick, and a
    loss-selected spec gets its own table instead of a loss printed as a percentage."""
    import json

    from zoo_core.sweep.report import render_report

    def row(key, spec, lr, val, test, metric="accuracy", h="h1"):
        return {"key": key, "status": "ok", "spec": spec, "dataset": "D", "seed": 0, "lr": lr, "axes": {},
                "config_hash": h, "metric": metric, "val": {metric: val}, "test": {metric: test}, "params": 10,
                "wall_s": 1.0, "epoch_time_s": [0.1]}

    rows = [row("a/D/seed-0/lr-0.1", "a", 0.1, 0.99, 0.11),  # stale: lr 0.1 is no longer in the grid
            row("a/D/seed-0/lr-0.2", "a", 0.2, 0.50, 0.90),
            row("b/D/seed-0/lr-0.2", "b", 0.2, 2.0, 2.5, metric="loss")]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md, _ = render_report(results, tmp_path / "rep", title="t", keep={"a/D/seed-0/lr-0.2": "h1", "b/D/seed-0/lr-0.2": "h1"})
    text = md.read_text()
    assert "1 row(s) of cells no longer in the sweep" in text
    assert "| a | 90.00 ± 0.00 | 1 | 0.2 |" in text and "11.00" not in text
    assert "D (loss)" in text and "250.00" not in text and "2.5000 ± 0.0000" in text


def test_a_cells_wall_clock_counts_the_invocations_before_its_resume(tmp_path):
    """The report's wall-clock is ``cell_wall_s``; a row written before it existed, whose last
    invocation resumed a checkpoint, falls back to its training epochs' sum where that is larger."""
    import json

    from zoo_core.sweep.report import cell_wall, render_report

    base = {"status": "ok", "dataset": "D", "lr": 0.1, "axes": {}, "config_hash": "h", "metric": "accuracy",
            "val": {"accuracy": 0.5}, "test": {"accuracy": 0.5}, "params": 10}
    rows = [{**base, "key": "new/D/seed-0/lr-0.1", "spec": "new", "seed": 0, "wall_s": 10.0, "cell_wall_s": 70.0,
             "epoch_time_s": [20.0, 20.0, 20.0]},
            {**base, "key": "old/D/seed-0/lr-0.1", "spec": "old", "seed": 0, "wall_s": 66.0, "epoch_time_s": [20.0, 20.0, 20.0]},
            {**base, "key": "old/D/seed-1/lr-0.1", "spec": "old", "seed": 1, "wall_s": 25.0, "epoch_time_s": [20.0, 20.0, 20.0]}]
    assert [cell_wall(r) for r in rows] == [70.0, 66.0, 60.0]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md, _ = render_report(results, tmp_path / "rep", title="t", keep={r["key"]: "h" for r in rows})
    text = md.read_text()
    assert "| new | 50.00 ± 0.00 | 1 | 0.1 | 10 | 70 | 20.00 |" in text
    assert "| old | 50.00 ± 0.00 | 2 | 0.1 | 10 | 63 | 20.00 |" in text  # mean of 66 and 60, not of 66 and 25


def test_a_dataset_name_cannot_name_a_folder_outside_the_output(tmp_path):
    import pytest

    from zoo_core.errors import SpecError
    from zoo_core.sweep.config import load_sweep

    (tmp_path / "s.yaml").write_text("schema_version: 1\nspecs: {x: nope.yaml}\ndatasets: ['../../escaped']\n")
    with pytest.raises(SpecError, match="must be letters, digits"):
        load_sweep(tmp_path / "s.yaml")


def test_a_failed_cells_error_is_its_exception_line_even_when_a_long_message_follows(tmp_path: Path) -> None:
    """torch's "Could not run 'op' with arguments from the 'CUDA' backend" is followed by one line per
    dispatch key: the row used to say "exit code 1: PythonDispatcher: registered at ..." (the log's last
    line), which names neither the op nor the device."""
    from zoo_core.sweep.execute import _error

    log = tmp_path / "log.txt"
    keys = [f"{k}: registered at /pytorch/aten/src/{k}.cpp:1 [backend fallback]" for k in ("CPU", "Meta", "Python", "PythonDispatcher")]
    log.write_text("\n".join(["# 2026-12-04 zoo train spec.yaml", "Pathfinder32-6: seed 1", "Traceback (most recent call last):",
                              '  File "loop.py", line 311, in _train_epoch', "    outs = runner(x)",
                              "NotImplementedError: Could not run 'zoo::linear_scan_fwd' with arguments from the 'CUDA' backend.",
                              *keys, ""]))
    err = _error(log, 1)
    assert err.splitlines()[0] == ("exit code 1: NotImplementedError: Could not run 'zoo::linear_scan_fwd' with arguments "
                                   "from the 'CUDA' backend.")
    assert "PythonDispatcher" not in err and '  File "loop.py", line 311' in err
    log.write_text("Pathfinder32-6: seed 1\nzoo: error: spec.yaml: training.lr must be > 0\n")  # zoo train's one-line error: the last line
    assert _error(log, 2).splitlines()[0] == "exit code 2: zoo: error: spec.yaml: training.lr must be > 0"
    assert _error(tmp_path / "missing.txt", -9) == "killed by signal SIGKILL"


def test_a_plot_of_twelve_series_draws_each_in_its_own_style(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tab10 alone repeats after ten lines (the task tables have twelve cores): each series keeps a
    colour-and-marker pair of its own, and a few x settings are labelled with their values."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from zoo_core.sweep.report import plot_points

    styles: list[tuple[tuple[float, ...], str]] = []
    ticks: list[list[float]] = []
    real_errorbar, real_set_xticks = Axes.errorbar, Axes.set_xticks

    def errorbar(self: Axes, *args: Any, **kw: Any) -> Any:
        styles.append((tuple(kw["color"]), str(kw["marker"])))
        return real_errorbar(self, *args, **kw)

    def set_xticks(self: Axes, xs: list[float], *args: Any, **kw: Any) -> Any:
        ticks.append(list(xs))
        return real_set_xticks(self, xs, *args, **kw)

    monkeypatch.setattr(Axes, "errorbar", errorbar)
    monkeypatch.setattr(Axes, "set_xticks", set_xticks)
    series = {f"core{i:02d}": [(32.0, 0.1 * i, 0.0), (64.0, 0.1 * i, 0.01), (128.0, 0.1 * i, 0.0)] for i in range(12)}
    out = plot_points(series, tmp_path / "p.png", xlabel="width", ylabel="accuracy", logx=True)
    assert out is not None and out.is_file()
    assert len(styles) == 12 and len(set(styles)) == 12
    assert len({c for c, _ in styles}) == 12  # past ten series the colours come from tab20
    assert ticks == [[32.0, 64.0, 128.0]]
