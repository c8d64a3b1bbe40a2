"""Mamba-3 (SISO)'s params model: the constructor's keyword arguments (torch-free).

Names and defaults follow mamba_ssm's released ``Mamba3`` (``d_state`` 128, ``headdim``, ``ngroups``,
``rope_fraction``, ``A_floor``, ``dt_min``/``dt_max``/``dt_init_floor``; ``outproj_norm`` is its
``is_outproj_norm``). Beyond it, ablation switches (``use_rope``, ``use_trapezoidal``, ``use_bc_norm``,
``use_bc_bias``: each part of the layer can be turned off), ``bias``, ``dt_scale`` and a Δ clamp as a pair
of fields, because a spec is YAML and this model is strict: ``dt_limit_min``/``dt_limit_max`` (``None``:
no upper limit).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from zoo_core.params import CoreParams, DtRange, DtScale, resolve_heads


class Mamba3Params(CoreParams, DtRange, DtScale):
    # Selective (input-dependent Δ, B, C, θ, λ): no "lti". Δ is a step size (exp(Δ·A), the trapezoid's
    # weights Δ·λ and Δ·(1 − λ)), so a sampling rate can rescale it: "continuous_time". Packed documents
    # run natively (forward_packed): "packing".
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "continuous_time", "packing"})

    d_state: int = Field(128, ge=1, le=1024, description="state size N per head")
    expand: int = Field(2, ge=1, le=64, description="inner width Di = expand · d_model")
    headdim: int | None = Field(None, ge=1, le=65536, description=(
        "head width P (None: from nheads, or gcd(expand · d_model, 64), the reference's 64 where it divides)"))
    nheads: int | None = Field(None, ge=1, le=65536,
                               description="number of heads H (None: expand · d_model / headdim); nheads · headdim = expand · d_model")
    ngroups: int = Field(1, ge=1, le=4096, description="groups sharing B and C (and the gated norm's groups); divides heads")
    rope_fraction: float = Field(0.5, description="the share of the state's pairs the rotary turns: 0.5 or 1.0 "
                                                  "(R = ⌊N·rope_fraction⌋ rounded down to even, / 2 angles)")
    A_floor: float = Field(1e-4, gt=0.0, le=1e4, allow_inf_nan=False,
                           description="A_t = −max(softplus(a_t), A_floor): every step decays at least this rate × Δ")
    dt_init_floor: float = Field(1e-4, ge=0.0, allow_inf_nan=False, description="lower clamp of the initial Δ")
    dt_limit_min: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="Δ is clamped to at least this (0: none)")
    dt_limit_max: float | None = Field(None, gt=0.0, allow_inf_nan=False,
                                       description="Δ is clamped to at most this (None: no upper limit)")
    bias: bool = Field(False, description="in_proj and out_proj have biases")
    use_rope: bool = Field(True, description="data-dependent rotary embedding of B and C (cumulative angle Σ π·tanh(θ)·Δ)")
    use_trapezoidal: bool = Field(True, description="trapezoidal discretisation (λ-weighted current and previous B·x); "
                                                    "false: Euler (Δ·B·x)")
    use_bc_norm: bool = Field(True, description="RMS norms on B and C (per group, before the biases)")
    use_bc_bias: bool = Field(True, description="per-head biases on B and C (init 1)")
    outproj_norm: bool = Field(False, description="an RMSNorm per head on y before the SiLU(z) gate (the release's "
                                                  "is_outproj_norm); false: y · SiLU(z)")
    chunk_size: int = Field(64, ge=1, le=65536, description="chunk length Q of the chunked backend (SSD-style)")

    @model_validator(mode="after")
    def _check(self) -> Mamba3Params:
        d_inner = self.expand * self.d_model
        if self.headdim is not None and self.nheads is not None and self.headdim * self.nheads != d_inner:
            raise ValueError(f"nheads · headdim = {self.nheads} · {self.headdim} = {self.nheads * self.headdim} must equal "
                             f"the inner width expand · d_model = {self.expand} · {self.d_model} = {d_inner}; give one "
                             "of them (the other is derived) or make the product match")
        for name, given in (("headdim", self.headdim), ("nheads", self.nheads)):
            if given is not None and d_inner % given:
                raise ValueError(f"{name} {given} must divide the inner width expand · d_model = {self.expand} · "
                                 f"{self.d_model} = {d_inner} (nheads · headdim = inner width); choose {name} among "
                                 f"{_divisors(d_inner)}")
        heads = self.heads
        if heads % self.ngroups:
            raise ValueError(f"ngroups {self.ngroups} must divide the number of heads {heads} (each group's B and C "
                             f"serve whole heads); choose ngroups among {_divisors(heads)}")
        if self.rope_fraction not in (0.5, 1.0):
            raise ValueError(f"rope_fraction {self.rope_fraction} must be 0.5 or 1.0 (the share of the state's pairs "
                             "the rotary turns, as the release allows)")
        if self.use_rope and int(self.d_state * self.rope_fraction) < 2:
            raise ValueError(f"d_state {self.d_state} × rope_fraction {self.rope_fraction} leaves no pair of states to "
                             "rotate; use d_state ≥ 2 / rope_fraction or set use_rope: false")
        if self.dt_limit_max is not None and self.dt_limit_min > self.dt_limit_max:
            raise ValueError(f"dt_limit_min ({self.dt_limit_min}) must not exceed dt_limit_max ({self.dt_limit_max})")
        return self

    @property
    def heads(self) -> int:
        """The number of heads H."""
        return resolve_heads(self.expand * self.d_model, self.headdim, self.nheads)[0]


def _divisors(n: int) -> list[int]:
    """The divisors of n (the valid choices an error message offers)."""
    return [k for k in range(1, n + 1) if n % k == 0][:24]
