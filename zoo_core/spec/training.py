"""The spec's optional ``training:`` section: how ``zoo train`` fits the model (stage 1, strict).

Owned by the training harness (``zoo_core.train``); the model builder ignores it. The defaults
follow the protocol of "Reshape and Recur" (the LinOSS / Log-NCDE code it builds on): merge the
official splits, drop duplicates, a random 70/15/15 split per seed, Adam with a constant learning
rate and no weight decay or clipping, the learning rate picked on validation, the test score taken
at the best validation point.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

PAPER_SEEDS = (2345, 3456, 4567, 5678, 6789)
PAPER_LR_GRID = (1e-3, 1e-4, 1e-5)


class TrainingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    dataset: str | None = Field(None, description="a registered dataset (zoo list --kind datasets)")
    protocol: Literal["seed-split", "official"] = Field(
        "seed-split",
        description="seed-split: merge the official splits, drop exact duplicates, random 70/15/15 per seed; "
        "official: the official test split, validation carved from the official train split",
    )
    loss: Literal["final", "blockwise"] = Field(
        "final", description="final: the head on the last period; blockwise: the mean loss of the shared head after each period"
    )
    lr: float | list[float] = Field(1e-3, description="a learning rate, or a grid: one run per value, picked on validation")
    optimizer: Literal["adam", "adamw"] = "adam"
    weight_decay: float = Field(0.0, ge=0, le=10)
    use_optim_hints: bool = Field(
        False, description="apply the cores' per-parameter hints (optim_hints: e.g. ssm_lr, no weight decay on SSM "
        "parameters); off = one learning rate for every parameter, as the seed's code")
    grad_clip: float | None = Field(None, gt=0, description="clip the global gradient norm to this value")
    epochs: int = Field(100, gt=0, le=100_000, description="the most epochs per run")
    batch_size: int = Field(32, gt=0, le=1_000_000, description="the global batch (split across ranks under torchrun)")
    eval_batch_size: int | None = Field(None, gt=0, le=1_000_000, description="default: batch_size")
    drop_last: bool = Field(True, description="drop each epoch's last partial batch (as the seed's code does)")
    seed: int = Field(0, ge=0, description="the seed of a single run (ignored when seeds is set)")
    seeds: list[int] | None = Field(None, description=f"one run per seed; the paper's: {list(PAPER_SEEDS)}")
    early_stop: int | None = Field(None, gt=0, description="stop after this many epochs without a better validation score")
    stop_at: float | None = Field(
        None, description="also stop once the validation metric reaches this value (e.g. 1.0 accuracy: a solved "
        "synthetic task has nothing left to select on); off by default")
    metric: Literal["auto", "accuracy", "loss"] = Field(
        "auto", description="what validation selects on: auto = accuracy for classification, loss otherwise"
    )
    normalize: Literal["none", "zscore"] = Field(
        "none", description="none (the seed's code normalises nothing) or per-channel z-score with training-split statistics"
    )
    val_fraction: float = Field(0.15 / 0.85, gt=0, lt=1, description="protocol official: the share of the train split held out")
    deterministic: bool = Field(True, description="torch.use_deterministic_algorithms (warn-only where an op has none)")
    save_every: int = Field(1, gt=0, description="write a resumable checkpoint every this many epochs")
    precision: Literal["32", "bf16-mixed", "16-mixed"] = Field(
        "32", description="Lightning's names: 32 = float32; bf16-mixed = bfloat16 autocast (float32 parameters, the "
        "cores' recurrences in float32); 16-mixed = float16 autocast with a gradient scaler")
    pack: bool = Field(False, description="pack each training batch's unequal-length sequences several to a row "
                       "(seq_idx; every sequence still starts from the zero state) instead of padding each to the longest")

    @field_validator("lr")
    @classmethod
    def _lr(cls, v: float | list[float]) -> float | list[float]:
        values = v if isinstance(v, list) else [v]
        if not values:
            raise ValueError("the learning-rate grid is empty; give at least one value")
        bad = [x for x in values if not 0 < x <= 10]
        if bad:
            raise ValueError(f"learning rates must lie in (0, 10], got {bad[0]}")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v:
                raise ValueError("seeds is empty; give at least one seed or leave it out")
            if len(set(v)) != len(v) or min(v) < 0:
                raise ValueError("seeds must be distinct non-negative integers")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``pack``, ``stop_at`` and ``precision`` are written only when set: a run, a fingerprint or a saved model's spec
        from before the options existed reads exactly as it did (``--resume`` keeps working, pinned configs
        stay equal)."""
        out: dict[str, Any] = handler(self)
        if not self.pack:
            out.pop("pack", None)
        if self.stop_at is None:
            out.pop("stop_at", None)
        if self.precision == "32":
            out.pop("precision", None)
        return out

    def lr_grid(self) -> list[float]:
        return list(self.lr) if isinstance(self.lr, list) else [self.lr]

    def seed_list(self) -> list[int]:
        return list(self.seeds) if self.seeds is not None else [self.seed]
