"""Integrity of pulled weights behind a mirror that is not the Hub.

A mirror or proxy may answer ETags that are no content hash we can check (an md5, a weak
``W/"…"`` validator, a hex digest of another length) or none at all. A flipped byte must then be
refused and evicted wherever a sha256 we trust exists (a registry pin, the paths-info API's LFS
sha256), and reported ``unverified`` (refused under ``--require-verified`` /
``ZOO_HUB_REQUIRE_VERIFIED=1``) where none does, through ``zoo pull``, ``--local-dir`` and
``create_model``, and again on an offline re-load from what the pull left behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch

from zoo_core.errors import CheckpointError, ZooError
from zoo_core.hub import create_model, pull, pull_hub, push_to_hub

WEIGHTS_GET = r"^/cdn-lfs/"  # the LFS bytes, served from the second host name
FORMS = ["md5", "weak", "sha512"]  # ETags that are neither a sha256 nor a git sha1


@pytest.fixture
def repo(hub, make_model):
    """org/f holding a tiny model; returns the weights' true sha256."""
    push_to_hub(make_model(0), "org/f")
    sha = next(f.sha256 for f in hub.repos["org/f"].commits[hub.head("org/f")].files.values() if f.sha256)
    hub.clear()
    return sha


def _blobs(hf_home: Path) -> list[Path]:
    return [b for b in (hf_home / "hub").glob("models--org--f/blobs/*") if not b.name.endswith(".incomplete")]


def _bad_blobs(hf_home: Path, sha: str, size: int) -> list[str]:
    """Blobs of the weights' size whose content is not the weights: what a flipped byte leaves."""
    return [b.name for b in _blobs(hf_home) if b.stat().st_size == size and hashlib.sha256(b.read_bytes()).hexdigest() != sha]


def _size(hub, sha: str) -> int:
    return len(hub.lfs[sha])


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _offline_local_dir_pulls() -> bool:
    """Clients < 1.0 look only in the cache when offline, even with ``local_dir`` (the folder is then read as local-dir:)."""
    import huggingface_hub

    return int(huggingface_hub.__version__.split(".")[0]) >= 1


# a sha256 we trust exists: refused and evicted -----------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_flipped_byte_is_evicted_and_downloaded_again_via_paths_info(hub, repo, hf_home, form, caplog):
    hub.mirror(etag=form)
    fault = hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET)
    with caplog.at_level(logging.WARNING, logger="zoo_core.hub"):
        got = pull("hf-hub:org/f")
    assert fault.hits == 1 and "removed from the cache" in caplog.text
    assert got.unverified == [] and got.files["model.safetensors"] == repo
    assert _bad_blobs(hf_home, repo, _size(hub, repo)) == []


@pytest.mark.parametrize("form", FORMS)
def test_flipped_byte_every_time_is_refused_and_never_served_offline(hub, repo, hf_home, form, monkeypatch, cli):
    hub.mirror(etag=form)
    hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET, times=None)
    with pytest.raises(CheckpointError, match="removed from the cache"):
        pull("hf-hub:org/f")
    assert _bad_blobs(hf_home, repo, _size(hub, repo)) == []
    done = cli("pull", "hf-hub:org/f")
    assert done.returncode == 3 and "verified" not in done.stdout and "Traceback" not in done.stderr
    assert _bad_blobs(hf_home, repo, _size(hub, repo)) == []
    _offline(monkeypatch)
    with pytest.raises(ZooError):
        pull("hf-hub:org/f")  # nothing bad was left for the offline load to serve


@pytest.mark.parametrize("form", FORMS)
def test_flipped_byte_against_a_registry_pin_is_refused_without_paths_info(hub, repo, hf_home, form):
    hub.mirror(etag=form, paths_info=False)
    hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET, times=None)
    with pytest.raises(CheckpointError, match="registry.yaml pins"):
        pull_hub("org/f", pins={"model.safetensors": repo})
    assert _bad_blobs(hf_home, repo, _size(hub, repo)) == []


def test_the_sha256_learnt_online_checks_an_offline_reload(hub, repo, hf_home, monkeypatch):
    hub.mirror(etag="md5")
    assert pull("hf-hub:org/f").unverified == []
    blob = next(b for b in _blobs(hf_home) if b.stat().st_size == _size(hub, repo))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))  # bit rot after a good download, under a name that is no sha256
    _offline(monkeypatch)
    hub.clear()
    with pytest.raises(CheckpointError, match="go online"):
        pull("hf-hub:org/f")
    assert not blob.exists() and hub.requests == []


