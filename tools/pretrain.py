"""Train, evaluate and bundle the zoo's pretrained tags; write their cards and registry.yaml's ``pretrained:``.

One tag ``arch.tag`` = one spec ``pretrained/specs/<arch.tag>.yaml`` with a ``training:`` section. For each::

    zoo train pretrained/specs/<tag>.yaml -o runs/pretrained/<tag>          # the seed's protocol, seeded
    zoo eval runs/pretrained/<tag>/seed-<s>/lr-<lr>/best -o .../eval-test.json   # the held-out test split
    pretrained/<tag>/   model.safetensors, config.json (the best epoch, as saved), curves.png (the run's),
                        README.md (render_card from the eval metrics: never a hand-edited number)
    model_cards/<tag>.md                      the same bytes as pretrained/<tag>/README.md
    registry.yaml       pretrained.<tag>: spec, source.bundled, sha256 of every file, metrics, card

Usage::

    python tools/pretrain.py s4d-small.japanesevowels     # one tag (several may be given)
    python tools/pretrain.py --all                        # every spec in pretrained/specs
    python tools/pretrain.py --all --verify               # retrain from scratch in a temporary folder and
                                                          # check the files come out byte-identical to the pins
    python tools/pretrain.py --list                       # the tags and whether each is catalogued
    python tools/pretrain.py TAG --from-run CELL_DIR      # adopt a finished `zoo train`/sweep cell as TAG's run

A finished run in ``--runs`` is reused (``zoo train --resume`` returns at once); ``--fresh`` trains again.
A tag listed in ``pretrained/published.yaml`` (tag -> rows of ``benchmarks/tasks/published.yaml``) gets the
papers' figures beside its test metric on its card, with their source and why ours differs; a tag listed
with ``none: <why>`` says it has none. Tags not listed keep the card they had.
Only the ``pretrained:`` section of registry.yaml is rewritten; comments and every other section stay
byte for byte. Nothing here publishes to the Hub: the printed ``zoo push`` command does that.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPECS = Path("pretrained/specs")
BUNDLES = Path("pretrained")
CARDS = Path("model_cards")
REGISTRY = Path("registry.yaml")
DEFAULT_RUNS = Path("runs/pretrained")  # the card's commands name this folder
HUB_ORG = "ssm-zoo"  # where `zoo push` would publish (not published yet)
LICENSE = "apache-2.0"
WEIGHTS, CONFIG, CARD, PLOT = "model.safetensors", "config.json", "README.md", "curves.png"
VOCAB = "vocab.json"  # a character model's tokenizer (zoo_core.tokenizer), bundled with its weights
SECTION_COMMENT = "# Written by tools/pretrain.py from the training runs (zoo eval's test metrics, sha256 pins); do not edit by hand."
PRIMARY = {"classification": "accuracy", "regression": "rmse", "sequence": "loss", "lm": "bits_per_token"}
FIGURES = Path("pretrained/published.yaml")  # tag -> the published rows its card shows (not in specs/: specs are strict)
PUBLISHED = Path("benchmarks/tasks/published.yaml")  # the papers' figures, each with where it was read


class PretrainError(RuntimeError):
    """A tag cannot be built: the message says which and what to do."""


# tags ---------------------------------------------------------------------------------------------
def spec_file(tag: str, root: Path = ROOT) -> Path:
    path = root / SPECS / f"{tag}.yaml"
    if not path.is_file():
        known = ", ".join(all_tags(root)) or "none"
        raise PretrainError(f"no spec for {tag!r}: expected {path.relative_to(root)} (known tags: {known})")
    return path


def all_tags(root: Path = ROOT) -> list[str]:
    """Every ``arch.tag`` with a spec in ``pretrained/specs``, sorted."""
    return sorted(p.name[: -len(".yaml")] for p in (root / SPECS).glob("*.yaml"))


def commands(tag: str, run: dict[str, Any] | None = None) -> dict[str, str]:
    """The exact commands, relative to the checkout, that make and check this tag."""
    best = f"{DEFAULT_RUNS}/{tag}/" + (f"seed-{run['seed']}/lr-{run['lr']:g}/best" if run else "seed-<s>/lr-<lr>/best")
    return {
        "train": f"zoo train {SPECS}/{tag}.yaml -o {DEFAULT_RUNS}/{tag} --device cpu",
        "eval": f"zoo eval {best} -o {DEFAULT_RUNS}/{tag}/eval-test.json --device cpu",
        "all": f"python tools/pretrain.py {tag}",
        "check": f"zoo eval {BUNDLES}/{tag} -o eval-{tag}.json --device cpu",
        "push": f"zoo push {BUNDLES}/{tag} {HUB_ORG}/{tag}",
    }


# training and evaluation --------------------------------------------------------------------------
def train_tag(tag: str, runs: Path, *, fresh: bool = False, quiet: bool = False, root: Path = ROOT,
              registry: Any = None) -> dict[str, Any]:
    """``zoo train`` the tag's spec into ``runs/<tag>`` (a finished run is reused); returns metrics.json."""
    from zoo_core.train import train
    from zoo_core.train.progress import Progress

    out = runs / tag
    if fresh and out.exists():
        shutil.rmtree(out)
    spec = spec_file(tag, root)
    rel = spec.relative_to(root)
    metrics = train(str(spec), output=out, resume=(out / "run.json").is_file(), device="cpu", registry=registry,
                    progress=Progress(quiet=quiet, bar=False), command=commands(tag)["train"].split())
    if metrics.get("name") != tag:
        raise PretrainError(f"{rel}: its name is {metrics.get('name')!r}; set name: {tag} (the tag the file is named for)")
    if len(metrics["seeds"]) != 1:
        raise PretrainError(f"{rel}: a pretrained tag ships one model; give training.seed, not several training.seeds")
    s = metrics["seeds"][0]
    s["model_dir"] = str(out / f"seed-{s['seed']}" / f"lr-{s['lr']:g}" / "best")  # where it is now (run folders move)
    return metrics


