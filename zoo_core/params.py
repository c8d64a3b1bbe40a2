"""Params models: a core's constructor keyword arguments, validated strictly, and the groups they share.

A plugin's params model subclasses ``CoreParams`` (plus the mixins it needs); its fields must equal
the core constructor's keyword parameters (minus ``device``/``dtype``), which the conformance suite
checks. The params model is the torch-free half of a core's contract: the spec system validates a
spec's ``model.core`` with it, ``CoreBase`` validates direct constructor calls with it (same rules,
one message style), and its ``capabilities`` are what the registry and the core class both report.

Mixins carry a parameter group several families share, with its rule written once:

- ``DtRange``: ``dt_min``/``dt_max``, the initial range of the step Δ, with ``dt_min <= dt_max``;
- ``DtScale``: ``dt_scale``, a factor on every Δ (2.0 runs a half-rate signal);
- ``SsmLr``: ``ssm_lr``, the learning-rate hint of the SSM parameters (None: the global settings).

A family whose default or bound differs redeclares the field (``dt_min: float = Field(0.5, ...)``);
the rule (the validator) stays the mixin's.
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

BackendSetting = str | dict[str, str]


class CoreParams(BaseModel):
    """Fields every core takes: the width it mixes and the backend setting.

    ``capabilities`` (a class attribute, not a field) is the core's declaration of what it supports
    (``zoo_core.protocols.CAPABILITIES``), written once: ``register(...)`` reads it when no
    ``capabilities=`` is given, and a ``CoreBase`` core built with ``params=`` this model reports it.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    capabilities: ClassVar[frozenset[str]] = frozenset()

    d_model: int = Field(gt=0, le=65536, description="model width H (set by model.d_model in a spec)")
    backend: BackendSetting = Field(
        "auto",
        description="'auto', 'naive' (the reference), one backend name, or {op: name} with op in kernel/conv/scan/attention",
    )

    def grows_state(self) -> bool:
        """Whether this configuration's streaming state grows with length (declared ``growing_state``;
        a family whose state is constant in some configurations, e.g. attention with a window, narrows it)."""
        return "growing_state" in self.capabilities


class DtRange(BaseModel):
    """The initial range of the step Δ (log-uniform between the two in most families)."""

    dt_min: float = Field(1e-3, gt=0, le=10.0, description="smallest initial step Δ (log-uniform per channel)")
    dt_max: float = Field(1e-1, gt=0, le=10.0, description="largest initial step Δ")

    @model_validator(mode="after")
    def _dt_range(self) -> DtRange:
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min ({self.dt_min}) must not exceed dt_max ({self.dt_max}): the initial Δ range needs "
                             "0 < dt_min <= dt_max; e.g. dt_min: 0.001, dt_max: 0.1")
        return self


class DtScale(BaseModel):
    """A factor on every step Δ: the sampling rate of the input relative to training."""

    dt_scale: float = Field(1.0, gt=0, le=1e6, allow_inf_nan=False,
                            description="multiplies every Δ: 2.0 runs a half-rate signal")


class SsmLr(BaseModel):
    """The learning-rate hint of the parameters ``CoreBase.ssm_params`` names (no weight decay)."""

    ssm_lr: float | None = Field(1e-3, ge=0, le=1.0, allow_inf_nan=False,
                                 description="learning rate hint for the SSM parameters, no weight decay (None: the global one)")


def resolve_heads(d_inner: int, head_dim: int | None, n_heads: int | None, default_head_dim: int = 64) -> tuple[int, int]:
    """(heads, head_dim) of a multi-head SSD layout (Mamba-2, Mamba-3) from whichever of the two is
    given; neither: head_dim = gcd(d_inner, default_head_dim), so a width that 64 does not divide
    still splits evenly. The params model has checked that the given ones fit d_inner."""
    if head_dim is None:
        head_dim = d_inner // n_heads if n_heads is not None else math.gcd(d_inner, default_head_dim)
    return d_inner // head_dim, head_dim
