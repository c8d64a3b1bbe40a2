"""The ``pretrained:`` section of ``registry.yaml``: one entry per ``arch.tag``.

Schema of an entry (paths are relative to the folder holding ``registry.yaml``)::

    pretrained:
      lru-uea.heartbeat:
        default: true                          # optional: the tag ``lru-uea`` alone resolves to
        spec: specs/pretrained/lru-uea.heartbeat.yaml   # or an inline mapping
        source:
          hub: ssm-zoo/lru-uea.heartbeat        # Hub repo id (optional if bundled)
          revision: 0123...cdef                 # the pinned commit: 40 hex digits, never a branch
          bundled: weights/lru-uea.heartbeat    # optional: a folder shipped in the repository
        files:                                  # sha256 of every file the repo holds
          model.safetensors: <64 hex>
          config.json: <64 hex>
          README.md: <64 hex>
        metrics:
          - {dataset: uea/heartbeat, split: test, metric: accuracy, value: 0.76}
        card: model_cards/lru-uea.heartbeat.md  # identical to the repo's README.md
        license: apache-2.0
        datasets: [uea/heartbeat]

``load_catalogue`` parses and type-checks it (errors name the entry and the key);
``check_catalogue`` compares it with the installed plugins, the bundled files and the cards.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError, UnknownNameError, did_you_mean
from ..plugin_catalogue import default_path
from ..spec import load_spec
from ..spec.yaml_loader import load_yaml_file
from .refs import _ARCH, _TAG, check_repo_id

ENTRY_KEYS = {"default", "spec", "source", "files", "metrics", "card", "license", "datasets", "description", "tags"}
SOURCE_KEYS = {"hub", "revision", "bundled"}
METRIC_KEYS = {"dataset", "split", "metric", "value", "task", "name"}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Metric:
    """One measured result: ``metric`` on ``dataset``'s ``split`` is ``value``."""

    dataset: str
    split: str
    metric: str
    value: float
    task: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class PretrainedEntry:
    """One ``arch.tag`` of the catalogue."""

    name: str
    spec: dict[str, Any]
    hub_repo: str | None = None
    revision: str | None = None
    bundled: Path | None = None
    files: dict[str, str] = field(default_factory=dict)
    metrics: tuple[Metric, ...] = ()
    card: Path | None = None
    license: str | None = None
    datasets: tuple[str, ...] = ()
    description: str = ""
    tags: tuple[str, ...] = ()
    default: bool = False

    @property
    def arch(self) -> str:
        return self.name.partition(".")[0]

    @property
    def tag(self) -> str:
        return self.name.partition(".")[2]

    @property
    def core(self) -> str | None:
        return self.spec.get("model", {}).get("core", {}).get("kind")

    def row(self) -> dict[str, Any]:
        """A JSON-able summary (``zoo list --pretrained``)."""
        return {
            "name": self.name, "core": self.core, "hub": self.hub_repo, "revision": self.revision,
            "bundled": str(self.bundled) if self.bundled else None, "license": self.license,
            "metrics": [m.__dict__ for m in self.metrics], "default": self.default,
        }


@dataclass(frozen=True)
class Catalogue:
    """All pretrained entries, by ``arch.tag``; ``path`` is the ``registry.yaml`` they came from."""

    path: Path | None
    entries: dict[str, PretrainedEntry]

    def get(self, name: str) -> PretrainedEntry:
        """The entry for ``arch.tag``, or for ``arch`` its default tag (the first one if none is marked)."""
        if name in self.entries:
            return self.entries[name]
        if "." not in name:
            tags = [e for e in self.entries.values() if e.arch == name]
            if tags:
                return next((e for e in tags if e.default), tags[0])
        where = f" in {self.path}" if self.path else " (no registry.yaml found; set ZOO_REGISTRY)"
        archs = {e.arch for e in self.entries.values()}
        raise UnknownNameError(
            f"no pretrained weights are catalogued as {name!r}{where};{did_you_mean(name, [*self.entries, *archs])} "
            "see `zoo list --pretrained`."
        )

    def filter(self, pattern: str = "*") -> Iterator[PretrainedEntry]:
        for name in sorted(self.entries):
            if fnmatch.fnmatch(name, pattern):
                yield self.entries[name]


def _fail(path: Path | None, where: str, message: str) -> SpecError:
    return SpecError(f"{path or 'registry.yaml'}: pretrained.{where}: {message}")


def _check_keys(value: Any, allowed: set[str], path: Path | None, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, where, f"expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _fail(path, where, f"unknown key {unknown[0]!r};{did_you_mean(str(unknown[0]), allowed)} "
                                 f"allowed: {', '.join(sorted(allowed))}")
    return dict(value)


def _load_spec(value: Any, root: Path, path: Path | None, where: str) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        spec_path = root / value
        if not spec_path.is_file():
            raise _fail(path, f"{where}.spec", f"{spec_path} does not exist")
        data, _ = load_yaml_file(spec_path)
        if not isinstance(data, dict):
            raise _fail(path, f"{where}.spec", f"{spec_path} does not hold a mapping")
        return data
    raise _fail(path, f"{where}.spec", "give a spec file path or an inline mapping")


