"""SequenceModel: input → encoder → stack → final norm → pool → head, in parallel and streamed.

Letters: B batch, T raw steps, D raw input channels, L model steps (L = T without reshaping),
H model width, V vocabulary, O outputs.

Tasks: ``classification`` / ``regression`` pool over time then map to (B, O); ``sequence``
maps every step to (B, L, O); ``lm`` embeds tokens and returns (B, L, V) logits.

The data path, one module per piece: the optional time channel and ``zoo_core.nn.reshape`` (raw steps
→ model steps), the encoder (``embed``), ``zoo_core.nn.stack`` (blocks over depth, ``zoo_core.nn.blocks``),
then ``readout``: the final norm and the pool chosen at build time (``zoo_core.nn.pools``: ``mean``,
``last``, ``mean_logits``, ``none``), whose head gives the output. ``lengths`` (B,) counts each
sample's valid raw steps; steps past it (batch padding) never reach the pool. Adaptive depth lives
in ``zoo_core.nn.adaptive``.

``step`` streams one raw time step with a constant-size ``ModelState`` (``zoo_core.nn.model_state``:
per-depth core states, the pool's running state, the reshaper's buffer) and returns what
``forward`` would return for the prefix seen so far (for pooled tasks: the head on the running
pool). With input reshaping, raw steps are buffered (concat) or split (rechunk); when the prefix
ends inside a model step, that step is evaluated zero-padded from the current state without being
committed, exactly as the parallel path pads the end — so every prefix gives the parallel prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..errors import UsageError
from ..packing import Segments
from .adaptive import AdaptiveConfig, AdaptiveResult, run_adaptive, stop_depths
from .adaptive import prediction as read_prediction
from .lean import KEPT, lean_applies, lean_plan, program_step
from .model_state import AdaptiveStream, ModelState
from .pools import Pool, PoolState, RunningPool
from .reshape import InputReshaper, ReshapeState
from .stack import Stack

if TYPE_CHECKING:  # annotations only, as in .blocks
    from ..corebase import CoreBase


def _check_lengths(lengths: Tensor | None, batch: int, steps: int) -> Tensor | None:
    if lengths is None:
        return None
    if lengths.shape != (batch,) or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be an integer tensor of shape ({batch},), got {tuple(lengths.shape)} {lengths.dtype}")
    if bool((lengths < 1).any()) or bool((lengths > steps).any()):
        raise ValueError(f"lengths must lie in [1, {steps}] (the number of input steps), got {lengths.tolist()}")
    return lengths.long()


class SequenceModel(nn.Module):
    """The assembled model (``zoo_core.build.build_model`` makes it from a spec): the parallel
    path (``forward``, ``period_outputs``, ``adaptive``) and the streaming path (``step``,
    ``forward_with_state``, ``adaptive_step``) over the same parts, chosen at build time."""

    def __init__(
        self,
        *,
        encoder: nn.Module,
        stack: Stack,
        head: nn.Module,
        task: str,
        pool: Pool,
        d_model: int,
        final_norm: nn.Module | None = None,
        time_length: int | None = None,
        reshaper: InputReshaper | None = None,
        adaptive: AdaptiveConfig | None = None,
        spec: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if reshaper is not None and pool.per_step:
            raise ValueError("input reshaping changes the number of steps; it needs a pooled task (pool mean, last or mean_logits)")
        self.encoder = encoder
        self.stack = stack
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.head = head
        self.task = task
        self.pool = pool
        self.d_model = d_model
        self.time_length = time_length
        self.reshaper = reshaper
        self.adaptive_config = adaptive or AdaptiveConfig()
        self.spec: dict[str, Any] = spec or {}
        # cores that do not declare "causal" (a bidirectional scan or block): they must not see end padding, so a
        # padded batch reaches them as documents (zoo_core.packing), each run on its valid steps alone
        self._non_causal = sorted({type(c).__name__ for c in self.cores() if "causal" not in getattr(c, "capabilities", ())})

    # the data path ---------------------------------------------------------------------
    def _with_time(self, x: Tensor, start: Tensor | int = 0, positions: Tensor | None = None) -> Tensor:
        """Raw input with the time channel t_i = i / length prepended when configured (B, T, 1 + D);
        ``positions`` (B, T): each step's index in its own document (a packed batch)."""
        if self.time_length is None:
            return x
        if positions is not None:
            steps = positions.to(x.dtype)
        else:
            offset = torch.as_tensor(start, device=x.device)[..., None].to(x.dtype)
            steps = torch.arange(x.shape[1], device=x.device, dtype=x.dtype) + offset
        t = (steps / self.time_length).expand(x.shape[0], -1)[..., None]  # (B, T, 1)
        return torch.cat([t, x], dim=-1)

    def embed(self, x: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Raw input (B, T, D) or tokens (B, T) → encoder output (B, L, H) and model-step lengths."""
        lengths = _check_lengths(lengths, x.shape[0], x.shape[1])
        x = self._with_time(x)
        if self.reshaper is not None:
            x, lengths = self.reshaper(x, lengths)  # (B, L, c)
        return self.encoder(x), lengths

    def readout(self, h: Tensor, lengths: Tensor | None = None) -> Tensor:
        """Stack output (B, L, H) → final norm → pool and head: what ``forward`` returns."""
        return self.pool.read(self.final_norm(h), lengths, self.head)

    def padding_layout(self, lengths: Tensor | None, steps: int) -> Segments | None:
        """A right-padded batch as one document per row, when a non-causal part must not see the
        padding (None otherwise: causal cores need nothing, the pool masks the padding)."""
        if not self._non_causal or lengths is None or not bool((lengths < steps).any()):
            return None
        return Segments.from_lengths(lengths, steps)

    def embed_packed(self, x: Tensor, seq_idx: Tensor) -> tuple[Tensor, Segments]:
        """A packed batch (``zoo_core.packing``: several documents per row, ``seq_idx`` (B, T) each step's
        document within its row, -1 on trailing padding) → encoder output (B, T, H) and its layout.
        The time channel counts steps within each document."""
        if self.reshaper is not None:
            raise UsageError("a packed batch (seq_idx) cannot be reshaped: input.reshape groups raw steps across "
                             "document boundaries; pack without input.reshape, or pass padded batches with lengths")
        seg = Segments.from_seq_idx(seq_idx.to(x.device))
        seg.check(x)
        if not bool(seg.valid.all()):  # packed padding holds zeros, whatever it held (even NaN)
            x = x.clone()
            x[seg.doc_id < 0] = 0
        return self.encoder(self._with_time(x, positions=seg.position)), seg

    def readout_packed(self, h: Tensor, seg: Segments) -> Tensor:
        """Stack output of a packed batch → (N, O) per document (pooled tasks, documents row-major)
        or (B, T, O) per step."""
        if self.pool.per_step:
            return self.readout(h)
        return self.readout(seg.unpack(h), seg.doc_len)

    # parallel --------------------------------------------------------------------------
    def features(self, x: Tensor, lengths: Tensor | None = None, *, seq_idx: Tensor | None = None) -> Tensor:
        """Per-step features (B, L, H) after the stack and final norm (L: model steps)."""
        z, _, seg = self._embed_any(x, lengths, seq_idx)
        return self.final_norm(self.stack(z, seg))

    def forward(self, x: Tensor, lengths: Tensor | None = None, *, seq_idx: Tensor | None = None) -> Tensor:
        """x (B, T, D) features or (B, T) tokens; ``lengths`` (B,) valid steps per sample (None: all).

        ``seq_idx`` (B, T) packs several documents per row (``zoo_core.packing``; instead of lengths):
        every document runs from the zero state as if alone; pooled tasks then return (N, O), one row
        per document in row-major order, per-step tasks (B, T, O)."""
        z, n, seg = self._embed_any(x, lengths, seq_idx)
        if seq_idx is not None:
            assert seg is not None
            return self.readout_packed(self.stack(z, seg), seg)
        return self.readout(self.stack(z, seg), n)

    def period_outputs(self, x: Tensor, lengths: Tensor | None = None, *, seq_idx: Tensor | None = None) -> list[Tensor]:
        """The shared head after each complete period j = 1..depth/m (one element for ABCDEF),
        each shaped like ``forward``'s output; the last equals ``forward(x, lengths)``. The
        blockwise loss is the mean of the loss over these."""
        z, n, seg = self._embed_any(x, lengths, seq_idx)
        m = self.stack.period
        hs = [h for k, h in self.stack.iterate(z, segments=seg) if k % m == 0]
        if seq_idx is not None:
            assert seg is not None
            return [self.readout_packed(h, seg) for h in hs]
        return [self.readout(h, n) for h in hs]

    def _embed_any(self, x: Tensor, lengths: Tensor | None, seq_idx: Tensor | None
                   ) -> tuple[Tensor, Tensor | None, Segments | None]:
        """Padded (lengths) or packed (seq_idx) input → encoder output, model-step lengths (padded
        batches) and the layout the stack needs (packed batches; padded ones with non-causal parts)."""
        if seq_idx is not None:
            if lengths is not None:
                raise UsageError("give lengths (a padded batch) or seq_idx (a packed one, -1 on padding), not both")
            z, seg = self.embed_packed(x, seq_idx)
            return z, None, seg
        z, n = self.embed(x, lengths)
        return z, n, self.padding_layout(n, z.shape[1])

    def adaptive(self, x: Tensor, lengths: Tensor | None = None, *, epsilon: float | None = None,
                 max_depth: int | None = None, min_depth: int | None = None, stop_at: str | None = None,
                 prediction: str | None = None, count_flops: bool = True) -> AdaptiveResult:
        """Adaptive depth (see ``zoo_core.nn.adaptive``): per-sample stopping on the relative change of
        successive predictions. Defaults come from the spec's ``model.stacking.adaptive``."""
        cfg = self._adaptive_cfg(epsilon=epsilon, max_depth=max_depth, min_depth=min_depth, stop_at=stop_at, prediction=prediction)
        return run_adaptive(self, x, lengths, cfg, count=count_flops)

    def _adaptive_cfg(self, **overrides: Any) -> AdaptiveConfig:
        cfg = self.adaptive_config.resolve(self.stack.depth, self.stack.period, **overrides)
        if self.stack.position_norms is not None and (cfg.max_depth or 0) > self.stack.depth:
            raise ValueError(f"norms: per_position has norms for the {self.stack.depth} trained positions only; "
                             f"max_depth {cfg.max_depth} needs norms: shared")
        return cfg

    # streaming -------------------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: ModelState | None = None, *,
                           seq_idx: Tensor | None = None) -> tuple[Tensor, ModelState]:
        """Run a chunk starting from ``state`` (None: from zero); returns the output and new state.

        ``seq_idx`` (B, T) prefills a packed batch (``zoo_core.packing``; a right-padded prompt batch is
        ``Segments.from_lengths(lengths, T).seq_idx``): every document from zero, the output as
        ``forward(x, seq_idx=...)`` gives it, and a state with one stream per document (row-major),
        each exactly its document's own — padding never enters it — so each continues with ``step``."""
        if seq_idx is not None:
            if state is not None:
                raise UsageError("a packed prefill starts every document from the zero state; pass no state with seq_idx")
            return self._prefill_packed(x, seq_idx)
        if state is None and self.reshaper is None:  # every core from its zero state, in parallel
            h, layers = self.stack.forward_with_state(self.encoder(self._with_time(x, 0)))
            d = self.stack.depth
            hn, pools = self._commit({d: h}, self._zero_pools(x.shape[0], [d], device=h.device, dtype=h.dtype))
            t = torch.full((x.shape[0],), x.shape[1], device=h.device, dtype=torch.long)
            return self.pool.stream_read(pools[d], hn[d], None, self.head), ModelState(t, layers, _kept(pools))
        if state is None:
            state = self.init_state(x.shape[0], device=x.device)
        outs, new = self._advance(x, state, stepwise=False, reads=[self.stack.depth])
        return outs[0], new

    def _prefill_packed(self, x: Tensor, seq_idx: Tensor) -> tuple[Tensor, ModelState]:
        z, seg = self.embed_packed(x, seq_idx)
        h, layers = self.stack.forward_with_state(z, segments=seg)  # per-document states
        d = self.stack.depth
        pools: dict[int, PoolState] = {}
        if isinstance(self.pool, RunningPool):  # a pooled task: each document's running readout
            pools[d] = self.pool.commit_documents(seg.unpack(self.final_norm(h)), seg.doc_len, self.head)
        return self.readout_packed(h, seg), ModelState(seg.doc_len.clone(), layers, pools)

    def __getstate__(self) -> dict[str, Any]:
        """The module's state for pickling and deep copies, without its lean step (``zoo_core.nn.lean``'s
        plan and program are over this model's modules: a copy builds its own)."""
        state = super().__getstate__()
        state.pop(KEPT, None)
        return state

    def step(self, x_t: Tensor, state: ModelState) -> tuple[Tensor, ModelState]:
        """One raw time step: x_t is (B, D) features or (B,) tokens; returns (B, O) and the new state.

        In eval mode with gradients off, a plain stream takes the lean plan (``zoo_core.nn.lean``; for
        models of the fused kernel's parts, one C++ call for the whole step): the same maths without the
        general path's Python (not while ``torch.compile`` traces, under autocast,
        or under a dispatch mode such as FLOP counting: those see the general path's ops). While
        ``torch.export`` traces, the plan's separate ops are what is exported (fewer nodes for an edge
        runtime to dispatch)."""
        if not (self.training or torch.is_grad_enabled()):
            done = program_step(self, x_t, state)
            if done is not None:
                return done
        exporting = torch.compiler.is_exporting()
        if not (self.training or torch.is_grad_enabled() or (torch.compiler.is_compiling() and not exporting)) \
                and lean_applies(self, x_t, state, exporting=exporting):
            plan = lean_plan(self)
            if plan is not None:
                return plan.step(self, x_t, state)
        outs, new = self._advance(x_t[:, None], state, stepwise=True, reads=[self.stack.depth])
        return self.pool.step_output(outs[0]), new

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> ModelState:
        """Zero state for ``batch_size`` streams (dtype: the parameters', float32 for integer ones)."""
        return self._zero_state(batch_size, device=device, dtype=dtype, depth=self.stack.depth, reads=[self.stack.depth])

    # adaptive streaming --------------------------------------------------------------
    def adaptive_init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None,
                            max_depth: int | None = None, stop_at: str | None = None) -> ModelState:
        """State for ``adaptive_step``: one per depth position up to max_depth, a pool per checkpoint."""
        if self.pool.per_step:
            raise ValueError("adaptive streaming needs a pooled task: a per-step task's stopping rule "
                             "compares whole output sequences, which a stream does not have yet")
        cfg = self._adaptive_cfg(max_depth=max_depth, stop_at=stop_at)
        depth = cfg.max_depth or self.stack.depth
        reads = [0, *cfg.checkpoints(self.stack.period)]
        state = self._zero_state(batch_size, device=device, dtype=dtype, depth=depth, reads=reads)
        return replace(state, adaptive=AdaptiveStream(depth, cfg.stop_at))

    def adaptive_step(self, x_t: Tensor, state: ModelState, *, epsilon: float | None = None, min_depth: int | None = None,
                      prediction: str | None = None) -> tuple[AdaptiveResult, ModelState]:
        """One raw step of adaptive inference; equals ``adaptive`` on the prefix seen so far.

        ``max_depth`` and ``stop_at`` are fixed by ``adaptive_init_state`` (they shape the state);
        ``epsilon``, ``min_depth`` and ``prediction`` may change from step to step."""
        if state.adaptive is None:
            raise UsageError("adaptive_step needs the state adaptive_init_state makes (one pool per checkpoint); "
                             "this one comes from init_state or forward_with_state")
        cfg = self._adaptive_cfg(epsilon=epsilon, max_depth=state.adaptive.max_depth, min_depth=min_depth,
                                 stop_at=state.adaptive.stop_at, prediction=prediction)
        checkpoints = cfg.checkpoints(self.stack.period)
        outs, new = self._advance(x_t[:, None], state, stepwise=True, reads=[0, *checkpoints])
        idx = stop_depths([read_prediction(o, self.task, cfg.prediction) for o in outs], checkpoints, cfg)  # (B,)
        output = torch.stack(outs[1:], dim=0)[idx, torch.arange(len(idx), device=idx.device)]  # (J, B, O) → (B, O)
        depths = torch.tensor(checkpoints, device=idx.device)[idx]
        return AdaptiveResult(output, depths), new

    # streaming internals -----------------------------------------------------------------
    def _zero_state(self, batch_size: int, *, device: Any, dtype: Any, depth: int, reads: Sequence[int]) -> ModelState:
        """Zero core states for ``depth`` positions and a zero pool at each depth in ``reads``."""
        p = next(self.parameters())
        device = device or p.device
        dtype = dtype or (p.dtype if p.is_floating_point() else torch.float32)
        layers = self.stack.init_state(batch_size, depth=depth, device=device, dtype=dtype)
        reshape = None if self.reshaper is None else self.reshaper.init_state(batch_size, device=device, dtype=dtype)
        pools = _kept(self._zero_pools(batch_size, reads, device=device, dtype=dtype))
        return ModelState(torch.zeros(batch_size, device=device, dtype=torch.long), layers, pools, reshape)

    def _zero_pools(self, batch_size: int, reads: Sequence[int], *, device: Any, dtype: Any) -> dict[int, PoolState | None]:
        return {k: self.pool.init_state(batch_size, self.d_model, self.head, device=device, dtype=dtype) for k in reads}

    def _advance(self, x: Tensor, state: ModelState, *, stepwise: bool, reads: list[int]) -> tuple[list[Tensor], ModelState]:
        """Raw steps x (B, T, ·) from ``state``: commit complete model steps, read the outputs at
        depths ``reads`` (numbers of positions applied; 0 is the encoder output)."""
        chunks, leftover, reshape = self._model_steps(self._with_time(x, state.t), state.reshape)
        layers = state.layers
        hn: dict[int, Tensor] = {}  # final-normed features of the committed steps, per read depth
        pools: dict[int, PoolState | None] = {k: state.pools.get(k) for k in reads}
        if chunks.shape[1]:
            hs, layers = self.stack.advance(self.encoder(chunks), layers, stepwise=stepwise, reads=reads)  # (B, n, H) each
            hn, pools = self._commit(hs, pools)
        extra: dict[int, Tensor] = {}
        if leftover is not None:  # a model step the prefix ends inside: evaluate it, commit nothing
            res, _ = self.stack.advance(self.encoder(leftover)[:, None], layers, stepwise=True, reads=reads)
            extra = {k: self.final_norm(h[:, 0]) for k, h in res.items()}  # (B, H)
        outs = [self.pool.stream_read(pools[k], hn.get(k), extra.get(k), self.head) for k in reads]
        return outs, replace(state, t=state.t + x.shape[1], layers=layers, pools=_kept(pools), reshape=reshape)

    def _model_steps(self, raw: Tensor, state: ReshapeState | None) -> tuple[Tensor, Tensor | None, ReshapeState | None]:
        """Raw steps (B, T, ·) → the complete model steps, the incomplete one (or None), the reshaper's state."""
        if self.reshaper is None:
            return raw, None, None
        if state is None:
            raise UsageError("this model reshapes its input, and the state has no reshaping buffer; start the "
                             "stream with this model's init_state")
        return self.reshaper.push(raw, state)

    def _commit(self, hs: dict[int, Tensor], pools: dict[int, PoolState | None]
                ) -> tuple[dict[int, Tensor], dict[int, PoolState | None]]:
        """Final-normed features at each read depth, and them folded into that depth's running pool."""
        hn = {k: self.final_norm(hs[k]) for k in pools}  # (B, n, H)
        return hn, {k: self.pool.commit(pool, hn[k], self.head) for k, pool in pools.items()}

    def cores(self) -> list[CoreBase]:
        """The distinct cores, in block order."""
        return [self.stack.block(i).core for i in range(len(self.stack.blocks))]


