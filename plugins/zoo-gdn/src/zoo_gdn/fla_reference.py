"""fla's pure-PyTorch gated-delta-rule references (``fla/ops/gated_delta_rule/naive.py``), loaded
for the parity tests and the benchmark peers; never used by the model.

Why the file is loaded by path: ``import fla.ops.gated_delta_rule.naive`` runs ``fla/ops/__init__.py``,
which imports every op's triton kernels, and triton is not installed on CPU-only machines (fla-core
lists it only under its ``cuda``/``cpu`` extras). ``naive.py`` itself needs only torch and einops, so
it is executed alone from the installed package's folder (found with ``importlib.util.find_spec``,
which locates ``fla`` without running its ``__init__``), under a private module name.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

_NAME = "zoo_gdn._fla_gated_delta_naive"
_cache: dict[str, ModuleType] = {}


class FlaUnavailableError(ImportError):
    """fla-core is not installed (the references are a test-only dependency)."""


def load_fla_naive() -> ModuleType:
    """The module holding ``naive_recurrent_gated_delta_rule`` and ``naive_chunk_gated_delta_rule``."""
    if _NAME in _cache:
        return _cache[_NAME]
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise FlaUnavailableError("fla's naive gated-delta-rule references need fla-core: "
                                  "pip install -e 'plugins/zoo-gdn[test]' (or pip install fla-core einops)")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / "gated_delta_rule" / "naive.py"
    if not path.is_file():
        raise FlaUnavailableError(f"fla-core at {path.parents[2]} has no ops/gated_delta_rule/naive.py; "
                                  "install a version that ships it: pip install 'fla-core>=0.6'")
    mod_spec = importlib.util.spec_from_file_location(_NAME, path)
    if mod_spec is None or mod_spec.loader is None:
        raise FlaUnavailableError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    _cache[_NAME] = module
    return module
