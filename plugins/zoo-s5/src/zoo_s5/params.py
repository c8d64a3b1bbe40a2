"""S5's params models: the constructor's keyword arguments and the capabilities (torch-free).

Two models because capabilities belong to a core: ``s5`` is causal and streams; ``s5-bidirectional``
adds a reverse-time scan, so it is neither causal nor streamable. Their fields are the same.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from zoo_core.params import CoreParams, DtRange, DtScale, SsmLr


class S5Params(CoreParams, DtRange, DtScale, SsmLr):
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "lti", "complex_params", "continuous_time",
                                                             "packing"})

    d_state: int = Field(64, ge=2, le=8192, description="state size N (P in the S5 code; even: N/2 conjugate pairs are stored)")
    blocks: int = Field(8, ge=1, le=4096, description="J: the initial A is J copies of HiPPO-N of size N/J (N/J even)")
    c_init: Literal["trunc_standard_normal", "lecun_normal", "complex_normal"] = Field(
        "trunc_standard_normal", description="C̃ init: S5 repo default, LinOSS codebase's choice, or C̃ complex normal without V")
    discretizer: str = Field("zoh", description="a registered diagonal discretizer: zoh, bilinear, euler")
    clip_eigs: bool = Field(False, description="use min(Re Λ, −1e-4): keeps every eigenvalue in the open left half plane")

    @model_validator(mode="after")
    def _check(self) -> S5Params:
        n, j = self.d_state, self.blocks
        if n % 2:
            raise ValueError(f"d_state must be even: S5 stores d_state/2 conjugate pairs (conjugate symmetry), "
                             f"got d_state={n}; use {n + 1} or {n - 1}")
        if n % j:
            raise ValueError(f"blocks must divide d_state: the state is split into J={j} HiPPO-N blocks of "
                             f"equal size, got d_state={n}, blocks={j}")
        if (n // j) % 2:
            raise ValueError(f"each block (size d_state/blocks = {n}/{j} = {n // j}) must be even: conjugate pairs "
                             "are formed inside each HiPPO-N block; use fewer blocks")
        return self


class S5BidirectionalParams(S5Params):
    capabilities: ClassVar[frozenset[str]] = frozenset({"lti", "complex_params", "continuous_time", "packing"})
