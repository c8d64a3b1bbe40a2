"""What every family must survive beyond the conformance suite: the user's workflows end to end.

``check_workflows(core, tmp_path)`` trains a two-block model around ``core`` (a ``model.core``
mapping) for one epoch on JapaneseVowels through ``zoo train``, scores the saved best model with
``zoo eval --adaptive`` (its fixed-depth accuracy, from the reloaded folder, must equal what
training reported), streams a real test sequence through ``zoo stream`` (step by step must agree
with the parallel forward) and round-trips a fresh model through ``save_pretrained`` /
``load_pretrained`` (identical outputs). A plugin's test is one call::

    @pytest.mark.requires("aeon")
    def test_zoo_workflows(tmp_path):
        check_workflows({"kind": "mycore", "d_state": 4}, tmp_path)

Small sizes on purpose (d_model 8, depth 2, one epoch): this checks that the pieces fit, not that
the model learns.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from ..build import build_model
from ..cli.train import main as train_main
from ..cli.zoo import main as zoo_main
from ..factory import load_pretrained
from ..io.pretrained import save_pretrained

DATASET = "JapaneseVowels"  # bundled with aeon: 12 channels, lengths 7-29, 9 classes
RESIDUAL_RMS = {"norm": "rms", "prenorm": True, "activation": "identity", "output": "none", "residual": True,
                "dropout": 0.0}


def workflow_spec(core: Mapping[str, Any], *, d_model: int = 8, depth: int = 2,
                  stacking: Mapping[str, Any] | None = None, block: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A small JapaneseVowels classifier around ``core`` with a one-epoch ``training`` section
    (default: one block shared across depth, pre-RMSNorm residual blocks)."""
    return {
        "schema_version": 1, "name": f"{core['kind']}-workflows",
        "task": {"kind": "classification", "classes": 9}, "input": {"channels": 12},
        "model": {"d_model": d_model, "depth": depth, "stacking": dict(stacking or {"policy": "periodic", "period": 1}),
                  "block": dict(block or RESIDUAL_RMS), "core": dict(core)},
        "training": {"dataset": DATASET, "protocol": "seed-split", "epochs": 1, "batch_size": 64, "lr": 3e-3},
    }


def _run(main: Any, argv: list[str]) -> str:
    """A CLI call that must succeed; its standard output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise AssertionError(f"`zoo {' '.join(argv)}` exited {code}; it printed:\n{out.getvalue()}")
    return out.getvalue()


def check_workflows(core: Mapping[str, Any], tmp_path: Path, *, d_model: int = 8, depth: int = 2,
                    stacking: Mapping[str, Any] | None = None, block: Mapping[str, Any] | None = None,
                    max_depth: int | None = None, stream_index: int = 3) -> dict[str, Any]:
    """``zoo train`` → ``zoo eval --adaptive`` → ``zoo stream`` → save/load. Returns train's
    ``metrics`` and the text ``zoo stream`` printed (``stream``) for further checks.

    ``max_depth`` bounds adaptive depth (default one block past the depth: reused blocks run on);
    with a period above 1 it must be a whole number of periods."""
    max_depth = max_depth or depth + 1
    spec = workflow_spec(core, d_model=d_model, depth=depth, stacking=stacking, block=block)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    printed = _run(train_main, ["train", str(path), "-o", str(tmp_path / "run"), "--plain"])
    assert f"{DATASET}: test accuracy" in printed, printed
    metrics: dict[str, Any] = json.loads((tmp_path / "run" / "metrics.json").read_text(encoding="utf-8"))
    best = metrics["seeds"][0]
    shown = json.loads(_run(train_main, ["eval", best["model_dir"], "--adaptive", "--max-depth", str(max_depth),
                                         "--epsilon", "0.05"]))
    assert shown["fixed_depth"]["accuracy"] == best["test"]["accuracy"], (shown, best["test"])
    assert 1 <= shown["adaptive"]["min_depth"] <= shown["adaptive"]["max_depth"] <= max_depth, shown["adaptive"]
    streamed = _run(zoo_main, ["stream", str(path), "--dataset", DATASET, "--index", str(stream_index)])
    assert "agreement        : OK" in streamed, streamed
    model = build_model({k: v for k, v in spec.items() if k != "training"}, seed=1).eval()
    save_pretrained(model, tmp_path / "saved")
    again = load_pretrained(tmp_path / "saved").eval()
    x = torch.randn(2, 13, 12, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)
    return {"metrics": metrics, "stream": streamed}
