"""Mixed precision: half-precision activations around cores that compute in their parameters' dtype.

The field's practice (mamba_ssm, fla) and the zoo's: parameters in float32, activations in bfloat16
(or float16) under ``torch.autocast``, and the sensitive parts of an SSM (discretisation, the
recurrences, FFTs, the Cauchy/Vandermonde sums, softplus of Δ) computed in float32, the output cast
back. A core's *compute precision* is the dtype of its parameters (float32 unless it was built in
another); ``at_compute_precision`` is how a core honours it:

- input in bfloat16/float16 to a core of another dtype: cast up to the compute dtype on entry, the
  output ``y`` cast back to the input's dtype; the returned state stays in the compute dtype (a
  state carried across thousands of steps must not be rounded to 8 mantissa bits at each one);
- under ``torch.autocast``: autocast is switched off inside the core (its matmuls would otherwise
  run in half precision and meet float32/complex64 tensors of the recurrence), so the whole core
  runs in its compute dtype; the model's other layers (encoders, MLPs, decoders) stay under autocast.

``CoreBase`` applies it to every core's ``forward``, ``forward_with_state``, ``forward_packed`` and
``step``: a core written on ``CoreBase`` needs nothing. A third-party core that satisfies only the
``SSMCore`` protocol decorates those methods itself.

Training precision (``zoo train --precision``) uses Lightning's names: ``32`` (float32 throughout),
``bf16-mixed`` (autocast to bfloat16) and ``16-mixed`` (autocast to float16, with a gradient scaler).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

HALF = (torch.bfloat16, torch.float16)
#: ``--precision`` value -> the autocast dtype (None: no autocast)
PRECISIONS: dict[str, torch.dtype | None] = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
#: what each op computes in, whatever the input dtype (declared for the card and the guide)
COMPUTE_PRECISION = "the core's parameter dtype (float32 unless built otherwise), autocast off inside; y cast back"

F = TypeVar("F", bound=Callable[..., Any])
_WRAPPED = "__zoo_precision__"
_INPUT_NAMES = ("x", "x_t", "u")  # the input's name where a method is called with keywords


def compute_dtype(module: nn.Module) -> torch.dtype:
    """The dtype a core computes in: its first real floating parameter's (a complex one's real part);
    float32 for a core without parameters. A core whose parameters differ in dtype (Mamba built in
    bfloat16 keeps A_log and D in float32) says which with a ``compute_dtype()`` method of its own."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
        if p.is_complex():
            return p.real.dtype
    return torch.float32


def _cast_output(out: Any, dtype: torch.dtype) -> Any:
    """``y`` (the output, or the first element of ``(y, state)``) cast to ``dtype``; the state as is."""
    if isinstance(out, Tensor):
        return out.to(dtype) if out.is_floating_point() else out
    if isinstance(out, tuple) and out and isinstance(out[0], Tensor) and out[0].is_floating_point():
        return (out[0].to(dtype), *out[1:])
    return out


def at_compute_precision(fn: F) -> F:
    """Decorate a core method whose first argument is the input ``x`` (``(B, L, H)`` or ``(B, H)``):
    half-precision input is cast up to the core's compute dtype and ``y`` back; autocast is off inside.
    Float32/float64 input outside autocast passes straight through (one dtype test, nothing else)."""
    if getattr(fn, _WRAPPED, False):
        return fn

    @functools.wraps(fn)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        key = next((k for k in _INPUT_NAMES if k in kwargs), None) if not args else None
        x = args[0] if args else kwargs.get(key) if key else None
        if not isinstance(x, Tensor):
            return fn(self, *args, **kwargs)
        device = x.device.type
        low = x.dtype in HALF
        # the meta device (footprint's dry runs) has no autocast: nothing to switch off there
        autocast = device != "meta" and torch.is_autocast_enabled(device)
        if not low and not autocast:
            return fn(self, *args, **kwargs)
        own = getattr(self, "compute_dtype", None)
        compute = own() if callable(own) else compute_dtype(self)
        off = torch.autocast(device, enabled=False) if device != "meta" else contextlib.nullcontext()
        if low and x.dtype != compute:
            if args:
                args = (x.to(compute), *args[1:])
            elif key is not None:
                kwargs = {**kwargs, key: x.to(compute)}
            with off:
                return _cast_output(fn(self, *args, **kwargs), x.dtype)
        with off:
            return fn(self, *args, **kwargs)

    setattr(wrapper, _WRAPPED, True)
    return wrapper  # type: ignore[return-value]


def parse_precision(value: str) -> str:
    """A ``--precision`` value checked: one of ``PRECISIONS`` (``ValueError`` naming them otherwise)."""
    value = str(value)
    if value not in PRECISIONS:
        raise ValueError(f"precision {value!r} is not one of {', '.join(PRECISIONS)} (Lightning's names: "
                         "32 = float32, bf16-mixed = bfloat16 autocast, 16-mixed = float16 autocast + gradient scaler)")
    return value


@contextlib.contextmanager
def autocast_for(precision: str, device: torch.device | str) -> Iterator[None]:
    """The forward/loss context of a training precision on ``device``: autocast to its dtype, or nothing."""
    dtype = PRECISIONS[parse_precision(precision)]
    if dtype is None:
        yield
        return
    with torch.autocast(torch.device(device).type, dtype=dtype):
        yield


def grad_scaler(precision: str, device: torch.device | str) -> torch.amp.GradScaler | None:
    """A gradient scaler for float16 training (its small exponent range underflows gradients), None otherwise."""
    if PRECISIONS[parse_precision(precision)] is not torch.float16:
        return None
    return torch.amp.GradScaler(torch.device(device).type)
