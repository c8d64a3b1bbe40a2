"""Specs that ask for the impossible: sized on the meta device, refused before allocating (exit 2),
and the size printed by ``zoo validate``; a path under a file as ``zoo build -o``; look-alike keys."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from zoo_core.cli import main
from zoo_core.errors import CheckpointError, SpecError
from zoo_core.footprint import MemoryBudgetError, check_build, estimate, parse_size, resolve_budget
from zoo_core.spec import load_spec

HEAD = "schema_version: 1\n"
IMPOSSIBLE = {
    "wide_and_deep": "task: {kind: classification, classes: 4}\ninput: {channels: 6}\n"
                     "model: {d_model: 65536, depth: 1000, core: {kind: s4d}}\n",
    "classes_1e6": "task: {kind: classification, classes: 1000000}\ninput: {channels: 6}\n"
                   "model: {d_model: 65536, depth: 1, core: {kind: s4d, preset: tiny}}\n",
    "vocab_1e7": "task: {kind: lm}\ninput: {vocab_size: 10000000}\n"
                 "model: {d_model: 4096, depth: 1, core: {kind: s4d, preset: tiny}}\n",
    "mlp_hidden_65536": "task: {kind: classification, classes: 4}\ninput: {channels: 6}\n"
                        "model: {d_model: 65536, depth: 1, encoder: {kind: mlp, hidden: 65536}, "
                        "head: {kind: mlp, hidden: 65536}, core: {kind: s4d, preset: tiny}}\n",
}
TINY = HEAD + ("task: {kind: classification, classes: 3}\ninput: {channels: 2, length: 100}\n"
               "model: {d_model: 8, depth: 2, core: {kind: s4d, preset: tiny}}\n"
               "training: {batch_size: 4}\n")


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("name", sorted(IMPOSSIBLE))
def test_impossible_spec_is_refused_by_build_before_allocating(tmp_path, name, capsys):
    spec = _write(tmp_path, name, HEAD + IMPOSSIBLE[name])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    assert main(["build", spec, "--memory-budget", "16GiB"]) == 2
    assert time.perf_counter() - started < 30
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 1024  # MiB
    err = capsys.readouterr().err
    assert "Traceback" not in err and "more than the memory budget of 16.0 GiB" in err and "parameters (" in err
    assert "--memory-budget" in err and "--no-memory-check" in err


def test_default_budget_is_the_available_memory(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ZOO_MEMORY_BUDGET", raising=False)
    spec = _write(tmp_path, "wide", HEAD + IMPOSSIBLE["wide_and_deep"])  # 31 TiB of parameters
    assert main(["build", spec]) == 2
    assert "31.3 TiB" in capsys.readouterr().err


def test_validate_prints_the_estimate_and_what_it_assumed(tmp_path, capsys):
    assert main(["validate", _write(tmp_path, "tiny", TINY)]) == 0
    out = capsys.readouterr().out
    assert "parameters (" in out and "activations ≈" in out
    assert "batch 4 × length 100 (batch from training.batch_size; length from input.length" in out
    assert main(["validate", _write(tmp_path, "wide", HEAD + IMPOSSIBLE["wide_and_deep"])]) == 0
    out = capsys.readouterr().out
    assert "8,602,911,440,900 parameters" in out and "batch: default 32; length: default 1024" in out
    assert "will refuse it" in out


def test_normal_specs_build_and_the_check_can_be_overridden(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ZOO_MEMORY_BUDGET", raising=False)
    spec = _write(tmp_path, "tiny", TINY)
    assert main(["build", spec]) == 0
    assert main(["build", spec, "--memory-budget", "1KB"]) == 2
    assert main(["build", spec, "--memory-budget", "1KB", "--no-memory-check"]) == 0
    monkeypatch.setenv("ZOO_MEMORY_BUDGET", "1KB")
    assert main(["build", spec]) == 2
    monkeypatch.setenv("ZOO_MEMORY_BUDGET", "off")
    assert main(["build", spec]) == 0
    assert main(["build", spec, "--memory-budget", "lots"]) == 2
    assert "is not a size" in capsys.readouterr().err


def test_estimate_matches_the_real_parameter_count():
    from zoo_core.build import build_model
    from zoo_core.nn.blocks import count_params

    for path in ("specs/s4d-tiny.yaml", "specs/s4d-lm.yaml", "specs/lru-shared-aaaaaa.yaml", "specs/lrcssm-backbone.yaml"):
        spec = load_spec(Path(__file__).resolve().parents[1] / path)
        assert estimate(spec, activations=False).params == count_params(build_model(spec, seed=0)), path


def test_budget_helpers():
    assert parse_size("32GiB") == 32 * 2**30 and parse_size("500 MB") == 500 * 10**6 and parse_size("1e3") == 1000
    assert resolve_budget("off") is None and resolve_budget("2KiB") == 2048
    with pytest.raises(SpecError):
        parse_size("-1GB")
    spec = load_spec(Path(__file__).resolve().parents[1] / "specs/s4d-tiny.yaml")
    with pytest.raises(MemoryBudgetError) as info:
        check_build(spec, budget="1KB")
    assert info.value.exit_code == 2


def test_build_output_under_a_file_is_refused_with_the_reason(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    spec = _write(tmp_path, "tiny", TINY)
    assert main(["build", spec, "-o", str(tmp_path / "afile" / "sub")]) == 3
    err = capsys.readouterr().err
    assert "afile is a file, not a folder" in err and "Traceback" not in err
    from zoo_core.build import build_model
    from zoo_core.io.pretrained import save_pretrained

    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        save_pretrained(build_model(spec, seed=0), tmp_path / "afile" / "sub" / "deeper")


@pytest.mark.parametrize("key, char", [("d_m\u043edel", "U+043E CYRILLIC SMALL LETTER O at position 3"),
                                       ("d\u200b_model", "U+200B ZERO WIDTH SPACE at position 1")])
def test_non_ascii_look_alike_keys_are_named(tmp_path, key, char):
    text = HEAD + f"task: {{kind: classification, classes: 3}}\ninput: {{channels: 2}}\n" \
                  f"model: {{{key}: 8, d_model: 8, depth: 2, core: {{kind: s4d, preset: tiny}}}}\n"
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, "lookalike", text))
    msg = str(info.value)
    assert f"contains non-ASCII character {char}" in msg and "did you mean 'd_model'?" in msg


def test_non_ascii_in_core_params_is_named(tmp_path):
    text = HEAD + "task: {kind: classification, classes: 3}\ninput: {channels: 2}\n" \
                  "model: {d_model: 8, depth: 2, core: {kind: s4d, d_st\u0430te: 4}}\n"
    with pytest.raises(SpecError, match="U\\+0430 CYRILLIC SMALL LETTER A at position 4; did you mean 'd_state'"):
        load_spec(_write(tmp_path, "core", text))


@pytest.mark.requires("aeon")  # the spec trains on BasicMotions
def test_train_refuses_before_building_or_loading(tmp_path, capsys):
    text = HEAD + "task: {kind: classification, classes: 4}\ninput: {channels: 6}\n" \
                  "model: {d_model: 65536, depth: 64, core: {kind: s4d, preset: tiny}}\n" \
                  "training: {dataset: basicmotions, batch_size: 8, epochs: 1}\n"
    spec = _write(tmp_path, "train", text)
    out = tmp_path / "run"
    assert main(["train", spec, "-o", str(out), "-q"]) == 2  # 2 TiB of parameters: above any default budget
    err = capsys.readouterr().err
    assert "training needs ≈" in err and "batch 8 × length" in err and "Traceback" not in err
    assert not out.exists()
