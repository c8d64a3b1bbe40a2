"""Registration only; the model code in ``core`` is imported when a model is built."""

from pydantic import Field

from zoo_core import hookimpl
from zoo_core.params import CoreParams

zoo_api = 1


class EMAParams(CoreParams):
    init_decay: float = Field(0.9, gt=0.0, lt=1.0, description="initial decay a of every channel")


@hookimpl
def zoo_register_cores(register):
    register(
        "ema",
        "zoo_example.core:EMA",
        params=EMAParams,
        presets={"tiny": {"init_decay": 0.8}, "slow": {"init_decay": 0.99}},
        capabilities={"step", "initial_state", "lti"},
        card="A learnable exponential moving average per channel (an N = 1 real diagonal SSM).",
    )
