"""Per-token latency of a model's streaming step: the zoo's eager ``step`` against its exported ONNX
stream model in onnxruntime, B = 1, one thread each, and the file's size.

    python -m benchmarks.stream_latency specs/s4d-basicmotions.yaml specs/s5-basicmotions.yaml specs/lru-jv.yaml

Each figure is the mean over 200 steps after 20 warm-up steps (random weights: latency does not depend
on them). Prints one line per spec; append them to a report by hand with the machine's load stated.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from pathlib import Path

import torch


def measure(spec: str, steps: int = 200, warmup: int = 20) -> dict[str, float]:
    import onnxruntime as ort

    from zoo_core.build import build_model
    from zoo_core.export_cli import example_input, export_model

    model = build_model(spec, seed=0).eval()
    x = example_input(model, 1, steps + warmup)
    with torch.no_grad():
        state = model.init_state(1)
        for t in range(warmup):
            _, state = model.step(x[:, t], state)
        start = time.perf_counter()
        for t in range(warmup, warmup + steps):
            _, state = model.step(x[:, t], state)
        eager = (time.perf_counter() - start) / steps
    with tempfile.TemporaryDirectory() as tmp:
        exported = export_model(spec, model=model, fmt="onnx", output=Path(tmp) / "m.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(exported.path), options, providers=["CPUExecutionProvider"])
        flat = [a[:1].numpy() for a in exported.args[1:]]
        for t in range(warmup + steps):
            if t == warmup:
                start = time.perf_counter()
            out = session.run(None, dict(zip(exported.inputs, [x[:, t].numpy(), *flat], strict=True)))
            flat = out[1:]
        onnx = (time.perf_counter() - start) / steps
        size = exported.path.stat().st_size
    return {"eager_us": eager * 1e6, "onnxruntime_us": onnx * 1e6, "file_kib": size / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="+")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    for spec in args.specs:
        r = measure(spec)
        print(f"{spec}: eager step {r['eager_us']:.0f} µs/token, onnxruntime {r['onnxruntime_us']:.0f} µs/token "
              f"({r['eager_us'] / r['onnxruntime_us']:.1f}x), file {r['file_kib']:.0f} KiB", flush=True)


if __name__ == "__main__":
    main()
