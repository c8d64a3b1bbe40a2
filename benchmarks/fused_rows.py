"""Where the fused streaming step stops beating the separate ops: ``model.step`` (the whole-step program
and the per-block kernel, ``zoo_core.nn.lean``) against the same model's general path, per batch size,
with the kernels' batch limit (``lean.max_rows``) lifted so both sides of it are timed.

    python -m benchmarks.fused_rows                  # 2 threads, the rows behind lean._ROWS_ALWAYS / _ROWS_X_WEIGHTS
    python -m benchmarks.fused_rows --threads 1

Models: the width-256, 4-layer Mamba LM of ``mamba/generate`` (largest matrix 262,144 weights), the same
with a 32,768-token head, and the width-32 S4D and LRU classifiers of ``specs/`` (largest 2,048). One
line per (model, B): the best of 3 rounds of 16 steps (µs a step) for each path and their ratio
(> 1: fused is faster). The general path is ``benchmarks.peers.general_step_copy``: the model with a
forward hook (never called by ``step``), which keeps it off the lean plan. Needs transformers (the LM's converted weights).
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import torch
from torch import Tensor, nn


def _best_step_s(model: Any, x: Tensor, rounds: int = 3) -> float:
    best = float("inf")
    with torch.no_grad():
        model.step(x[:, 0], model.init_state(x.shape[0]))  # builds the plan and program; not timed
        for _ in range(rounds):
            state, t0 = model.init_state(x.shape[0]), time.perf_counter()
            for i in range(x.shape[1]):
                _, state = model.step(x[:, i], state)
            best = min(best, (time.perf_counter() - t0) / x.shape[1])
    return best


def compare(name: str, model: Any, x: Tensor) -> tuple[float, float]:
    """µs a step, fused and general, for the inputs x (B, steps, ...); printed as one line."""
    from benchmarks.peers import general_step_copy

    fused_s, general_s = _best_step_s(model, x), _best_step_s(general_step_copy(model), x)
    print(f"{name:<34} B={x.shape[0]:<5} fused {fused_s * 1e6:9.0f} µs   general {general_s * 1e6:9.0f} µs   "
          f"ratio {general_s / fused_s:5.2f}", flush=True)
    return fused_s, general_s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fused_rows", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from benchmarks.peers import _lm_pair
    from zoo_core.build import build_model
    from zoo_core.export_cli import example_input
    from zoo_core.nn import lean

    lean._ROWS_ALWAYS = lean._ROWS_X_WEIGHTS = 1 << 40  # both sides of the limit
    lm = _lm_pair()[0]
    for B in (1, 8, 16, 32, 64):
        compare("Mamba LM, width 256", lm, torch.randint(0, 1024, (B, 16), generator=torch.Generator().manual_seed(B)))
    big = copy.deepcopy(lm)
    big.head = nn.Linear(256, 32768, bias=False).eval()
    for B in (1, 8, 32):
        compare("Mamba LM, 32k-token head", big, torch.randint(0, 1024, (B, 16)))
    for spec in ("specs/s4d-basicmotions.yaml", "specs/lru-jv.yaml"):
        model = build_model(spec, seed=0).eval()
        for B in (64, 256, 512, 2048):
            compare(f"{spec.removeprefix('specs/')} (width {model.d_model})", model, example_input(model, B, 16))


if __name__ == "__main__":
    main()
