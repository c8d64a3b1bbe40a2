"""registry.yaml, model cards and plugin folders agree with each other and with the loader."""

from __future__ import annotations

from pathlib import Path

import yaml

from zoo_core.plugin_catalogue import plugin_owners
from zoo_core.plugins import get_registry

ROOT = Path(__file__).resolve().parents[1]


def _catalogue():
    return yaml.safe_load((ROOT / "registry.yaml").read_text())


def test_every_plugin_folder_is_catalogued_and_vice_versa():
    cat = _catalogue()
    folders = {p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file()}
    assert folders == set(cat["plugins"])
    for dist, entry in cat["plugins"].items():
        assert (ROOT / entry["path"] / "pyproject.toml").is_file()
        assert (ROOT / entry["card"]).is_file()


def test_install_hints_read_the_catalogue():
    cat = _catalogue()
    known = plugin_owners()
    expected = {core: dist for dist, entry in {**cat["plugins"], **cat["planned"]}.items() for core in entry["cores"]}
    assert known.owners == expected
    assert known.planned == frozenset(cat["planned"])


def test_install_hints_without_a_catalogue_name_nobody(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_REGISTRY", str(tmp_path / "missing.yaml"))
    assert plugin_owners().owners == {}


def test_every_registered_core_has_a_card_and_its_catalogue_entry():
    cat = _catalogue()
    for name, entry in get_registry().cores.items():
        assert (ROOT / "model_cards" / f"{name}.md").is_file(), name
        assert name in cat["plugins"][entry.provider.dist]["cores"]

