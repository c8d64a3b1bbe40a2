"""Base class for a core's params model: the constructor's keyword arguments, validated strictly.

A plugin's params model subclasses ``CoreParams``; its fields must equal the core constructor's
keyword parameters (minus ``device``/``dtype``), which the conformance suite checks.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

BackendSetting = str | dict[str, str]


class CoreParams(BaseModel):
    """Fields every core takes: the width it mixes and the backend setting."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    d_model: int = Field(gt=0, le=65536, description="model width H (set by model.d_model in a spec)")
    backend: BackendSetting = Field(
        "auto",
        description="'auto', 'naive' (the reference), one backend name, or {op: name} with op in kernel/conv/scan",
    )
