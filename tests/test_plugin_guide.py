"""The plugin author's guide is true where it shows code: its third-party scan backend, written from
the op Protocol alone, registers and equals every core's naive reference (the conformance check)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from zoo_core.plugins import entry_point_sources, inline_source, load_registry
from zoo_core.testing import case_from_registry
from zoo_core.testing.checks import check_backends

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugin-guide.md"


def _backend_example() -> types.ModuleType:
    text = GUIDE.read_text()
    block = re.search(r"A complete third-party scan backend, from the Protocol alone:\n\n```python\n(.*?)```", text, re.S)
    assert block, "the guide lost its backend example"
    module = types.ModuleType("guide_backend")
    module.zoo_api = 1
    exec(compile(block.group(1), str(GUIDE), "exec"), module.__dict__)  # noqa: S102 - our own documentation
    return module


@pytest.mark.parametrize("core", ["s4d", "lru"])
def test_the_guides_backend_serves_cores_and_equals_their_reference(core):
    reg = load_registry([*entry_point_sources(), inline_source("guide", _backend_example())])
    assert reg.backend("scan", "loop").name == "unrolled"
    case = case_from_registry(core, registry=reg)
    check_backends(case)  # compares every combination, "unrolled" included, with the naive path
    assert "unrolled" in {e.name for e in reg.backends_for("scan")}
