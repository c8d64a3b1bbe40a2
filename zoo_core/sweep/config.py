"""The sweep file (strict: pydantic, ``extra="forbid"``, errors at ``file:line:col: key.path``) and its cells.

A sweep is specs × datasets × [axes] × seeds × learning rates (a grid), or an explicit ``cells:`` list
over the same names. Each cell is one ``zoo train`` run of one spec on one dataset with one seed and
one learning rate; an axis is a named set of patches deep-merged into the spec (``model:``,
``input:``, ``training:`` ...), so "width 32 / 64 / 128" or "stacking ABCDEF / AAAAAA" is one axis.

    schema_version: 1
    name: jv-lru
    output: ../runs/jv-lru                 # relative to this file (default: runs/sweeps/<file stem>)
    results: ../results/sweeps/jv-lru.jsonl  # default: <output>/results.jsonl
    specs: {lru: ../specs/lru-japanesevowels.yaml}
    datasets: [JapaneseVowels]             # default: each spec's training.dataset
    seeds: [2345, 3456, 4567]              # or: paper
    lrs: [0.001]                           # or: paper; default: each spec's training.lr
    training: {epochs: 60, early_stop: 15} # overrides of every cell's training: section
    axes:
      c: {"0": {}, "24": {input: {reshape: {c: 24}}}}
    resources: {num_cpus: 1, num_gpus: 0}  # per cell: local worker count, and Ray's request
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..datasets import get_dataset, resolve_name
from ..errors import SpecError, ZooError, did_you_mean
from ..spec import load_spec
from ..spec.errors import format_validation_error, spec_error
from ..spec.training import PAPER_LR_GRID, PAPER_SEEDS, TrainingSpec
from ..spec.yaml_loader import Positions, load_yaml_file

# the training keys a cell sets itself (its dataset, seed and lr are the sweep's axes)
RESERVED_TRAINING = ("dataset", "seed", "seeds", "lr")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # becomes a folder name


def _label(value: str, what: str) -> str:
    if not _LABEL.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be letters, digits and . _ + - (it names a folder)")
    return value


def _training_keys(value: dict[str, Any]) -> dict[str, Any]:
    known = [k for k in TrainingSpec.model_fields if k not in RESERVED_TRAINING]
    for key in value:
        if key in RESERVED_TRAINING:
            raise ValueError(f"{key!r} is a sweep axis, not a training override: use the sweep's "
                             f"{'datasets' if key == 'dataset' else 'seeds' if key.startswith('seed') else 'lrs'}: list")
        if key not in known:
            raise ValueError(f"unknown training key {key!r};{did_you_mean(key, known)} (the keys of a spec's training: section)")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SpecRef(_Strict):
    path: str = Field(description="a spec YAML, relative to the sweep file")
    patch: dict[str, Any] = Field(default_factory=dict, description="deep-merged into the spec (model:, input:, training: ...)")


class Resources(_Strict):
    num_cpus: float = Field(1, gt=0, le=1024, description="CPU threads per cell (OMP_NUM_THREADS) and Ray's num_cpus")
    num_gpus: float = Field(0, ge=0, le=64, description="GPUs per cell: Ray's num_gpus (local workers share the GPUs: set --workers)")


class CellEntry(_Strict):
    """One cell of an explicit ``cells:`` list (names refer to the file's specs and axes)."""

    spec: str
    dataset: str | None = None
    seed: int = Field(0, ge=0)

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str | None) -> str | None:
        return None if v is None else _label(v, "dataset")
    lr: float | None = Field(None, gt=0, le=10)
    axes: dict[str, str] = Field(default_factory=dict, description="axis name -> one of its labels")


