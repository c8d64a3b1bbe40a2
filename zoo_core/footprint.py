"""How big the model a spec describes is, computed without allocating it, and the memory budget.

Letters: B batch, L length, H d_model.

Why: a spec or a weights file's stored spec can ask for 10^12 parameters in a few bytes of YAML.
Everything here runs on PyTorch's ``meta`` device (shapes, no storage), so asking costs nothing.

* **Parameters** come from a meta-device build of the whole model (the real builder, so the names
  and shapes are exactly what ``build_model`` would make). Every core builds on meta when passed
  ``device="meta"``; some compute their initialisation on the CPU first (S4/S4D/S5's HiPPO and
  diagonal inits call ``.item()``, which meta tensors cannot) and one (LrcSSM) draws a float64
  ``(D, H)`` matrix on the CPU before moving it. So the build first runs inside a
  ``torch.device("meta")`` context (every factory call lands on meta: LrcSSM allocates nothing),
  and a core that fails there is built again with ``device="meta"`` only, which costs one block's
  CPU initialisation (O(H·N)); the remaining blocks are copies of the first (``build._assemble``).
* **Activations** are estimated by meta-device forwards (training mode, autograd on) at batch 1
  and 2 and length ``min(L, 256)`` under a dispatch mode that tracks the bytes of every tensor an
  op produces from its creation until it is freed (autograd's saved tensors live to the end), and
  takes the peak. The batch-2 minus batch-1 difference is the per-sample part, the rest is shared
  (an S4 kernel does not grow with B); both are scaled linearly in L (every core here is linear
  in L). Eval mode is tried when training mode branches on data (EMA batch norm's first call).
  Against the real forward's max-RSS growth at B = 32, L = 1024 the estimate was 0.75-1.2× for
  the S4D, S4, S5, LRU and S4D-LM example specs, and 4.3× (over) for LinOSS's step loop. A
  model that cannot run on meta (LrcSSM's Newton solver reads convergence with ``.item()``)
  gets an analytical bound instead:
  ``64 · B · L · max(H, N) · 4 bytes`` per applied block (LrcSSM's backbone spec measured 0.6× of
  it at B = 4, L = 1024), said so in the estimate.
"""

from __future__ import annotations

import logging
import math
import os
import re
import weakref
from dataclasses import dataclass
from typing import Any

from .errors import SpecError
from .logs import log_once

log = logging.getLogger(__name__)

DEFAULT_BATCH = 32
"""Batch assumed when the spec has no ``training.batch_size`` (TrainingSpec's own default)."""

DEFAULT_LENGTH = 1024
"""Sequence length assumed when neither the spec (``input.length``) nor the dataset gives one."""

PROBE_LENGTH = 256
"""Longest sequence the meta-device forward runs (the estimate scales linearly beyond it)."""

FALLBACK_MEMORY = 8 * 2**30
"""Budget when the machine's available memory cannot be read (no /proc/meminfo, no sysconf)."""

BUDGET_ENV = "ZOO_MEMORY_BUDGET"
"""Environment override of the budget: a size (``32GiB``, ``500MB``, bytes) or ``off``."""

_ANALYTICAL_FACTOR = 64
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


class MemoryBudgetError(SpecError):
    """A spec asks for more memory than the budget allows (exit 2, before anything is allocated)."""


# sizes ------------------------------------------------------------------------------------------
def fmt_bytes(n: int) -> str:
    """``8.6 GiB`` style, for messages."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def parse_size(text: str) -> int:
    """``32GiB``, ``500 MB``, ``1e9`` -> bytes; a ``SpecError`` naming the accepted forms otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in _UNITS:
        raise SpecError(f"memory budget {text!r} is not a size; write e.g. 32GiB, 500MB or a number of bytes "
                        f"(units: {', '.join(u for u in _UNITS if u)})")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (Linux); else free physical pages; else ``FALLBACK_MEMORY``."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        log.info("cannot read the available memory here; assuming %s", fmt_bytes(FALLBACK_MEMORY))
        return FALLBACK_MEMORY


def resolve_budget(setting: str | None = None) -> int | None:
    """The budget in bytes: ``setting`` (a CLI flag), else ``$ZOO_MEMORY_BUDGET``, else the
    available memory. ``off`` (either place) disables the check: None."""
    raw = setting if setting is not None else os.environ.get(BUDGET_ENV)
    if raw is None or raw.strip() == "":
        return available_memory()
    if raw.strip().lower() in ("off", "none", "0"):
        return None
    return parse_size(raw)


