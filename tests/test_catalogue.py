"""registry.yaml, model cards and plugin folders agree with each other and with the loader."""

from __future__ import annotations

from pathlib import Path

import yaml

from zoo_core.plugins import get_registry
from zoo_core.registry import KNOWN_PLUGINS

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


def test_install_hints_match_the_catalogue():
    cat = _catalogue()
    for dist, entry in {**cat["plugins"], **cat["planned"]}.items():
        for core in entry["cores"]:
            assert KNOWN_PLUGINS[core] == dist


def test_every_registered_core_has_a_card_and_its_catalogue_entry():
    cat = _catalogue()
    for name, entry in get_registry().cores.items():
        assert (ROOT / "model_cards" / f"{name}.md").is_file(), name
        assert name in cat["plugins"][entry.provider.dist]["cores"]

