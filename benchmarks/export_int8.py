"""What int8 costs: each pretrained tag's test split through its exported ONNX stream model, float32 and
int8 (``zoo export --quantize int8``), one sequence at a time at its own length, against ``zoo eval``.

    python -m benchmarks.export_int8                      # the JapaneseVowels tags
    python -m benchmarks.export_int8 s4d-small.japanesevowels mamba-small.japanesevowels

One line per tag: the test accuracy of the zoo (``evaluate``), of the float32 ONNX stream model and of
the int8 one, the files' sizes, and how many test predictions int8 changed. Nothing downloads: the
tags are bundled (``pretrained/``).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch


def jv_tags() -> list[str]:
    """Every catalogued JapaneseVowels tag (``registry.yaml``), so a new one is measured the day it lands."""
    from zoo_core.hub.catalogue import load_catalogue

    return [e.name for e in load_catalogue().filter("*.japanesevowels")]


def _stream_predictions(path: Path, names: list[str], start: list[np.ndarray], data: dict[str, torch.Tensor]) -> np.ndarray:
    """The class each test sequence gets from the ONNX stream model at ``path`` (its last step's output)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    X, lengths = data["X"].numpy(), data["lengths"]
    out = []
    for i in range(X.shape[0]):
        state = list(start)
        for t in range(int(lengths[i])):
            got = session.run(None, {"x_t": X[i : i + 1, t], **dict(zip(names, state, strict=True))})
            state = got[1:]
        out.append(int(np.argmax(got[0][0])))
    return np.array(out)


def measure(tag: str) -> dict[str, Any]:
    from zoo_core.export_cli import export_model
    from zoo_core.hub.pulling import pull
    from zoo_core.train.evaluate import model_split
    from zoo_core.train.loop import evaluate

    folder = Path(pull(tag).path)
    model, ds, data, _, _, _ = model_split(folder, device="cpu")
    zoo = evaluate(model.eval(), data, ds.info.task, 256)["accuracy"]
    y = data["y"].numpy()
    row: dict[str, Any] = {"tag": tag, "sequences": len(y), "zoo": zoo}
    with tempfile.TemporaryDirectory() as tmp:
        preds = {}
        for quant in (None, "int8"):
            exported = export_model(tag, model=model, fmt="onnx", output=Path(tmp) / f"{quant or 'float32'}.onnx",
                                    quantize=quant)
            names = [f"state.{n}" for n in exported.module.names]
            start = [t[:1].numpy() for t in exported.module.flatten(model.init_state(1))]
            preds[quant or "float32"] = _stream_predictions(exported.path, names, start, data)
            row[f"{quant or 'float32'}_kib"] = exported.path.stat().st_size / 1024
    row["float32"] = float((preds["float32"] == y).mean())
    row["int8"] = float((preds["int8"] == y).mean())
    row["changed"] = int((preds["float32"] != preds["int8"]).sum())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tags", nargs="*", help="tags to measure (default: every JapaneseVowels tag)")
    args = parser.parse_args()
    args.tags = args.tags or jv_tags()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    print("| tag | test sequences | zoo | ONNX float32 | ONNX int8 | predictions changed | size float32 → int8 (KiB) |")
    print("|---|---|---|---|---|---|---|")
    for tag in args.tags:
        r = measure(tag)
        print(f"| {r['tag']} | {r['sequences']} | {r['zoo']:.4f} | {r['float32']:.4f} | {r['int8']:.4f} | {r['changed']} | "
              f"{r['float32_kib']:.0f} → {r['int8_kib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
