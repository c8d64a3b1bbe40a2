"""zoo_core.convert: converters registered through the hook are found by name or detected, their
models are saved atomically (a failure leaves nothing), and ``zoo convert`` maps errors to exit
codes. Uses inline plugins with a toy checkpoint format, so it needs no model plugin."""

from __future__ import annotations

import argparse
import contextlib
import json
import types
from pathlib import Path

import pytest
import torch

from zoo_core import hookimpl
from zoo_core.build import build_model
from zoo_core.cli import zoo as cli
from zoo_core.convert import Converter, convert_checkpoint, detect_converter, get_converter, register_cli
from zoo_core.errors import CheckpointError, PluginLoadError, SpecError, UnknownNameError
from zoo_core.factory import load_pretrained
from zoo_core.plugins import entry_point_sources, inline_source, load_registry, using_registry
from zoo_core.testing import toys


def toy_spec(d_model: int) -> dict:
    return {"schema_version": 1, "task": {"kind": "sequence", "outputs": 2}, "input": {"channels": 3},
            "model": {"d_model": d_model, "depth": 1, "core": {"kind": "toy-diag", "d_state": 2}}}


class ToyFormat:
    """A checkpoint folder holding toy.json: {"d_model": H, "scale": s}; weights are s everywhere."""

    def __init__(self) -> None:
        self.converted = 0

    def detect(self, source: Path) -> bool:
        return (source / "toy.json").is_file()

    def convert(self, source: Path):
        cfg = json.loads((source / "toy.json").read_text())
        if cfg.get("broken"):
            raise CheckpointError(f"{source}: toy.json says broken")
        model = build_model(toy_spec(cfg["d_model"]), seed=0)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(cfg["scale"])
        self.converted += 1
        return model


class Greedy:
    """Detects every folder (to make detection ambiguous)."""

    def detect(self, source: Path) -> bool:
        return True

    def convert(self, source: Path):
        raise AssertionError("not used")


class Explodes:
    def detect(self, source: Path) -> bool:
        raise RuntimeError("detect is broken")

    def convert(self, source: Path):
        raise RuntimeError("boom")


TOY = ToyFormat()
NOT_A_CONVERTER = object()
HERE = __name__


@pytest.fixture()
def reg(monkeypatch):
    """zoo-core's defaults, the toy cores, and converters named toy / greedy / broken."""
    mod = types.SimpleNamespace(__name__="convplug", zoo_api=1)

    def zoo_register_converters(register):
        register("toy", f"{HERE}:TOY", description="toy.json folders")
        register("broken", f"{HERE}:NOT_A_CONVERTER", description="registers something without methods")

    mod.zoo_register_converters = hookimpl(zoo_register_converters)
    reg = load_registry([*[s for s in entry_point_sources() if s.dist == "zoo-core"],
                         inline_source("toys", toys), inline_source("convplug", mod)])
    with using_registry(reg):
        yield reg


def toy_folder(tmp_path: Path, name="src", **cfg) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "toy.json").write_text(json.dumps({"d_model": 4, "scale": 0.25, **cfg}))
    return folder


def test_convert_by_name_and_by_detection(reg, tmp_path):
    src = toy_folder(tmp_path)
    assert isinstance(get_converter("toy", registry=reg), Converter)
    path, name, model = convert_checkpoint(src, tmp_path / "out", registry=reg)
    assert name == "toy" and path == tmp_path / "out"
    loaded = load_pretrained(path, registry=reg)
    assert loaded.spec == model.spec and all(bool((p == 0.25).all()) for p in loaded.parameters())
    path2, name2, _ = convert_checkpoint(src, tmp_path / "out2", converter="toy", registry=reg)
    assert name2 == "toy" and (path2 / "model.safetensors").is_file()


def test_unknown_and_broken_converters(reg, tmp_path):
    with pytest.raises(UnknownNameError, match="did you mean 'toy'"):
        get_converter("tyo", registry=reg)
    with pytest.raises(PluginLoadError, match="no detect"):
        get_converter("broken", registry=reg)
    with pytest.raises(UnknownNameError, match="registered converters: broken, toy"):
        convert_checkpoint(toy_folder(tmp_path), tmp_path / "out", converter="nope", registry=reg)


def test_detection_needs_exactly_one_yes(reg, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecError, match="no registered converter recognises"):
        detect_converter(empty, registry=reg)
    entry = reg.converters["toy"]
    reg.converters["explodes"] = entry.__class__("explodes", Explodes(), "", entry.provider)
    src = toy_folder(tmp_path)
    assert detect_converter(src, registry=reg) == "toy"  # a converter whose detect raises is skipped
    reg.converters["greedy"] = entry.__class__("greedy", Greedy(), "", entry.provider)
    with pytest.raises(SpecError, match=r"several converters recognise .*\(greedy, toy\)"):
        detect_converter(src, registry=reg)


def test_a_failed_conversion_writes_nothing(reg, tmp_path):
    src = toy_folder(tmp_path, broken=True)
    with pytest.raises(CheckpointError, match="says broken"):
        convert_checkpoint(src, tmp_path / "out", registry=reg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no destination, no staging leftovers


def test_destination_rules(reg, tmp_path):
    src = toy_folder(tmp_path)
    with pytest.raises(SpecError, match="no such checkpoint folder"):
        convert_checkpoint(tmp_path / "missing", tmp_path / "out", registry=reg)
    with pytest.raises(SpecError, match="is the source folder"):
        convert_checkpoint(src, src, registry=reg)
    convert_checkpoint(src, tmp_path / "out", registry=reg)
    with pytest.raises(SpecError, match="already exists"):
        convert_checkpoint(src, tmp_path / "out", registry=reg)
    (src / "toy.json").write_text(json.dumps({"d_model": 4, "scale": 0.5}))
    convert_checkpoint(src, tmp_path / "out", overwrite=True, registry=reg)
    assert all(bool((p == 0.5).all()) for p in load_pretrained(tmp_path / "out", registry=reg).parameters())
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not part of a saved model"):
        convert_checkpoint(src, foreign, overwrite=True, registry=reg)
    assert (foreign / "notes.txt").read_text() == "mine"
    (tmp_path / "emptydst").mkdir()
    convert_checkpoint(src, tmp_path / "emptydst", registry=reg)  # an empty folder is fine


def test_register_cli_adds_the_command():
    parser = argparse.ArgumentParser(prog="zoo")
    register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["convert", "a", "b", "--from", "toy", "--overwrite"])
    assert (args.source, args.destination, args.converter, args.overwrite) == ("a", "b", "toy", True)
    assert parser.parse_args(["convert", "a", "b"]).converter == "auto"


def test_zoo_convert_exit_codes(reg, tmp_path, monkeypatch, capsys, request):
    monkeypatch.setattr(cli, "_registry", lambda: reg)
    stack = contextlib.ExitStack()
    request.addfinalizer(stack.close)
    stack.enter_context(using_registry(reg))
    src = toy_folder(tmp_path)
    assert cli.main(["convert", str(src), str(tmp_path / "out")]) == 0
    assert "converted" in capsys.readouterr().out
    assert cli.main(["convert", str(src), str(tmp_path / "out")]) == 2  # exists
    assert cli.main(["convert", str(tmp_path / "missing"), str(tmp_path / "o")]) == 2
    assert cli.main(["convert", str(src), str(tmp_path / "o"), "--from", "nope"]) == 2
    assert cli.main(["convert", str(toy_folder(tmp_path, "bad", broken=True)), str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err
    assert "zoo convert: error:" in err and "says broken" in err and not (tmp_path / "o").exists()