# adopting a finished run (a sweep cell) --------------------------------------------------------------
def _rename_saved(folder: Path, name: str) -> None:
    """Set the spec's ``name`` inside a folder ``save_pretrained`` (or a training checkpoint) wrote: the
    weights file's metadata and config.json, every other byte as a save of the renamed model would write
    it. Refuses a folder whose files this zoo_core would not write byte for byte (then a rename could
    not give what training the tag's spec gives)."""
    from zoo_core.io.pretrained import CONFIG as CONFIG_FILE
    from zoo_core.io.pretrained import WEIGHTS as WEIGHTS_FILE
    from zoo_core.io.pretrained import canonical_safetensors, read_folder

    tensors, info = read_folder(folder, allow_nonfinite=True)

    def meta(spec: Mapping[str, Any]) -> dict[str, str]:  # as zoo_core.io.pretrained.model_files writes it
        return {"format": info["format"], "spec": json.dumps(spec, sort_keys=True),
                "versions": json.dumps(info["versions"], sort_keys=True), "complex": json.dumps(info["complex"]),
                "tied": json.dumps(info["tied"], sort_keys=True)}

    weights, config_path = folder / WEIGHTS_FILE, folder / CONFIG_FILE
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if (canonical_safetensors(tensors, meta(info["spec"])) != weights.read_bytes()
            or json.dumps(config, indent=2, sort_keys=True) + "\n" != config_path.read_text(encoding="utf-8")):
        raise PretrainError(f"{folder}: not written as this zoo_core writes a saved model, so its name cannot be changed "
                            "exactly; retrain the tag instead (python tools/pretrain.py TAG --fresh)")
    renamed = {**info["spec"], "name": name}
    weights.write_bytes(canonical_safetensors(tensors, meta(renamed)))
    config_path.write_text(json.dumps({**config, "spec": renamed}, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _run_files(folder: Path) -> dict[str, bytes]:
    """A run's results and weights (what ``zoo train --resume`` of a finished run must leave alone)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and (p.name == "result.json" or p.parent.name in ("best", "checkpoint"))}


def adopt_run(tag: str, cell: Path, runs: Path, *, root: Path = ROOT, fresh: bool = False, registry: Any = None) -> Path:
    """Make a finished ``zoo train`` output folder (a sweep cell) this tag's run instead of retraining it.

    1. ``pretrained/specs/<tag>.yaml`` = the cell's ``spec.yaml`` with ``name: <tag>``: written when absent;
       when present it must resolve to the same settings (else PretrainError, nothing written).
    2. The cell is copied to ``runs/<tag>`` (where :func:`train_tag` looks) with the spec's name changed
       wherever the run stores it (run.json's fingerprint, every saved model's weights and config.json),
       so the folder is what ``zoo train`` of the tag's spec writes: ``--fresh`` reproduces it.
    3. ``zoo train --resume`` of the tag's spec must accept the copy as the same settings and return without
       training a step (no result or weight file changes); otherwise the copy is removed and PretrainError raised.

    An existing ``runs/<tag>`` is replaced only when it was adopted from the same cell, or with ``fresh``.
    """
    from zoo_core.errors import ZooError
    from zoo_core.spec import load_spec

    cell = Path(cell).resolve()
    for need in ("run.json", "spec.yaml"):
        if not (cell / need).is_file():
            raise PretrainError(f"{cell}: no {need}; give the folder `zoo train -o` wrote (a sweep cell's folder, "
                                "holding run.json, spec.yaml and seed-*/lr-*/)")
    if not list(cell.glob("seed-*/lr-*/result.json")):
        raise PretrainError(f"{cell}: the run is not finished (no seed-*/lr-*/result.json); let the sweep finish it first")
    cell_spec = yaml.safe_load((cell / "spec.yaml").read_text(encoding="utf-8"))
    stored = json.loads((cell / "run.json").read_text(encoding="utf-8"))
    if stored.get("device") not in (None, "cpu"):
        print(f"note: {cell} trained on {stored['device']}; the card's `zoo train ... --device cpu` retrains it on a CPU, "
              "which gives close, not bit-identical, weights", file=sys.stderr)
    try:
        if load_spec(cell_spec, registry=registry).resolved() != stored["fingerprint"]["spec"]:
            raise PretrainError(f"{cell}: its spec.yaml is not the spec its run.json records (trained with overrides?); "
                                "adopt only a cell whose spec.yaml is the settings it ran with")
        tag_spec = {**cell_spec, "name": tag}
        resolved = load_spec(tag_spec, registry=registry).resolved()
        path = root / SPECS / f"{tag}.yaml"
        if path.is_file():
            have = load_spec(str(path), registry=registry).resolved()
            if have != resolved:
                diff = sorted(k for k in set(have) | set(resolved) if have.get(k) != resolved.get(k))
                raise PretrainError(f"{path.relative_to(root)} exists with other settings than {cell}/spec.yaml (differs in: "
                                    f"{', '.join(diff)}); delete it or adopt the cell under another tag")
        else:
            where = cell.relative_to(ROOT) if cell.is_relative_to(ROOT) else cell
            header = (f"# Adopted by tools/pretrain.py --from-run from the finished run {where}: its spec.yaml with\n"
                      f"# name: {tag}. `python tools/pretrain.py {tag} --fresh` retrains it from this file.\n")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(header + yaml.safe_dump(tag_spec, sort_keys=False, width=120), encoding="utf-8")
    except ZooError as exc:
        raise PretrainError(f"{cell}/spec.yaml: {exc}") from None
    out = runs / tag
    if out.exists():
        previous = json.loads((out / "run.json").read_text(encoding="utf-8")) if (out / "run.json").is_file() else {}
        if not fresh and previous.get("adopted_from") != str(cell):
            raise PretrainError(f"{out} already holds a run (not adopted from {cell}); pass --fresh to replace it")
    staging = runs / f".{tag}.adopting-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(cell, staging, symlinks=False)
    try:
        for weights in sorted(staging.rglob(WEIGHTS)):
            if (weights.parent / CONFIG).is_file():
                _rename_saved(weights.parent, tag)
        fingerprint = {**stored["fingerprint"], "spec": {**stored["fingerprint"]["spec"], "name": tag}}
        record = {**stored, "fingerprint": fingerprint, "command": commands(tag)["train"].split(), "adopted_from": str(cell)}
        (staging / "run.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        (staging / "metrics.json").unlink(missing_ok=True)  # zoo train --resume writes the tag's own
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    before = _run_files(out)
    try:
        train_tag(tag, runs, quiet=True, root=root, registry=registry)
    except (ZooError, PretrainError) as exc:
        shutil.rmtree(out)
        raise PretrainError(f"zoo train --resume refused the adopted run of {tag}: {exc}") from None
    if _run_files(out) != before:
        shutil.rmtree(out)
        raise PretrainError(f"zoo train --resume of {tag} trained again instead of reusing {cell}; the cell is not a finished run")
    return out


def has_adaptive(spec: Mapping[str, Any]) -> bool:
    """Whether the spec sets adaptive depth (``model.stacking.adaptive``): then the card reports it too."""
    return bool(spec.get("model", {}).get("stacking", {}).get("adaptive"))


def evaluate_run(metrics: dict[str, Any], out: Path) -> dict[str, Any]:
    """``zoo eval`` the selected model on its test split (what the card reports); ``--adaptive`` as well
    when the spec sets adaptive depth (its settings are the spec's)."""
    from zoo_core.io.pretrained import read_folder
    from zoo_core.train import evaluate_model

    best = metrics["seeds"][0]["model_dir"]
    evaluation = evaluate_model(best, split="test", device="cpu", output=out / "eval-test.json")
    if has_adaptive(read_folder(best)[1]["spec"]):
        adaptive = evaluate_model(best, split="test", adaptive=True, device="cpu", output=out / "eval-test-adaptive.json")
        evaluation["adaptive"] = adaptive["adaptive"]
    return evaluation


ADAPTIVE_ROWS = {"accuracy": "adaptive_accuracy", "loss": "adaptive_loss", "mean_depth": "adaptive_mean_depth",
                 "flops_ratio": "adaptive_flops_ratio"}


def headline(task: str, selection: str | None = None) -> str:
    """The metric a card puts first: the task's, except a token task selected on accuracy (MQAR,
    induction heads: recall is the result, bits per token a by-product)."""
    return "accuracy" if task == "lm" and selection == "accuracy" else PRIMARY.get(task, "loss")


def metric_rows(evaluation: dict[str, Any], task: str, selection: str | None = None) -> list[dict[str, Any]]:
    """The card's and registry's metrics: the task's headline metric first, then the rest (loss, ...),
    then adaptive depth's (``adaptive_*``) when it was evaluated."""
    fixed = evaluation["fixed_depth"]
    first = headline(task, selection)
    rows = [(k, float(fixed[k])) for k in sorted(fixed, key=lambda k: (k != first, k))]
    rows += [(name, float(evaluation["adaptive"][k])) for k, name in ADAPTIVE_ROWS.items() if k in evaluation.get("adaptive", {})]
    return [{"dataset": evaluation["dataset"], "split": evaluation["split"], "metric": k, "value": v} for k, v in rows]


# the card -----------------------------------------------------------------------------------------
def _describe_run(spec: Mapping[str, Any], metrics: dict[str, Any], ds: Mapping[str, Any]) -> str:
    t, s = metrics["training"], metrics["seeds"][0]
    run = next(r for r in s["runs"] if r["lr"] == s["lr"])
    sizes = s["split"]["sizes"]
    stop = f", stopping after {t['early_stop']} epochs without a better validation {metrics['metric']}" if t["early_stop"] else ""
    clip = f", the gradient norm clipped at {t['grad_clip']:g}" if t.get("grad_clip") else ""
    loss = ("the blockwise loss (the shared head after every period, averaged)" if t["loss"] == "blockwise"
            else "the loss of the final output")
    optimizer = {"adamw": "AdamW"}.get(t["optimizer"], t["optimizer"].capitalize())
    decay = f" and weight decay {t['weight_decay']:g}" if t.get("weight_decay") else ""
    protocol = {"seed-split": "the official splits merged, exact duplicates dropped, a random 70/15/15 split",
                "official": "the official splits"}[t["protocol"]]
    return (f"{spec.get('description') or 'A sequence model assembled by SSM Zoo.'}\n\n"
            f"Trained with `zoo train` on {ds['name']} ({ds.get('description') or ds.get('source') or 'a registered dataset'}): "
            f"{protocol} with seed {s['split']['seed']} (train {sizes['train']}, validation {sizes['val']}, "
            f"test {sizes['test']} sequences), {optimizer} at learning rate {s['lr']:g}{decay}{clip}, batch {t['batch_size']}, "
            f"{loss}, up to {t['epochs']} epoch{'s' if t['epochs'] != 1 else ''}{stop}. "
            "The weights are those of the best validation epoch, ties going to the later one "
            f"(epoch {s['best_epoch']} of the {run['epochs_run']} run). Every number below is what `zoo eval` measures on the "
            "held-out test split, which training never saw."
            + (_describe_adaptive(spec) if has_adaptive(spec) else ""))


def _describe_adaptive(spec: Mapping[str, Any]) -> str:
    m = spec["model"]
    a = m["stacking"]["adaptive"]
    return (f"\n\nThe `adaptive_*` rows are `zoo eval --adaptive` with the spec's settings: the shared block is applied "
            f"again and again, up to {a.get('max_depth') or m['depth']} times, and each sequence stops (after a "
            f"{a.get('stop_at', 'period')}, at depth {a.get('min_depth') or 1} or more) once its prediction changes by less "
            f"than {a.get('epsilon')} (relative) from one application to the next; `adaptive_mean_depth` is the mean "
            f"number of applications and `adaptive_flops_ratio` the FLOPs over those of the fixed depth {m['depth']}.")


def _char_lm(task: str, ds: Mapping[str, Any]) -> bool:
    """A character language model (its vocabulary ships with it); token tasks such as MQAR are ``lm`` too."""
    if task != "lm":
        return False
    from zoo_core.tokenizer import CharTokenizer, TokenizerError

    try:
        CharTokenizer.for_dataset(ds["name"])
    except TokenizerError:
        return False
    return True


def _intended_use(tag: str, task: str, ds: Mapping[str, Any]) -> str:
    if task == "lm" and not _char_lm(task, ds):
        return (f"A small reference model for the synthetic token task {ds['name']}: loading by tag, streaming "
                "inference with `step` (constant memory at any length), extrapolation to longer test sequences, "
                "and a baseline to compare other cores against on the same generated splits. Research and teaching only.")
    if task == "lm":
        return ("A small character-level language model to try SSM Zoo's language-model path: loading by tag, "
                "streaming generation with `step`, perplexity on the held-out plays, and converting or fine-tuning "
                "tests. Research and teaching only.\n\n"
                f"Its characters ship in `{VOCAB}` (`zoo_core.tokenizer.CharTokenizer.from_pretrained(\"{tag}\")` "
                f"encodes and decodes text); `zoo generate {tag} --prompt \"ROMEO:\" --temperature 0` continues a prompt.")
    return (f"A small, fast reference classifier for {ds['name']}: loading by tag, streaming inference with `step`, "
            "depth and backend experiments, and a baseline to compare other cores against on the same split. "
            "Research and teaching only.")


def _limitations(tag: str, task: str, sizes: Mapping[str, int], params: int, char_lm: bool = True) -> str:
    cmd = commands(tag)
    text = (f"Small ({params:,} parameters) and trained once, with one seed and one learning rate; the result is "
            f"one sample, not a mean over seeds, and the test split holds only {sizes['test']} sequences")
    text += (f" (one sequence is {100 / sizes['test']:.1f} points of accuracy)." if task == "classification" else ".")
    text += (" The numbers hold for this dataset and split only and say nothing about other data. Bitwise "
             "reproduction of the weights needs the same versions (below) and a CPU; other hardware gives close, "
             "not identical, numbers.")
    if task == "lm" and char_lm:
        text += (" The model has seen only Shakespeare's plays (84 characters), for one epoch (about 4 million characters) on a CPU: "
                 "it produces plausible-looking character sequences, not meaningful text.")
    text += (f"\n\nThe Hub copy is not published yet: this folder ships in the repository as a bundled copy "
             f"(registry.yaml's source.bundled). Publishing it is `{cmd['push']}`, then pinning the commit it prints "
             "in registry.yaml (source.hub and source.revision).")
    return text


# the papers' figures beside ours ------------------------------------------------------------------
ROW_KEYS = ("task", "model", "metric", "split", "setting")  # what a pretrained/published.yaml row may match on


def published_figures(tag: str, root: Path = ROOT) -> list[dict[str, Any]] | str | None:
    """What ``pretrained/published.yaml`` says for ``tag``.

    Returns the rows of ``benchmarks/tasks/published.yaml`` to show (each named by task and model, plus
    metric/split/setting where a pair has several rows), the reason no paper reports it (``none: <why>``),
    or None when the tag is not listed: its card then stays as it was before figures existed, byte for
    byte, so the pins of tags trained earlier hold.
    """
    path = root / FIGURES
    if not path.is_file():
        return None
    listed = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(listed, dict):
        raise PretrainError(f"{FIGURES}: expected a mapping tag -> rows, got {type(listed).__name__}")
    if tag not in listed:
        return None
    want = listed[tag]
    if isinstance(want, dict) and set(want) == {"none"} and isinstance(want["none"], str) and want["none"].strip():
        return str(want["none"]).strip()
    usage = (f"{FIGURES}: {tag}: give a list of rows of {PUBLISHED}, each {{task: ..., model: ...}} (plus metric, split or "
             "setting where that pair has several rows), or {none: <why no paper reports this model on this task>}")
    if not isinstance(want, list) or not want or not all(isinstance(w, dict) and {"task", "model"} <= set(w) <= set(ROW_KEYS)
                                                         for w in want):
        raise PretrainError(usage)
    table = yaml.safe_load((root / PUBLISHED).read_text(encoding="utf-8")) or []
    rows = []
    for w in want:
        hits = [r for r in table if isinstance(r, dict) and all(r.get(k) == v for k, v in w.items())]
        if len(hits) != 1:
            raise PretrainError(f"{FIGURES}: {tag}: {len(hits)} rows of {PUBLISHED} match {w}; name exactly one "
                                "(add metric, split or setting)")
        if hits[0].get("value") is None:
            raise PretrainError(f"{FIGURES}: {tag}: {w} has no number in {PUBLISHED} (value: null); choose a row with one")
        rows.append(hits[0])
    return rows


def _ours(row: Mapping[str, Any], fixed: Mapping[str, float]) -> tuple[float, str] | None:
    """Our test number on the published row's scale ("accuracy (%)" is ours x 100), or None when we do not
    measure that metric."""
    name = str(row["metric"])
    key = name.split(" (")[0].strip()
    if key not in fixed:  # "recall accuracy (fraction)" is our accuracy; a metric we do not measure is shown as such
        key = "accuracy" if "accuracy" in key and "accuracy" in fixed else ""
    if not key:
        return None
    return (100.0 * fixed[key], " %") if "(%)" in name else (float(fixed[key]), "")


def _source(row: Mapping[str, Any]) -> str:
    src = row["source"]
    version = str(src.get("version") or "").split(" ")[0]
    arxiv = f"arXiv {src['arxiv']}" + (f" {version}" if re.fullmatch(r"v\d+", version) else "")
    return f"{src['paper']} ({arxiv}), {src['where']}"


def _why_ours_differs(row: Mapping[str, Any], metrics: dict[str, Any]) -> str:
    """One sentence from the run (size, epochs, updates, data) against the paper's stated setting."""
    from zoo_core.datasets import dataset_info
    from zoo_core.errors import ZooError

    t, s, ds = metrics["training"], metrics["seeds"][0], metrics["dataset"]
    run = next(r for r in s["runs"] if r["lr"] == s["lr"])
    n_train, batch = int(s["split"]["sizes"]["train"]), int(t["batch_size"])
    per_epoch = n_train // batch if t.get("drop_last", True) else -(-n_train // batch)
    epochs = int(run["epochs_run"])
    data = f"{n_train:,} training sequences of {ds['name']} ({ds.get('description') or 'as registered'})"
    try:
        theirs = dataset_info(str(row["task"])) if row["task"] != ds["name"] else None
    except (ZooError, KeyError, ValueError):
        theirs = None
    if theirs is not None:
        # not "the paper's task is": the zoo's dataset of that name may itself be a CPU-sized form (mqar)
        data += (f"; the zoo's dataset named for the paper's task is {theirs.name} ({theirs.description}; "
                 f"{int(theirs.sizes.get('train', 0)):,} training sequences)")
    elif row["task"] == ds["name"]:
        data += ", the paper's data"
    return (f"It is one {int(metrics['params']):,}-parameter model, one seed, trained for {epochs} epoch"
            f"{'s' if epochs != 1 else ''} ({epochs * per_epoch:,} updates of batch {batch}) on a CPU on {data}; "
            f"the paper's figure comes from its own protocol ({row.get('setting') or 'setting not recorded'}).")


def figures_section(figures: list[dict[str, Any]] | str, metrics: dict[str, Any], evaluation: dict[str, Any]) -> str:
    """The card's "Beside the papers" block: each published figure next to our test number, its source,
    and why they differ (no trailing newline: it goes between the results table and what follows)."""
    if isinstance(figures, str):
        return f"### Beside the papers\n\nNo published figure for this model on this task: {figures}"
    fixed = evaluation["fixed_depth"]
    lines = ["### Beside the papers", "",
             "| published model | task (split) | metric | this tag | published | source |", "| --- | --- | --- | --- | --- | --- |"]
    gaps = []
    for row in figures:
        ours = _ours(row, fixed)
        mine = f"{ours[0]:.2f}{ours[1]}" if ours else "not measured"
        plot = " (read off a plot)" if "read off" in f"{row.get('notes', '')} {row.get('quote', '')}" else ""
        lines.append(f"| {row['model']} | {row['task']} ({row.get('split', 'test')}) | {row['metric']} | {mine} | "
                     f"{float(row['value']):g}{ours[1] if ours else ''}{plot} | {_source(row)} |")
        if ours:
            gap = ours[0] - float(row["value"])
            unit = " points" if ours[1] else ""
            gaps.append(f"{abs(gap):.2f}{unit} {'below' if gap < 0 else 'above'} {row['model']}'s {float(row['value']):g}{ours[1]}")
    text = "\n".join(lines) + "\n\n"
    if gaps:
        text += f"This tag is {'; '.join(gaps)}. "
    text += _why_ours_differs(figures[0], metrics)
    text += (f" The published figures are the rows of `{PUBLISHED}` (each with the quote and where it was read; "
             f"`{PUBLISHED.parent}/PUBLISHED.md` is the digest) that `{FIGURES}` names for this tag.")
    return text


def _insert_after_results(card: str, block: str) -> str:
    """``card`` with ``block`` right after its results table (before the curves and "How to use")."""
    start = card.index("## Results\n\n") + len("## Results\n\n")
    end = card.index("\n\n", start)
    return card[:end] + "\n\n" + block + card[end:]


def render(tag: str, metrics: dict[str, Any], evaluation: dict[str, Any], info: Mapping[str, Any],
           figures: list[dict[str, Any]] | str | None = None) -> str:
    """README.md of the bundled folder: zoo_core.hub.card.render_card with the run's numbers, and the
    papers' figures beside them when ``pretrained/published.yaml`` lists the tag."""
    from zoo_core.hub.card import render_card

    spec, task, ds = info["spec"], metrics["task"], metrics["dataset"]
    s = metrics["seeds"][0]
    cmd = commands(tag, s)
    evals = [cmd["eval"]]
    if "adaptive" in evaluation:
        evals.append(cmd["eval"].replace("eval-test.json", "eval-test-adaptive.json") + " --adaptive")
    command = "\n".join([cmd["train"], *evals, "# or all of it, with this folder, its card and its registry entry:",
                         cmd["all"], "# the bundled copy gives the same numbers:", cmd["check"]])
    card = render_card(
        name=tag, spec=spec, metrics=metric_rows(evaluation, task, metrics["metric"]), license=LICENSE, datasets=[ds["name"]],
        tags=[task, ds["name"]], num_params=int(metrics["params"]), training_command=command,
        plot=PLOT if metrics.get("plot") else None, description=_describe_run(spec, metrics, ds),
        intended_use=_intended_use(tag, task, ds),
        limitations=_limitations(tag, task, s["split"]["sizes"], int(metrics["params"]), _char_lm(task, ds)),
        versions=info["versions"],
    )
    return card if figures is None else _insert_after_results(card, figures_section(figures, metrics, evaluation))


# the bundled folder and the registry entry --------------------------------------------------------
def bundle(tag: str, metrics: dict[str, Any], evaluation: dict[str, Any], target: Path,
           figures: list[dict[str, Any]] | str | None = None) -> dict[str, str]:
    """Write ``target`` (atomically): the best model's files, the run's plot and the card; returns sha256s."""
    from zoo_core.hub.catalogue import sha256_file
    from zoo_core.io.atomic import atomic_write_dir
    from zoo_core.io.pretrained import read_folder

    best = Path(metrics["seeds"][0]["model_dir"])
    _, info = read_folder(best)
    files: dict[str, bytes] = {n: (best / n).read_bytes() for n in (WEIGHTS, CONFIG)}
    plot = Path(metrics["plot"]) if metrics.get("plot") else None
    if plot is not None:
        files[PLOT] = plot.read_bytes()
    if _char_lm(metrics["task"], metrics["dataset"]):  # without its vocabulary a character model cannot encode a prompt
        from zoo_core.tokenizer import CharTokenizer

        files[VOCAB] = CharTokenizer.for_dataset(metrics["dataset"]["name"]).to_json()
    files[CARD] = render(tag, metrics, evaluation, info, figures).encode("utf-8")
    atomic_write_dir(target, files)
    return {n: sha256_file(target / n) for n in sorted(files)}


def entry_for(tag: str, metrics: dict[str, Any], evaluation: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """registry.yaml's ``pretrained.<tag>`` (the schema in zoo_core/hub/catalogue.py)."""
    ds = metrics["dataset"]["name"]
    return {
        "spec": f"{SPECS}/{tag}.yaml",
        "source": {"bundled": f"{BUNDLES}/{tag}"},
        "files": dict(sorted(files.items())),
        "metrics": metric_rows(evaluation, metrics["task"], metrics["metric"]),
        "card": f"{CARDS}/{tag}.md",
        "license": LICENSE,
        "datasets": [ds],
        "description": f"{metrics['task']} on {ds}; {int(metrics['params']):,} parameters",
    }


# registry.yaml: replace one top-level section, keep every other byte --------------------------------
_TOP_KEY = re.compile(r"[^\s#-]")


def replace_section(text: str, key: str, body: str) -> str:
    """``text`` with the top-level ``key:`` section (its line up to the next top-level key) replaced by ``body``.

    Comments and blank lines just before the next top-level key stay with it; everything outside
    the section is kept byte for byte. A missing section is appended. Raises PretrainError when
    the result does not parse or any other section's value changed.
    """
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(rf"{re.escape(key)}\s*:", line)), None)
    if start is None:
        out = text + ("" if not text or text.endswith("\n") else "\n") + body
    else:
        end = next((i for i in range(start + 1, len(lines)) if _TOP_KEY.match(lines[i])), len(lines))
        while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
            end -= 1
        out = "".join(lines[:start]) + body + "".join(lines[end:])
    before, after = yaml.safe_load(text) or {}, yaml.safe_load(out) or {}
    before.pop(key, None)
    changed = {k for k in set(before) | set(after) if k != key and before.get(k) != after.get(k)}
    if changed:
        raise PretrainError(f"rewriting {key}: would change {', '.join(sorted(changed))}; the file's layout is unexpected")
    return out


def section_text(key: str, entries: Mapping[str, Any]) -> str:
    """``key:`` with the entries in block style, sorted by name, under a do-not-edit comment."""
    if not entries:
        return f"{key}: {{}}\n"
    dumped = yaml.safe_dump({k: entries[k] for k in sorted(entries)}, sort_keys=False, default_flow_style=False,
                            width=120, allow_unicode=True)
    return f"{key}:\n  {SECTION_COMMENT}\n" + "".join(f"  {line}" if line.strip() else line for line in dumped.splitlines(True))


def write_entries(registry: Path, updates: Mapping[str, Any]) -> None:
    """Merge ``updates`` into registry.yaml's ``pretrained:`` (re-read just before writing), check it, write atomically."""
    from zoo_core.hub.catalogue import parse_catalogue
    from zoo_core.io.atomic import atomic_write_file

    for _ in range(5):  # another editor may write the file between our read and our write: read again
        text = registry.read_text(encoding="utf-8")
        current = dict((yaml.safe_load(text) or {}).get("pretrained") or {})
        current.update(updates)
        out = replace_section(text, "pretrained", section_text("pretrained", current))
        parse_catalogue(yaml.safe_load(out), path=registry)
        if registry.read_text(encoding="utf-8") == text:
            atomic_write_file(registry, out.encode("utf-8"))
            return
    raise PretrainError(f"{registry} kept changing while it was being rewritten; run again")


# one tag, end to end ------------------------------------------------------------------------------
def build_tag(tag: str, runs: Path, *, root: Path = ROOT, fresh: bool = False, quiet: bool = False,
              write: bool = True) -> dict[str, Any]:
    """Train (or reuse the run), evaluate, bundle, write the card; returns the registry entry and a summary.

    With ``write=False`` the bundle goes to a temporary folder and nothing in the checkout changes
    (``--verify``); the entry's ``files`` are then the fresh files' sha256s.
    """
    metrics = train_tag(tag, runs, fresh=fresh, quiet=quiet, root=root)
    evaluation = evaluate_run(metrics, runs / tag)
    trained = metrics["seeds"][0]["test"]
    if any(abs(trained[k] - evaluation["fixed_depth"][k]) > 1e-6 * max(1.0, abs(trained[k])) for k in trained):
        print(f"note: {tag}: zoo eval's test numbers {evaluation['fixed_depth']} differ from training's {trained} "
              "(another batch size pads differently); the card reports zoo eval's", file=sys.stderr)
    figures = published_figures(tag, root)
    if figures is None and not quiet:
        print(f"note: {tag}: not listed in {FIGURES}, so its card shows no published figure (list its rows of "
              f"{PUBLISHED}, or none: <why>)", file=sys.stderr)
    if write:
        target = root / BUNDLES / tag
        files = bundle(tag, metrics, evaluation, target, figures)
        shutil.copyfile(target / CARD, root / CARDS / f"{tag}.md")
    else:
        with tempfile.TemporaryDirectory(prefix="zoo-pretrain-") as tmp:
            files = bundle(tag, metrics, evaluation, Path(tmp) / tag, figures)
    entry = entry_for(tag, metrics, evaluation, files)
    size = sum((root / BUNDLES / tag / n).stat().st_size for n in files) if write else None
    summary = {"tag": tag, "dataset": metrics["dataset"]["name"], "params": int(metrics["params"]),
               "metrics": {m["metric"]: m["value"] for m in entry["metrics"]}, "bytes": size,
               "train_epochs_s": round(sum(h["time_s"] for r in metrics["seeds"][0]["runs"] for h in r["history"]), 1),
               "command": commands(tag)["train"]}
    return {"entry": entry, "summary": summary}


def verify(tags: Sequence[str], root: Path = ROOT, quiet: bool = True) -> list[str]:
    """Retrain every tag from scratch in a temporary folder; list the files that differ from the pins."""
    from zoo_core.hub.catalogue import load_catalogue

    cat = load_catalogue(root / REGISTRY)
    problems = []
    with tempfile.TemporaryDirectory(prefix="zoo-verify-") as tmp:
        for tag in tags:
            got = build_tag(tag, Path(tmp), root=root, quiet=quiet, write=False)["entry"]
            want = cat.get(tag)
            for name in sorted(set(want.files) | set(got["files"])):
                if want.files.get(name) != got["files"].get(name):
                    problems.append(f"{tag}: {name} differs from its pin after retraining")
            if [m["value"] for m in got["metrics"]] != [m.value for m in want.metrics]:
                problems.append(f"{tag}: metrics differ after retraining: {got['metrics']}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/pretrain.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tags", nargs="*", help="arch.tag names (pretrained/specs/<arch.tag>.yaml)")
    p.add_argument("--all", action="store_true", help="every spec in pretrained/specs")
    p.add_argument("--runs", type=Path, default=None, help=f"run folders (default {DEFAULT_RUNS} in the checkout)")
    p.add_argument("--fresh", action="store_true", help="delete a tag's run folder and train again")
    p.add_argument("--verify", action="store_true", help="retrain in a temporary folder; compare with the pins")
    p.add_argument("--list", action="store_true", help="list the tags and whether registry.yaml catalogues them")
    p.add_argument("--from-run", type=Path, metavar="CELL_DIR",
                   help="adopt this finished `zoo train` output folder (a sweep cell) as the one tag's run: writes "
                        "pretrained/specs/TAG.yaml from its spec.yaml (if absent or the same), copies it to the runs "
                        "folder, checks `zoo train --resume` accepts it, then bundles as usual")
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    tags = all_tags() if args.all else list(args.tags)
    if args.list:
        listed = (yaml.safe_load((ROOT / REGISTRY).read_text(encoding="utf-8")) or {}).get("pretrained") or {}
        for tag in all_tags():
            print(f"{tag:40s} {'catalogued' if tag in listed else 'not catalogued'}")
        return 0
    if not tags:
        p.error("give tags, or --all (see --list)")
    runs = args.runs or ROOT / DEFAULT_RUNS
    if args.from_run is not None:
        if len(tags) != 1 or args.all or args.verify:
            p.error("--from-run adopts one run as one tag: give exactly one tag (no --all, no --verify)")
        adopt_run(tags[0], args.from_run, runs, fresh=args.fresh)
        args.fresh = False  # the adopted run is the tag's run now
    for tag in tags:
        spec_file(tag)
    if args.verify:
        problems = verify(tags, quiet=args.quiet)
        print("\n".join(problems) if problems else f"reproduced byte for byte: {', '.join(tags)}")
        return 1 if problems else 0
    for tag in tags:
        done = build_tag(tag, runs, fresh=args.fresh, quiet=args.quiet)
        write_entries(ROOT / REGISTRY, {tag: done["entry"]})
        print(json.dumps(done["summary"]))
    from zoo_core.hub.catalogue import check_catalogue, load_catalogue

    problems = check_catalogue(load_catalogue(ROOT / REGISTRY))
    for problem in problems:
        print(f"registry.yaml: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PretrainError as exc:  # the message says what to do; a traceback would bury it
        print(f"python tools/pretrain.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
