"""Safe YAML for specs: YAML 1.2 core-schema scalars, no aliases or tags, key positions kept.

Values are built from PyYAML's node tree, never by its constructors, so no tag can run anything.
Every rejection is a `SpecError` reading ``file:line:col: what is wrong; how to fix it``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from yaml.composer import Composer
from yaml.error import MarkedYAMLError
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent, StreamEndEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from ..errors import SpecError

Loc = tuple[str | int, ...]  # key path, e.g. ("model", "core", "d_state") or ("layers", 0)

MAX_BYTES = 256 * 1024
MAX_DEPTH = 64
_DEEP = f"nesting is deeper than {MAX_DEPTH} levels of lists and mappings"

_Y = "tag:yaml.org,2002:"
_PLAIN = "tag:zoo,2026:plain"  # an untagged plain scalar, resolved below by the core schema
_TAGS = {  # explicit tags a spec may use, by event kind
    ScalarEvent: {_Y + t for t in ("str", "int", "float", "bool", "null")},
    SequenceStartEvent: {_Y + "seq"}, MappingStartEvent: {_Y + "map"},
}
_KIND = {ScalarNode: "a scalar", SequenceNode: "a list", MappingNode: "a mapping"}
_CORE = (  # YAML 1.2 core schema (not PyYAML's 1.1), in resolution order: (kind, pattern, value)
    ("null", re.compile(r"~|null|Null|NULL|"), lambda s: None),
    ("bool", re.compile(r"true|True|TRUE|false|False|FALSE"), lambda s: s[0] in "tT"),
    ("int", re.compile(r"[-+]?[0-9]+"), int),  # decimal, so 010 is 10
    ("int", re.compile(r"0o[0-7]+"), lambda s: int(s[2:], 8)),
    ("int", re.compile(r"0x[0-9a-fA-F]+"), lambda s: int(s[2:], 16)),
    ("float", re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"), float),
    ("float", re.compile(r"[-+]?\.(?:inf|Inf|INF)"), lambda s: -math.inf if s[0] == "-" else math.inf),
    ("float", re.compile(r"\.(?:nan|NaN|NAN)"), lambda s: math.nan),
)


@dataclass(frozen=True)
class Positions:
    """Where each key path sits in the file: 1-based (line, col) of the key or sequence item."""

    filename: str
    table: dict[Loc, tuple[int, int]] = field(default_factory=dict)

    def line_of(self, loc: Loc) -> tuple[int, int] | None:
        """Position of `loc`, or of its nearest known ancestor; None when nothing is known."""
        loc = tuple(loc)
        return next((self.table[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in self.table), None)


def _pos(mark: Any) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


def _fail(filename: str, where: tuple[int, int], message: str, hint: str) -> SpecError:
    """`file:line:col: message; hint`, with `.errors` shaped like format_validation_error's."""
    err = SpecError(f"{filename}:{where[0]}:{where[1]}: {message}; {hint}")
    err.errors = [((), where[0], where[1], message)]
    return err


def _too_big(filename: str, size: int) -> SpecError:
    return _fail(filename, (1, 1), f"spec is {size} bytes, over the {MAX_BYTES}-byte (256 KiB) limit",
                 "a spec only names parts and sizes; keep data out of it")


def _line_col(text: str | bytes, index: int) -> tuple[int, int]:
    if isinstance(text, bytes):  # count bytes in bytes: index is a byte offset there
        return text.count(b"\n", 0, index) + 1, index - (text.rfind(b"\n", 0, index) + 1) + 1
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_Y):] if tag.startswith(_Y) else tag


