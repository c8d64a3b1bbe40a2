"""pydantic errors as ``file:line:col: dotted.path: message`` lines, with close-name suggestions."""

from __future__ import annotations

import types
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pydantic
from pydantic import BaseModel

from ..errors import SpecError, did_you_mean
from .yaml_loader import Loc, Positions

MAX_LINES = 50
_SEQS = (list, tuple, set, frozenset, Sequence)
_MAPS = (dict, Mapping)

Row = tuple[Loc, int | None, int | None, str]  # (loc, line, col, message)


def _strip(tp: Any) -> Any:
    """`tp` without Annotated[...] and without the None of Optional[...]."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, types.UnionType):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) > 1:
                return tp
            tp = members[0]
        else:
            return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _names(model: type[BaseModel]) -> set[str]:
    """Keys a model accepts: each field's alias, and its name unless only the alias is accepted."""
    cfg = model.model_config
    by_name = cfg.get("populate_by_name") or cfg.get("validate_by_name")
    by_alias = cfg.get("validate_by_alias", True)
    out: set[str] = set()
    for name, f in model.model_fields.items():
        alias = next((a for a in (f.validation_alias, f.alias) if isinstance(a, str)), None)
        if alias and by_alias:
            out.add(alias)
        if by_name or not (alias and by_alias):
            out.add(name)
    return out


def _field(model: type[BaseModel], key: str) -> Any:
    for name, f in model.model_fields.items():
        if key in (name, f.alias, f.validation_alias):
            return f.annotation
    return None


def _child(tp: Any, seg: str | int) -> Any:
    """The type found at `seg` inside a value of type `tp`; None when unknown."""
    if _is_model(tp):
        return _field(tp, seg) if isinstance(seg, str) else None
    origin, args = get_origin(tp), get_args(tp)
    if isinstance(origin, type) and issubclass(origin, _SEQS) and isinstance(seg, int) and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return args[seg] if seg < len(args) else None
        return args[0]
    if isinstance(origin, type) and issubclass(origin, _MAPS) and len(args) == 2:
        return args[1]
    return None


def _pick(union: Any, tag: str | int) -> Any:
    """The union member that pydantic's loc tag names: a class name or a discriminator value."""
    for member in map(_strip, get_args(union)):
        if getattr(member, "__name__", None) == tag:
            return member
        if _is_model(member):
            for f in member.model_fields.values():
                ann = _strip(f.annotation)
                if get_origin(ann) is Literal and tag in get_args(ann):
                    return member
    return None


def _walk(loc: Loc, model: type[BaseModel] | None, positions: Positions, prefix: Loc) -> tuple[Loc, Any]:
    """`loc` without pydantic's union tags, and the model owning its last key (None if unknown).

    A tag is known from the model (a union sits here), or, without type information, from the
    file: a segment before the last that the file does not have, under a key that it does have.
    """
    out: list[str | int] = []
    tp: Any = model
    owner = None
    table = positions.table
    for i, seg in enumerate(loc):
        tp = _strip(tp)
        here = prefix + tuple(out)
        if get_origin(tp) in (Union, types.UnionType):
            tp = _pick(tp, seg)
            continue
        if tp is None and i < len(loc) - 1 and here in table and here + (seg,) not in table:
            continue
        out.append(seg)
        owner = tp if _is_model(tp) else None
        tp = _child(tp, seg)
    return tuple(out), owner


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _message(err: Mapping[str, Any], loc: Loc, owner: Any) -> str:
    kind = err["type"]
    if kind == "extra_forbidden" and loc:
        key = loc[-1]
        names = _names(owner) if owner is not None else set()
        hint = did_you_mean(str(key), names)
        foreign = non_ascii(str(key))
        if foreign:
            return f"unknown {foreign}" + (f";{hint}" if hint else "")
        if hint:
            return f"unknown key {key!r};{hint}"
        return f"unknown key {key!r}" + (f" (allowed: {', '.join(sorted(names))})" if names else "")
    if kind == "missing":
        return "missing required key"
    msg = err["msg"]
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        expected = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
        return f"{msg};{did_you_mean(str(ctx.get('tag')), expected)}".rstrip(";")
    value = err.get("input")
    if isinstance(value, (str, int, float, bool, type(None))):
        msg += f" (got {_short(value)})"
    return msg


def non_ascii(key: str) -> str:
    """"key 'd_mоdel' contains non-ASCII character U+043E CYRILLIC SMALL LETTER O at position 3",
    or '' for an ASCII key. Why: a look-alike letter or an invisible character makes a key that
    reads right fail as unknown, and nothing on screen shows which character is wrong."""
    for i, ch in enumerate(key):
        if ord(ch) > 127:
            name = unicodedata.name(ch, "(unnamed)")
            return f"key {key!r} contains non-ASCII character U+{ord(ch):04X} {name} at position {i}"
    return ""


def _fmt(filename: str, row: Row) -> str:
    loc, line, col, message = row
    where = f"{filename}:{line}:{col}" if line is not None else filename
    path = ".".join(str(seg) for seg in loc)
    return f"{where}: {path}: {message}" if path else f"{where}: {message}"


def _error(positions: Positions, rows: list[Row]) -> SpecError:
    lines = [_fmt(positions.filename, row) for row in rows[:MAX_LINES]]
    if len(rows) > MAX_LINES:
        lines.append(f"... and {len(rows) - MAX_LINES} more errors")
    err = SpecError("\n".join(lines))
    err.errors = rows
    return err


def _row(positions: Positions, loc: Loc, message: str) -> Row:
    line, col = positions.line_of(loc) or (None, None)
    return loc, line, col, message


def format_validation_error(
    exc: pydantic.ValidationError,
    positions: Positions,
    *,
    prefix: Loc = (),
    model: type[BaseModel] | None = None,
) -> SpecError:
    """One `file:line:col: dotted.path: message` line per pydantic error, in pydantic's order.

    Args:
        prefix: key path of the validated value inside the file (a params model validated alone).
        model: the model that was validated; lets unknown keys get close-name suggestions.
    """
    rows: list[Row] = []
    for err in exc.errors(include_url=False):
        loc, owner = _walk(tuple(err["loc"]), model, positions, tuple(prefix))
        full = tuple(prefix) + loc
        message = _message(err, full, owner)
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            key = str(err.get("ctx", {}).get("discriminator", "")).strip("'")
            full = full + (key,) if full + (key,) in positions.table else full
        rows.append(_row(positions, full, message))
    return _error(positions, rows)


def spec_error(positions: Positions, loc: Loc, message: str) -> SpecError:
    """A later-stage error (unknown registry name, ...) pointing at the key at `loc`."""
    return _error(positions, [_row(positions, tuple(loc), message)])
