"""A pulled or local folder whose own files lie: config.json of the wrong types or naming a plugin
to install, a zoo-pull.json record claiming more than was compared, a FIFO where the record goes."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from zoo_core.hub import pull
from zoo_core.hub.create import check_plugins
from zoo_core.hub.errors import MissingPluginError
from zoo_core.hub.pulling import RECORD

ROOT = Path(__file__).resolve().parents[2]
TAG = ROOT / "pretrained" / "s4d-small.japanesevowels"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    dest = tmp_path / "m"
    shutil.copytree(TAG, dest)
    return dest


def _config(folder: Path, **change: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    core = dict(config["spec"]["model"]["core"])
    if "kind" in change:
        core["kind"] = change.pop("kind")
    config["spec"]["model"]["core"] = core
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("change", [{"kind": ["s4d"]}, {"kind": {"a": 1}}, {"kind": "nosuchcore", "versions": []},
                                    {"kind": "nosuchcore", "versions": "x"}])
def test_a_config_of_the_wrong_types_is_left_to_the_full_load_check_not_a_traceback(folder, change):
    _config(folder, **change)
    try:
        check_plugins(folder, where="m")
    except MissingPluginError:
        pass  # a clear refusal is fine; a TypeError/AttributeError traceback is not


def test_the_file_never_names_the_package_to_install(folder):
    _config(folder, kind="nosuchcore", versions={"zoo-core": "0", "evil-typosquat": "6.6.6"})
    with pytest.raises(MissingPluginError) as err:
        check_plugins(folder, where="m")
    assert "pip install" not in str(err.value) and "evil-typosquat" in str(err.value) and "unverified" in str(err.value)


def _record(folder: Path, **fields: object) -> None:
    from zoo_core.hub.catalogue import sha256_file

    files = {n: sha256_file(folder / n) for n in ("model.safetensors", "config.json", "README.md")}
    record = {"repo_id": "org/m", "commit": "a" * 40, "files": files, "verified": {n: "pin" for n in files}}
    record.update(fields)
    (folder / RECORD).write_text(json.dumps(record))


def test_a_record_claiming_a_file_verified_that_it_never_hashed_does_not_make_it_verified(folder):
    _record(folder)
    record = json.loads((folder / RECORD).read_text())
    del record["files"]["config.json"]  # claimed verified, but no recorded sha256 to compare with
    (folder / RECORD).write_text(json.dumps(record))
    got = pull(f"local-dir:{folder}")
    assert "config.json" not in got.verified and "config.json" in got.unverified
    assert set(got.verified) == {"model.safetensors", "README.md"}


def test_a_record_of_the_wrong_types_is_no_traceback(folder):
    _record(folder, files=["model.safetensors"], verified="all")
    got = pull(f"local-dir:{folder}")
    assert not got.verified and "model.safetensors" in got.unverified


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_fifo_where_the_record_goes_does_not_hang_the_load(folder):
    os.mkfifo(folder / RECORD)
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(pull(f"local-dir:{folder}")), daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # unblock the reader so the test process can end
        with open(folder / RECORD, "w"):
            pass
        pytest.fail("reading zoo-pull.json from a FIFO hung the load")
    assert done
