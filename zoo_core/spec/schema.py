"""The spec envelope (stage 1). Core params are validated in stage 2 by the core's own model.

Everything is ``extra="forbid"`` and strict (no '64' → 64, no true → 1), with bounds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from ..errors import did_you_mean
from .training import TrainingSpec

SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TaskSpec(_Strict):
    """What the model predicts."""

    kind: Literal["classification", "regression", "sequence", "lm"]
    classes: int | None = Field(None, gt=1, le=10**6, description="number of classes (classification)")
    outputs: int | None = Field(None, gt=0, le=10**6, description="output width (regression, sequence)")
    # lm only: the special tokens of the model's tokenizer (carried over by zoo convert; generate stops at eos)
    bos_token_id: int | None = Field(None, ge=0, le=10**7, description="lm: the token that begins a sequence")
    eos_token_id: int | None = Field(None, ge=0, le=10**7, description="lm: the token that ends one; generate stops at it by default")
    pad_token_id: int | None = Field(None, ge=0, le=10**7, description="lm: the padding token")

    @model_validator(mode="after")
    def _needs(self) -> TaskSpec:
        need = {"classification": "classes", "regression": "outputs", "sequence": "outputs"}.get(self.kind)
        if need and getattr(self, need) is None:
            raise ValueError(f"task kind {self.kind!r} needs task.{need}")
        extra = [f for f in ("classes", "outputs") if f != need and getattr(self, f) is not None]
        extra += [f for f in TOKEN_FIELDS if self.kind != "lm" and getattr(self, f) is not None]
        if extra:
            raise ValueError(f"task kind {self.kind!r} does not take task.{extra[0]}")
        return self


TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


class ReshapeSpec(_Strict):
    """Input reshaping (seed 001 §3): flatten time × features and cut into c-wide model steps.

    c > d concatenates c/d consecutive steps (d must divide c); c < d re-chunks each step over
    several model steps (zero-padded at the end). d counts the time channel when it is on.
    """

    c: int = Field(gt=0, le=10**6, description="concentration factor: features per model step")


class InputSpec(_Strict):
    """What the model reads: real features (``channels``) or tokens (``vocab_size``)."""

    channels: int | None = Field(None, gt=0, le=10**6)
    reshape: ReshapeSpec | None = Field(None, description="input reshaping with concentration factor c (real features, pooled tasks)")
    vocab_size: int | None = Field(None, gt=1, le=10**7)
    include_time: bool = Field(False, description="prepend the time channel t_i = i / length as feature 0")
    length: int | None = Field(None, gt=0, le=10**8, description="nominal sequence length (the time channel's scale)")

    @model_validator(mode="after")
    def _one(self) -> InputSpec:
        if (self.channels is None) == (self.vocab_size is None):
            raise ValueError("set exactly one of input.channels (real features) or input.vocab_size (tokens)")
        if self.include_time and (self.length is None or self.channels is None):
            raise ValueError("input.include_time needs real features (input.channels) and input.length, "
                             "the sequence length that scales t_i = i / length (fixed so streaming agrees)")
        return self


class AdaptiveSpec(_Strict):
    """Adaptive depth at inference (``SequenceModel.adaptive``); see zoo_core.nn.adaptive."""

    epsilon: float = Field(0.01, gt=0, description="stop when the relative change of successive predictions is below this")
    max_depth: int | None = Field(None, gt=0, le=4096, description="most block applications (default: the depth; may exceed it)")
    min_depth: int = Field(1, gt=0, le=4096, description="fewest block applications before a sample may stop")
    stop_at: Literal["block", "period"] = Field("period", description="check after every block, or after complete periods only")
    prediction: Literal["probabilities", "logits"] = Field(
        "probabilities", description="classification: compare softmax probabilities (default) or logits")


class StackingSpec(_Strict):
    """Depth as data: the schedule (policy, period) and how reused blocks behave."""

    policy: str = Field("independent", description="a registered stacking policy (zoo list stacking)")
    period: int | None = Field(None, gt=0, le=4096, description="blocks per period (policy 'periodic')")
    norms: Literal["shared", "per_position"] = Field(
        "shared", description="a reused block's norms: shared across its positions (default, as the seed's code) "
        "or one set per depth position")
    damping: float | Literal["learned"] = Field(
        1.0, description="Krasnosel'skii–Mann h ← (1−α)h + α·f(h): α in (0, 1] (1 = plain), or 'learned' (sigmoid, per unique block)")
    damping_init: float | None = Field(None, gt=0, lt=1, description="initial α when damping is 'learned' (default 0.9)")
    adaptive: AdaptiveSpec | None = Field(None, description="defaults for adaptive depth at inference")

    @field_validator("damping")
    @classmethod
    def _alpha(cls, v: float | str) -> float | str:
        if isinstance(v, float) and not 0 < v <= 1:
            raise ValueError(f"damping α must lie in (0, 1] (1 = the plain update) or be 'learned', got {v}")
        return v


class EncoderSpec(_Strict):
    """The input map to d_model: ``linear``, or ``mlp`` = Linear → ReLU → Linear (the LrcSSM backbone's)."""

    kind: Literal["linear", "mlp"] = "linear"
    hidden: int | None = Field(None, gt=0, le=65536, description="mlp width (default d_model)")


class HeadSpec(_Strict):
    """The output map from d_model: ``linear``, or ``mlp`` = Linear → ReLU → Linear (the LrcSSM backbone's)."""

    kind: Literal["linear", "mlp"] = "linear"
    hidden: int | None = Field(None, gt=0, le=65536, description="mlp width (default d_model)")


BLOCK_PRESETS: dict[str, dict[str, Any]] = {
    # The Log-NCDE/LinOSS backbone block that "Reshape and Recur" builds on (models.md §12.1):
    # norm → SSM → GELU (tanh) → dropout → GLU → dropout → residual, with PyTorch's affine
    # BatchNorm — the paper's Table 3 parameter counts need the norm's 2·H affine parameters.
    "uea": {"norm": "batch", "norm_affine": True, "prenorm": True, "activation": "gelu_tanh",
            "output": "glu", "dropout": 0.1, "residual": True},
    # The same block with Equinox's EMA batch norm and no affine parameters, as the JAX code runs.
    "uea-ema": {"norm": "ema_batch", "norm_affine": False, "prenorm": True, "activation": "gelu_tanh",
                "output": "glu", "dropout": 0.1, "residual": True},
    # The LrcSSM backbone's block (models.md §12.3): u = LN(x); s = core(u); v = LN(s + u);
    # y = v + MLP(v), LayerNorms without weight or bias (eps 1e-5), MLP Linear → ReLU → Linear.
    "lrcssm": {"layout": "lrcssm", "norm": "layer", "norm_affine": False, "activation": "relu", "dropout": 0.0},
}
_RESIDUAL_ONLY = ("prenorm", "output", "residual")


class BidirectionalSpec(_Strict):
    """``block.bidirectional``: run every block's causal core forward and on the time-reversed
    sequence, and combine (``zoo_core.nn.bidirectional``). The model is then not causal."""

    combine: Literal["sum", "concat", "gate"] = Field(
        "concat", description="sum: y_fwd + y_bwd; concat: a linear map of [y_fwd; y_bwd]; gate: g ⊙ y_fwd + (1 − g) ⊙ y_bwd, "
        "g = σ(linear [y_fwd; y_bwd])")
    shared: bool = Field(False, description="one core run both ways (true) or a second core of the same kind and settings (false)")


class BlockSpec(_Strict):
    """The residual block around each core; ``preset`` fills defaults, explicit keys win."""

    preset: Literal["uea", "uea-ema", "lrcssm"] | None = Field(None, description="a named block recipe (see BLOCK_PRESETS)")
    layout: Literal["residual", "lrcssm"] = Field(
        "residual", description="residual: norm → core → act → out → residual; lrcssm: LN → core → LN(s + u) → + MLP")
    norm: Literal["layer", "rms", "batch", "ema_batch", "none"] = "layer"
    norm_affine: bool = True
    norm_eps: float = Field(1e-5, gt=0, lt=1, description="the norms' epsilon (block norms and the final norm)")
    prenorm: bool = True
    activation: Literal["gelu", "gelu_tanh", "silu", "relu", "identity"] = "gelu"
    output: Literal["glu", "linear", "none"] = "glu"
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    residual: bool = True
    bidirectional: BidirectionalSpec | None = Field(
        None, description="run each core in both directions (non-causal: classification, tagging); see BidirectionalSpec")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("preset"), str) and data["preset"] in BLOCK_PRESETS:
            return {**BLOCK_PRESETS[data["preset"]], **data}
        return data

    @model_validator(mode="after")
    def _layout_keys(self) -> BlockSpec:
        if self.layout == "lrcssm":
            bad = [k for k in _RESIDUAL_ONLY
                   if k in self.model_fields_set and getattr(self, k) != type(self).model_fields[k].default]
            if bad:
                raise ValueError(f"block.{bad[0]} does not apply to layout 'lrcssm' (its order is fixed); remove it")
        return self

    def recipe(self) -> dict[str, Any]:
        """The keyword arguments of the layout's block class (``zoo_core.nn.blocks.make_block``)."""
        exclude = {"preset", "layout", "bidirectional"} | (set(_RESIDUAL_ONLY) | {"output"} if self.layout == "lrcssm" else set())
        return self.model_dump(exclude=exclude)


