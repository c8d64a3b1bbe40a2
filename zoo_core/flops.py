"""Counted FLOPs: every aten op a computation dispatches, priced by a fixed table.

``count_flops()`` is a ``TorchDispatchMode``: it sees each aten op actually executed (whatever the
backend chose: a loop scan issues its per-step multiplies and adds, an FFT convolution its FFTs)
and adds:

* matrix products and convolutions: PyTorch's own formulas (``torch.utils.flop_counter``;
  2·M·N·K for a matmul), times 4 when the operands are complex;
* FFTs (``_fft_r2c``, ``_fft_c2r``, ``_fft_c2c``): 5·n·log2(n) per transformed signal of length n
  (the usual radix-2 count), summed over the other dimensions;
* pointwise ops (aten tag ``pointwise``: add, mul, exp, sigmoid, where, ...): one per output
  element, two for complex outputs;
* reductions (aten tag ``reduction``: sum, mean, var, amax, norm, ...): one per input element,
  two for complex inputs;
* everything else (views, copies and clones, cat, indexing, factories, dtype casts, lazy
  conjugation): zero — data movement.

This is a count under a stated convention, not a hardware measurement: the same model on another
backend executes other ops and counts differently. Backward passes are counted too when they
happen inside the context.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

_aten = torch.ops.aten
_FFT = {_aten._fft_r2c.default, _aten._fft_c2r.default, _aten._fft_c2c.default}
# Tagged pointwise by aten but pure data movement or initialisation: free under this convention.
_FREE = {"clone", "copy", "copy_", "_to_copy", "fill", "fill_", "zero_", "zeros_like", "ones_like", "full_like",
         "empty_like", "lift_fresh_copy", "alias", "detach", "_conj", "conj", "resolve_conj", "resolve_neg"}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _fft_flops(func: Any, args: tuple[Any, ...], out: Any) -> int:
    dims = args[1]
    if func is _aten._fft_c2r.default:  # the full real output length along the last dim
        sizes = {d: out.shape[d] for d in dims}
        ref = out
    else:
        sizes = {d: args[0].shape[d] for d in dims}
        ref = args[0]
    total = 0
    numel = ref.numel()
    for n in sizes.values():
        if n > 1:
            total += int(5 * numel * math.log2(n))  # (numel / n) signals × 5 n log2 n
    return total


# PyTorch's table prices the GPU attention kernels only; scaled_dot_product_attention on CPU runs this
# one, priced the same way (its two matrix products, QKᵀ and PV, grouped heads included).
_CPU_SDPA: dict[str, Callable[..., int]] = {
    "_scaled_dot_product_flash_attention_for_cpu": lambda q, k, v, *_, **__: sdpa_flop_count(q.shape, k.shape, v.shape),
    "_scaled_dot_product_flash_attention_for_cpu_backward":
        lambda g, q, k, v, *_, **__: sdpa_backward_flop_count(g.shape, q.shape, k.shape, v.shape),
}


def op_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """The FLOPs the table above assigns to one executed aten op."""
    packet = func._overloadpacket
    if packet.__name__ in _CPU_SDPA:
        return int(_CPU_SDPA[packet.__name__](*args, **kwargs))
    if packet in flop_registry:
        ins = _tensors(args)
        n = int(flop_registry[packet](*args, **kwargs, out_val=out))  # takes tensors, reads their shapes
        return n * (4 if any(t.is_complex() for t in ins) else 1)
    if func in _FFT:
        return _fft_flops(func, args, out)
    tags = func.tags
    if packet.__name__ in _FREE:
        return 0
    if torch.Tag.pointwise in tags:
        outs = _tensors(out)
        return sum(t.numel() * (2 if t.is_complex() else 1) for t in outs)
    if torch.Tag.reduction in tags:
        ins = _tensors(args[:1])
        return sum(t.numel() * (2 if t.is_complex() else 1) for t in ins)
    return 0


class count_flops(TorchDispatchMode):
    """Context manager counting FLOPs of everything run inside it.

    Example::

        with count_flops() as fc:
            model(x)
        fc.total          # FLOPs
        fc.by_op          # Counter: aten op name -> FLOPs
    """

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        n = op_flops(func, args, kwargs, out)
        if n:
            self.total += n
            self.by_op[str(func._overloadpacket.__name__)] += n
        return out
