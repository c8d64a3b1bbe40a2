"""Datasets: registered through the ``zoo_register_datasets`` hook, loaded per official split.

Letters: n sequences, L (padded) length, D channels, O regression outputs.

A dataset is registered with its metadata (task kind, channels, classes or outputs, length, the
official splits, whether it needs a network, the optional package it needs and the command that
installs it) and a loader ``loader(split, **params) -> SplitData``. Listing datasets imports
nothing heavy; a loader imports its package when it runs.

What a loader returns (``SplitData``):

* ``X``: float32 ``(n, L, D)``, unequal-length sets zero-padded at the end (never truncated), or
  int64 tokens ``(n, L)`` (a dataset registered with ``vocab_size`` and no ``channels``: language
  modelling, token tasks such as MQAR, or token classification such as ListOps);
* ``y``: int64 class ids ``(n,)``, float32 targets ``(n, O)``, or int64 next tokens ``(n, L)``
  (lm; ``-100`` marks a position with no target, ``zoo_core.train.loop.IGNORE``);
* ``lengths``: int64 ``(n,)`` valid steps per sequence, or None when every sequence is full length.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .errors import SpecError, UnknownNameError, ZooError, did_you_mean
from .plugins import env_flag, get_registry

TASKS = ("classification", "regression", "lm")


class MissingDependencyError(ZooError, ImportError):
    """An optional dependency is not installed; the message names the install command."""

    exit_code = 2


class DatasetUnavailableError(ZooError, OSError):
    """A dataset cannot be obtained here (it needs a network and none is reachable, ...)."""

    exit_code = 2


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset is, without loading it."""

    name: str
    task: str
    channels: int | None = None  # real features per step (None for token data)
    classes: int | None = None  # classification
    outputs: int | None = None  # regression targets per sequence
    vocab_size: int | None = None  # lm
    length: int | None = None  # the longest sequence (steps)
    sizes: Mapping[str, int] = field(default_factory=dict)  # official split -> number of sequences
    unequal_length: bool = False
    needs_network: bool = False
    requires: tuple[str, ...] = ()  # importable modules the loader needs
    install: str = ""  # the command that installs them
    source: str = ""
    description: str = ""

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.sizes)

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["sizes"], out["requires"] = dict(self.sizes), list(self.requires)
        return out


@dataclass(frozen=True)
class SplitData:
    """One split: ``X`` (n, L, D) float32 or (n, L) tokens, ``y``, ``lengths`` (n,) or None."""

    X: Any
    y: Any
    lengths: Any = None

    def __len__(self) -> int:
        return int(self.X.shape[0])

    def subset(self, idx: Any) -> SplitData:
        return SplitData(self.X[idx], self.y[idx], None if self.lengths is None else self.lengths[idx])


_INFO_FIELDS = set(DatasetInfo.__dataclass_fields__) - {"name", "description"}