class CoreSpec(BaseModel):
    """``kind`` names a registered core; ``preset`` one of its presets; the rest are its params."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    kind: str
    preset: str | None = None


DEFAULT_CORE = "core"
"""The name the default core (``model.core``) goes by in ``model.pattern`` and in messages."""

CoreName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")]
Position = Annotated[int, Field(gt=0, le=4096)]


class ModelBody(_Strict):
    d_model: int = Field(gt=0, le=65536)
    depth: int = Field(gt=0, le=4096)
    stacking: StackingSpec = StackingSpec()
    block: BlockSpec = BlockSpec()
    core: CoreSpec
    # hybrid stacks: more cores beside the default, placed per depth position by pattern or positions
    cores: dict[CoreName, CoreSpec] | None = Field(
        None, max_length=64, description="hybrid stacks: named cores beside the default model.core, placed by "
        "model.pattern or model.positions (the default core is called 'core' there)")
    pattern: list[CoreName] | None = Field(
        None, min_length=1, max_length=4096, description="hybrid stacks: core names repeated over the depth, e.g. "
        "[core, core, attn] (its length must divide model.depth)")
    positions: dict[CoreName, Annotated[list[Position], Field(max_length=4096)]] | None = Field(
        None, max_length=64, description="hybrid stacks: named core -> the depth positions (counted from 1) it runs "
        "at; the default core runs everywhere else")
    encoder: EncoderSpec = EncoderSpec()
    head: HeadSpec = HeadSpec()
    pool: Literal["mean", "last", "mean_logits", "none"] | None = Field(
        None, description="default: mean for classification/regression, none for sequence/lm; "
                          "mean_logits: the head on every step, then the mean of its outputs"
    )
    final_norm: Literal["layer", "rms", "batch", "none"] = "none"
    tie_embeddings: bool = Field(False, description="lm only: the head reuses the embedding matrix")


class PlacementError(ValueError):
    """A hybrid placement that does not fit (``place_cores``): ``loc`` is the key path to point at."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _names_list(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(names)


