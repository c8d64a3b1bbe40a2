"""The spec's optional ``training:`` section: how ``zoo train`` fits the model (stage 1, strict).

Owned by the training harness (``zoo_core.train``); the model builder ignores it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TrainingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    dataset: str | None = Field(None, description="a registered dataset (zoo list datasets)")
    loss: Literal["final", "blockwise"] = Field(
        "final", description="final: the head on the last period; blockwise: the mean loss of the shared head after each period"
    )
    lr: float = Field(1e-3, gt=0, le=10)
    epochs: int = Field(100, gt=0, le=100_000)
    batch_size: int = Field(32, gt=0, le=1_000_000)
    seed: int = Field(0, ge=0)
    early_stop: int | None = Field(None, gt=0, description="stop after this many epochs without a better validation score")