class Dataset:
    """A registered dataset: its ``info`` and ``load(split)``."""

    def __init__(self, info: DatasetInfo, loader: Callable[..., SplitData], params: Mapping[str, Any] | None = None) -> None:
        self.info = info
        self._loader = loader
        self._params = dict(params or {})

    def __repr__(self) -> str:
        return f"Dataset({self.info.name!r}, task={self.info.task!r})"

    def check_available(self) -> None:
        """Raise MissingDependencyError when a package the loader needs is not importable."""
        import importlib.util

        missing = [m for m in self.info.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise MissingDependencyError(
                f"dataset {self.info.name!r} needs the package providing {', '.join(map(repr, missing))}, "
                f"which is not installed: {self.info.install or 'pip install ' + missing[0]}"
            )

    def load(self, split: str) -> SplitData:
        """One official split, checked: shapes, dtypes and lengths as the module docstring says."""
        if split not in self.info.sizes:
            raise SpecError(f"dataset {self.info.name!r} has no split {split!r}; its splits: {', '.join(self.info.splits)}")
        self.check_available()
        data = self._loader(split, **self._params)
        _check_split(self.info, split, data)
        return data

    def check_spec(self, envelope: Any, where: str = "spec") -> None:
        """Raise SpecError, before any training, when a model spec cannot be trained on this dataset."""
        check_spec_fits(self.info, envelope, where)


def _check_split(info: DatasetInfo, split: str, data: SplitData) -> None:
    import numpy as np

    n = len(data)
    bad = []
    if info.task == "lm":
        if data.X.dtype != np.int64 or data.X.ndim != 2 or data.y.shape != data.X.shape:
            bad.append(f"tokens X {data.X.shape} {data.X.dtype}, y {data.y.shape}")
    elif info.vocab_size is not None and info.channels is None:  # token input, one target per sequence
        if data.X.dtype != np.int64 or data.X.ndim != 2:
            bad.append(f"tokens X {data.X.shape} {data.X.dtype} (want int64 (n, L))")
        want_y = (n,) if info.task == "classification" else (n, info.outputs)
        if tuple(data.y.shape) != want_y:
            bad.append(f"y {tuple(data.y.shape)} (want {want_y})")
    else:
        if data.X.dtype != np.float32 or data.X.ndim != 3 or data.X.shape[2] != info.channels:
            bad.append(f"X {data.X.shape} {data.X.dtype} (want float32 (n, L, {info.channels}))")
        want_y = (n,) if info.task == "classification" else (n, info.outputs)
        if tuple(data.y.shape) != want_y:
            bad.append(f"y {tuple(data.y.shape)} (want {want_y})")
    if data.lengths is not None and (data.lengths.shape != (n,) or data.lengths.max(initial=0) > data.X.shape[1]):
        bad.append(f"lengths {data.lengths.shape}")
    if bad:
        raise ZooError(f"dataset {info.name!r} split {split!r}: the loader returned {'; '.join(bad)}; the loader is broken")


def check_spec_fits(info: DatasetInfo, env: Any, where: str = "spec") -> None:
    """The spec's task, classes/outputs and input width must match the dataset's."""
    task, inp = env.task, env.input
    name = info.name
    if task.kind != info.task:
        want = {"classification": f"task: {{kind: classification, classes: {info.classes}}}",
                "regression": f"task: {{kind: regression, outputs: {info.outputs}}}",
                "lm": "task: {kind: lm} with input.vocab_size"}[info.task]
        raise SpecError(f"{where}: task.kind is {task.kind!r} but {name!r} is a {info.task} dataset; "
                        f"train a {info.task} spec on it ({want}) or choose a {task.kind} dataset (zoo list --kind datasets)")
    if info.task == "classification" and task.classes != info.classes:
        raise SpecError(f"{where}: task.classes is {task.classes} but {name!r} has {info.classes} classes; "
                        f"set task.classes: {info.classes}")
    if info.task == "regression" and task.outputs != info.outputs:
        raise SpecError(f"{where}: task.outputs is {task.outputs} but {name!r} has {info.outputs} target(s); "
                        f"set task.outputs: {info.outputs}")
    if info.task == "lm" or (info.vocab_size is not None and info.channels is None):
        if inp.vocab_size is None or inp.vocab_size < (info.vocab_size or 0):
            raise SpecError(f"{where}: input.vocab_size is {inp.vocab_size} but {name!r} uses {info.vocab_size} tokens; "
                            f"set input.vocab_size: {info.vocab_size}")
        return
    if inp.channels != info.channels:
        raise SpecError(f"{where}: input.channels is {inp.channels} but {name!r} has {info.channels} channel(s) per step; "
                        f"set input.channels: {info.channels}")


# registry lookups -------------------------------------------------------------------------------
def _registry(registry: Any) -> Any:
    if registry is not None:
        return registry

    return get_registry()


def resolve_name(name: str, registry: Any = None) -> str:
    """The registered name for ``name`` (case-insensitive), or UnknownNameError with suggestions."""
    reg = _registry(registry)
    if name in reg.datasets:
        return name
    folded = {n.casefold(): n for n in reg.datasets}
    if name.casefold() in folded:
        return folded[name.casefold()]
    reg.refuse_conflict("datasets", name)  # two plugins claim it: name both (exit 4), not "unknown"
    close = did_you_mean(name, reg.datasets) or did_you_mean(name.casefold(), folded)
    raise UnknownNameError(
        f"unknown dataset {name!r};{close} registered datasets: {', '.join(sorted(reg.datasets)) or '(none)'} "
        "(zoo list --kind datasets)"
    )


def dataset_info(name: str, registry: Any = None) -> DatasetInfo:
    """Metadata of a registered dataset (imports nothing)."""
    reg = _registry(registry)
    entry = reg.datasets[resolve_name(name, reg)]
    meta = {k: v for k, v in entry.extra.items() if k in _INFO_FIELDS}
    meta["requires"] = tuple(meta.get("requires", ()))
    meta["sizes"] = dict(meta.get("sizes", {}))
    return DatasetInfo(name=entry.name, description=entry.description, **meta)


def get_dataset(name: str, registry: Any = None) -> Dataset:
    """The registered dataset ``name`` (case-insensitive), ready to ``load(split)``."""
    reg = _registry(registry)
    info = dataset_info(name, reg)
    entry = reg.datasets[info.name]
    return Dataset(info, entry.load(), entry.extra.get("params"))


def list_datasets(registry: Any = None) -> list[DatasetInfo]:
    reg = _registry(registry)
    return [dataset_info(n, reg) for n in sorted(reg.datasets)]


# helpers for loaders ----------------------------------------------------------------------------
def pad_sequences(seqs: Sequence[Any]) -> tuple[Any, Any]:
    """List of (L_i, D) arrays -> X (n, max L_i, D) float32 zero-padded at the end, lengths (n,)."""
    import numpy as np

    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    X = np.zeros((len(seqs), int(lengths.max(initial=0)), seqs[0].shape[1] if len(seqs) else 0), dtype=np.float32)
    for i, s in enumerate(seqs):
        X[i, : len(s)] = s
    return X, lengths


def encode_labels(labels: Sequence[Any]) -> tuple[list[Any], dict[Any, int]]:
    """Sorted distinct labels (numerically when all are numbers) and label -> class id."""

    def key(v: Any) -> tuple[int, Any]:
        try:
            return (0, float(v))
        except (TypeError, ValueError):
            return (1, str(v))

    classes = sorted(set(labels), key=key)
    return classes, {c: i for i, c in enumerate(classes)}


def data_home() -> Path:
    """Where downloaded datasets are cached: ``$ZOO_DATA_DIR``, else ``~/.cache/zoo/datasets``."""
    return Path(os.environ.get("ZOO_DATA_DIR") or Path.home() / ".cache" / "zoo" / "datasets")


def offline() -> bool:
    """True when ``ZOO_OFFLINE`` or ``HF_HUB_OFFLINE`` is set: never try a download."""
    return env_flag("ZOO_OFFLINE") or env_flag("HF_HUB_OFFLINE")


# kept for ``zoo stream`` (demo.py) --------------------------------------------------------------
BUNDLED_UEA = {"basicmotions": "BasicMotions", "japanesevowels": "JapaneseVowels"}


class Sequences(NamedTuple):
    """A split as arrays, lengths always present: ``X`` (n, L, D) zero-padded at the end, ``y`` (n,),
    ``lengths`` (n,) valid steps per sequence (L for every sequence of an equal-length set)."""

    X: Any
    y: Any
    lengths: Any


def load_uea_bundled(name: str, split: str = "test") -> Sequences:
    """(X, y, lengths) of a bundled UEA set: X (n, L, D) float32 (zero-padded), y (n,) int64, lengths (n,) int64.

    The lengths are returned because a padded set scored without them is scored on its padding
    (JapaneseVowels: 0.638 instead of 0.981); pass them on as ``model(X, lengths=lengths)`` or
    score with ``zoo_core.train.evaluate.evaluate_split``.
    """
    import numpy as np

    data = get_dataset(BUNDLED_UEA.get(name, name)).load(split)
    lengths = data.lengths if data.lengths is not None else np.full(len(data), data.X.shape[1], dtype=np.int64)
    return Sequences(data.X, data.y, lengths)


def describe(name: str) -> dict[str, Any]:
    info = dataset_info(BUNDLED_UEA.get(name, name))
    return {"name": info.name, "source": info.source}
