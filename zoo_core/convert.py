"""Foreign checkpoints → zoo model folders: the converter protocol, lookup, and ``zoo convert``.

A plugin registers a converter through the ``zoo_register_converters`` hook::

    register("transformers-mamba", "zoo_mamba.convert:TRANSFORMERS", description="...")

The target (imported only when used) is any object with two methods (``Converter``):

* ``detect(source: Path) -> bool`` — cheap (reads a config file, never the weights): does this
  folder look like a checkpoint this converter reads? ``--from auto`` asks every converter and
  needs exactly one yes.
* ``convert(source: Path) -> SequenceModel`` — read the folder and return a built model carrying
  its spec (``zoo_core.build.build_model``) with the converted weights. It raises
  ``CheckpointError`` for unreadable or inconsistent checkpoints (a config that disagrees with the
  weights names each field) and ``SpecError`` for architectures the zoo cannot express; it never
  unpickles anything but through torch's weights-only loader.

``convert_checkpoint`` runs one and writes the result with ``save_pretrained``, which writes a
staging folder and renames it into place: a failed conversion leaves no destination folder (or the
old one untouched).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import CheckpointError, PluginLoadError, SpecError, UnknownNameError, did_you_mean
from .plugins import get_registry

log = logging.getLogger("zoo_core.convert")

__all__ = ["Converter", "convert_checkpoint", "detect_converter", "get_converter", "register_cli"]


@runtime_checkable
class Converter(Protocol):
    """What a registered converter target provides."""

    def detect(self, source: Path) -> bool: ...

    def convert(self, source: Path) -> Any: ...


def _registry(registry: Any) -> Any:
    if registry is not None:
        return registry

    return get_registry()


def get_converter(name: str, *, registry: Any = None) -> Converter:
    """The converter registered as ``name`` (imports its code)."""
    reg = _registry(registry)
    if name not in reg.converters:
        reg.refuse_conflict("converters", name)  # two plugins claim it: name both (exit 4), not "unknown"
        names = sorted(reg.converters)
        raise UnknownNameError(
            f"unknown converter {name!r};{did_you_mean(name, names)} registered converters: "
            f"{', '.join(names) or '(none: install a plugin that provides one, e.g. zoo-mamba)'}."
        )
    entry = reg.converters[name]
    target = entry.load()
    if not isinstance(target, Converter):
        raise PluginLoadError(
            f"converter {name!r} registered by {entry.provider} has no detect(source) and convert(source) methods; "
            "the plugin is broken: reinstall or report it"
        )
    return target


def detect_converter(source: str | os.PathLike[str], *, registry: Any = None) -> str:
    """The name of the one registered converter that recognises ``source``."""
    reg = _registry(registry)
    path = Path(source)
    found = []
    for name in sorted(reg.converters):
        try:
            if get_converter(name, registry=reg).detect(path):
                found.append(name)
        except Exception as exc:  # a broken plugin costs only itself
            log.warning("skipping converter %r, whose detect failed: %s: %s", name, type(exc).__name__, exc)
    if len(found) == 1:
        return found[0]
    names = ", ".join(sorted(reg.converters)) or "(none)"
    if not found:
        raise SpecError(f"no registered converter recognises {path} (tried: {names}); check the folder or name one with --from")
    raise SpecError(f"several converters recognise {path} ({', '.join(found)}); choose one with --from")


def convert_checkpoint(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    converter: str = "auto",
    overwrite: bool = False,
    registry: Any = None,
) -> tuple[Path, str, Any]:
    """Convert the checkpoint folder ``source`` and save it as a zoo model folder.

    Args:
        source: the foreign checkpoint folder.
        destination: the zoo folder to write (model.safetensors + config.json); it must not exist
            unless ``overwrite`` (then it must be a folder save_pretrained wrote).
        converter: a registered converter name, or "auto" (the one whose ``detect`` says yes).
        overwrite: replace an existing destination.
        registry: the plugin registry (default: the installed plugins).

    Returns:
        (the destination path, the converter's name, the converted model).

    Raises:
        SpecError: a missing source, a bad destination, no / several converters, an architecture
            the zoo cannot express. CheckpointError: unreadable or inconsistent checkpoint files.
    """
    from .io.pretrained import save_pretrained  # lazy: keeps safetensors, torch out of convert

    src, dst = Path(source), Path(destination)
    if not src.is_dir():
        raise SpecError(f"{src}: no such checkpoint folder")
    if dst.exists() and dst.resolve() == src.resolve():
        raise SpecError(f"the destination {dst} is the source folder; write the converted model somewhere else")
    if dst.exists() and not overwrite and (not dst.is_dir() or any(dst.iterdir())):
        raise SpecError(f"{dst} already exists; choose a new folder or pass --overwrite to replace a zoo model folder")
    reg = _registry(registry)
    name = detect_converter(src, registry=reg) if converter == "auto" else converter
    model = get_converter(name, registry=reg).convert(src)
    if not getattr(model, "spec", None):
        raise PluginLoadError(f"converter {name!r} returned a model without a spec; it must build models with zoo_core.build.build_model")
    try:
        path = save_pretrained(model, dst)
    except OSError as exc:
        raise CheckpointError(f"cannot write {dst}: {exc.strerror or exc}") from None
    return path, name, model


def cmd_convert(args: argparse.Namespace) -> int:
    from .build import summary  # lazy: keeps torch out of convert

    path, name, model = convert_checkpoint(args.source, args.destination, converter=args.converter, overwrite=args.overwrite)
    print(summary(model))
    print(f"converted {args.source} ({name}) -> {path}")
    return 0


def register_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``zoo convert SRC DST [--from NAME] [--overwrite]`` to an argparse subparsers object."""
    p = subparsers.add_parser("convert", help="convert a foreign checkpoint folder (transformers, mamba_ssm, ...) into a zoo model folder")
    p.add_argument("source", metavar="SRC", help="the checkpoint folder (config.json + weights)")
    p.add_argument("destination", metavar="DST", help="the zoo model folder to write (must not exist)")
    p.add_argument("--from", dest="converter", default="auto", metavar="NAME",
                   help="a registered converter (zoo list --kind converters); default: detect")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it is a zoo model folder")
    p.set_defaults(fn=cmd_convert)
    return p
