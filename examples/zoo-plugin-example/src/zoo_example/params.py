"""The EMA core's params model: its constructor's keyword arguments and its capabilities (torch-free)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from zoo_core.params import CoreParams


class EMAParams(CoreParams):
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "lti"})

    init_decay: float = Field(0.9, gt=0.0, lt=1.0, description="initial decay a of every channel")
