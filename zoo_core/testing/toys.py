"""Toy cores for testing the conformance suite itself: one correct, and one broken per check.

ToyDiag is a real diagonal recurrence per channel: h_t = a ⊙ h_{t−1} + b ⊙ x_t,
y_t = Σ_n c_n h_{t,n} + d ⊙ x_t, with a = sigmoid(a_logit) ∈ (0, 1). Shapes: x (B, L, H),
h (B, H, N). It is also a plugin (``zoo_register_cores``) so specs can build it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor, nn

from ..corebase import CoreBase, runs_path
from ..hookspecs import RegisterCore, hookimpl
from ..kernels.systems import DiagSystem
from ..params import CoreParams
from ..plugin_registry import Problem
from ..protocols import OptimHint, State

zoo_api = 1


class ToyParams(CoreParams):
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "lti"})

    d_state: int = Field(4, gt=0, le=64)


class ToyDiag(CoreBase, params=ToyParams):
    paths = {"conv": ("kernel", "conv"), "recurrent": ("scan",)}
    reference = {"scan": "naive"}
    problem = Problem(structure="diag", lti=True, complex=False)

    def __init__(self, d_model: int, d_state: int = 4, backend: Any = "auto", *, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.d_model, self.d_state = d_model, d_state
        self.a_logit = nn.Parameter(torch.linspace(0.5, 3.0, d_state, **kw).repeat(d_model, 1))  # (H, N)
        self.b = nn.Parameter(torch.randn(d_model, d_state, **kw))  # (H, N)
        self.c = nn.Parameter(torch.randn(d_model, d_state, **kw) / d_state)  # (H, N)
        self.d = nn.Parameter(torch.randn(d_model, **kw))  # (H,)

    def decay(self) -> Tensor:
        return torch.sigmoid(self.a_logit)  # (H, N)

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, h_last = self.run_path(x, self.decay(), None if state is None else state["h"])
        return y + self.d * x, {"h": h_last}

    @runs_path("recurrent")
    def _recurrent(self, x: Tensor, a: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        h, h_last = self.ops.scan(a[None, None], self.b * x[..., None], h0)  # (B, L, H, N)
        return (h * self.c).sum(-1), h_last  # (B, L, H)

    @runs_path("conv")
    def _convolve(self, x: Tensor, a: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        L = x.shape[1]
        y = self.ops.conv(x, self.ops.kernel(DiagSystem(torch.log(a), self.c * self.b), L))  # (B, L, H)
        powers = a[None] ** torch.arange(1, L + 1, dtype=x.dtype, device=x.device)[:, None, None]  # (L, H, N)
        if h0 is not None:
            y = y + torch.einsum("lhn,bhn,hn->blh", powers, h0, self.c)
        rev = a[None] ** torch.arange(L - 1, -1, -1, dtype=x.dtype, device=x.device)[:, None, None]  # (L, H, N)
        h_last = torch.einsum("lhn,blhn->bhn", rev, self.b * x[..., None]) + (0 if h0 is None else powers[-1] * h0)
        return y, h_last

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        h = self.decay() * state["h"] + self.b * x_t[..., None]  # (B, H, N)
        return (h * self.c).sum(-1) + self.d * x_t, {"h": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        return {"h": torch.zeros(batch_size, self.d_model, self.d_state, device=device or self.d.device, dtype=dtype or self.d.dtype)}

    def optim_hints(self) -> Mapping[str, OptimHint]:
        return {"a_logit": OptimHint(lr=1e-3, weight_decay=0.0)}


# broken cores: each breaks one promise -------------------------------------------------------
class PeeksAhead(ToyDiag):
    """Breaks causality: y_t sees x_{t+1}."""

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, s = super().forward_with_state(x, state)
        return y + 0.1 * torch.roll(x, -1, dims=1), s


class MixesBatch(ToyDiag):
    """Breaks batch independence: subtracts the batch mean."""

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, s = super().forward_with_state(x, state)
        return y - y.mean(0, keepdim=True) * 0.5, s


class DriftingStep(ToyDiag):
    """Breaks step = forward: the step uses a slightly different decay."""

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        h = self.decay() * 1.001 * state["h"] + self.b * x_t[..., None]
        return (h * self.c).sum(-1) + self.d * x_t, {"h": h}


class ForgetsState(ToyDiag):
    """Breaks state carry: ignores the incoming state."""

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        return super().forward_with_state(x, None)


class WrongFastPath(ToyDiag):
    """Breaks backend equivalence: the convolution path drops the skip term."""

    @runs_path("conv")
    def _convolve_wrong(self, x: Tensor, a: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        y, h_last = self._convolve(x, a, h0)
        return y - self.d * x, h_last


class AlwaysFloat32(ToyDiag):
    """Breaks dtype behaviour: always returns float32."""

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, s = super().forward_with_state(x, state)
        return y.float(), s


class DetachedParam(ToyDiag):
    """Breaks gradient flow: a parameter that never reaches the output."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.unused = nn.Parameter(torch.zeros(self.d_model, dtype=self.d.dtype))


class Unstable(ToyDiag):
    """Breaks stability: a decay above one blows up at long L."""

    def decay(self) -> Tensor:
        return 1.02 + 0 * self.a_logit


class Noisy(ToyDiag):
    """Breaks determinism: adds noise even in eval mode."""

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, s = super().forward_with_state(x, state)
        return y + 1e-3 * torch.randn_like(y), s


