"""Small builders the zoo's own tests share, and that a plugin's tests can use too.

Why a module and not copies: the depth, adaptive, reshape and model tests each carried the same
``spec()`` / ``streaming_cores()`` / ``unroll()`` and the plugin tests the same inline-plugin
builders, drifting apart one default at a time. Test modules are imported with
``--import-mode=importlib`` (no ``tests`` package to import from), so the shared pieces live here,
importable from any test, the plugins' included.

Parametrize over what the registry declares, not over names: ``cores_with("step")`` is every
installed core that streams, so a new plugin is tested the day it is installed.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from torch import Tensor

from ..hookspecs import hookimpl
from ..params import CoreParams
from ..plugin_registry import BackendEntry, Registry
from ..plugins import get_registry


def model_spec(
    core: str | Mapping[str, Any] = "lru",
    *,
    task: Mapping[str, Any] | None = None,
    inp: Mapping[str, Any] | None = None,
    d_model: int = 6,
    depth: int = 2,
    **model: Any,
) -> dict[str, Any]:
    """A complete spec (a dict) around one core: its ``tiny`` preset unless ``core`` is a mapping.

    Args:
        core: a core name (built with ``preset: tiny``) or the whole ``model.core`` mapping.
        task: ``task:`` (default: 3-class classification).
        inp: ``input:`` (default: 3 channels).
        d_model, depth: ``model.d_model`` / ``model.depth``.
        model: any other ``model:`` keys (``stacking``, ``block``, ``pool``, ...), passed as is.
    """
    body = {"d_model": d_model, "depth": depth,
            "core": {"kind": core, "preset": "tiny"} if isinstance(core, str) else dict(core), **model}
    return {"schema_version": 1, "task": dict(task or {"kind": "classification", "classes": 3}),
            "input": dict(inp or {"channels": 3}), "model": body}


def cores_with(*capabilities: str, without: Iterable[str] = (), registry: Registry | None = None) -> list[str]:
    """Sorted names of the registered cores that declare every one of ``capabilities`` and none of
    ``without`` (for ``pytest.mark.parametrize``: a new plugin's core joins the test by itself)."""
    reg = registry or get_registry()
    need, refuse = set(capabilities), set(without)
    return sorted(n for n, e in reg.cores.items() if need <= e.capabilities and not refuse & e.capabilities)


def backends_for(op: str, *, registry: Registry | None = None) -> list[BackendEntry]:
    """Every registered backend of ``op`` (``kernel``, ``conv``, ``scan``), by name: a test holding
    each one to the ``naive`` reference covers a plugin's backend the day it registers."""
    reg = registry or get_registry()
    return sorted((e for (o, _), e in reg.backends.items() if o == op), key=lambda e: e.name)


def unroll(model: Any, x: Tensor) -> list[Tensor]:
    """The model's output after every step of ``x`` (B, T, ...), streamed through ``step`` from
    ``init_state``: compared with the parallel forward on each prefix."""
    state = model.init_state(x.shape[0])
    outs = []
    for t in range(x.shape[1]):
        y, state = model.step(x[:, t], state)
        outs.append(y)
    return outs


def slice_backward_elements(*outputs: Tensor) -> int:
    """How many elements the backward of ``outputs`` zero-fills for its slices: each ``t[:, n]`` or
    ``t[:, a:b]`` node rebuilds a gradient the size of ``t``. In a loop over steps or chunks a slice per
    iteration makes that quadratic in the length, where ``t.unbind`` makes one gradient for all of them;
    a loop written that way stays linear (compare two lengths: at 4x the length ~4x the elements, not ~16x)."""
    total = 0
    seen: set[Any] = set()
    todo = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if type(node).__name__ in ("SelectBackward0", "SliceBackward0"):
            total += math.prod(node._saved_self_sym_sizes)  # type: ignore[attr-defined]  # the sliced tensor's shape
        todo.extend(n for n, _ in node.next_functions if n is not None)
    return total


def assert_slice_backward_linear(outputs_at: Callable[[int], Sequence[Tensor]], length: int) -> None:
    """Fail if a loop's backward zero-fills slices quadratically: ``outputs_at(n)`` runs the loop at length
    ``n`` and returns the outputs to backpropagate; at 4x ``length`` a loop by ``unbind`` fills ~4x the
    elements (:func:`slice_backward_elements`), a slice per piece ~16x, and more than 6x fails."""
    short, long = (slice_backward_elements(*outputs_at(n)) for n in (length, 4 * length))
    assert long <= 6 * short, (
        f"the backward zero-fills {long:,} elements for its slices at length {4 * length} against {short:,} at "
        f"{length} ({long / max(short, 1):.1f}x for 4x the length): take the loop's pieces by unbind, not a slice each")


def inline_plugin(name: str, **hooks: Callable[..., Any]) -> types.SimpleNamespace:
    """A plugin object made of hook functions (``zoo_register_cores=...``), for ``inline_source``."""
    return types.SimpleNamespace(__name__=name, zoo_api=1, **{k: hookimpl(v) for k, v in hooks.items()})


def register_cores(*names: str, target: str = "zoo_core.testing.toys:ToyDiag") -> Callable[[Any], None]:
    """A ``zoo_register_cores`` hook registering ``names``, each a toy core with a ``tiny`` preset."""
    def zoo_register_cores(register: Any) -> None:
        for n in names:
            register(n, target, params=CoreParams, presets={"tiny": {}})

    return zoo_register_cores