# meta-device build ------------------------------------------------------------------------------
def meta_model(spec: Any, *, registry: Any = None) -> Any:
    """The model ``spec`` describes, built on the meta device (shapes only, no storage).

    Raises:
        SpecError: the spec is invalid (as ``build_model`` would).
    """
    import torch

    from .build import build_model  # lazy: keeps torch out of footprint

    try:
        with torch.device("meta"):
            return build_model(spec, registry=registry, device="meta")
    except RuntimeError as exc:  # a core that calls .item() on its initialisation: see the module docstring
        _once(f"core {_kinds(spec)} cannot initialise with every factory on the meta device ({exc}); sizing it "
              "with device='meta' only (its initialisation runs on the CPU for one block)")
        return build_model(spec, registry=registry, device="meta")


def _kinds(spec: Any) -> str:
    """The spec's core kind(s) for messages: 'lru', or 'lru'/'s4d' for a hybrid stack."""
    named = getattr(spec, "named", None) or {"core": (spec.core, spec.core_params)}
    return "/".join(dict.fromkeys(repr(entry.name) for entry, _ in named.values()))


def _once(message: str) -> None:
    """Log a degraded sizing path once per process (the estimate itself says which method it used)."""
    log_once(log, logging.INFO, message, "%s", message)


def expected_tensors(model: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    """What ``save_pretrained`` stores for ``model``: name -> (shape, dtype), tied tensors once
    (by identity: meta tensors have no storage to compare) and complex ones as real views (…, 2)."""
    out: dict[str, tuple[tuple[int, ...], Any]] = {}
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=True).items():
        if t.numel() and id(t) in seen:
            continue
        seen.add(id(t))
        out[name] = ((*t.shape, 2), t.real.dtype) if t.is_complex() else (tuple(t.shape), t.dtype)
    return out


# estimate ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Footprint:
    """Sizes of a model and, when estimated, one training step's activations at ``batch × length``."""

    params: int
    param_bytes: int  # parameters and buffers: what a build allocates
    activation_bytes: int | None = None
    batch: int = 0
    length: int = 0
    assumed: str = ""  # where batch and length came from
    method: str = ""  # how the activations were estimated

    @property
    def train_bytes(self) -> int:
        """Parameters, gradients and Adam's two moments (4× the parameters) plus activations."""
        return 4 * self.param_bytes + (self.activation_bytes or 0)

    def describe(self) -> str:
        text = f"{self.params:,} parameters ({fmt_bytes(self.param_bytes)})"
        if self.activation_bytes is None:
            return text
        return (f"{text}; activations ≈ {fmt_bytes(self.activation_bytes)} at batch {self.batch} × length "
                f"{self.length} ({self.assumed}; {self.method}); training ≈ {fmt_bytes(self.train_bytes)} "
                "(parameters, gradients, Adam moments, activations)")


def _batch_length(spec: Any, batch: int | None, length: int | None) -> tuple[int, int, str]:
    env = spec.envelope
    said = []
    if batch is None:
        batch = env.training.batch_size if env.training is not None else DEFAULT_BATCH
        said.append("batch from training.batch_size" if env.training is not None else f"batch: default {DEFAULT_BATCH}")
    if length is None:
        length = env.input.length or DEFAULT_LENGTH
        said.append("length from input.length" if env.input.length else f"length: default {DEFAULT_LENGTH}")
    return batch, length, "; ".join(said) or "batch and length given"


def _probe_input(spec: Any, batch: int, length: int) -> Any:
    import torch

    inp = spec.envelope.input
    if inp.vocab_size is not None:
        return torch.zeros(batch, length, dtype=torch.long, device="meta")
    return torch.zeros(batch, length, inp.channels, device="meta")