def _unknown(name: str, known: list[str], what: str) -> str:
    hint = did_you_mean(name, known)  # ' did you mean 'attn'?' or ''
    return f"unknown core name {name!r};{hint or ''} {what}: {_names_list(known) or 'none'}"


def place_cores(body: ModelBody) -> tuple[str, ...]:
    """The core name at each depth position (position 1 first): ``core`` everywhere for a plain
    spec; for a hybrid one, ``model.pattern`` repeated over the depth or ``model.positions`` over
    the default. Why a separate pass: the messages point at the exact key (``PlacementError.loc``),
    which a pydantic validator on the whole body cannot."""
    named = dict(body.cores or {})
    if DEFAULT_CORE in named:
        raise PlacementError(("model", "cores", DEFAULT_CORE), f"{DEFAULT_CORE!r} is the name of the default core "
                             "(model.core) in model.pattern; give this core another name")
    if body.pattern is not None and body.positions is not None:
        raise PlacementError(("model", "positions"), "set one of model.pattern (core names repeated over the depth) or "
                             "model.positions (named core -> depth positions), not both")
    if named and body.pattern is None and body.positions is None:
        raise PlacementError(("model", "cores"), "model.cores names cores that no depth position runs: place them "
                             "with model.pattern (e.g. [core, core, attn]) or model.positions (e.g. {attn: [3, 7]})")
    if body.pattern is not None:
        layout = _from_pattern(body.pattern, sorted([DEFAULT_CORE, *named]), body.depth)
    elif body.positions is not None:
        layout = _from_positions(body.positions, sorted(named), body.depth)
    else:
        return (DEFAULT_CORE,) * body.depth
    for name in named:
        if name not in layout:
            where = "model.pattern" if body.pattern is not None else "model.positions"
            raise PlacementError(("model", "cores", name), f"core {name!r} runs at no depth position: name it in "
                                 f"{where} or remove it")
    if DEFAULT_CORE not in layout:
        raise PlacementError(("model", "core"), f"the default core (model.core, kind {body.core.kind!r}) runs at no "
                             f"depth position: name {DEFAULT_CORE!r} in the placement, or move one of the named cores "
                             "to model.core")
    return layout