class _Loader(Reader, Scanner, Parser, Composer, BaseResolver):
    """PyYAML's pure-Python front end up to nodes; no constructor, so nothing is ever built."""

    def __init__(self, text: str, filename: str) -> None:
        Reader.__init__(self, text)
        for base in (Scanner, Parser, Composer, BaseResolver):
            base.__init__(self)
        self.filename, self.depth = filename, 0

    def fetch_flow_collection_start(self, token_class: type) -> None:
        if self.flow_level >= MAX_DEPTH:  # fail before the scanner's simple-key lookahead turns O(n^2)
            raise _fail(self.filename, _pos(self.get_mark()), _DEEP, "flatten the spec")
        super().fetch_flow_collection_start(token_class)

    def resolve(self, kind: type, value: str | None, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode and implicit[0]:
            return _PLAIN
        return super().resolve(kind, value, implicit)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:  # None as in yaml.Composer
        event = self.peek_event()
        if isinstance(event, AliasEvent) or event.anchor is not None:
            mark = ("*" if isinstance(event, AliasEvent) else "&") + event.anchor
            raise _fail(self.filename, _pos(event.start_mark), f"aliases are not allowed in specs "
                        f"(found {mark!r})", "write each value out in full instead of using anchors")
        tag = event.tag
        if tag is not None and tag not in _TAGS.get(type(event), ()):
            raise _fail(self.filename, _pos(event.start_mark), f"tag {_show_tag(tag)!r} is not "
                        "allowed in specs", "remove it (allowed: !!str !!int !!float !!bool !!null "
                        "!!map !!seq)")
        level = not isinstance(event, ScalarEvent)  # depth counts lists and mappings
        self.depth += level
        if self.depth > MAX_DEPTH:
            raise _fail(self.filename, _pos(event.start_mark), _DEEP, "flatten the spec")
        node = super().compose_node(parent, index)
        self.depth -= level
        return node


class _Builder:
    """Plain Python values from nodes, recording each key's and item's position."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.table: dict[Loc, tuple[int, int]] = {}

    def value(self, node: Node, loc: Loc) -> Any:
        if isinstance(node, ScalarNode):
            return self.scalar(node)
        if isinstance(node, SequenceNode):
            out = []
            for i, item in enumerate(node.value):
                self.table[loc + (i,)] = _pos(item.start_mark)
                out.append(self.value(item, loc + (i,)))
            return out
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self.key(key_node)
            if key in result:
                lines = self.table[loc + (key,)][0], key_node.start_mark.line + 1
                raise _fail(self.filename, _pos(key_node.start_mark), f"duplicate key {key!r} "
                            "(lines %d and %d)" % lines, "keep only one of them")
            self.table[loc + (key,)] = _pos(key_node.start_mark)
            result[key] = self.value(value_node, loc + (key,))
        return result

    def key(self, node: Node) -> str:
        if isinstance(node, ScalarNode) and node.tag == _PLAIN and node.value == "<<":
            raise _fail(self.filename, _pos(node.start_mark), "merge keys ('<<') are not allowed in "
                        "specs", "write the merged keys out in full")
        key = self.scalar(node) if isinstance(node, ScalarNode) else _KIND[type(node)]
        if not isinstance(key, str) or not isinstance(node, ScalarNode):
            raise _fail(self.filename, _pos(node.start_mark), f"mapping keys must be strings, found "
                        f"{key if isinstance(key, str) else repr(key)}", "quote the key: '\"1\": ...'")
        return key

    def scalar(self, node: ScalarNode) -> Any:
        s, kind = node.value, None if node.tag == _PLAIN else node.tag[len(_Y):]
        if kind == "str":  # quoted, block or !!str (other tags were refused while composing)
            return s
        for name, pattern, value in _CORE:
            if kind in (None, name) and pattern.fullmatch(s):
                try:
                    return value(s)
                except ValueError:  # past Python's int digit limit
                    raise _fail(self.filename, _pos(node.start_mark), f"number {s[:20]}... has too "
                                "many digits", "use a smaller number") from None
        if kind is None:
            return s
        raise _fail(self.filename, _pos(node.start_mark), f"{s!r} is not a valid {_show_tag(node.tag)}",
                    "fix the value or drop the tag")


def _text(text: str | bytes, filename: str) -> str:
    """Size-checked, decoded, BOM-free text without NUL bytes."""
    size = len(text)
    if isinstance(text, str) and size <= MAX_BYTES:  # chars <= bytes: only encode small inputs
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise _too_big(filename, size)
    if isinstance(text, bytes):
        data = text.removeprefix(b"\xef\xbb\xbf")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(filename, _line_col(data, exc.start), f"byte {data[exc.start]:#04x} is not "
                        "valid UTF-8", "save the file as UTF-8") from None
    text = text.removeprefix("\ufeff")
    if "\0" in text:
        raise _fail(filename, _line_col(text, text.index("\0")), "NUL byte in spec",
                    "a spec is a text file; remove the NUL byte")
    return text


def load_yaml(text: str | bytes, filename: str = "<spec>") -> tuple[Any, Positions]:
    """One spec document as plain dicts/lists/scalars, and where each key sits in it.

    Raises SpecError (``file:line:col: message; hint``) on anything a spec must not contain.
    """
    text = _text(text, filename)
    try:
        loader = _Loader(text, filename)  # the reader rejects control characters here
        loader.get_event()  # stream start
        node = None if loader.check_event(StreamEndEvent) else loader.compose_document()
        if not loader.check_event(StreamEndEvent):
            raise _fail(filename, _pos(loader.peek_event().start_mark), "a spec must be a single "
                        "YAML document, found a second one", "remove the '---' and what follows")
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = f"invalid YAML: {exc.problem}" + (f" ({exc.context})" if exc.context else "")
        raise _fail(filename, _pos(mark), what, "check indentation, colons and quoting here") from None
    except ReaderError as exc:
        raise _fail(filename, _line_col(text, exc.position), f"character {chr(exc.character)!r} "
                    "is not allowed in YAML", "remove the control character") from None
    except RecursionError:
        raise _fail(filename, (1, 1), "nesting is too deep", "flatten the spec") from None
    if node is None:
        raise _fail(filename, (1, 1), "spec is empty", "write a mapping such as 'model: ...'")
    if not isinstance(node, MappingNode):
        raise _fail(filename, _pos(node.start_mark), "the top level of a spec must be a mapping of "
                    f"keys to values, found {_KIND[type(node)]}", "start the file with 'key: value' lines")
    builder = _Builder(filename)
    builder.table[()] = _pos(node.start_mark)
    value = builder.value(node, ())
    return value, Positions(filename, builder.table)


def load_yaml_file(path: str | os.PathLike) -> tuple[Any, Positions]:
    """`load_yaml` on a file; its size is checked before a byte is read."""
    name = os.fsdecode(path)
    try:
        size = os.stat(path).st_size
        if size <= MAX_BYTES:
            with open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)  # a file may grow, or stat may lie (pipes, /proc)
    except OSError as exc:
        raise SpecError(f"{name}: cannot read spec file: {exc.strerror or exc}; check the path") from None
    if size > MAX_BYTES:
        raise _too_big(name, size)
    return load_yaml(data, name)