class _PeakBytes:
    """Live and peak bytes of the tensors ops produce, on the meta device (see ``_traced_bytes``)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def add(self, tensor: Any) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(tensor, self._free, nbytes)

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes


def _traced_bytes(model: Any, x: Any, *, train: bool) -> int:
    """Peak bytes held during ``model(x)``: every tensor an op produces counts from its creation
    until it is freed (autograd's saved tensors stay alive until the end, as in training); views
    and in-place results share their input's memory and are not counted."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    peak = _PeakBytes()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if getattr(func, "is_view", False):
                return out
            inputs = {id(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and id(t) not in inputs:
                    peak.add(t)
            return out

    with _Count():
        y = model.train(train)(x)
    del y
    return peak.peak


def _analytical_bytes(spec: Any, batch: int, length: int) -> int:
    m = spec.envelope.model
    named = getattr(spec, "named", None) or {"core": (spec.core, spec.core_params)}
    # a hybrid stack: the widest core bounds every position (an upper bound, as the rest of it)
    width = max(m.d_model, *(int(getattr(params, "d_state", 0) or 0) for _, params in named.values()))
    return _ANALYTICAL_FACTOR * batch * length * width * 4 * m.depth


def activation_bytes(spec: Any, model: Any, batch: int, length: int) -> tuple[int, str]:
    """(bytes, method) for one training forward at ``batch × length``; see the module docstring."""
    probe = min(length, PROBE_LENGTH)
    reasons = []
    for train in (True, False):  # eval mode sidesteps data-dependent training branches (EMA batch norm)
        try:
            one, two = (_traced_bytes(model, _probe_input(spec, b, probe), train=train) for b in (1, 2))
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
            reasons.append(str(exc).split("\n")[0])
            continue
        per_sample = max(two - one, 0)  # what grows with B; the rest (e.g. an S4 kernel) does not
        shared = max(one - per_sample, 0)
        mode = "training" if train else "eval"
        return (math.ceil((shared + batch * per_sample) * length / probe),
                f"peak of meta-device forwards ({mode} mode, autograd on) at batch 1 and 2, length {probe}, "
                "scaled to B·L")
    _once(f"core {_kinds(spec)}: the model cannot run on the meta device ({reasons[-1]}); using the analytical "
          "activation bound")
    return (_analytical_bytes(spec, batch, length),
            f"analytical bound {_ANALYTICAL_FACTOR}·B·L·max(H, N)·4 B per block: the model cannot run on meta")


def estimate(spec: Any, *, batch: int | None = None, length: int | None = None, activations: bool = True,
             registry: Any = None) -> Footprint:
    """Parameter count and bytes and (``activations``) an activation estimate for ``spec`` (a
    validated ``Spec``), without allocating; ``batch``/``length`` default to the spec's (see
    ``Footprint.assumed``)."""
    model = meta_model(spec, registry=registry)
    tensors = expected_tensors(model)
    params = sum(p.numel() for p in model.parameters())  # unique parameters (tied ones once), as count_params
    nbytes = sum(math.prod(shape) * dtype.itemsize for shape, dtype in tensors.values())  # + buffers
    if not activations:
        return Footprint(params, nbytes)
    batch, length, assumed = _batch_length(spec, batch, length)
    act, method = activation_bytes(spec, model, batch, length)
    return Footprint(params, nbytes, act, batch, length, assumed, method)


def check_budget(need: int, budget: int | None, *, what: str, footprint: Footprint, where: str) -> None:
    """Refuse (``MemoryBudgetError``, exit 2) when ``need`` bytes exceed ``budget``; None = no check."""
    if budget is None or need <= budget:
        return
    raise MemoryBudgetError(
        f"{where}: {what} needs ≈ {fmt_bytes(need)}, more than the memory budget of {fmt_bytes(budget)} "
        f"({footprint.describe()}). Make the model smaller (d_model, depth, classes, vocab_size, hidden widths), "
        f"or raise the budget with --memory-budget SIZE / {BUDGET_ENV}=SIZE, or skip the check with "
        f"--no-memory-check / {BUDGET_ENV}=off"
    )


def check_build(spec: Any, *, budget: str | None = None, check: bool = True, saving: bool = False) -> None:
    """Before ``zoo build`` allocates: the parameters (3× when saving: the tensors, the writer's
    contiguous copies and the serialised file) must fit the budget (exit 2 otherwise)."""
    if not check:
        return
    limit = resolve_budget(budget)
    if limit is None:
        return
    fp = estimate(spec, activations=False)
    what = "building and saving the model" if saving else "building the model"
    check_budget(fp.param_bytes * (3 if saving else 1), limit, what=what, footprint=fp, where=spec.filename)


def check_training(spec: Any, *, batch: int, length: int | None, budget: str | None = None, check: bool = True) -> None:
    """Before ``zoo train`` builds anything: parameters, gradients, Adam's moments and one batch's
    activations (the dataset's length) must fit the budget (exit 2 otherwise)."""
    if not check:
        return
    limit = resolve_budget(budget)
    if limit is None:
        return
    fp = estimate(spec, batch=batch, length=length)
    check_budget(fp.train_bytes, limit, what="training", footprint=fp, where=spec.filename)