def _from_pattern(pattern: list[str], known: list[str], depth: int) -> tuple[str, ...]:
    for i, name in enumerate(pattern):
        if name not in known:
            raise PlacementError(("model", "pattern", i), _unknown(name, known, "known names (model.core is "
                                 f"{DEFAULT_CORE!r}, model.cores the others)"))
    n = len(pattern)
    if depth % n:
        fits = [k * n for k in range(max(1, depth // n), depth // n + 2) if k * n != depth]
        raise PlacementError(("model", "pattern"), f"the pattern [{_names_list(pattern)}] has {n} entries, which does "
                             f"not fit depth {depth}: it repeats over the depth, so the depth must be a multiple of "
                             f"{n} (e.g. {' or '.join(map(str, fits))}), or use a pattern whose length divides {depth}")
    return tuple(pattern) * (depth // n)


def _from_positions(positions: dict[str, list[int]], known: list[str], depth: int) -> tuple[str, ...]:
    layout = [DEFAULT_CORE] * depth
    for name, where in positions.items():
        if name == DEFAULT_CORE:
            raise PlacementError(("model", "positions", name), f"the default core runs at every position not listed; "
                                 f"list only named cores (model.cores: {_names_list(known) or 'none'}) here")
        if name not in known:
            raise PlacementError(("model", "positions", name), _unknown(name, known, "model.cores names"))
        if not where:
            raise PlacementError(("model", "positions", name), f"core {name!r} has no positions: list at least one "
                                 f"(1 to {depth}) or remove it")
        for j, pos in enumerate(where):
            if pos > depth:
                raise PlacementError(("model", "positions", name, j), f"position {pos} is past depth {depth}: "
                                     f"positions count from 1 to {depth}")
            if layout[pos - 1] != DEFAULT_CORE:
                other = layout[pos - 1]
                why = (f"is listed twice for {name!r}; list each position once" if other == name else
                       f"is given to both {other!r} and {name!r}; a position runs one core")
                raise PlacementError(("model", "positions", name, j), f"position {pos} {why}")
            layout[pos - 1] = name
    return tuple(layout)


class ModelSpec(_Strict):
    schema_version: Literal[1]
    name: str | None = Field(None, max_length=200)
    description: str | None = Field(None, max_length=10_000)
    task: TaskSpec
    input: InputSpec
    model: ModelBody
    training: TrainingSpec | None = Field(None, description="how zoo train fits the model (ignored by build)")

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.task.kind == "lm" and self.input.vocab_size is None:
            raise ValueError("task kind 'lm' reads tokens: set input.vocab_size")
        for f in TOKEN_FIELDS:
            token = getattr(self.task, f)
            if token is not None and self.input.vocab_size is not None and token >= self.input.vocab_size:
                raise ValueError(f"task.{f} {token} is outside the vocabulary (input.vocab_size {self.input.vocab_size})")
        if self.model.tie_embeddings and self.task.kind != "lm":
            raise ValueError("model.tie_embeddings applies to task kind 'lm' only")
        if self.task.kind == "lm" and self.model.block.bidirectional is not None:
            raise ValueError("task kind 'lm' predicts the next token, and model.block.bidirectional reads the sequence "
                             "backwards too (each step would see the token it must predict); drop it, or use task kind "
                             "sequence or classification")
        pooled = self.task.kind in ("classification", "regression")
        if self.model.pool == "none" and pooled:
            raise ValueError(f"task kind {self.task.kind!r} needs a pool (mean, last or mean_logits)")
        if self.model.pool not in (None, "none") and not pooled:
            raise ValueError(f"task kind {self.task.kind!r} predicts every step: model.pool must be none")
        return self

    @property
    def pool(self) -> str:
        if self.model.pool is not None:
            return self.model.pool
        return "mean" if self.task.kind in ("classification", "regression") else "none"


def envelope_schema() -> dict[str, Any]:
    return ModelSpec.model_json_schema()
