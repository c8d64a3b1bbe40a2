"""The shipped pretrained zoo: every tag catalogued in registry.yaml is bundled in the repository,
matches its sha256 pins and its card, loads with no network, and reproduces the card's test
metrics when evaluated again; plus tools/pretrain.py's rewrite of registry.yaml's pretrained: section.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from zoo_core.errors import CheckpointError
from zoo_core.hub import create_model, pull
from zoo_core.hub.catalogue import (
    check_catalogue,
    load_catalogue,
    parse_catalogue,
    sha256_file,
)

ROOT = Path(__file__).resolve().parents[1]
CAT = load_catalogue(ROOT / "registry.yaml")
TAGS = sorted(CAT.entries)
MAX_FOLDER_BYTES = 400_000  # a bundled copy ships in git: keep each one small
MAX_TOTAL_BYTES = 4_000_000


def _tool():
    spec = importlib.util.spec_from_file_location("zoo_pretrain_tool", ROOT / "tools" / "pretrain.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scored(tag: str):
    """A tag whose card is checked by scoring its test split: it needs what its dataset's loader
    declares (aeon for the UEA sets: skipped with the install command where absent), and is slow
    for a language model (its whole test split takes seconds; a classifier's, a fraction of one)."""
    from zoo_core.datasets import dataset_info

    spec = CAT.entries[tag].spec
    marks = [pytest.mark.requires(*dataset_info(spec["training"]["dataset"]).requires)]
    if spec.get("task", {}).get("kind") == "lm":
        marks.append(pytest.mark.slow)
    return pytest.param(tag, marks=marks)


def _config(tag: str) -> dict:
    entry = CAT.entries[tag]
    assert entry.bundled is not None, f"{tag}: no bundled copy"
    return json.loads((entry.bundled / "config.json").read_text(encoding="utf-8"))


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text[4 : text.index("\n---\n", 4)])


# the catalogue as a whole -------------------------------------------------------------------------
def test_the_catalogue_checks_against_plugins_bundles_and_cards():
    assert TAGS, "registry.yaml catalogues no pretrained tags"
    assert check_catalogue(CAT) == []


def test_every_spec_in_pretrained_specs_is_catalogued_and_every_bundle_has_a_spec():
    specs = {p.name[: -len(".yaml")] for p in (ROOT / "pretrained" / "specs").glob("*.yaml")}
    folders = {p.name for p in (ROOT / "pretrained").iterdir() if p.is_dir() and p.name != "specs"}
    assert specs == set(TAGS) == folders


def test_the_pretrained_section_is_exactly_what_the_tool_writes():
    """Not hand-edited: regenerating the section from its own entries gives the same bytes."""
    tool = _tool()
    text = (ROOT / "registry.yaml").read_text(encoding="utf-8")
    entries = yaml.safe_load(text)["pretrained"]
    assert tool.replace_section(text, "pretrained", tool.section_text("pretrained", entries)) == text


def test_the_bundles_are_small():
    sizes = {tag: sum(p.stat().st_size for p in CAT.entries[tag].bundled.iterdir()) for tag in TAGS}  # type: ignore[union-attr]
    assert all(size < MAX_FOLDER_BYTES for size in sizes.values()), sizes
    assert sum(sizes.values()) < MAX_TOTAL_BYTES


# each tag -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tag", TAGS)
def test_every_bundled_file_is_pinned_and_matches(tag):
    entry = CAT.entries[tag]
    assert entry.bundled == ROOT / "pretrained" / tag and entry.hub_repo is None  # bundled only until published
    present = sorted(p.name for p in entry.bundled.iterdir())
    assert present == sorted(entry.files), "every file of the folder is pinned, and only those"
    assert {"model.safetensors", "config.json", "README.md"} <= set(present)
    assert {n: sha256_file(entry.bundled / n) for n in present} == entry.files


@pytest.mark.parametrize("tag", TAGS)
def test_the_card_is_the_bundled_readme_and_states_what_it_must(tag):
    entry = CAT.entries[tag]
    assert entry.card == ROOT / "model_cards" / f"{tag}.md"
    text = entry.card.read_text(encoding="utf-8")
    assert entry.card.read_bytes() == (entry.bundled / "README.md").read_bytes()  # type: ignore[operator]
    meta = _front_matter(text)
    assert meta["library_name"] == "ssm-zoo" and meta["license"] == entry.license
    results = meta["model-index"][0]["results"]
    carded = {(r["dataset"]["name"], r["dataset"]["split"], m["type"]): m["value"] for r in results for m in r["metrics"]}
    assert carded == {(m.dataset, m.split, m.metric): m.value for m in entry.metrics}
    from zoo_core.nn.blocks import count_params

    params = count_params(create_model(tag, pretrained=False))
    assert f"- parameters: {params:,}" in text
    assert f"zoo train pretrained/specs/{tag}.yaml -o runs/pretrained/{tag}" in text
    assert f"python tools/pretrain.py {tag}" in text
    assert "## Intended use" in text and "## Limitations" in text and "not published yet" in text
    assert ("![training curves](curves.png)" in text) == ("curves.png" in entry.files)


@pytest.mark.parametrize("tag", TAGS)
def test_the_registry_spec_is_the_spec_the_weights_carry(tag):
    from zoo_core.spec import load_spec

    entry = CAT.entries[tag]
    assert entry.spec["name"] == tag
    assert load_spec(entry.spec).resolved() == _config(tag)["spec"]
    assert entry.datasets == (entry.spec["training"]["dataset"],)
    assert {m.dataset for m in entry.metrics} == set(entry.datasets) and {m.split for m in entry.metrics} == {"test"}


