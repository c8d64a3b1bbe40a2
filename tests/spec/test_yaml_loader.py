"""Hostile-spec checks for the YAML layer (reliability.md §7.B: S1, S3–S7, S13)."""

from __future__ import annotations

import math
import os
import time

import pytest

from zoo_core.errors import SpecError
from zoo_core.spec import yaml_loader
from zoo_core.spec.yaml_loader import MAX_BYTES, MAX_DEPTH, Positions, load_yaml, load_yaml_file


def fails(text: str | bytes, *needles: str) -> SpecError:
    """Load `text` expecting a SpecError whose message holds every needle; return it."""
    with pytest.raises(SpecError) as info:
        load_yaml(text, "spec.yaml")
    for needle in needles:
        assert needle in str(info.value), str(info.value)
    return info.value


# --- S1: tags never construct anything -------------------------------------------------------

PYTHON_TAGS = {
    "apply": ("x: !!python/object/apply:os.system ['touch /tmp/zoo_pwned']\n",
              "!!python/object/apply:os.system"),
    "new": ("x: !!python/object/new:os.system ['touch /tmp/zoo_pwned']\n", "!!python/object/new:os.system"),
    "name": ("x: !!python/name:os.system\n", "!!python/name:os.system"),
    "module": ("x: !!python/module:os\n", "!!python/module:os"),
    "custom": ("x: !Exploit {cmd: 'touch /tmp/zoo_pwned'}\n", "!Exploit"),
}


