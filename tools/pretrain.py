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

A finished run in ``--runs`` is reused (``zoo train --resume`` returns at once); ``--fresh`` trains again.
Only the ``pretrained:`` section of registry.yaml is rewritten; comments and every other section stay
byte for byte. Nothing here publishes to the Hub: the printed ``zoo push`` command does that.
"""

from __future__ import annotations

import argparse
import json
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
def train_tag(tag: str, runs: Path, *, fresh: bool = False, quiet: bool = False, root: Path = ROOT) -> dict[str, Any]:
    """``zoo train`` the tag's spec into ``runs/<tag>`` (a finished run is reused); returns metrics.json."""
    from zoo_core.train import train
    from zoo_core.train.progress import Progress

    out = runs / tag
    if fresh and out.exists():
        shutil.rmtree(out)
    spec = spec_file(tag, root)
    rel = spec.relative_to(root)
    metrics = train(str(spec), output=out, resume=(out / "run.json").is_file(), device="cpu",
                    progress=Progress(quiet=quiet, bar=False), command=commands(tag)["train"].split())
    if metrics.get("name") != tag:
        raise PretrainError(f"{rel}: its name is {metrics.get('name')!r}; set name: {tag} (the tag the file is named for)")
    if len(metrics["seeds"]) != 1:
        raise PretrainError(f"{rel}: a pretrained tag ships one model; give training.seed, not several training.seeds")
    s = metrics["seeds"][0]
    s["model_dir"] = str(out / f"seed-{s['seed']}" / f"lr-{s['lr']:g}" / "best")  # where it is now (run folders move)
    return metrics


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