# no sha256 we trust: reported unverified, refused when strict ---------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_no_trustworthy_hash_is_reported_unverified_and_refused_when_strict(hub, repo, hf_home, form, cli, monkeypatch):
    hub.mirror(etag=form, paths_info=False)
    hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET, times=None)
    done = cli("pull", "hf-hub:org/f")
    assert done.returncode == 0, done.stderr
    assert "unverified" in done.stdout and "verified against" not in done.stdout and "model.safetensors" in done.stdout
    got = pull("hf-hub:org/f")
    assert "model.safetensors" in got.unverified
    assert json.loads(cli("pull", "hf-hub:org/f", "--json").stdout)["unverified"] == got.unverified
    strict = cli("pull", "hf-hub:org/f", "--require-verified")
    assert strict.returncode == 3 and "could not be verified" in strict.stderr and "Traceback" not in strict.stderr
    assert cli("pull", "hf-hub:org/f", env={"ZOO_HUB_REQUIRE_VERIFIED": "1"}).returncode == 3
    with pytest.raises(CheckpointError, match="could not be verified"):
        pull("hf-hub:org/f", require_verified=True)
    # offline, the cache must not make the unverified blob look verified
    _offline(monkeypatch)
    hub.clear()
    again = pull("hf-hub:org/f")
    assert "model.safetensors" in again.unverified and hub.requests == []
    offline = cli("pull", "hf-hub:org/f")
    assert offline.returncode == 0 and "unverified" in offline.stdout and "verified against" not in offline.stdout
    assert cli("pull", "hf-hub:org/f", "--require-verified").returncode == 3
    monkeypatch.setenv("ZOO_HUB_REQUIRE_VERIFIED", "1")
    with pytest.raises(CheckpointError, match="could not be verified"):
        create_model("hf-hub:org/f")


def test_the_real_hubs_hashes_still_verify(hub, repo, cli):
    done = cli("pull", "hf-hub:org/f")
    assert done.returncode == 0 and "verified against the LFS sha256 the Hub announced" in done.stdout
    assert pull("hf-hub:org/f").unverified == []


def test_no_etag_at_all_is_refused_clearly(hub, repo, hf_home, cli):
    hub.mirror(etag="none")
    with pytest.raises(ZooError, match="ETag"):
        pull("hf-hub:org/f")
    done = cli("pull", "hf-hub:org/f")
    assert done.returncode == 2 and "ETag" in done.stderr and "HF_ENDPOINT" in done.stderr and "Traceback" not in done.stderr
    assert not list((hf_home / "hub").glob("models--org--f/snapshots/*/model.safetensors"))


# --local-dir ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_local_dir_flipped_byte_is_refused_and_removed(hub, repo, tmp_path, form):
    hub.mirror(etag=form)
    hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET, times=None)
    with pytest.raises(CheckpointError, match="removed"):
        pull("hf-hub:org/f", local_dir=tmp_path / "m")
    assert not (tmp_path / "m" / "model.safetensors").exists()


@pytest.mark.parametrize("form", FORMS)
def test_local_dir_without_a_trustworthy_hash_is_unverified_then_and_later(hub, repo, tmp_path, form, cli, monkeypatch):
    hub.mirror(etag=form, paths_info=False)
    hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET, times=None)
    target = tmp_path / "m"
    done = cli("pull", "hf-hub:org/f", "--local-dir", str(target))
    assert done.returncode == 0 and "unverified" in done.stdout and "verified against" not in done.stdout
    record = json.loads((target / "zoo-pull.json").read_text())
    assert "model.safetensors" in record["unverified"]
    assert "model.safetensors" in pull(f"local-dir:{target}").unverified
    assert cli("pull", f"local-dir:{target}", "--require-verified").returncode == 3
    _offline(monkeypatch)
    hub.clear()
    assert "model.safetensors" in pull(f"local-dir:{target}").unverified
    if _offline_local_dir_pulls():
        assert "model.safetensors" in pull("hf-hub:org/f", local_dir=target).unverified
        assert cli("pull", "hf-hub:org/f", "--local-dir", str(target), "--require-verified").returncode == 3
    assert hub.requests == []


def test_local_dir_offline_reload_keeps_what_was_verified(hub, repo, tmp_path, monkeypatch):
    hub.mirror(etag="md5")
    target = tmp_path / "m"
    assert pull("hf-hub:org/f", local_dir=target).unverified == []
    _offline(monkeypatch)
    hub.clear()
    assert pull(f"local-dir:{target}").unverified == []
    if _offline_local_dir_pulls():
        assert pull("hf-hub:org/f", local_dir=target).unverified == []


# create_model -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_create_model_refuses_a_flipped_byte(hub, repo, hf_home, form):
    hub.mirror(etag=form)
    hub.add_fault("corrupt", method="GET", path=WEIGHTS_GET, times=None)
    with pytest.raises(CheckpointError):
        create_model("hf-hub:org/f")
    assert _bad_blobs(hf_home, repo, _size(hub, repo)) == []


def test_create_model_without_a_trustworthy_hash_warns_and_strict_refuses(hub, repo, hf_home, caplog, monkeypatch):
    hub.mirror(etag="md5", paths_info=False)
    with caplog.at_level(logging.WARNING, logger="zoo_core.hub"):
        model = create_model("hf-hub:org/f")
    assert isinstance(model, torch.nn.Module) and "unverified" in caplog.text
    with pytest.raises(CheckpointError, match="could not be verified"):
        create_model("hf-hub:org/f", require_verified=True)
