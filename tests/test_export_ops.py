"""The export-only opaque forms of the chunked ops (Mamba-2 SSD, Gated DeltaNet, Mamba-3): each equals
its Python composition, its fake agrees with it (opcheck, with and without ``ends``), it is taken
only while exporting, and a backward through it is refused with the way out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from zoo_core.kernels import export_ops

F64 = torch.float64


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _marks(Bt: int, L: int) -> tuple[Tensor, Tensor]:
    reset = torch.zeros(Bt, L, dtype=torch.bool)
    reset[:, 0] = True
    reset[0, 7] = True
    ends = torch.zeros(Bt, L, dtype=torch.bool)
    ends[0, 6] = ends[:, L - 1] = True
    return reset, ends


@dataclass
class Case:
    """One export-only op: ``op(*args, reset, ends)`` against ``ref(args, reset, ends)``, its composition."""

    op: Any
    args: list[Any]
    ref: Callable[[list[Any], Any, Any], Any]
    narrow: int  # the input the mixed-dtype test makes bfloat16


def _ssd(dtype: torch.dtype) -> Case:
    from zoo_mamba2.export_op import ssd_chunked_op
    from zoo_mamba2.ssd import ssd_chunked

    g, Bt, L, Hh, P, G, N = _g(), 2, 13, 4, 3, 2, 5
    args = [torch.randn(Bt, L, Hh, P, generator=g), torch.rand(Bt, L, Hh, generator=g) * 0.5,
            -torch.rand(Hh, generator=g) - 0.1, torch.randn(Bt, L, G, N, generator=g), torch.randn(Bt, L, G, N, generator=g)]
    args = [a.to(dtype) for a in args] + [4, torch.randn(Bt, Hh, P, N, generator=g, dtype=dtype)]  # chunk 4, h0
    return Case(ssd_chunked_op, args, lambda a, r, e: ssd_chunked(*a, reset=r, ends=e), narrow=0)


def _gdn(dtype: torch.dtype) -> Case:
    from zoo_gdn.export_op import gated_delta_chunked_op
    from zoo_gdn.ops import gated_delta_chunked

    g, B, L, H, K, V = _g(1), 2, 13, 2, 4, 3
    k = torch.nn.functional.normalize(torch.randn(B, L, H, K, generator=g), dim=-1)
    args = [torch.randn(B, L, H, K, generator=g), k, torch.randn(B, L, H, V, generator=g), torch.rand(B, L, H, generator=g),
            -torch.rand(B, L, H, generator=g) * 0.3, torch.randn(B, H, K, V, generator=g)]
    args = [a.to(dtype) for a in args] + [4]  # chunk size
    return Case(gated_delta_chunked_op, args,
                lambda a, r, e: gated_delta_chunked(*a[:-1], chunk_size=a[-1], reset=r, ends=e), narrow=2)  # v


def _trap(dtype: torch.dtype) -> Case:
    from zoo_mamba3.export_op import trap_scan_chunked_op
    from zoo_mamba3.scan import trap_scan_chunked

    g, Bt, L, H, P, N = _g(2), 2, 13, 2, 3, 4
    args = [torch.randn(Bt, L, H, P, generator=g), torch.rand(Bt, L, H, generator=g) * 0.5, -torch.rand(H, generator=g) - 0.1,
            torch.randn(Bt, L, H, N, generator=g), torch.randn(Bt, L, H, N, generator=g), torch.rand(Bt, L, H, generator=g),
            torch.randn(Bt, H, P, N, generator=g), torch.randn(Bt, H, P, generator=g), torch.randn(Bt, H, N, generator=g)]
    args = [a.to(dtype) for a in args] + [4]  # chunk size
    return Case(trap_scan_chunked_op, args,
                lambda a, r, e: trap_scan_chunked(*a[:-1], chunk_size=a[-1], reset=r, ends=e), narrow=0)


CASES = {"ssd": _ssd, "gated-delta": _gdn, "trapezoidal": _trap}


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("marks", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_op_is_its_composition_and_its_fake_agrees(case: str, marks: bool, dtype: torch.dtype) -> None:
    c = CASES[case](dtype)
    reset, ends = _marks(c.args[0].shape[0], c.args[0].shape[1]) if marks else (None, None)
    out, want = c.op(*c.args, reset, ends), c.ref(c.args, reset, ends)
    for o, w in zip(out, want, strict=True):
        assert o.dtype == w.dtype and o.shape == w.shape
        torch.testing.assert_close(o, w, rtol=0, atol=0)
    torch.library.opcheck(c.op, (*c.args, reset, ends))


def test_a_backward_through_the_export_op_is_refused_naming_the_way_out() -> None:
    c = _ssd(F64)
    x = c.args[0].clone().requires_grad_()
    y, _ = c.op(x, *c.args[1:], None, None)
    with pytest.raises(RuntimeError, match="export-only form.*eagerly or under torch.compile"):
        y.sum().backward()


def test_only_export_takes_the_opaque_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager and torch.compile trace the composition (autograd, Inductor fusion); export, the op."""
    from zoo_mamba2 import export_op
    from zoo_mamba2.ssd import ssd_chunked

    calls: list[int] = []
    real = export_op.ssd_chunked_op
    monkeypatch.setattr(export_op, "ssd_chunked_op", lambda *a: calls.append(1) or real(*a))
    args = _ssd(F64).args
    ssd_chunked(*args)
    assert calls == [] and not export_ops.exporting()
    monkeypatch.setattr(export_ops.torch.compiler, "is_exporting", lambda: True)
    ssd_chunked(*args)
    assert calls == [1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fake_follows_the_composition_with_mixed_dtypes(case: str) -> None:
    """One input narrower than the rest (bfloat16): the fake's dtypes are the composition's own."""
    c = CASES[case](torch.float32)
    args = [a.to(torch.bfloat16) if i == c.narrow else a for i, a in enumerate(c.args)]
    torch.library.opcheck(c.op, (*args, None, None))
    assert [o.dtype for o in c.op(*args, None, None)] == [w.dtype for w in c.ref(args, None, None)]
