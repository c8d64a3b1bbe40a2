"""Smoke test of a user's install: zoo-core and the plugins with no extras, in a fresh venv.

For every installed core: build a model from a spec, save it, load it back (strict), stream a few
steps through ``step`` and compare them with the parallel forward; then one optimizer step and a
training checkpoint round trip. It imports only what a plain ``pip install zoo-core zoo-s4d ...``
installs, so a module the packages use but do not declare fails here (``make smoke``, run by CI).

Usage: python tools/smoke.py [--expect-installed]   (the flag: refuse to run from a source tree)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS = 7  # odd on purpose


def spec_for(core: str, presets: set[str]) -> dict[str, Any]:
    """A small causal classifier around ``core`` (its tiny preset when it has one)."""
    kind = {"kind": core, **({"preset": "tiny"} if "tiny" in presets else {})}
    return {"schema_version": 1, "name": f"smoke-{core}", "task": {"kind": "classification", "classes": 3},
            "input": {"channels": 4}, "model": {"d_model": 8, "depth": 2, "core": kind}}


def check_core(core: str, presets: set[str], capabilities: set[str], folder: Path) -> str:
    """Build, save, load, stream vs forward for one core; returns a one-line report."""
    import torch

    from zoo_core import build_model, load_pretrained, save_pretrained

    model = build_model(spec_for(core, presets), seed=0).eval()
    save_pretrained(model, folder / core)
    loaded = load_pretrained(folder / core)
    x = torch.randn(2, STEPS, 4, generator=torch.Generator().manual_seed(0))  # (B, L, D)
    with torch.no_grad():
        parallel = loaded(x)  # (B, C)
        if not torch.equal(parallel, model(x)):
            raise SystemExit(f"{core}: the loaded model's output differs from the saved one's")
        if "step" not in capabilities:
            return f"{core:18s} build/save/load ok (not causal: no step)"
        state = loaded.init_state(batch_size=2)
        for t in range(STEPS):
            streamed, state = loaded.step(x[:, t], state)
    err = float((streamed - parallel).abs().max() / parallel.abs().max().clamp_min(1e-6))
    if not err < 1e-4:
        raise SystemExit(f"{core}: streamed output differs from the parallel forward (relative error {err:.2e})")
    return f"{core:18s} build/save/load ok, step vs forward relative error {err:.1e}"


def check_training(folder: Path) -> str:
    """One optimizer step and a resumable checkpoint (numpy + safetensors' torch writer)."""
    import torch

    from zoo_core import build_model
    from zoo_core.train.loop import make_optimizer
    from zoo_core.train.state import load_checkpoint, save_checkpoint
    from zoo_core.spec.training import TrainingSpec

    model = build_model(spec_for("s4d", {"tiny"}), seed=0)
    opt = make_optimizer(model, TrainingSpec(), 1e-3)
    x, y = torch.randn(4, STEPS, 4), torch.tensor([0, 1, 2, 0])
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    save_checkpoint(folder / "checkpoint", model, opt, {"epochs_done": 1})
    fresh = build_model(spec_for("s4d", {"tiny"}), seed=1)
    state = load_checkpoint(folder / "checkpoint", fresh, make_optimizer(fresh, TrainingSpec(), 1e-3))
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    if not same or state["epochs_done"] != 1:
        raise SystemExit("training checkpoint round trip changed the weights")
    return "training step + checkpoint round trip ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-installed", action="store_true", help="fail if zoo_core is imported from a source tree")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import zoo_core
    from zoo_core.plugins import get_registry

    where = Path(zoo_core.__file__).resolve()
    if args.expect_installed and "site-packages" not in where.parts:
        raise SystemExit(f"zoo_core comes from {where}, not from an installed copy")
    registry = get_registry()
    cores = registry.cores
    if not cores:
        raise SystemExit("no cores are registered: the plugins did not install or load")
    print(f"zoo_core {zoo_core.__version__} from {where.parent}; cores: {', '.join(sorted(cores))}")
    with tempfile.TemporaryDirectory(prefix="zoo-smoke-") as tmp:
        for name in sorted(cores):
            entry = cores[name]
            print(check_core(name, set(entry.presets), set(entry.capabilities), Path(tmp)))
        print(check_training(Path(tmp)))
    print(f"smoke test passed in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
