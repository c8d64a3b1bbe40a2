"""``zoo stream``: one real sequence through the parallel forward and through ``step``, compared.

SPEC is a spec (a model built from it, fresh weights from ``--seed``) or a saved model folder
(``save_pretrained``, e.g. a ``zoo train`` run's ``best/``: its trained weights)."""

from __future__ import annotations

from pathlib import Path

import torch

from .build import build_model, summary
from .datasets import BUNDLED_UEA, load_uea_bundled
from .errors import SpecError
from .factory import load_pretrained
from .spec import load_spec


def stream_demo(spec_path: str, *, dataset: str = "basicmotions", index: int = 0, seed: int = 0) -> int:
    # the specs spell a dataset as its source does (JapaneseVowels); the flag takes any case
    if dataset.lower() not in BUNDLED_UEA:
        raise SpecError(f"unknown dataset {dataset!r}; bundled: {', '.join(BUNDLED_UEA)}")
    dataset = dataset.lower()
    folder = Path(spec_path).is_dir()
    if folder:
        model = load_pretrained(spec_path).eval()
        spec = load_spec(model.spec)
    else:
        spec = load_spec(spec_path)
    channels = spec.envelope.input.channels
    if channels is None:
        raise SpecError(f"{spec_path}: this model reads tokens (input.vocab_size); {dataset} is a real-valued time series")
    X, y, lengths = load_uea_bundled(dataset, split="test")
    if X.shape[2] != channels:
        raise SpecError(f"{spec_path}: input.channels is {channels} but {dataset} has {X.shape[2]} channels")
    if not 0 <= index < len(X):
        raise SpecError(f"--index {index} is out of range: {dataset}'s test split has {len(X)} sequences (0..{len(X) - 1})")
    if not folder:
        model = build_model(spec, seed=seed).eval()
    x = torch.from_numpy(X[index : index + 1, : int(lengths[index])])  # (1, L, D): its valid steps, not the padding
    print(summary(model))
    print(f"\ninput: {dataset} test sequence {index}: length {x.shape[1]}, {x.shape[2]} channels, label {int(y[index])}")
    with torch.no_grad():
        parallel = model(x)  # (1, O)
        state = model.init_state(1)
        for t in range(x.shape[1]):
            streamed, state = model.step(x[:, t], state)
    diff = (parallel - streamed).abs().max().item()
    scale = parallel.abs().max().item()
    torch.set_printoptions(precision=6, sci_mode=False)
    print(f"parallel forward : {parallel[0]}")
    print(f"streamed (step)  : {streamed[0]}")
    print(f"max |difference| : {diff:.3e}  (relative {diff / max(scale, 1e-30):.3e})")
    tensors = state.flatten()
    state_numel = sum(v.numel() for v in tensors.values())
    grows = sorted({type(c).__name__ for c in model.cores() if (hp := getattr(c, "hparams", None)) is not None and hp.grows_state()})
    size = f"grows with sequence length ({', '.join(grows)}: a KV cache)" if grows else "independent of sequence length"
    print(f"streaming state  : {len(tensors)} tensors, {state_numel} numbers, {size}")
    ok = diff <= 1e-4 * max(scale, 1.0)
    print("agreement        : " + ("OK" if ok else "MISMATCH"))
    return 0 if ok else 1
