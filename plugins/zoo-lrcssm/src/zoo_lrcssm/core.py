"""LrcSSM: the liquid-resistance liquid-capacitance cell, solved sequentially or by Newton (DEER).

Letters: B batch, L length, H = m input width (d_model), D state size (d_state).

Per step, with u_t ∈ R^H and x = x_{t−1} ∈ R^D (models.md §8.1; the parameters keep the names of
the reference's ``LRC_diagmat.py``, ``weight_sensory_mu`` ... ``weight_elastance_shift``):

    s_u = σ(σ_s ⊙ (u_t − μ_s))                    (H,)   sensory synapses, mix all inputs
    q   = σ(s ⊙ (x − μ))                           (D,)   self synapses, elementwise
    f   = g_L + W_f s_u + w ⊙ q,   zz = g_L + W_z s_u + h ⊙ q     (the same g_L in both)
    ε   = Δt·σ(k_ε x + b_ε)                        asymmetric (default)
        = Δt·(σ(k_ε x + b_ε + s_ε) − σ(k_ε x + b_ε − s_ε))      symmetric
    x_t = x + ε ⊙ (−σ(f) ⊙ x + v_L ⊙ tanh(zz))

The state enters only elementwise, so ∂x_t/∂x_{t−1} is diagonal (closed form in
``step_and_jacobian``). The layer's output is the state trajectory x_{1:L} (B, L, D), as in the
reference; when D ≠ H a Linear(D → H) ``out_proj`` maps it to the model width.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from zoo_core.corebase import CoreBase, runs_path
from zoo_core.kernels.export_ops import exporting
from zoo_core.logs import log_once
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State

from .deer import NewtonConvergenceError, NewtonResult, default_tol, newton_fixed_point, newton_step
from .params import DEFAULT_MAX_ITER, LrcSSMParams

F64 = torch.float64
log = logging.getLogger("zoo_lrcssm")

# Reference order of the 13 draws (LRCU.__init__); weight_elastance_shift only when symmetric.
_VECTOR_IN = ("weight_sensory_mu", "weight_sensory_sigma")  # (H,)
_MATRIX = ("weight_sensory_w", "weight_sensory_h")  # (D, H)
_VECTOR_STATE = ("weight_mu", "weight_sigma", "weight_w", "weight_h", "weight_gleak", "weight_vleak",
                 "weight_elastance_kernel", "weight_elastance_bias")  # (D,)
_SHIFT = "weight_elastance_shift"  # (D,)


def euler_cell(x: Tensor, pf: Tensor, pz: Tensor, sigma: Tensor, mu: Tensor, w: Tensor, h: Tensor, e_bias: Tensor,
               e_kernel: Tensor, e_shift: Tensor | None, vleak: Tensor, dt: float) -> Tensor:
    """One Euler step x_{t−1} -> x_t for x, pf, pz (..., D) (``LrcSSM.cell``; ``e_shift`` None: asymmetric)."""
    q = torch.sigmoid(sigma * (x - mu))  # (..., D)
    sf = torch.sigmoid(torch.addcmul(pf, w, q))  # σ(f)
    th = torch.tanh(torch.addcmul(pz, h, q))  # tanh(zz)
    arg = torch.addcmul(e_bias, e_kernel, x)
    eps = torch.sigmoid(arg) if e_shift is None else torch.sigmoid(arg + e_shift) - torch.sigmoid(arg - e_shift)
    if dt != 1.0:
        eps = eps * dt
    return torch.addcmul(x, eps, vleak * th - sf * x)  # (..., D)


class LrcSSM(CoreBase, params=LrcSSMParams):
    # "sequential" uses no op: the reference loop ("naive", {}). "deer" runs one diagonal scan per
    # Newton step; "auto" picks it.
    paths = {"deer": ("scan",), "sequential": ()}
    reference = {}
    problem = Problem(structure="diag", lti=False, complex=False)
    # The scan "auto" and "deer" pick inside Newton, per device type (benchmarks/REPORT_LRCSSM.md).
    auto_backends = {"cpu": {"scan": "scan"}}
    # Newton windows hold about this many state entries (B·W·D) per sweep, so a sweep's working
    # set stays in cache on a CPU; at least MIN_WINDOW steps. None: one window of L steps.
    window_elems: ClassVar[int | None] = 2**18
    min_window: ClassVar[int] = 64
    # The cell's parameters, registered by name in __init__ (the reference's names): declared so
    # the type checker sees Parameters, not nn.Module.__getattr__'s Tensor | Module.
    weight_sensory_mu: nn.Parameter  # (H,)
    weight_sensory_sigma: nn.Parameter  # (H,)
    weight_sensory_w: nn.Parameter  # (D, H)
    weight_sensory_h: nn.Parameter  # (D, H)
    weight_mu: nn.Parameter  # (D,)
    weight_sigma: nn.Parameter  # (D,)
    weight_w: nn.Parameter  # (D,)
    weight_h: nn.Parameter  # (D,)
    weight_gleak: nn.Parameter  # (D,)
    weight_vleak: nn.Parameter  # (D,)
    weight_elastance_kernel: nn.Parameter  # (D,)
    weight_elastance_bias: nn.Parameter  # (D,)
    weight_elastance_shift: nn.Parameter  # (D,) symmetric elastance only

    def __init__(
        self,
        d_model: int,
        d_state: int | None = None,
        elastance: str = "asymmetric",
        dt: float = 1.0,
        tol: float | None = None,
        max_iter: int = DEFAULT_MAX_ITER,
        on_nonconvergence: str = "fallback",
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        real = dtype or torch.get_default_dtype()
        H, D = d_model, (d_state or d_model)
        self.d_model, self.d_state = H, D
        self.elastance, self.dt, self.tol, self.max_iter = elastance, float(dt), tol, max_iter
        self.on_nonconvergence = on_nonconvergence
        lim = 1.0 / math.sqrt(D)  # Equinox default_init with lim = sqrt(1 / hidden_size)
        names = (*_VECTOR_IN, *_MATRIX, *_VECTOR_STATE) + ((_SHIFT,) if elastance == "symmetric" else ())
        shapes = {**dict.fromkeys(_VECTOR_IN, (H,)), **dict.fromkeys(_MATRIX, (D, H))}
        for name in names:  # drawn in float64 and cast: float32 and float64 builds agree
            value = torch.empty(shapes.get(name, (D,)), dtype=F64).uniform_(-lim, lim)
            self.register_parameter(name, nn.Parameter(value.to(device=device, dtype=real)))
        # PyTorch's Linear init (U[±1/√D] weight and bias), drawn in float64 like the cell
        self.out_proj = nn.Linear(D, H, dtype=F64).to(device=device, dtype=real) if D != H else None
        self.last_iterations: int | None = None  # Newton sweeps of the latest deer solve
        self.last_solve: NewtonResult | None = None  # its details (without the trajectory)

    # the cell ---------------------------------------------------------------------------
    def drive(self, u: Tensor) -> tuple[Tensor, Tensor]:
        """Input-only terms g_L + W_f s_u and g_L + W_z s_u: u (..., H) -> two (..., D)."""
        s_u = torch.sigmoid(self.weight_sensory_sigma * (u - self.weight_sensory_mu))  # (..., H)
        W = torch.cat([self.weight_sensory_w, self.weight_sensory_h], 0)  # (2D, H)
        pf, pz = (s_u @ W.T).split(self.d_state, -1)  # (..., D) each
        return pf + self.weight_gleak, pz + self.weight_gleak

    def _elastance(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """ε(x) and dε/dx, elementwise (..., D)."""
        arg = torch.addcmul(self.weight_elastance_bias, self.weight_elastance_kernel, x)  # (..., D)
        if self.elastance == "symmetric":
            hi = torch.sigmoid(arg + self.weight_elastance_shift)
            lo = torch.sigmoid(arg - self.weight_elastance_shift)
            eps = hi - lo
            slope = torch.addcmul(hi, hi, hi, value=-1) - torch.addcmul(lo, lo, lo, value=-1)  # σ'(+) − σ'(−)
        else:
            eps = torch.sigmoid(arg)
            slope = torch.addcmul(eps, eps, eps, value=-1)  # σ(1 − σ)
        if self.dt != 1.0:
            eps = eps * self.dt
        return eps, slope * (self.weight_elastance_kernel * self.dt)

    def step_and_jacobian(self, x: Tensor, pf: Tensor, pz: Tensor) -> tuple[Tensor, Tensor]:
        """F(x) and diag ∂F/∂x for x, pf, pz (..., D) (models.md §8.1):

        J = 1 + ε'·r + ε·(v_L h (1 − tanh²zz) q' − σ(f) − σ'(f) w q' x),  r = v_L tanh(zz) − σ(f) x,
        q' = s σ'(s(x − μ)). Written with fused multiply-adds: it runs at every Newton sweep.
        """
        s = self.weight_sigma
        q = torch.sigmoid(torch.addcmul(-s * self.weight_mu, s, x))  # (..., D) σ(s(x − μ))
        sf = torch.sigmoid(torch.addcmul(pf, self.weight_w, q))  # σ(f)
        th = torch.tanh(torch.addcmul(pz, self.weight_h, q))  # tanh(zz)
        eps, eps_x = self._elastance(x)
        r = torch.addcmul(self.weight_vleak * th, sf, x, value=-1)  # v_L tanh(zz) − σ(f) x
        dq = torch.addcmul(q, q, q, value=-1) * s  # q'
        inner = torch.addcmul(torch.addcmul(self.weight_vleak * self.weight_h, th * th, self.weight_vleak * self.weight_h, value=-1),
                              torch.addcmul(sf, sf, sf, value=-1) * x, self.weight_w, value=-1)
        dr = torch.addcmul(-sf, dq, inner)  # ∂r/∂x
        return torch.addcmul(x, eps, r), torch.addcmul(torch.addcmul(torch.ones_like(r), eps_x, r), eps, dr)

    def _step_and_jacobian_reset(self, x: Tensor, pf: Tensor, pz: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
        """``step_and_jacobian`` of packed documents: keep (..., 1) is 0 at a document's first step, where
        the previous state is replaced by zero (F(0)) and the Jacobian is zero (nothing carried across)."""
        F, J = self.step_and_jacobian(x * keep, pf, pz)
        return F, J * keep

    def _cell_params(self) -> tuple[Any, ...]:
        """The cell's parameters in ``euler_cell``'s order (after x, pf, pz)."""
        shift = self.weight_elastance_shift if self.elastance == "symmetric" else None
        return (self.weight_sigma, self.weight_mu, self.weight_w, self.weight_h, self.weight_elastance_bias,
                self.weight_elastance_kernel, shift, self.weight_vleak, self.dt)

    def cell(self, x: Tensor, pf: Tensor, pz: Tensor) -> Tensor:
        """One Euler step x_{t−1} -> x_t for x, pf, pz (..., D)."""
        return euler_cell(x, pf, pz, *self._cell_params())

    # solvers ----------------------------------------------------------------------------
    @runs_path("sequential")
    def _solve_sequential(self, pf: Tensor, pz: Tensor, h0: Tensor, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The loop over time; ``keep`` (B, L, 1), for packed documents, zeroes the state entering each start.
        While exporting, the same loop as one opaque op (``export_op``): a traced loop would pin L."""
        if exporting():
            from .export_op import lrcssm_sequential_op

            states, last = lrcssm_sequential_op(pf, pz, h0, keep, *self._cell_params())
            return states, last
        x, xs = h0, []
        if keep is None:
            for pf_t, pz_t in zip(pf.unbind(1), pz.unbind(1), strict=True):  # unbind: one backward node, not L slices
                x = self.cell(x, pf_t, pz_t)  # (B, D)
                xs.append(x)
        else:
            for pf_t, pz_t, k_t in zip(pf.unbind(1), pz.unbind(1), keep.unbind(1), strict=True):
                x = self.cell(x * k_t, pf_t, pz_t)  # (B, D)
                xs.append(x)
        return torch.stack(xs, 1), x  # (B, L, D), (B, D)

    def _window(self, B: int, L: int, D: int) -> int | None:
        """Newton window length for a (B, L, D) trajectory, None for the whole sequence."""
        if self.window_elems is None:
            return None
        window = max(self.min_window, self.window_elems // (B * D))
        return window if window < L else None

    @runs_path("deer")
    def _solve_deer(self, pf: Tensor, pz: Tensor, h0: Tensor, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Newton (DEER) over the whole batch. With ``keep`` (B, L, 1; packed documents) the previous
        state is zero and the Jacobian zero at every document start: the linearised scan of each sweep
        restarts there, so every document is solved from zero in the same sweeps (and a start step
        is exact at once, like step 0).

        Under ``torch.compile`` / ``torch.export`` the exact sequential loop runs instead: Newton's stopping
        test reads the residual on the host (a data-dependent branch a traced graph cannot hold, so
        ``fullgraph=True`` and export refuse it), and the loop computes the very trajectory Newton
        converges to (within ``tol``)."""
        if torch.compiler.is_compiling():
            return self._solve_sequential(pf, pz, h0, keep)
        scan = self.ops.scan
        tol = self.tol if self.tol is not None else default_tol(pf.dtype)
        B, L, D = pf.shape
        window = self._window(B, L, D)
        step, inputs = ((self.step_and_jacobian, (pf, pz)) if keep is None
                        else (self._step_and_jacobian_reset, (pf, pz, keep)))
        with torch.no_grad():
            res = newton_fixed_point(step, inputs, h0, scan=scan, tol=tol, max_iter=self.max_iter, window=window)
        self.last_iterations = res.iterations
        self.last_solve = dataclasses.replace(res, x=res.x[:0])
        log.debug("lrcssm deer: %d Newton sweep(s) at L=%d in %d window(s), at most %d per window, residual %.2e (tol %.0e)",
                  res.iterations, L, res.windows, res.max_window_iterations, res.residual, tol)
        if not res.converged:
            msg = (f"LrcSSM's Newton (deer) iteration did not converge in max_iter={self.max_iter} iterations "
                   f"on window {res.windows + 1} of L={L}: max|x^(k+1) − x^(k)| = {res.residual:.3e} > tol {tol:.0e}")
            if self.on_nonconvergence == "error":
                raise NewtonConvergenceError(
                    msg + "; raise max_iter (max_iter ≥ L always converges), use backend 'naive' (the "
                    "sequential loop), or set on_nonconvergence: fallback")
            log_once(log, logging.WARNING, "deer-nonconvergence", "%s; falling back to the exact sequential loop "
                     "(said once; later calls fall back silently)", msg)
            return self._solve_sequential(pf, pz, h0, keep)
        if torch.is_grad_enabled() and (pf.requires_grad or pz.requires_grad or h0.requires_grad):
            return newton_step(step, res.x, inputs, h0, scan=scan, window=window)
        return res.x, res.x[:, -1]

    # sequence ---------------------------------------------------------------------------
    def _out(self, states: Tensor) -> Tensor:
        return states if self.out_proj is None else self.out_proj(states)  # (..., H)

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        u = x.to(self.weight_mu.dtype)  # (B, L, H)
        h0 = self.init_state(u.shape[0], dtype=u.dtype, device=u.device)["x"] if state is None else state["x"]
        pf, pz = self.drive(u)  # (B, L, D) each
        states, last = self.run_path(pf, pz, h0.to(u.dtype))  # (B, L, D), (B, D)
        return self._out(states).to(x.dtype), {"x": last}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents (``zoo_core.packing``) in one solve of the chosen path over the whole batch:
        the state entering every document start is zero (and, for Newton, so is the Jacobian there);
        each final state is the document's last step."""
        segments.check(x)
        u = x.to(self.weight_mu.dtype)  # (B, L, H)
        pf, pz = self.drive(u)  # (B, L, D) each
        h0 = self.init_state(u.shape[0], dtype=u.dtype, device=u.device)["x"]
        states, _ = self.run_path(pf, pz, h0, segments.reset_mask(pf))  # (B, L, D)
        return self._out(states).to(x.dtype), ({"x": segments.at_ends(states)} if with_states else None)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        u = x_t.to(self.weight_mu.dtype)  # (B, H)
        x = self.cell(state["x"].to(u.dtype), *self.drive(u))  # (B, D)
        return self._out(x).to(x_t.dtype), {"x": x}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        return {"x": torch.zeros(batch_size, self.d_state, dtype=dtype or self.weight_mu.dtype,
                                 device=device or self.weight_mu.device)}

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, elastance={self.elastance}, dt={self.dt}, "
                f"tol={self.tol}, max_iter={self.max_iter}, on_nonconvergence={self.on_nonconvergence}, "
                f"backend={self.backend_choice.label()}")