def _check_metrics(got: dict, entry) -> None:
    """Accuracies to 1e-6 (they are counts over the split), the rest to 1e-5 relative (float sums)."""
    assert set(got) >= {m.metric for m in entry.metrics}
    for m in entry.metrics:
        if m.metric.endswith("accuracy"):
            assert got[m.metric] == pytest.approx(m.value, abs=1e-6), m.metric
        else:
            assert got[m.metric] == pytest.approx(m.value, rel=1e-5), m.metric


def _adaptive(metrics: dict) -> dict:
    return {f"adaptive_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}


@pytest.mark.parametrize("tag", [_scored(t) for t in TAGS])
def test_loads_offline_and_reproduces_the_cards_test_metrics(tag, no_network):
    from zoo_core.datasets import get_dataset
    from zoo_core.train.evaluate import adaptive_metrics
    from zoo_core.train.loop import evaluate, to_tensors
    from zoo_core.train.protocol import make_splits

    entry = CAT.entries[tag]
    model = create_model(tag, pretrained=True)  # strict by default: every tensor present and of its shape
    assert not model.training
    t = _config(tag)["spec"]["training"]
    ds = get_dataset(t["dataset"])
    test = make_splits(ds, protocol=t["protocol"], seed=t["seed"], val_fraction=t["val_fraction"], normalize=t["normalize"]).test
    data = to_tensors(test, torch.device("cpu"))
    got = evaluate(model, data, ds.info.task, 256)  # zoo eval's default batch
    if any(m.metric.startswith("adaptive_") for m in entry.metrics):
        got.update(_adaptive(adaptive_metrics(model, data, ds.info.task, 256)))
    _check_metrics(got, entry)
    fresh = create_model(tag, pretrained=False)
    assert not all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("tag", [_scored(t) for t in TAGS])
def test_the_cards_check_command_zoo_eval_on_the_bundled_copy_gives_the_same_numbers(tag, tmp_path, no_network):
    from zoo_core.train import evaluate_model

    entry = CAT.entries[tag]
    adaptive = any(m.metric.startswith("adaptive_") for m in entry.metrics)
    got = evaluate_model(entry.bundled, split="test", device="cpu", adaptive=adaptive, output=tmp_path / "eval.json")
    assert got["dataset"] == entry.datasets[0] and got["split"] == "test"
    _check_metrics({**got["fixed_depth"], **_adaptive(got.get("adaptive", {}))}, entry)


@pytest.mark.parametrize("tag", TAGS)
def test_zoo_pull_exits_0_with_the_verified_bundled_copy(tag, no_network, capsys):
    from zoo_core.cli import main

    assert main(["pull", tag, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["source"] == "bundled" and record["pinned"] is True
    assert Path(record["path"]) == ROOT / "pretrained" / tag and record["files"] == CAT.entries[tag].files


def test_the_zoo_command_pulls_a_tag_in_a_fresh_process_offline():
    tag = TAGS[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "zoo_core.cli", "pull", tag], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sha256 matches registry.yaml's pins" in done.stdout and str(ROOT / "pretrained" / tag) in done.stdout


# failures are caught ------------------------------------------------------------------------------
def test_a_tampered_bundle_is_refused(tmp_path):
    tag = TAGS[0]
    entry = CAT.entries[tag]
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text(encoding="utf-8"))
    data = {"schema_version": 1, "pretrained": {tag: raw["pretrained"][tag]}}
    for rel in (data["pretrained"][tag]["spec"], data["pretrained"][tag]["card"]):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
    shutil.copytree(entry.bundled, tmp_path / "pretrained" / tag)  # type: ignore[arg-type]
    cat = parse_catalogue(data, root=tmp_path)
    assert check_catalogue(cat) == [] and pull(tag, catalogue=cat).pinned
    weights = tmp_path / "pretrained" / tag / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    assert any("model.safetensors does not match" in p for p in check_catalogue(cat))
    with pytest.raises(CheckpointError, match="sha256"):
        create_model(tag, catalogue=cat)


# tools/pretrain.py's registry rewrite -------------------------------------------------------------
REGISTRY = """\
# The zoo's catalogue.  Keep this comment.
schema_version: 1
plugins:
  zoo-s4d:  {path: plugins/zoo-s4d, cores: [s4d]}   # odd spacing kept
pretrained: {}
# about planned plugins
planned:
  zoo-x: {cores: [x]}
"""


def test_replace_section_keeps_every_other_byte():
    tool = _tool()
    entries = {"b-arch.t": {"spec": "b.yaml", "metrics": [{"dataset": "d", "split": "test", "metric": "loss", "value": 0.1}]},
               "a-arch.t": {"spec": "a.yaml"}}
    out = tool.replace_section(REGISTRY, "pretrained", tool.section_text("pretrained", entries))
    head, tail = REGISTRY.split("pretrained: {}\n")
    assert out.startswith(head) and out.endswith(tail)
    assert yaml.safe_load(out)["pretrained"] == entries
    assert list(yaml.safe_load(out)["pretrained"]) == ["a-arch.t", "b-arch.t"]  # sorted by name
    again = tool.replace_section(out, "pretrained", tool.section_text("pretrained", {}))
    assert again == REGISTRY  # back to the empty section, byte for byte


def test_replace_section_appends_a_missing_section_and_refuses_to_touch_others():
    tool = _tool()
    text = "schema_version: 1\nplugins: {}\n"
    assert tool.replace_section(text, "pretrained", "pretrained: {}\n") == text + "pretrained: {}\n"
    with pytest.raises(tool.PretrainError, match="plugins"):
        tool.replace_section(REGISTRY, "pretrained", "pretrained: {}\nplugins: {}\n")