class SweepFile(_Strict):
    schema_version: Literal[1] = 1
    name: str | None = None
    description: str = ""
    output: str | None = Field(None, description="run folders, relative to the sweep file (default runs/sweeps/<stem>)")
    results: str | None = Field(None, description="the JSONL, relative to the sweep file (default <output>/results.jsonl)")
    specs: dict[str, str | SpecRef] = Field(min_length=1, description="label -> spec path (or {path, patch})")
    datasets: list[str] | None = Field(None, min_length=1, description="default: each spec's training.dataset")
    seeds: list[int] | Literal["paper"] = Field(default_factory=lambda: [0], description="or 'paper' (the seed paper's five)")
    lrs: list[float] | Literal["paper"] | None = Field(None, description="or 'paper' (1e-3, 1e-4, 1e-5); default: the spec's")
    training: dict[str, Any] = Field(default_factory=dict, description="overrides of every cell's training: section")
    axes: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict, description="axis -> label -> spec patch")
    cells: list[CellEntry] | None = Field(None, min_length=1, description="an explicit list instead of the grid")
    resources: Resources = Field(default_factory=Resources)

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [_label(d, "dataset") for d in v]  # it names a folder: no '..' or '/'

    device: str = Field("auto", description="zoo train --device for every cell")

    @field_validator("specs")
    @classmethod
    def _specs(cls, v: dict[str, Any]) -> dict[str, Any]:
        return {_label(k, "spec label"): p for k, p in v.items()}

    @field_validator("axes")
    @classmethod
    def _axes(cls, v: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
        for axis, labels in v.items():
            _label(axis, "axis name")
            if not labels:
                raise ValueError(f"axis {axis!r} has no labels; give at least one (label: patch)")
            for lab, patch in labels.items():
                _label(lab, f"axis {axis!r} label")
                _training_keys(patch.get("training") or {})  # a cell's dataset, seed and lr are never patched away
        return v

    @field_validator("training")
    @classmethod
    def _training(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _training_keys(v)

    @field_validator("specs")
    @classmethod
    def _spec_patches(cls, v: dict[str, str | SpecRef]) -> dict[str, str | SpecRef]:
        for ref in v.values():
            if isinstance(ref, SpecRef):
                _training_keys(ref.patch.get("training") or {})
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int] | str) -> list[int] | str:
        if isinstance(v, list) and (not v or len(set(v)) != len(v) or min(v) < 0):
            raise ValueError("seeds must be a non-empty list of distinct non-negative integers (or 'paper')")
        return v

    @field_validator("lrs")
    @classmethod
    def _lrs(cls, v: list[float] | str | None) -> list[float] | str | None:
        if isinstance(v, list) and (not v or any(not 0 < x <= 10 for x in v)):
            raise ValueError("lrs must be a non-empty list of learning rates in (0, 10] (or 'paper')")
        return v

    @model_validator(mode="after")
    def _cells_name_known_things(self) -> SweepFile:
        for i, c in enumerate(self.cells or []):
            if c.spec not in self.specs:
                raise ValueError(f"cells[{i}].spec {c.spec!r} is not a label of specs:;{did_you_mean(c.spec, list(self.specs))}")
            missing = sorted(set(self.axes) - set(c.axes))
            if missing:
                raise ValueError(f"cells[{i}] gives no label for axis {missing[0]!r} (every cell names one label per axis)")
            for axis, lab in c.axes.items():
                if axis not in self.axes:
                    raise ValueError(f"cells[{i}].axes: unknown axis {axis!r};{did_you_mean(axis, list(self.axes))}")
                if lab not in self.axes[axis]:
                    raise ValueError(f"cells[{i}].axes.{axis}: unknown label {lab!r};{did_you_mean(lab, list(self.axes[axis]))}")
        return self


@dataclass(frozen=True)
class Cell:
    """One ``zoo train`` run: the merged spec it trains (written to ``<run_dir>/spec.yaml``) and its names."""

    key: str  # spec/dataset[/axis=label...]/seed-S/lr-LR, also the run folder under the output
    spec_label: str
    spec_path: str
    dataset: str
    seed: int
    lr: float
    axes: dict[str, str]
    spec: dict[str, Any]
    config_hash: str  # of the merged spec: a finished row with another hash was made by other settings

    def training(self) -> dict[str, Any]:
        return dict(self.spec.get("training") or {})


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep file: where it writes, what each cell needs, and the cells in order."""

    file: Path
    name: str
    output: Path
    results: Path
    resources: Resources
    device: str
    cells: list[Cell] = field(default_factory=list)


def deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` over ``base``: mappings merge key by key, anything else (lists included) replaces."""
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _lr_text(lr: float) -> str:
    return f"{lr:g}"


def load_sweep(path: str | os.PathLike[str], *, output: str | os.PathLike[str] | None = None,
               validate: bool = True) -> Sweep:
    """Read and check ``path``; expand its cells, each spec merged and (``validate``) checked as ``zoo train`` would.

    ``output`` (``zoo sweep -o``) replaces the file's ``output:`` and puts ``results.jsonl`` in it.
    """
    data, positions = load_yaml_file(path)
    try:
        cfg = SweepFile.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, positions, model=SweepFile) from None
    file = Path(path).resolve()
    here = file.parent
    out = Path(output).resolve() if output is not None else (here / cfg.output if cfg.output else Path("runs/sweeps") / file.stem).resolve()
    # an output given here moves the whole sweep: its results too (a trial run never appends to the file's results)
    results = (here / cfg.results).resolve() if cfg.results and output is None else out / "results.jsonl"
    bases = {label: _base_spec(label, ref, here, positions) for label, ref in cfg.specs.items()}
    cells = [_cell(cfg, bases, *entry, positions) for entry in _entries(cfg, bases, positions)]
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise SpecError(f"{positions.filename}: the cell {dup!r} appears twice; every cell must differ")
    if validate:
        for c in cells:
            _validate(c, positions.filename)
    return Sweep(file, cfg.name or file.stem, out, results, cfg.resources, cfg.device, cells)


