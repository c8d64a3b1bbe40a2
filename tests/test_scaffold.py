"""``zoo plugin new NAME`` writes a plugin package whose core passes the conformance suite as
generated: loaded from its source folder (nothing pip-installed) through ``inline_source``."""

from __future__ import annotations

import importlib
import sys

import pytest
import tomllib

from zoo_core.cli import main
from zoo_core.errors import UsageError
from zoo_core.plugins import entry_point_sources, inline_source, load_registry, set_registry
from zoo_core.scaffold import new_plugin
from zoo_core.testing import CHECKS, case_from_registry, run_all


@pytest.fixture
def generated(tmp_path, monkeypatch):
    root = new_plugin("scaffold-demo", tmp_path)
    monkeypatch.syspath_prepend(str(root / "src"))
    yield root
    for mod in [m for m in sys.modules if m.startswith("zoo_scaffold_demo")]:
        del sys.modules[mod]


def test_the_generated_package_declares_entry_point_test_extra_tiny_preset_and_card(generated):
    meta = tomllib.loads((generated / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "zoo-scaffold-demo" and "pytest>=8" in meta["optional-dependencies"]["test"]
    assert meta["entry-points"]["zoo_core.plugins"] == {"scaffold-demo": "zoo_scaffold_demo.plugin"}
    assert {"torch>=2.2", "pydantic>=2"} <= set(meta["dependencies"])
    assert "class TestScaffoldDemo(ConformanceSuite)" in (generated / "tests" / "test_conformance.py").read_text()
    for path in generated.rglob("*.py"):
        assert "type: ignore" not in path.read_text(), path


def test_the_generated_core_passes_every_conformance_check(generated):
    plugin = importlib.import_module("zoo_scaffold_demo.plugin")
    base = [s for s in entry_point_sources() if s.dist == "zoo-core"]
    reg = load_registry([*base, inline_source("scaffold-demo", plugin)])
    entry = reg.core("scaffold-demo")
    assert "tiny" in entry.presets and entry.card and entry.capabilities == {"causal", "step", "initial_state", "lti"}
    set_registry(reg)  # as the toy cores' fixture: save/load reads the process registry's providers
    try:
        results = run_all(case_from_registry("scaffold-demo", registry=reg))
    finally:
        set_registry(None)
    assert results == {name: "ok" for name in CHECKS}


def test_zoo_plugin_new_writes_the_package_and_refuses_what_is_in_the_way(tmp_path, capsys):
    assert main(["plugin", "new", "other", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "zoo-other" / "src" / "zoo_other" / "core.py").is_file()
    assert main(["plugin", "new", "other", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["plugin", "new", "Bad_Name", "--dir", str(tmp_path)]) == 2
    with pytest.raises(UsageError, match="lowercase name"):
        new_plugin("9lives", tmp_path)
