"""Is a Pathfinder set learnable at this size, and how long is its plateau? A small CNN, outside the zoo.

    python -m benchmarks.tasks.pathfinder_probe Pathfinder32-6 --epochs 12

Every sequence model in `benchmarks/tasks/sweeps/pathfinder.yaml` sat at exactly 50 % validation accuracy
(a constant prediction) for the first epochs at difficulty 14. This probe separates "the data carries
no learnable signal at 8,000 images" from "the models have not left the plateau yet": a 4-layer CNN that
sees the image as an image (no 1,024-step memory needed), Adam at 1e-3, batch 64, one thread. It prints
the validation accuracy after every epoch. Measured on 2026-12-03 (`benchmarks/tasks/reading/pathfinder.md`).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.datasets import get_dataset


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(64, 2),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tasks.pathfinder_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", help="a registered Pathfinder set, e.g. Pathfinder32-6 or Pathfinder32-14")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    ds = get_dataset(a.dataset)

    def images(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        d = ds.load(split)
        side = int(round(d.X.shape[1] ** 0.5))
        return torch.as_tensor(d.X).float().reshape(-1, 1, side, side), torch.as_tensor(d.y).long()

    (xt, yt), (xv, yv) = images("train"), images("val")
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    for epoch in range(1, a.epochs + 1):
        model.train()
        for idx in torch.randperm(len(xt)).split(64):
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            acc = (model(xv).argmax(-1) == yv).float().mean().item()
        print(f"epoch {epoch}: validation accuracy {acc:.3f}  ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
