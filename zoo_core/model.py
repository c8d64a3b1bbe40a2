"""SequenceModel: input reshaping → encoder → stack → final norm → pooling → head.

Letters: B batch, T raw steps, D raw input channels, L model steps (L = T without reshaping),
H model width, V vocabulary, O outputs.

Tasks: ``classification`` / ``regression`` pool over time then map to (B, O); ``sequence``
maps every step to (B, L, O); ``lm`` embeds tokens and returns (B, L, V) logits.

Pools: ``mean`` (the head on the mean of the features over valid steps), ``last`` (the head on
the last valid step), ``mean_logits`` (the head on every step, then the mean of its outputs over
valid steps — the LrcSSM backbone's readout; unlike ``mean`` when the head is nonlinear),
``none`` (per-step outputs). ``lengths`` (B,) counts each sample's valid raw steps; steps past it
(batch padding) never reach the pool.

``step`` streams one raw time step with a constant-size state and returns what ``forward`` would
return for the prefix seen so far (for pooled tasks: the head on the running pool). With input
reshaping, raw steps are buffered (concat) or split (rechunk); when the prefix ends inside a model
step, that step is evaluated zero-padded from the current state without being committed, exactly
as the parallel path pads the end — so every prefix gives the parallel prediction.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor, nn

from .adaptive import AdaptiveConfig, AdaptiveResult, prediction, run_adaptive, stop_depths
from .protocols import State
from .reshape import InputReshaper
from .stack import Stack

POOLS = ("mean", "last", "mean_logits", "none")


def _check_lengths(lengths: Tensor | None, batch: int, steps: int) -> Tensor | None:
    if lengths is None:
        return None
    if lengths.shape != (batch,) or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be an integer tensor of shape ({batch},), got {tuple(lengths.shape)} {lengths.dtype}")
    if bool((lengths < 1).any()) or bool((lengths > steps).any()):
        raise ValueError(f"lengths must lie in [1, {steps}] (the number of input steps), got {lengths.tolist()}")
    return lengths.long()


class SequenceModel(nn.Module):
    def __init__(
        self,
        *,
        encoder: nn.Module,
        stack: Stack,
        head: nn.Module,
        task: str,
        pool: str,
        d_model: int,
        final_norm: nn.Module | None = None,
        time_length: int | None = None,
        reshaper: InputReshaper | None = None,
        adaptive: AdaptiveConfig | None = None,
        spec: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; choose one of {POOLS}")
        if reshaper is not None and pool == "none":
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

    # input --------------------------------------------------------------------------
    def _with_time(self, x: Tensor, start: Tensor | int = 0) -> Tensor:
        """Raw input with the time channel t_i = i / length prepended when configured (B, T, 1 + D)."""
        if self.time_length is None:
            return x
        steps = torch.arange(x.shape[1], device=x.device, dtype=x.dtype) + torch.as_tensor(start, device=x.device)[..., None].to(x.dtype)
        t = (steps / self.time_length).expand(x.shape[0], -1)[..., None]  # (B, T, 1)
        return torch.cat([t, x], dim=-1)

    def _embed(self, x: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Raw input (B, T, D) or tokens (B, T) → encoder output (B, L, H) and model-step lengths."""
        lengths = _check_lengths(lengths, x.shape[0], x.shape[1])
        if lengths is not None and bool((lengths < x.shape[1]).any()):
            acausal = sorted({type(c).__name__ for c in self.cores() if "step" not in getattr(c, "capabilities", ())})
            if acausal:  # a non-causal core reads the padding into the valid steps: masking the pool is not enough
                raise ValueError(f"{', '.join(acausal)} is not causal (it reads the sequence in both directions), so "
                                 "end padding would change the valid steps' outputs; run unequal lengths one "
                                 "sample at a time, or group them by length")
        x = self._with_time(x)
        if self.reshaper is not None:
            x, lengths = self.reshaper(x, lengths)  # (B, L, c)
        return self.encoder(x), lengths

    # readout ------------------------------------------------------------------------
    def _readout(self, h: Tensor, lengths: Tensor | None = None) -> Tensor:
        """Stack output (B, L, H) → final norm → pool → head: what ``forward`` returns."""
        h = self.final_norm(h)
        if self.pool == "none":
            return self.head(h)  # (B, L, O)
        if self.pool == "last":
            last = h[:, -1] if lengths is None else h[torch.arange(h.shape[0], device=h.device), lengths.to(h.device) - 1]
            return self.head(last)
        if self.pool == "mean_logits":
            h = self.head(h)  # (B, L, O)
        if lengths is None:
            pooled = h.mean(dim=1)
        else:
            mask = (torch.arange(h.shape[1], device=h.device) < lengths.to(h.device)[:, None]).to(h.dtype)  # (B, L)
            pooled = (h * mask[..., None]).sum(dim=1) / lengths.to(h.device, h.dtype)[:, None]
        return pooled if self.pool == "mean_logits" else self.head(pooled)

    # parallel --------------------------------------------------------------------------
    def features(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        """Per-step features (B, L, H) after the stack and final norm (L: model steps)."""
        z, _ = self._embed(x, lengths)
        return self.final_norm(self.stack(z))

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        """x (B, T, D) features or (B, T) tokens; ``lengths`` (B,) valid steps per sample (None: all)."""
        z, n = self._embed(x, lengths)
        return self._readout(self.stack(z), n)

    def period_outputs(self, x: Tensor, lengths: Tensor | None = None) -> list[Tensor]:
        """The shared head after each complete period j = 1..depth/m (one element for ABCDEF),
        each shaped like ``forward``'s output; the last equals ``forward(x, lengths)``. The
        blockwise loss is the mean of the loss over these."""
        z, n = self._embed(x, lengths)
        m = self.stack.period
        return [self._readout(h, n) for k, h in self.stack.iterate(z) if k % m == 0]

    def adaptive(self, x: Tensor, lengths: Tensor | None = None, *, epsilon: float | None = None,
                 max_depth: int | None = None, min_depth: int | None = None, stop_at: str | None = None,
                 prediction: str | None = None, count_flops: bool = True) -> AdaptiveResult:
        """Adaptive depth (see ``zoo_core.adaptive``): per-sample stopping on the relative change of
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
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """Run a chunk starting from ``state`` (None: from zero); returns the output and new state."""
        if state is None and self.reshaper is None:
            h, layers = self.stack.forward_with_state(self._encode_raw(x, 0))
            new: State = {"input.t": torch.full((x.shape[0],), x.shape[1], device=h.device, dtype=torch.long)}
            new.update(self._flatten(layers))
            return self._read_fresh(h, new)
        if state is None:
            state = self.init_state(x.shape[0], device=x.device)
        return self._advance(x, state, parallel=True, reads=[self.stack.depth])

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One raw time step: x_t is (B, D) features or (B,) tokens; returns (B, O) and the new state."""
        y, new = self._advance(x_t[:, None], state, parallel=False, reads=[self.stack.depth])
        return (y[:, 0] if self.pool == "none" else y), new

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None, depth: int | None = None,
                   reads: list[int] | None = None) -> State:
        """Zero state for ``batch_size`` streams. ``depth`` (> training depth for adaptive
        streaming) sets how many depth positions keep a state; ``reads`` which positions keep a
        pool (internal; default the last)."""
        p = next(self.parameters())
        device = device or p.device
        dtype = dtype or (p.dtype if p.is_floating_point() else torch.float32)
        depth = depth or self.stack.depth
        state = self._flatten(self.stack.init_state(batch_size, depth=depth, device=device, dtype=dtype))
        state["input.t"] = torch.zeros(batch_size, device=device, dtype=torch.long)
        if self.reshaper is not None:
            state.update(self.reshaper.init_state(batch_size, device=device, dtype=dtype))
        if self.pool != "none":
            width = self._pool_width()
            for k in reads or [depth]:
                pre = self._pool_prefix(k)
                state[pre + "sum"] = torch.zeros(batch_size, width, device=device, dtype=dtype)
                state[pre + "count"] = torch.zeros(batch_size, device=device, dtype=torch.long)
                state[pre + "last"] = torch.zeros(batch_size, self.d_model, device=device, dtype=dtype)
        return state

    # adaptive streaming --------------------------------------------------------------
    def adaptive_init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None,
                            max_depth: int | None = None, stop_at: str | None = None) -> State:
        """State for ``adaptive_step``: one per depth position up to max_depth, a pool per checkpoint."""
        if self.pool == "none":
            raise ValueError("adaptive streaming needs a pooled task: a per-step task's stopping rule "
                             "compares whole output sequences, which a stream does not have yet")
        cfg = self._adaptive_cfg(max_depth=max_depth, stop_at=stop_at)
        reads = [0, *cfg.checkpoints(self.stack.period)]
        state = self.init_state(batch_size, device=device, dtype=dtype, depth=cfg.max_depth, reads=reads)
        dev = state["input.t"].device
        state["adaptive.max_depth"] = torch.full((batch_size,), cfg.max_depth or 0, dtype=torch.long, device=dev)
        state["adaptive.block_stops"] = torch.full((batch_size,), cfg.stop_at == "block", dtype=torch.bool, device=dev)
        return state

    def adaptive_step(self, x_t: Tensor, state: State, *, epsilon: float | None = None, min_depth: int | None = None,
                      prediction: str | None = None) -> tuple[AdaptiveResult, State]:
        """One raw step of adaptive inference; equals ``adaptive`` on the prefix seen so far.

        ``max_depth`` and ``stop_at`` are fixed by ``adaptive_init_state`` (they shape the state);
        ``epsilon``, ``min_depth`` and ``prediction`` may change from step to step."""
        max_depth = int(state["adaptive.max_depth"][0])
        stop_at = "block" if bool(state["adaptive.block_stops"][0]) else "period"
        cfg = self._adaptive_cfg(epsilon=epsilon, max_depth=max_depth, min_depth=min_depth, stop_at=stop_at, prediction=prediction)
        checkpoints = cfg.checkpoints(self.stack.period)
        outs, new = self._advance(x_t[:, None], state, parallel=False, reads=[0, *checkpoints])
        preds = [_pred(o, self.task, cfg.prediction) for o in outs]
        idx = stop_depths(preds, checkpoints, cfg)  # (B,)
        stacked = torch.stack(outs[1:], dim=0)  # (J, B, O)
        output = stacked[idx, torch.arange(len(idx), device=idx.device)]
        new["adaptive.max_depth"], new["adaptive.block_stops"] = state["adaptive.max_depth"], state["adaptive.block_stops"]
        depths = torch.tensor(checkpoints, device=idx.device)[idx]
        return AdaptiveResult(output, depths), new

    # streaming internals -----------------------------------------------------------------
    def _encode_raw(self, x: Tensor, start: Tensor | int) -> Tensor:
        return self.encoder(self._with_time(x, start))

    def _pool_width(self) -> int:
        if self.pool != "mean_logits":
            return self.d_model
        last = [m for m in self.head.modules() if isinstance(m, nn.Linear)][-1]
        return last.out_features

    def _pool_prefix(self, k: int) -> str:
        return "pool." if k == self.stack.depth else f"pool{k}."

    def _advance(self, x: Tensor, state: State, *, parallel: bool, reads: list[int]) -> tuple[Any, State]:
        """Raw steps x (B, T, ·) from ``state``: commit complete model steps, read the outputs at
        depths ``reads`` (one output for the usual single read, a list for adaptive)."""
        depth = 1 + max((int(k[5:].partition(".")[0]) for k in state if k.startswith("layer")), default=self.stack.depth - 1)
        layers = self._layer_states(state, depth)
        new: State = {"input.t": state["input.t"] + x.shape[1]}
        raw = self._with_time(x, state["input.t"]) if self.time_length is not None else x
        leftover = None
        if self.reshaper is not None:
            chunks, leftover, rs = self.reshaper.push(raw, state)
            new.update(rs)
        else:
            chunks = raw
        pools = {k: {n: state[self._pool_prefix(k) + n] for n in ("sum", "count", "last")} for k in reads} if self.pool != "none" else {}
        hs: dict[int, Tensor] = {}
        if chunks.shape[1]:
            z = self.encoder(chunks)  # (B, n, H)
            hs = self._run(z, layers, parallel, reads)
            layers = hs.pop("layers")  # type: ignore[assignment]
            for k in reads:
                if self.pool != "none":
                    pools[k] = self._pool_commit(pools[k], hs[k])
        new.update(self._flatten(layers))
        for k, pk in pools.items():
            for n, v in pk.items():
                new[self._pool_prefix(k) + n] = v
        extra: dict[int, Tensor] = {}
        if leftover is not None:  # a model step the prefix ends inside: evaluate it, commit nothing
            z = self.encoder(leftover)  # (B, H)
            res = self._run(z[:, None], layers, False, reads)
            extra = {k: res[k][:, 0] for k in reads}
        if self.pool == "none":
            outs = [self.head(self.final_norm(hs[k])) for k in reads]
        else:
            outs = [self._pool_read(pools[k], extra.get(k)) for k in reads]
        return (outs[0] if len(reads) == 1 and reads[0] == self.stack.depth else outs), new

    def _run(self, z: Tensor, layers: list[State], parallel: bool, reads: list[int]) -> dict[Any, Any]:
        """z (B, n, H) through every kept depth position; features at each read depth."""
        out: dict[Any, Any] = {}
        if 0 in reads:
            out[0] = z
        h, new_layers = z, []
        for pos, st in enumerate(layers):
            if parallel:
                h, s = self.stack.apply_with_state(pos, h, st)
            else:  # one step at a time (n is small: a step, or the chunks one raw step completes)
                ys = []
                for t in range(h.shape[1]):
                    y_t, st = self.stack.apply_step(pos, h[:, t], st)
                    ys.append(y_t)
                h, s = torch.stack(ys, dim=1), st
            new_layers.append(s)
            if pos + 1 in reads:
                out[pos + 1] = h
        out["layers"] = new_layers
        return out

    def _pool_commit(self, pool: dict[str, Tensor], h: Tensor) -> dict[str, Tensor]:
        hn = self.final_norm(h)  # (B, n, H)
        summed = self.head(hn).sum(dim=1) if self.pool == "mean_logits" else hn.sum(dim=1)
        return {"sum": pool["sum"] + summed, "count": pool["count"] + h.shape[1], "last": hn[:, -1]}

    def _pool_read(self, pool: dict[str, Tensor], extra: Tensor | None) -> Tensor:
        """The head on the running pool, with one uncommitted step ``extra`` (B, H) if given."""
        total, count, last = pool["sum"], pool["count"], pool["last"]
        if extra is not None:
            en = self.final_norm(extra)
            total = total + (self.head(en) if self.pool == "mean_logits" else en)
            count, last = count + 1, en
        if self.pool == "last":
            return self.head(last)
        mean = total / count.clamp(min=1).to(total.dtype)[:, None]
        return mean if self.pool == "mean_logits" else self.head(mean)

    def _read_fresh(self, h: Tensor, new: State) -> tuple[Tensor, State]:
        """Output and pool state of a first chunk h (B, L, H) run from zero."""
        if self.pool == "none":
            return self.head(self.final_norm(h)), new
        B = h.shape[0]
        zero = {"sum": h.new_zeros(B, self._pool_width()), "count": torch.zeros(B, dtype=torch.long, device=h.device),
                "last": h.new_zeros(B, self.d_model)}
        pool = self._pool_commit(zero, h)
        for n, v in pool.items():
            new["pool." + n] = v
        return self._pool_read(pool, None), new

    @staticmethod
    def _flatten(layers: list[State]) -> State:
        return {f"layer{pos}.{k}": v for pos, s in enumerate(layers) for k, v in s.items()}

    def _layer_states(self, state: State, depth: int | None = None) -> list[State]:
        out: list[State] = [{} for _ in range(depth or self.stack.depth)]
        for key, value in state.items():
            if key.startswith("layer"):
                pos, _, name = key[5:].partition(".")
                if int(pos) < len(out):
                    out[int(pos)][name] = value
        return out

    # convenience -----------------------------------------------------------------------
    def save_pretrained(self, directory: str) -> Any:
        from .io.pretrained import save_pretrained

        return save_pretrained(self, directory)

    @classmethod
    def from_pretrained(cls, ref: str | os.PathLike[str], **kw: Any) -> SequenceModel:
        """A saved folder, or any model reference: ``arch.tag``, ``hf-hub:org/name@rev``, ``local-dir:path``.

        Keyword arguments as huggingface_hub's (revision, cache_dir, local_files_only, token,
        force_download) and ``strict=True``; see ``zoo_core.hub.create_model``.
        """
        if os.path.isdir(ref):
            from .io.pretrained import load_pretrained

            return load_pretrained(ref, **kw)
        from .hub.api import create_model

        return create_model(str(ref), pretrained=True, **kw)

    def push_to_hub(self, repo_id: str, **kw: Any) -> Any:
        """Publish to the Hub (revision, private, commit_message, create_pr, token); see ``zoo_core.hub.push_to_hub``."""
        from .hub.api import push_to_hub

        return push_to_hub(self, repo_id, **kw)

    def cores(self) -> list[nn.Module]:
        """The distinct cores, in block order."""
        return [b.core for b in self.stack.blocks]


def _pred(out: Tensor, task: str, kind: str) -> Tensor:
    return prediction(out, task, kind)


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
        for core, scale in zip(cores, before):  # all or nothing: no half-rescaled model
            core.dt_scale = scale
        raise
    core_spec = model.spec.get("model", {}).get("core")
    if core_spec is not None:
        core_spec["dt_scale"] = float(cores[0].dt_scale)
    return model