def _parse_entry(name: str, raw: Any, root: Path, path: Path | None) -> PretrainedEntry:
    arch, dot, tag = str(name).partition(".")
    if not dot or not _ARCH.fullmatch(arch) or not _TAG.fullmatch(tag):
        raise _fail(path, str(name), "entries are named arch.tag (lowercase letters, digits, '-', '_')")
    e = _check_keys(raw, ENTRY_KEYS, path, name)
    if "spec" not in e:
        raise _fail(path, name, "missing 'spec'")
    src = _check_keys(e.get("source", {}), SOURCE_KEYS, path, f"{name}.source")
    hub, revision, bundled = src.get("hub"), src.get("revision"), src.get("bundled")
    if not hub and not bundled:
        raise _fail(path, f"{name}.source", "give a Hub repo ('hub' + 'revision'), a 'bundled' folder, or both")
    if hub:
        check_repo_id(str(hub))
        if not isinstance(revision, str) or not _COMMIT.fullmatch(revision):
            raise _fail(path, f"{name}.source.revision", "pin a 40-hex-digit commit sha (a branch or tag can move)")
    files = _check_keys(e.get("files", {}), set(e.get("files", {}) or {}), path, f"{name}.files")
    for fname, digest in files.items():
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise _fail(path, f"{name}.files.{fname}", "expected a sha256: 64 lowercase hex digits")
    metrics = []
    for i, m in enumerate(e.get("metrics", []) or []):
        m = _check_keys(m, METRIC_KEYS, path, f"{name}.metrics[{i}]")
        missing = [k for k in ("dataset", "split", "metric", "value") if k not in m]
        if missing or isinstance(m["value"], bool) or not isinstance(m["value"], (int, float)):
            raise _fail(path, f"{name}.metrics[{i}]", f"needs dataset, split, metric and a numeric value (missing: {missing or 'value'})")
        metrics.append(Metric(str(m["dataset"]), str(m["split"]), str(m["metric"]), float(m["value"]), m.get("task"), m.get("name")))
    return PretrainedEntry(
        name=name, spec=_load_spec(e["spec"], root, path, name), hub_repo=hub, revision=revision,
        bundled=root / bundled if bundled else None, files=files, metrics=tuple(metrics),
        card=root / e["card"] if e.get("card") else None, license=e.get("license"),
        datasets=tuple(e.get("datasets", []) or ()), description=str(e.get("description", "")),
        tags=tuple(e.get("tags", []) or ()), default=bool(e.get("default", False)),
    )


def parse_catalogue(data: Any, *, path: Path | None = None, root: Path | None = None) -> Catalogue:
    """Type-check the ``pretrained:`` section of an already parsed ``registry.yaml``."""
    root = root or (path.parent if path else Path.cwd())
    section = (data or {}).get("pretrained", {}) if isinstance(data, Mapping) else None
    if not isinstance(section, Mapping):
        raise SpecError(f"{path or 'registry.yaml'}: 'pretrained' must be a mapping of arch.tag -> entry")
    entries = {str(n): _parse_entry(str(n), raw, root, path) for n, raw in section.items()}
    for arch in {e.arch for e in entries.values()}:
        defaults = [n for n, e in entries.items() if e.arch == arch and e.default]
        if len(defaults) > 1:
            raise _fail(path, defaults[1], f"{arch!r} has several default tags ({', '.join(defaults)}); keep one")
    return Catalogue(path, entries)


_CACHE: dict[tuple[str, float], Catalogue] = {}


def load_catalogue(path: str | os.PathLike[str] | None = None) -> Catalogue:
    """Read and check ``registry.yaml`` (``default_path()`` when ``path`` is None); cached by mtime."""
    p = Path(path) if path is not None else default_path()
    if p is None:
        return Catalogue(None, {})
    if not p.is_file():
        raise SpecError(f"{p}: no such registry file")
    key = (str(p.resolve()), p.stat().st_mtime)
    if key not in _CACHE:
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise SpecError(f"{p}: not valid YAML ({exc})") from None
        _CACHE[key] = parse_catalogue(data, path=p)
    return _CACHE[key]


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_catalogue(catalogue: Catalogue, *, registry: Any = None) -> list[str]:
    """Problems found comparing the catalogue with the installed plugins, bundled files and cards.

    Checks, per entry: its spec validates against the installed plugins (an unknown core names
    the plugin to install); a bundled folder exists and every file matches its sha256 pin, and
    ``model.safetensors`` / ``config.json`` are pinned; the card exists and, when ``README.md`` is
    pinned, is byte-identical to it. Returns an empty list when everything agrees.
    """
    problems: list[str] = []
    for e in catalogue.filter():
        try:
            load_spec(e.spec, registry=registry)
        except Exception as exc:  # noqa: BLE001 - every problem is reported, not only the first
            problems.append(f"{e.name}: spec does not validate: {exc}")
        if e.hub_repo or e.bundled:
            for needed in ("model.safetensors", "config.json"):
                if needed not in e.files:
                    problems.append(f"{e.name}: files: no sha256 pin for {needed}")
        if e.bundled is not None:
            if not e.bundled.is_dir():
                problems.append(f"{e.name}: bundled folder {e.bundled} does not exist")
            else:
                for fname, digest in e.files.items():
                    fpath = e.bundled / fname
                    if not fpath.is_file():
                        problems.append(f"{e.name}: bundled {fname} is missing from {e.bundled}")
                    elif sha256_file(fpath) != digest:
                        problems.append(f"{e.name}: bundled {fname} does not match its sha256 pin")
        if e.card is not None:
            if not e.card.is_file():
                problems.append(f"{e.name}: card {e.card} does not exist")
            elif "README.md" in e.files and sha256_file(e.card) != e.files["README.md"]:
                problems.append(f"{e.name}: card {e.card} differs from the pinned README.md (regenerate it with render_card)")
    return problems
