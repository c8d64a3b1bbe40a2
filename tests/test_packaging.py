"""Every third-party module zoo-core and the plugins import is declared by the distribution that
imports it: ``pip install zoo-core`` + a plugin, then saving a model, failed with ModuleNotFoundError
(numpy: safetensors' torch writer imports it, and so does training) because nothing declared it.

The audit reads the source with ``ast`` (no imports run) and maps each module to the distribution
that installs it (``importlib.metadata.packages_distributions``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(p for p in (ROOT / "plugins").glob("zoo-*") if (p / "pyproject.toml").is_file())

# imports that are optional at run time, each guarded (try/except or a probe) and announced when absent
OPTIONAL = {
    "tqdm": "a progress bar on terminals, plain lines without it (huggingface-hub installs it anyway)",
    "mamba_ssm": "zoo-mamba's CUDA scan backend, registered only when its run-time probe passes",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    return _norm(re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0])


def _declared(pyproject: Path) -> tuple[set[str], set[str]]:
    """(dependencies, every extra's requirements) of a pyproject.toml, as normalised names."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    deps = {_requirement_name(r) for r in project.get("dependencies", [])}
    extras = {_requirement_name(r) for reqs in project.get("optional-dependencies", {}).values() for r in reqs}
    return deps, extras


def _imports(package_dir: Path) -> dict[str, set[str]]:
    """Top-level third-party module -> the files importing it (relative imports and the stdlib left out)."""
    own = {p.name for p in package_dir.iterdir() if p.is_dir()} | {"zoo_core"}
    found: dict[str, set[str]] = {}
    for f in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names} - own - set(sys.stdlib_module_names):
                found.setdefault(top, set()).add(str(f.relative_to(ROOT)))
    return found


def _distribution(module: str) -> str:
    """The distribution installing ``module``; an optional one not installed here is taken to share its name."""
    dists = importlib.metadata.packages_distributions().get(module)
    return _norm(dists[0]) if dists else _norm(module)


CORE_DEPS, CORE_EXTRAS = _declared(ROOT / "pyproject.toml")


def _undeclared(package_dir: Path, allowed: set[str]) -> list[str]:
    return sorted(f"{m} (distribution {_distribution(m)}; imported by {', '.join(sorted(files)[:3])})"
                  for m, files in _imports(package_dir).items() if m not in OPTIONAL and _distribution(m) not in allowed)


def test_zoo_core_declares_numpy_and_every_module_it_imports():
    assert "numpy" in CORE_DEPS  # save_pretrained (safetensors' torch writer) and training import it
    assert not _undeclared(ROOT / "zoo_core", CORE_DEPS | CORE_EXTRAS), "declare these in pyproject.toml"


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_each_plugin_declares_what_it_imports(plugin: Path):
    deps, extras = _declared(plugin / "pyproject.toml")
    assert "zoo-core" in deps
    # zoo-core's own dependencies (pydantic for CoreParams, torch) arrive with it
    assert not _undeclared(plugin / "src", deps | extras | CORE_DEPS), f"declare these in {plugin.name}/pyproject.toml"


def test_the_optional_imports_are_guarded_where_they_are_imported():
    """An optional module imported at the top level of a module would break its importers when absent."""
    for package in [ROOT / "zoo_core", *(p / "src" for p in PLUGINS)]:
        for f in package.rglob("*.py"):
            for node in ast.parse(f.read_text(encoding="utf-8")).body:  # module level only
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
                assert not [n for n in names if n.split(".")[0] in OPTIONAL], f"{f}: imports an optional module at module level"


def test_the_ci_installs_with_no_extras_and_runs_the_smoke_script():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = make[make.index("\nsmoke:"):].split("\n\n")[0]
    assert "make smoke" in ci and "tools/smoke.py --expect-installed" in target
    install = next(line for line in target.splitlines() if "pip install" in line and "$(PLUGINS)" in line)
    assert " . $(PLUGINS)" in install and "[" not in install and "-e" not in install.split()  # no extras, not editable
