"""The export-only opaque forms of the chunked ops (Mamba-2 SSD, Gated DeltaNet, Mamba-3): each equals
its Python composition, its fake agrees with it (opcheck, with and without ``ends``), it is taken
only while exporting, and a backward through it is refused with the way out."""

from __future__ import annotations

from collections.abc import Callable
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


def _ssd(dtype: torch.dtype) -> tuple[Callable[..., Any], Callable[..., Any], list[Any], dict[str, Any]]:
    from zoo_mamba2.export_op import ssd_chunked_op
    from zoo_mamba2.ssd import ssd_chunked

    g, Bt, L, Hh, P, G, N = _g(), 2, 13, 4, 3, 2, 5
    args = [torch.randn(Bt, L, Hh, P, generator=g), torch.rand(Bt, L, Hh, generator=g) * 0.5,
            -torch.rand(Hh, generator=g) - 0.1, torch.randn(Bt, L, G, N, generator=g), torch.randn(Bt, L, G, N, generator=g)]
    args = [a.to(dtype) for a in args] + [4, torch.randn(Bt, Hh, P, N, generator=g, dtype=dtype)]
    return ssd_chunked_op, lambda *a, reset=None, ends=None: ssd_chunked(*a, reset=reset, ends=ends), args, {}


def _gdn(dtype: torch.dtype) -> tuple[Callable[..., Any], Callable[..., Any], list[Any], dict[str, Any]]:
    from zoo_gdn.export_op import gated_delta_chunked_op
    from zoo_gdn.ops import gated_delta_chunked

    g, B, L, H, K, V = _g(1), 2, 13, 2, 4, 3
    k = torch.nn.functional.normalize(torch.randn(B, L, H, K, generator=g), dim=-1)
    args = [torch.randn(B, L, H, K, generator=g), k, torch.randn(B, L, H, V, generator=g), torch.rand(B, L, H, generator=g),
            -torch.rand(B, L, H, generator=g) * 0.3, torch.randn(B, H, K, V, generator=g)]
    args = [a.to(dtype) for a in args]

    def op(*a: Any, reset: Any = None, ends: Any = None) -> Any:
        return gated_delta_chunked_op(*a, 4, reset, ends)

    def ref(*a: Any, reset: Any = None, ends: Any = None) -> Any:
        return gated_delta_chunked(*a, chunk_size=4, reset=reset, ends=ends)

    return op, ref, args, {"positional_marks": False}


def _trap(dtype: torch.dtype) -> tuple[Callable[..., Any], Callable[..., Any], list[Any], dict[str, Any]]:
    from zoo_mamba3.export_op import trap_scan_chunked_op
    from zoo_mamba3.scan import trap_scan_chunked

    g, Bt, L, H, P, N = _g(2), 2, 13, 2, 3, 4
    args = [torch.randn(Bt, L, H, P, generator=g), torch.rand(Bt, L, H, generator=g) * 0.5, -torch.rand(H, generator=g) - 0.1,
            torch.randn(Bt, L, H, N, generator=g), torch.randn(Bt, L, H, N, generator=g), torch.rand(Bt, L, H, generator=g),
            torch.randn(Bt, H, P, N, generator=g), torch.randn(Bt, H, P, generator=g), torch.randn(Bt, H, N, generator=g)]
    args = [a.to(dtype) for a in args]

    def op(*a: Any, reset: Any = None, ends: Any = None) -> Any:
        return trap_scan_chunked_op(*a, 4, reset, ends)

    def ref(*a: Any, reset: Any = None, ends: Any = None) -> Any:
        return trap_scan_chunked(*a, chunk_size=4, reset=reset, ends=ends)

    return op, ref, args, {"positional_marks": False}


CASES = {"ssd": _ssd, "gated-delta": _gdn, "trapezoidal": _trap}


def _call_op(op: Callable[..., Any], args: list[Any], extra: dict[str, Any], reset: Any, ends: Any) -> Any:
    if extra.get("positional_marks", True):  # ssd_chunked_op takes (…, chunk_size, h0, reset, ends) positionally
        return op(*args, reset, ends)
    return op(*args, reset=reset, ends=ends)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("marks", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_op_is_its_composition_and_its_fake_agrees(case: str, marks: bool, dtype: torch.dtype) -> None:
    op, ref, args, extra = CASES[case](dtype)
    reset, ends = _marks(args[0].shape[0], args[0].shape[1]) if marks else (None, None)
    out, want = _call_op(op, args, extra, reset, ends), ref(*args, reset=reset, ends=ends)
    for o, w in zip(out, want, strict=True):
        assert o.dtype == w.dtype and o.shape == w.shape
        torch.testing.assert_close(o, w, rtol=0, atol=0)
    raw = op._opoverload if hasattr(op, "_opoverload") else None
    target = raw if raw is not None else op
    if extra.get("positional_marks", True):
        torch.library.opcheck(target, (*args, reset, ends))
    else:
        from zoo_gdn.export_op import gated_delta_chunked_op
        from zoo_mamba3.export_op import trap_scan_chunked_op

        full = gated_delta_chunked_op if case == "gated-delta" else trap_scan_chunked_op
        torch.library.opcheck(full, (*args, 4, reset, ends))


def test_a_backward_through_the_export_op_is_refused_naming_the_way_out() -> None:
    from zoo_mamba2.export_op import ssd_chunked_op

    _, _, args, _ = _ssd(F64)
    x = args[0].clone().requires_grad_()
    y, _ = ssd_chunked_op(x, *args[1:], None, None)
    with pytest.raises(RuntimeError, match="export-only form.*eagerly or under torch.compile"):
        y.sum().backward()


def test_only_export_takes_the_opaque_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager and torch.compile trace the composition (autograd, Inductor fusion); export, the op."""
    from zoo_mamba2 import export_op
    from zoo_mamba2.ssd import ssd_chunked

    calls: list[int] = []
    real = export_op.ssd_chunked_op
    monkeypatch.setattr(export_op, "ssd_chunked_op", lambda *a: calls.append(1) or real(*a))
    _, _, args, _ = _ssd(F64)
    ssd_chunked(*args)
    assert calls == [] and not export_ops.exporting()
    monkeypatch.setattr(export_ops.torch.compiler, "is_exporting", lambda: True)
    ssd_chunked(*args)
    assert calls == [1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fake_follows_the_composition_with_mixed_dtypes(case: str) -> None:
    """One input narrower than the rest (bfloat16): the fake's dtypes are the composition's own."""
    op, ref, args, extra = CASES[case](torch.float32)
    narrow = 2 if case == "gated-delta" else 0  # GDN's v; the others' x
    args = [a.to(torch.bfloat16) if i == narrow else a for i, a in enumerate(args)]
    want = ref(*args)
    if extra.get("positional_marks", True):
        torch.library.opcheck(op, (*args, None, None))
    else:
        from zoo_gdn.export_op import gated_delta_chunked_op
        from zoo_mamba3.export_op import trap_scan_chunked_op

        full = gated_delta_chunked_op if case == "gated-delta" else trap_scan_chunked_op
        torch.library.opcheck(full, (*args, 4, None, None))
    out = _call_op(op, args, extra, None, None)
    assert [o.dtype for o in out] == [w.dtype for w in want]
