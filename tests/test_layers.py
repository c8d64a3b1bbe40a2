"""zoo_core's imports point one way (zoo_core/LAYERS.md): no cycle, counting the imports inside
functions, no module importing a higher layer, and an import inside a function only where it keeps
its module free of a heavy dependency (torch, huggingface_hub, safetensors), saying so with ``# lazy:``
(on the import or the line above it).

Why: function-level imports hid three cycles (build -> model -> io -> build, cli <-> hub.cli,
kernels.dplr <-> kernels.kernel); walking the source with ``ast`` sees every import, run or not.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zoo_core"
HEAVY = frozenset({"torch", "huggingface_hub", "safetensors"})


@dataclass(frozen=True)
class Import:
    """One import statement of a zoo_core module: what it names, where, and whether a function holds it."""

    source: str
    target: str
    line: int
    lazy: bool
    comment: bool


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Dotted names an import statement may load: the module, and ``module.name`` for each name."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        base = ".".join(here + ([node.module] if node.module else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def _guarded(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    return {id(s) for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
            for s in ast.walk(n)}


def _in_functions(tree: ast.Module) -> set[int]:
    return {id(s) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for s in ast.walk(n)}


def _imports(module: str, path: Path) -> list[Import]:
    """Every import of ``module``: module level and function level, relative and absolute, and
    ``importlib.import_module("...")`` with a literal name."""
    text = path.read_text(encoding="utf-8")
    lines, tree = text.splitlines(), ast.parse(text)
    guarded, inner = _guarded(tree), _in_functions(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in guarded:
            names = _targets(module, path, node)
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        else:
            continue
        said = any("# lazy:" in lines[i - 1] for i in range(node.lineno - 1, (node.end_lineno or node.lineno) + 1))
        found += [Import(module, t, node.lineno, id(node) in inner or isinstance(node, ast.Call), said) for t in names]
    return found


IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def _internal(module: str, *, lazy: bool | None = None) -> set[str]:
    return {i.target for i in IMPORTS[module]
            if i.target in MODULES and i.target != module and (lazy is None or i.lazy == lazy)}


def _parents(module: str) -> list[str]:
    """Packages whose ``__init__`` runs before ``module`` does."""
    parts = module.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _heavy(module: str, seen: set[str] | None = None) -> frozenset[str]:
    """Heavy packages that importing ``module`` loads (module-level imports, transitively)."""
    seen = set() if seen is None else seen
    if module in seen:
        return frozenset()
    seen.add(module)
    own = {i.target.split(".")[0] for i in IMPORTS[module] if not i.lazy} & HEAVY
    for dep in _internal(module, lazy=False) | set(_parents(module)):
        own |= _heavy(dep, seen)
    return frozenset(own)


def _layers() -> list[tuple[str, list[str]]]:
    """The layer table of zoo_core/LAYERS.md, lowest first: (name, module prefixes)."""
    rows = []
    for line in (PACKAGE / "LAYERS.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and cells[0].isdigit():
            rows.append((cells[1], re.findall(r"`(zoo_core[\w.]*)`", cells[2])))
    return rows


LAYERS = _layers()


def layer_of(module: str) -> int:
    """Index of the layer whose most specific prefix names ``module``."""
    best = (-1, -1)
    for index, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if module == p or (p != "zoo_core" and module.startswith(p + ".")):
                best = max(best, (len(p), index))
    if best[1] < 0:
        pytest.fail(f"{module} is in no layer of zoo_core/LAYERS.md; add it to the row it belongs to")
    return best[1]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_cycle_counting_function_level_imports():
    cycle = _cycle({m: _internal(m) for m in MODULES})
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_the_layer_table_is_read():
    assert len(LAYERS) >= 8 and LAYERS[0][1][0] == "zoo_core.errors"


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_a_higher_layer():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m in MODULES for t in sorted(_internal(m)) if layer_of(t) > layer_of(m)]
    assert not upward, "imports against the layer order of zoo_core/LAYERS.md:\n" + "\n".join(upward)


def test_function_level_imports_keep_a_heavy_dependency_out_and_say_so():
    problems = []
    for module in MODULES:
        for imp in IMPORTS[module]:
            if not imp.lazy or imp.target not in MODULES or imp.target == module:
                continue
            spared = _heavy(imp.target) - _heavy(module)
            where = f"{MODULES[module].relative_to(ROOT)}:{imp.line} imports {imp.target} inside a function"
            if not spared:
                problems.append(f"{where} but {module} loads everything it needs already: import it at module level")
            elif not imp.comment:
                problems.append(f"{where} (keeping {', '.join(sorted(spared))} out) without a '# lazy:' comment saying so")
    assert not problems, "\n".join(sorted(set(problems)))