def _kept(pools: dict[int, PoolState | None]) -> dict[int, PoolState]:
    """The pools a state keeps (a per-step readout keeps none)."""
    return {k: p for k, p in pools.items() if p is not None}


def rescale_sampling_rate(model: SequenceModel, factor: float) -> SequenceModel:
    """Run the same weights on a sequence sampled ``factor`` times more coarsely: Δ ← Δ·factor.

    E.g. factor=2 for audio recorded at half the training sampling rate (S4's zero-shot
    Speech Commands trick). Only continuous-time cores (capability ``continuous_time``) can do
    this; the stored spec's ``model.core.dt_scale`` is updated so a saved model keeps it.
    """
    if not factor > 0:
        raise ValueError(f"the rescaling factor must be positive, got {factor}")
    cores = model.cores()
    bad = [type(c).__name__ for c in cores if "continuous_time" not in getattr(c, "capabilities", ())]
    if bad:
        raise ValueError(
            f"{', '.join(sorted(set(bad)))} is discrete-time (no step size Δ), so its sampling rate "
            "cannot be rescaled; only cores with the 'continuous_time' capability support this"
        )
    before = [core.dt_scale for core in cores]
    try:
        for core in cores:
            core.rescale_dt(factor)
    except Exception:
        for core, scale in zip(cores, before, strict=True):  # all or nothing: no half-rescaled model
            core.dt_scale = scale
        raise
    body = model.spec.get("model", {})
    for name, core in zip(model.stack.core_names, cores, strict=True):  # a hybrid's named cores too
        core_spec = body.get("core") if name == "core" else (body.get("cores") or {}).get(name)
        if core_spec is not None:
            core_spec["dt_scale"] = float(core.dt_scale)
    return model
