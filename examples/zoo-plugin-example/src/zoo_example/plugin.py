"""Registration only; the model code in ``core`` is imported when a model is built."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterCore, hookimpl

from .params import EMAParams

zoo_api = 1


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register(
        "ema",
        "zoo_example.core:EMA",
        params=EMAParams,
        presets={"tiny": {"init_decay": 0.8}, "slow": {"init_decay": 0.99}},
        card="A learnable exponential moving average per channel (an N = 1 real diagonal SSM).",
    )
