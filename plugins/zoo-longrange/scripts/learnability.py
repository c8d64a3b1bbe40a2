"""A short learnability check: does a small model pick a long-range task up at all in one CPU epoch?

    python plugins/zoo-longrange/scripts/learnability.py sMNIST --train 6000 --test 1000

Trains the example spec for the dataset's task (``specs/s4d-smnist.yaml`` for sMNIST/psMNIST,
``specs/s4d-pathfinder.yaml`` for Pathfinder, ``specs/s4d-listops.yaml`` for ListOps) on the first
``--train`` sequences of the train split for ``--epochs`` epochs with AdamW (the spec's lr and
weight decay), one thread, and prints the accuracy on the first ``--test`` test sequences beside
chance. It is a sanity check of the data (a broken generator or loader stays at chance), not a
benchmark: ``zoo train`` / ``zoo sweep`` produce the numbers.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from zoo_core import build_model
from zoo_core.datasets import get_dataset
from zoo_core.spec import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", help="sMNIST, psMNIST, Pathfinder32-6, ListOps, ...")
    ap.add_argument("--train", type=int, default=6000)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = get_dataset(args.dataset)
    family = "listops" if ds.info.vocab_size else "pathfinder" if ds.info.classes == 2 else "smnist"
    spec = SPECS / f"s4d-{family}.yaml"
    tr, te = ds.load("train"), ds.load("test")
    n, m = min(args.train, len(tr)), min(args.test, len(te))
    X, y = torch.from_numpy(tr.X[:n]), torch.from_numpy(tr.y[:n])
    L = None if tr.lengths is None else torch.from_numpy(tr.lengths[:n])
    Xt, yt = torch.from_numpy(te.X[:m]), torch.from_numpy(te.y[:m])
    Lt = None if te.lengths is None else torch.from_numpy(te.lengths[:m])
    model = build_model(spec, seed=0)
    training = load_spec(spec).envelope.training
    opt = torch.optim.AdamW(model.parameters(), lr=float(training.lr), weight_decay=training.weight_decay)
    start = time.time()
    for _ in range(args.epochs):
        model.train()
        for idx in torch.randperm(n).split(args.batch_size):
            logits = model(X[idx]) if L is None else model(X[idx], lengths=L[idx])
            loss = torch.nn.functional.cross_entropy(logits, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for idx in torch.arange(m).split(250):
            logits = model(Xt[idx]) if Lt is None else model(Xt[idx], lengths=Lt[idx])
            correct += int((logits.argmax(-1) == yt[idx]).sum())
    chance = float(torch.bincount(yt).max()) / m
    print(f"{args.dataset}: {spec.name}, {args.epochs} epoch(s) on {n} sequences: test accuracy {correct / m:.3f} on {m} "
          f"(majority class {chance:.3f}); {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
