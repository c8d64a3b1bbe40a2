"""The sweep file: strict keys (errors naming file, line and key), the grid and list expansions, patches."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo_core.errors import SpecError
from zoo_core.spec.training import PAPER_LR_GRID, PAPER_SEEDS
from zoo_core.sweep import load_sweep

from .conftest import write_sweep


def test_grid_is_specs_datasets_axes_seeds_lrs_seed_major(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, {"datasets": ["BasicMotions", "JapaneseVowels"], "seeds": [1, 2], "lrs": [0.01, 0.001],
                                  "axes": {"width": {"8": {"model": {"d_model": 8}}, "16": {"model": {"d_model": 16}}}}})
    sweep = load_sweep(path, validate=False)
    assert len(sweep.cells) == 2 * 2 * 2 * 2
    assert sweep.cells[0].key == "tiny/BasicMotions/width=8/seed-1/lr-0.01"
    assert [c.seed for c in sweep.cells] == [1] * 8 + [2] * 8  # a sweep cut short holds whole seeds
    wide = next(c for c in sweep.cells if c.axes == {"width": "16"} and c.dataset == "JapaneseVowels")
    assert wide.spec["model"]["d_model"] == 16 and wide.spec["model"]["depth"] == 1  # merged, not replaced
    assert wide.spec["training"] == {"dataset": "JapaneseVowels", "epochs": 1, "batch_size": 16, "seed": wide.seed, "lr": wide.lr}
    assert sweep.output == (Path.cwd() / "runs/sweeps/sweep").resolve()
    assert sweep.results == sweep.output / "results.jsonl"


def test_defaults_come_from_the_spec_and_paper_names_the_seed_papers_grid(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {"output": "out", "seeds": "paper", "lrs": "paper", "training": {"epochs": 3}}),
                       validate=False)
    assert {c.seed for c in sweep.cells} == set(PAPER_SEEDS) and {c.lr for c in sweep.cells} == set(PAPER_LR_GRID)
    assert {c.dataset for c in sweep.cells} == {"BasicMotions"}  # the spec's training.dataset
    assert sweep.cells[0].spec["training"]["epochs"] == 3 and sweep.output == tmp_path / "out"
    moved = load_sweep(write_sweep(tmp_path, {"output": "out", "results": "res/r.jsonl"}), output=tmp_path / "trial", validate=False)
    assert moved.results == tmp_path / "trial/results.jsonl"  # -o moves the results too: a trial never appends to the file's
    assert load_sweep(write_sweep(tmp_path, {"results": "res/r.jsonl"}), validate=False).results == tmp_path / "res/r.jsonl"
    one = load_sweep(write_sweep(tmp_path / "b", {}), validate=False)
    assert [(c.seed, c.lr) for c in one.cells] == [(0, 1e-3)]  # seed 0, the spec's (default) lr


def test_an_explicit_cell_list(tmp_path: Path) -> None:
    body = {"axes": {"depth": {"1": {}, "2": {"model": {"depth": 2}}}},
            "cells": [{"spec": "tiny", "seed": 3, "lr": 0.01, "axes": {"depth": "2"}},
                      {"spec": "tiny", "dataset": "JapaneseVowels", "axes": {"depth": "1"}}]}
    sweep = load_sweep(write_sweep(tmp_path, body), validate=False)
    assert [c.key for c in sweep.cells] == ["tiny/BasicMotions/depth=2/seed-3/lr-0.01", "tiny/JapaneseVowels/depth=1/seed-0/lr-0.001"]
    assert sweep.cells[0].spec["model"]["depth"] == 2


@pytest.mark.parametrize(("body", "expected"), [
    ({"seed": [1]}, "sweep.yaml:4:1: seed: unknown key 'seed'; did you mean 'seeds'?"),
    ({"training": {"epoch": 2}}, "unknown training key 'epoch'; did you mean 'epochs'"),
    ({"training": {"lr": 0.1}}, "'lr' is a sweep axis, not a training override: use the sweep's lrs: list"),
    ({"lrs": [0]}, "lrs must be a non-empty list of learning rates in (0, 10]"),
    ({"axes": {"L": {"64": {"training": {"dataset": "X"}}}}}, "'dataset' is a sweep axis, not a training override"),
    ({"seeds": [1, 1]}, "seeds must be a non-empty list of distinct"),
    ({"axes": {"w": {"a/b": {}}}}, "axis 'w' label 'a/b' must be letters, digits"),
    ({"resources": {"num_cpu": 2}}, "resources.num_cpu: unknown key 'num_cpu'; did you mean 'num_cpus'"),
    ({"cells": [{"spec": "tinyy"}]}, "cells[0].spec 'tinyy' is not a label of specs:; did you mean 'tiny'"),
    ({"axes": {"w": {"1": {}}}, "cells": [{"spec": "tiny"}]}, "cells[0] gives no label for axis 'w'"),
])
def test_the_file_is_strict_and_errors_name_the_key(tmp_path: Path, body: dict, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        load_sweep(write_sweep(tmp_path, body), validate=False)
    assert expected in str(err.value)


def test_a_missing_spec_file_and_a_duplicate_cell_are_refused(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, {})
    path.write_text(path.read_text().replace("tiny.yaml", "nope.yaml"))
    with pytest.raises(SpecError, match=r"sweep.yaml:3:3: specs.tiny: spec file .*nope.yaml not found"):
        load_sweep(path, validate=False)
    dup = {"cells": [{"spec": "tiny", "seed": 1}, {"spec": "tiny", "seed": 1}]}
    with pytest.raises(SpecError, match="the cell 'tiny/BasicMotions/seed-1/lr-0.001' appears twice"):
        load_sweep(write_sweep(tmp_path / "d", dup), validate=False)


def test_every_cell_is_checked_as_zoo_train_would_before_anything_runs(tmp_path: Path) -> None:
    body = {"axes": {"state": {"ok": {}, "bad": {"model": {"core": {"d_stat": 4}}}}}}
    with pytest.raises(SpecError) as err:
        load_sweep(write_sweep(tmp_path, body))
    text = str(err.value)
    assert "cell tiny/BasicMotions/state=bad/seed-0/lr-0.001" in text and "d_stat" in text and "d_state" in text
    with pytest.raises(SpecError, match="training.*batch_size|batch_size"):
        load_sweep(write_sweep(tmp_path / "b", {"training": {"batch_size": 0}}))
    assert len(load_sweep(write_sweep(tmp_path / "c", {"seeds": [1, 2]})).cells) == 2


def test_the_config_hash_follows_the_cells_settings(tmp_path: Path) -> None:
    a = load_sweep(write_sweep(tmp_path / "a", {"training": {"epochs": 2}}), validate=False).cells[0]
    b = load_sweep(write_sweep(tmp_path / "b", {"training": {"epochs": 3}}), validate=False).cells[0]
    c = load_sweep(write_sweep(tmp_path / "c", {"training": {"epochs": 2}}), validate=False).cells[0]
    assert a.key == b.key and a.config_hash != b.config_hash and a.config_hash == c.config_hash