class SchemaDrift(ToyDiag):
    """Breaks params schema = constructor: takes a keyword its params model does not list."""

    def __init__(self, d_model: int, d_state: int = 4, backend: Any = "auto", scale: float = 1.0, *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(d_model, d_state, backend, device=device, dtype=dtype)


class BadHints(ToyDiag):
    """Breaks optim hints: names a parameter that does not exist."""

    def optim_hints(self) -> Mapping[str, OptimHint]:
        return {"A_log": OptimHint(lr=1e-3)}


class UnsavedState(ToyDiag):
    """Breaks save/load: part of the model lives in a plain attribute, not in the state dict."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.hidden_gain = torch.rand(()) + 0.5

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, s = super().forward_with_state(x, state)
        return y * self.hidden_gain, s


class WrongCapabilities(ToyDiag):
    """Breaks the protocol: declares a capability nobody knows."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "lti", "teleport"})


BROKEN: dict[str, type] = {
    "protocol": WrongCapabilities,
    "causality": PeeksAhead,
    "batch_independence": MixesBatch,
    "step_vs_forward": DriftingStep,
    "state_carry": ForgetsState,
    "backends": WrongFastPath,
    "dtypes": AlwaysFloat32,
    "gradients": DetachedParam,
    "stability": Unstable,
    "determinism": Noisy,
    "params_schema": SchemaDrift,
    "optim_hints": BadHints,
    "save_load": UnsavedState,
    "long_step": DriftingStep,
    "shapes": PeeksAhead,  # replaced below by a core whose output has the wrong width
}


class WrongWidth(ToyDiag):
    """Breaks shapes: drops the last channel."""

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, s = super().forward_with_state(x, state)
        return y[..., :-1], s


BROKEN["shapes"] = WrongWidth


class StateOnSelf(ToyDiag):
    """Breaks sharing across depth: step keeps its recurrent state on the module, not in the state dict."""

    _h: Tensor  # (B, H, N), set by the first step

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        if not hasattr(self, "_h") or self._h.shape[0] != x_t.shape[0] or bool((state["h"] == 0).all()):
            self._h = state["h"]
        self._h = self.decay() * self._h + self.b * x_t[..., None]  # (B, H, N)
        return (self._h * self.c).sum(-1) + self.d * x_t, {"h": self._h}


BROKEN["shared_depth"] = StateOnSelf


class HalfInside(ToyDiag):
    """Breaks the half-precision behaviour: runs its recurrence in the input's half precision (parameters
    cast down, the state returned rounded) instead of at its parameters' dtype. Its methods are set after
    the class statement, as a core written without ``CoreBase``'s precision wrapper would have them."""


def _half_inside_forward(self: HalfInside, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
    h = x.new_zeros(x.shape[0], self.d_model, self.d_state) if state is None else state["h"].to(x.dtype)
    a, b, c, d = (t.to(x.dtype) for t in (self.decay(), self.b, self.c, self.d))
    ys = []
    for t in range(x.shape[1]):
        h = a * h + b * x[:, t, :, None]
        ys.append((h * c).sum(-1) + d * x[:, t])
    return torch.stack(ys, 1), {"h": h}


def _half_inside_step(self: HalfInside, x_t: Tensor, state: State) -> tuple[Tensor, State]:
    y, s = _half_inside_forward(self, x_t[:, None], state)
    return y[:, 0], s


HalfInside.forward_with_state = _half_inside_forward  # type: ignore[method-assign,assignment]
HalfInside.step = _half_inside_step  # type: ignore[method-assign,assignment]


class NeedsBackend(ToyDiag):
    """Breaks backend-less construction: ``backend`` has no default (only a spec would supply it)."""

    def __init__(self, d_model: int, d_state: int = 4, *, backend: Any, device: Any = None, dtype: Any = None) -> None:
        super().__init__(d_model, d_state, backend, device=device, dtype=dtype)


class GrowingState(ToyDiag):
    """Breaks constant streaming memory: step keeps every input in its state without declaring it grows."""

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        state = super().init_state(batch_size, device=device, dtype=dtype)
        return {**state, "seen": state["h"].new_zeros(batch_size, 0, self.d_model)}

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        seen = x.new_zeros(x.shape[0], 0, x.shape[2]) if state is None else state["seen"]
        y, s = super().forward_with_state(x, None if state is None else {"h": state["h"]})
        return y, {**s, "seen": torch.cat([seen, x], 1)}

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        y, s = super().step(x_t, {"h": state["h"]})
        return y, {**s, "seen": torch.cat([state["seen"], x_t[:, None]], 1)}


class PackingToyParams(ToyParams):
    capabilities: ClassVar[frozenset[str]] = ToyParams.capabilities | {"packing"}


class LeaksAcrossDocuments(ToyDiag, params=PackingToyParams):
    """Breaks packed batches: claims a native packed path but runs each row whole, so every document
    starts from the state the one before it left (no reset at document starts)."""

    def forward_packed(self, x: Tensor, segments: Any, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        y, state = self.forward_with_state(x)  # the whole row, as if one sequence
        return y, ({"h": state["h"][segments.doc_row]} if with_states else None)


BROKEN["half_precision"] = HalfInside
BROKEN["state_size"] = GrowingState
BROKEN["backendless"] = NeedsBackend
BROKEN["packing"] = LeaksAcrossDocuments


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register("toy-diag", "zoo_core.testing.toys:ToyDiag", params=ToyParams, presets={"tiny": {"d_state": 3}})
    for check, cls in BROKEN.items():  # capabilities from ToyParams: WrongCapabilities's class disagrees
        params = PackingToyParams if cls is LeaksAcrossDocuments else ToyParams
        register(f"toy-broken-{check.replace('_', '-')}", cls, params=params, presets={"tiny": {"d_state": 3}})