def metric_rows(evaluation: dict[str, Any], task: str) -> list[dict[str, Any]]:
    """The card's and registry's metrics: the task's headline metric first, then the rest (loss, ...),
    then adaptive depth's (``adaptive_*``) when it was evaluated."""
    fixed = evaluation["fixed_depth"]
    first = PRIMARY.get(task, "loss")
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
    loss = "the blockwise loss (the shared head after every period, averaged)" if t["loss"] == "blockwise" else "the loss of the final output"
    protocol = {"seed-split": "the official splits merged, exact duplicates dropped, a random 70/15/15 split",
                "official": "the official splits"}[t["protocol"]]
    return (f"{spec.get('description') or 'A sequence model assembled by SSM Zoo.'}\n\n"
            f"Trained with `zoo train` on {ds['name']} ({ds.get('description') or ds.get('source') or 'a registered dataset'}): "
            f"{protocol} with seed {s['split']['seed']} (train {sizes['train']}, validation {sizes['val']}, "
            f"test {sizes['test']} sequences), {t['optimizer'].capitalize()} at learning rate {s['lr']:g}{clip}, batch {t['batch_size']}, "
            f"{loss}, up to {t['epochs']} epoch{'s' if t['epochs'] != 1 else ''}{stop}. The weights are those of the best validation epoch, ties going to the later one "
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


def _intended_use(tag: str, task: str, ds: Mapping[str, Any]) -> str:
    if task == "lm":
        return ("A small character-level language model to try SSM Zoo's language-model path: loading by tag, "
                "streaming generation with `step`, perplexity on the held-out plays, and converting or fine-tuning "
                "tests. Research and teaching only.\n\n"
                f"Its characters ship in `{VOCAB}` (`zoo_core.tokenizer.CharTokenizer.from_pretrained(\"{tag}\")` "
                f"encodes and decodes text); `zoo generate {tag} --prompt \"ROMEO:\" --temperature 0` continues a prompt.")
    return (f"A small, fast reference classifier for {ds['name']}: loading by tag, streaming inference with `step`, "
            "depth and backend experiments, and a baseline to compare other cores against on the same split. "
            "Research and teaching only.")


def _limitations(tag: str, task: str, sizes: Mapping[str, int], params: int) -> str:
    cmd = commands(tag)
    text = (f"Small ({params:,} parameters) and trained once, with one seed and one learning rate; the result is "
            f"one sample, not a mean over seeds, and the test split holds only {sizes['test']} sequences")
    text += (f" (one sequence is {100 / sizes['test']:.1f} points of accuracy)." if task == "classification" else ".")
    text += (" The numbers hold for this dataset and split only and say nothing about other data. Bitwise "
             "reproduction of the weights needs the same versions (below) and a CPU; other hardware gives close, "
             "not identical, numbers.")
    if task == "lm":
        text += (" The model has seen only Shakespeare's plays (84 characters), for one epoch (about 4 million characters) on a CPU: "
                 "it produces plausible-looking character sequences, not meaningful text.")
    text += (f"\n\nThe Hub copy is not published yet: this folder ships in the repository as a bundled copy "
             f"(registry.yaml's source.bundled). Publishing it is `{cmd['push']}`, then pinning the commit it prints "
             "in registry.yaml (source.hub and source.revision).")
    return text


def render(tag: str, metrics: dict[str, Any], evaluation: dict[str, Any], info: Mapping[str, Any]) -> str:
    """README.md of the bundled folder: zoo_core.hub.card.render_card with the run's numbers."""
    from zoo_core.hub.card import render_card

    spec, task, ds = info["spec"], metrics["task"], metrics["dataset"]
    s = metrics["seeds"][0]
    cmd = commands(tag, s)
    evals = [cmd["eval"]]
    if "adaptive" in evaluation:
        evals.append(cmd["eval"].replace("eval-test.json", "eval-test-adaptive.json") + " --adaptive")
    command = "\n".join([cmd["train"], *evals, "# or all of it, with this folder, its card and its registry entry:",
                         cmd["all"], "# the bundled copy gives the same numbers:", cmd["check"]])
    return render_card(
        name=tag, spec=spec, metrics=metric_rows(evaluation, task), license=LICENSE, datasets=[ds["name"]],
        tags=[task, ds["name"]], num_params=int(metrics["params"]), training_command=command,
        plot=PLOT if metrics.get("plot") else None, description=_describe_run(spec, metrics, ds),
        intended_use=_intended_use(tag, task, ds), limitations=_limitations(tag, task, s["split"]["sizes"], int(metrics["params"])),
        versions=info["versions"],
    )


# the bundled folder and the registry entry --------------------------------------------------------
def bundle(tag: str, metrics: dict[str, Any], evaluation: dict[str, Any], target: Path) -> dict[str, str]:
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
    if metrics["task"] == "lm":  # without its vocabulary a character model cannot encode a prompt
        from zoo_core.tokenizer import CharTokenizer

        files[VOCAB] = CharTokenizer.for_dataset(metrics["dataset"]["name"]).to_json()
    files[CARD] = render(tag, metrics, evaluation, info).encode("utf-8")
    atomic_write_dir(target, files)
    return {n: sha256_file(target / n) for n in sorted(files)}


def entry_for(tag: str, metrics: dict[str, Any], evaluation: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """registry.yaml's ``pretrained.<tag>`` (the schema in zoo_core/hub/catalogue.py)."""
    ds = metrics["dataset"]["name"]
    return {
        "spec": f"{SPECS}/{tag}.yaml",
        "source": {"bundled": f"{BUNDLES}/{tag}"},
        "files": dict(sorted(files.items())),
        "metrics": metric_rows(evaluation, metrics["task"]),
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
    if write:
        target = root / BUNDLES / tag
        files = bundle(tag, metrics, evaluation, target)
        shutil.copyfile(target / CARD, root / CARDS / f"{tag}.md")
    else:
        with tempfile.TemporaryDirectory(prefix="zoo-pretrain-") as tmp:
            files = bundle(tag, metrics, evaluation, Path(tmp) / tag)
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
    for tag in tags:
        spec_file(tag)
    if args.verify:
        problems = verify(tags, quiet=args.quiet)
        print("\n".join(problems) if problems else f"reproduced byte for byte: {', '.join(tags)}")
        return 1 if problems else 0
    runs = args.runs or ROOT / DEFAULT_RUNS
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
    sys.exit(main())