@pytest.mark.parametrize("text, tag", PYTHON_TAGS.values(), ids=PYTHON_TAGS.keys())
def test_s1_python_and_custom_tags_are_rejected_and_never_run(text, tag, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    fails(text, f"spec.yaml:1:4: tag {tag!r} is not allowed in specs; remove it")
    fails("model:\n  core:\n    " + text.replace("x: ", "d_state: "), "spec.yaml:3:14:", tag)
    assert calls == []


@pytest.mark.parametrize("text", [
    "a: !!set {x}\n", "a: !!binary aGk=\n", "a: !!timestamp 2020-01-01\n", "a: !!omap [{b: 1}]\n",
    "a: ! 12\n", "a: !!map [1]\n", "a: !!int {b: 1}\n",
    "%TAG !! tag:evil.example,2000:\n---\na: !!str x\n",  # a redefined !! handle is not the standard one
])
def test_s1_non_standard_or_misplaced_tags_are_rejected(text):
    fails(text, "is not allowed in specs")


def test_standard_tags_are_allowed():
    data, _ = load_yaml("a: !!float 1\nb: !!int '0x10'\nc: !!str 12\nd: !!null ''\n"
                        "e: !!bool 'TRUE'\nf: !!seq [1]\ng: !!map {h: 1}\n")
    assert data == {"a": 1.0, "b": 16, "c": "12", "d": None, "e": True, "f": [1], "g": {"h": 1}}
    assert type(data["a"]) is float


def test_standard_tag_with_a_wrong_value_is_rejected():
    fails("a:\n  b: !!int twelve\n", "spec.yaml:2:6:", "'twelve' is not a valid !!int")


# --- S3: anchors, aliases, merges ------------------------------------------------------------

def billion_laughs(levels: int = 9) -> str:
    names = "abcdefghijklmnopqrstuvwxyz"
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip(names, names[1 : levels]):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_s3_billion_laughs_rejected_fast():
    text = billion_laughs(9)
    assert text.count("*") == 72
    start = time.perf_counter()
    fails(text, "spec.yaml:1:4:", "aliases are not allowed in specs")
    assert time.perf_counter() - start < 0.1


@pytest.mark.parametrize("text, where", [
    ("a: &x 1\n", "1:4"),
    ("a: 1\nb: *x\n", "2:4"),  # an alias without its anchor
    ("base: &b {d_state: 16}\ncore:\n  <<: *b\n", "1:7"),
])
def test_s3_anchors_and_aliases_rejected(text, where):
    fails(text, f"spec.yaml:{where}:", "aliases are not allowed in specs")


def test_s3_merge_key_rejected_even_without_alias():
    fails("core:\n  <<: {d_state: 16}\n", "spec.yaml:2:3:", "merge keys ('<<') are not allowed")


def test_quoted_merge_key_is_just_a_string():
    assert load_yaml("'<<': 1\n")[0] == {"<<": 1}


# --- S4: size cap ----------------------------------------------------------------------------

class Boom:
    def __init__(self, *args, **kwargs):
        raise AssertionError("the parser ran")


@pytest.mark.parametrize("kind", ["str", "bytes", "multibyte"])
def test_s4_oversized_text_rejected_before_parsing(kind, monkeypatch):
    monkeypatch.setattr(yaml_loader, "_Loader", Boom)
    text = {"str": "a: " + "x" * MAX_BYTES, "bytes": b"a: " + b"x" * MAX_BYTES,
            "multibyte": "a: " + "\u00e9" * (MAX_BYTES // 2)}[kind]  # fewer chars than bytes
    start = time.perf_counter()
    fails(text, "spec.yaml:1:1:", "over the 262144-byte (256 KiB) limit")
    assert time.perf_counter() - start < 0.05


def test_s4_oversized_file_rejected_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a: 1\n" + b"#" * (300 * 1024))
    with monkeypatch.context() as patch, pytest.raises(SpecError) as info:
        patch.setattr(yaml_loader, "load_yaml", Boom)
        patch.setattr("builtins.open", Boom)
        load_yaml_file(path)
    assert str(info.value).startswith(f"{path}:1:1: spec is 307205 bytes, over the 262144-byte")


def test_s4_spec_of_exactly_the_limit_is_accepted():
    text = "a: 1\n#" + "x" * (MAX_BYTES - 7) + "\n"
    assert len(text.encode()) == MAX_BYTES
    assert load_yaml(text)[0] == {"a": 1}


# --- S5: nesting -----------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("open_, close", [("[", "]"), ("{a: ", "}")])
def test_s5_deep_flow_nesting_is_a_spec_error(depth, open_, close):
    text = "x: " + open_ * depth + close * depth
    if len(text) > MAX_BYTES:
        text = "x: " + open_ * (MAX_BYTES // 8) + close * (MAX_BYTES // 8)
    start = time.perf_counter()
    fails(text, f"nesting is deeper than {MAX_DEPTH} levels")  # not a RecursionError
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_s5_deep_block_nesting_is_a_spec_error(depth):
    fails("- " * depth + "1\n", "spec.yaml:1:129:", f"nesting is deeper than {MAX_DEPTH} levels")


def test_s5_deep_indented_mappings_point_at_the_first_level_too_deep():
    fails("".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "v: 1\n",
          "spec.yaml:65:65:", "nesting is deeper")


def test_s5_depth_limit_is_exact():
    ok = "x: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)  # the top mapping is level 1
    value = load_yaml(ok)[0]["x"]
    for _ in range(MAX_DEPTH - 2):
        (value,) = value
    assert value == []
    fails("x: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH, "nesting is deeper")


def test_s5_recursion_error_is_mapped(monkeypatch):
    def recurse(self, parent, index):
        raise RecursionError

    monkeypatch.setattr(yaml_loader._Loader, "compose_node", recurse)
    fails("a: 1\n", "spec.yaml:1:1: nesting is too deep")


# --- S6: duplicate keys ----------------------------------------------------------------------

def test_s6_duplicate_key_names_key_and_both_lines():
    err = fails("model:\n  d_state: 16\n  d_model: 8\n  d_state: 64\n",
                "spec.yaml:4:3:", "duplicate key 'd_state' (lines 2 and 4)")
    assert err.errors == [((), 4, 3, "duplicate key 'd_state' (lines 2 and 4)")]


def test_s6_duplicate_after_quoting_and_in_flow_style():
    fails("a: 1\n'a': 2\n", "duplicate key 'a' (lines 1 and 2)")
    fails("m: {x: 1, y: 2, x: 3}\n", "spec.yaml:1:17:", "duplicate key 'x' (lines 1 and 1)")


def test_same_key_in_different_mappings_is_fine():
    assert load_yaml("a: {x: 1}\nb: {x: 2}\n")[0] == {"a": {"x": 1}, "b": {"x": 2}}


# --- S7: scalars follow the YAML 1.2 core schema ---------------------------------------------

SCALARS = [
    ("1e-3", 0.001), ("1.0e-3", 0.001), (".5", 0.5), ("-2E+4", -20000.0), ("1.10", 1.1), ("1.", 1.0),
    ("no", "no"), ("NO", "NO"), ("yes", "yes"), ("on", "on"), ("off", "off"), ("y", "y"),
    ("010", 10), ("+12", 12), ("-7", -7), ("0x40", 64), ("0o17", 15), ("0b101", "0b101"),
    ("1_000", "1_000"), ("1:30", "1:30"), ("2026-11-30", "2026-11-30"), ("12:30:00", "12:30:00"),
    ("true", True), ("True", True), ("TRUE", True), ("false", False), ("FALSE", False),
    ("tRUE", "tRUE"), ("", None), ("~", None), ("null", None), ("Null", None), ("NULL", None),
    (".inf", math.inf), ("-.Inf", -math.inf), ("+.INF", math.inf),
    ("'1e-3'", "1e-3"), ('"010"', "010"), ("'true'", "true"), ("'null'", "null"), ("''", ""),
    ("|\n  1e-3", "1e-3\n"), ("s4d", "s4d"),
]


@pytest.mark.parametrize("written, expected", SCALARS, ids=[w for w, _ in SCALARS])
def test_s7_scalar_table(written, expected):
    value = load_yaml(f"v: {written}\n")[0]["v"]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("written", [".nan", ".NaN", ".NAN"])
def test_s7_nan_is_a_float(written):
    value = load_yaml(f"v: {written}\n")[0]["v"]
    assert isinstance(value, float) and math.isnan(value)


def test_s7_huge_integer_is_an_error_not_a_crash():
    fails("v: " + "9" * 5000 + "\n", "spec.yaml:1:4:", "too many digits")


@pytest.mark.parametrize("text, found", [
    ("1: x\n", "1"), ("true: x\n", "True"), ("null: x\n", "None"), ("1.5: x\n", "1.5"),
    ("? [a]\n: b\n", "a list"), ("? {a: 1}\n: b\n", "a mapping"),
])
def test_mapping_keys_must_be_strings(text, found):
    fails(text, "mapping keys must be strings, found " + found)


def test_keys_that_look_like_1_1_booleans_stay_strings():
    assert load_yaml("no: 1\non: 2\n'1': 3\n")[0] == {"no": 1, "on": 2, "1": 3}


# --- S13: encoding, shape of the stream ------------------------------------------------------

def test_s13_non_utf8_is_rejected_with_position():
    fails(b"a: 1\nname: caf\xe9\n", "spec.yaml:2:10:", "byte 0xe9 is not valid UTF-8")


@pytest.mark.parametrize("text", [b"\xef\xbb\xbfa: 1\n", "\ufeffa: 1\n"])
def test_s13_bom_is_tolerated(text):
    data, positions = load_yaml(text)
    assert data == {"a": 1} and positions.table[("a",)] == (1, 1)


def test_s13_nul_byte_is_rejected():
    fails(b"a: 1\nb: x\x00y\n", "spec.yaml:2:5:", "NUL byte")


def test_control_character_is_rejected():
    fails("a: 1\nb: x\x07\n", "spec.yaml:2:5:", "is not allowed in YAML")


@pytest.mark.parametrize("text, found", [
    ("- a\n- b\n", "a list"), ("just a string\n", "a scalar"), ("42\n", "a scalar"), ("---\n", "a scalar"),
])
def test_s13_top_level_must_be_a_mapping(text, found):
    fails(text, "spec.yaml:", "top level of a spec must be a mapping", found)


@pytest.mark.parametrize("text", ["", b"", "\n\n", "# only a comment\n", b"\xef\xbb\xbf"])
def test_s13_empty_spec_is_rejected(text):
    fails(text, "spec.yaml:1:1: spec is empty")


def test_s13_multi_document_stream_is_rejected():
    fails("a: 1\n---\nb: 2\n", "spec.yaml:2:1:", "single YAML document")
    fails("a: 1\n...\n---\nb: 2\n", "single YAML document")


def test_explicit_single_document_is_fine():
    assert load_yaml("---\na: 1\n...\n")[0] == {"a": 1}


def test_syntax_error_has_position():
    err = fails("a: 1\nb: [1, 2\n", "spec.yaml:", "invalid YAML")
    assert str(err).startswith("spec.yaml:3:1:")
    fails("a: 1\n b: 2\n", "spec.yaml:2:3:", "invalid YAML: mapping values are not allowed here")


# --- positions and files ---------------------------------------------------------------------

def test_positions_of_keys_and_items():
    text = "model:\n  core:\n    d_state: 16\n  layers:\n    - a\n    - {b: 1}\n"
    data, positions = load_yaml(text, "s.yaml")
    assert positions.filename == "s.yaml"
    assert positions.table == {
        (): (1, 1), ("model",): (1, 1), ("model", "core"): (2, 3), ("model", "core", "d_state"): (3, 5),
        ("model", "layers"): (4, 3), ("model", "layers", 0): (5, 7), ("model", "layers", 1): (6, 7),
        ("model", "layers", 1, "b"): (6, 8),
    }
    assert positions.line_of(("model", "core", "d_model")) == (2, 3)  # nearest known ancestor
    assert positions.line_of(("nope", "x")) == (1, 1)
    assert Positions("x", {}).line_of(("a",)) is None


def test_load_yaml_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("model:\n  d_model: 64\n")
    data, positions = load_yaml_file(path)
    assert data == {"model": {"d_model": 64}} and positions.filename == str(path)
    path.write_text("model:\n  d_model: 64\n  d_model: 8\n")
    with pytest.raises(SpecError, match=f"^{path}:3:3: duplicate key"):
        load_yaml_file(str(path))


def test_load_yaml_file_missing_or_directory(tmp_path):
    with pytest.raises(SpecError, match="cannot read spec file"):
        load_yaml_file(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="cannot read spec file"):
        load_yaml_file(tmp_path)


def test_errors_are_value_errors():
    assert isinstance(fails("- 1\n"), ValueError)