def _base_spec(label: str, ref: str | SpecRef, here: Path, positions: Positions) -> tuple[str, dict[str, Any]]:
    ref = SpecRef(path=ref) if isinstance(ref, str) else ref
    p = (here / ref.path).resolve()
    if not p.is_file():
        raise spec_error(positions, ("specs", label), f"spec file {p} not found (paths are relative to the sweep file)")
    spec, _ = load_yaml_file(p)
    if not isinstance(spec, dict):
        raise spec_error(positions, ("specs", label), f"{p} does not hold a spec mapping")
    return str(p), deep_merge(spec, ref.patch)


Entry = tuple[str, str, dict[str, str], int, float]  # spec label, dataset, axes, seed, lr


def _entries(cfg: SweepFile, bases: dict[str, tuple[str, dict[str, Any]]], positions: Positions) -> list[Entry]:
    seeds = list(PAPER_SEEDS) if cfg.seeds == "paper" else list(cfg.seeds)
    lrs_cfg = list(PAPER_LR_GRID) if cfg.lrs == "paper" else cfg.lrs

    def datasets(label: str, given: str | None = None) -> list[str]:
        if given or cfg.datasets:
            return [given] if given else list(cfg.datasets or [])
        name = (bases[label][1].get("training") or {}).get("dataset")
        if not name:
            raise spec_error(positions, ("specs", label), "this spec names no training.dataset; list the sweep's datasets:")
        return [name]

    def lrs(label: str, given: float | None = None) -> list[float]:
        if given is not None or lrs_cfg:
            return [given] if given is not None else list(lrs_cfg or [])
        lr = deep_merge(bases[label][1].get("training") or {}, cfg.training).get("lr", TrainingSpec.model_fields["lr"].default)
        return [float(v) for v in (lr if isinstance(lr, list) else [lr])]

    if cfg.cells is not None:
        return [(c.spec, d, dict(c.axes), c.seed, lr) for c in cfg.cells for d in datasets(c.spec, c.dataset)
                for lr in lrs(c.spec, c.lr)]
    combos: list[dict[str, str]] = [{}]
    for axis, labels in cfg.axes.items():
        combos = [{**c, axis: lab} for c in combos for lab in labels]
    # seed-major: a sweep cut short still holds whole seeds of every configuration
    return [(label, d, combo, seed, lr) for seed in seeds for label in cfg.specs for d in datasets(label)
            for combo in combos for lr in lrs(label)]


def _cell(cfg: SweepFile, bases: dict[str, tuple[str, dict[str, Any]]], label: str, dataset: str, axes: dict[str, str],
          seed: int, lr: float, positions: Positions) -> Cell:
    path, spec = bases[label]
    dataset = resolve_name(dataset)  # the registered spelling: "MQAR-small" and "mqar-small" are one cell
    spec = deep_merge(spec, {"training": cfg.training})
    for axis, lab in axes.items():
        spec = deep_merge(spec, cfg.axes[axis][lab])
    training = {k: v for k, v in (spec.get("training") or {}).items() if k not in RESERVED_TRAINING}
    spec["training"] = {**training, "dataset": dataset, "seed": seed, "lr": lr}
    key = "/".join([label, dataset, *(f"{a}={b}" for a, b in axes.items()), f"seed-{seed}", f"lr-{_lr_text(lr)}"])
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return Cell(key, label, path, dataset, seed, lr, dict(axes), spec, digest)


def _validate(cell: Cell, filename: str) -> None:
    """The checks ``zoo train`` makes before training (spec, training section, the dataset exists and fits
    the spec), before any cell runs."""
    try:
        spec = load_spec(cell.spec)
        TrainingSpec.model_validate(cell.training())
        get_dataset(cell.dataset).check_spec(spec.envelope, where=f"spec {cell.spec_path}")
    except (SpecError, ValidationError) as exc:
        text = str(exc).replace("<dict>: ", "")
        raise SpecError(f"{filename}: cell {cell.key}: the spec {cell.spec_path} with the sweep's training "
                        f"overrides and patches is invalid:\n{text}") from None
    except ZooError as exc:
        raise type(exc)(f"{filename}: cell {cell.key}: {exc}") from None
