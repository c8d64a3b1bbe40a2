"""``push_to_hub``: stage a model or a saved folder (weights, config, card), check it loads, publish it."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .card import render_card
from .catalogue import sha256_file
from .client import CARD, CONFIG, IMAGES, PUSHED, _cache_dir, _progress_bars, _retrying, _translate, retry_settings
from .errors import HubError
from .refs import check_repo_id, check_revision


@dataclass
class PushResult:
    """What a push created: the commit (or the pull request) on the Hub."""

    repo_id: str
    commit: str | None
    commit_url: str | None
    revision: str
    pr_url: str | None = None
    files: dict[str, str] = field(default_factory=dict)


# pushing -----------------------------------------------------------------------------------------
def _stage(model_or_dir: Any, staging: Path, repo_id: str) -> dict[str, str]:
    """Write what will be pushed into ``staging``; returns sha256 per file."""
    from ..io.pretrained import read_folder, save_pretrained  # lazy: keeps safetensors, torch out of api

    if isinstance(model_or_dir, (str, os.PathLike)):
        src = Path(model_or_dir)
        if not src.is_dir():
            raise HubError(f"{src} is not a folder; push a folder written by save_pretrained, or a model")
    else:
        src = staging.parent / "saved"
        save_pretrained(model_or_dir, src)
    _check_loadable(src)  # never publish weights that would not load: before anything is uploaded
    tensors, info = read_folder(src)
    staging.mkdir()
    for name in os.listdir(src):
        if name in PUSHED or name.endswith(IMAGES):
            shutil.copyfile(src / name, staging / name)
    if not (staging / CONFIG).is_file():
        raise HubError(f"{src} has no {CONFIG}; save it again with save_pretrained (Hub tooling reads config.json)")
    if not (staging / CARD).is_file():
        card = render_card(name=repo_id.split("/")[1], spec=info["spec"], versions=info["versions"], repo_id=repo_id,
                           num_params=sum(int(t.numel()) for t in tensors.values()))
        (staging / CARD).write_text(card, encoding="utf-8")
    return {n: sha256_file(staging / n) for n in sorted(os.listdir(staging))}


def _check_loadable(folder: Path) -> None:
    """The full load check of ``zoo_core.factory.check_folder`` (metadata, header, a meta-device build).

    Why: a folder whose stored spec is a string, is far larger than its tensors or has metadata of
    the wrong types would be published and then fail for everyone who pulls it.
    """
    from ..factory import check_folder  # lazy: keeps safetensors, torch out of api

    check_folder(folder)


def push_to_hub(model_or_dir: Any, repo_id: str, *, revision: str | None = None, private: bool | None = None,
                commit_message: str | None = None, create_pr: bool = False, token: str | None = None) -> PushResult:
    """Publish a model (or a saved folder) as one commit: ``model.safetensors``, ``config.json``, ``README.md``.

    The folder is checked strictly first (weights that would not load are never published). A
    missing ``README.md`` is generated with ``render_card``. ``revision`` names a branch, created
    from ``main`` if missing; ``create_pr`` opens a pull request against it instead of committing.
    """
    from huggingface_hub import HfApi, get_token

    check_repo_id(repo_id)
    branch = check_revision(revision) if revision else "main"
    retry_settings()  # a bad ZOO_HUB_* value is a usage error before any request
    token = token or get_token()
    if not token:
        raise HubError("pushing needs a Hub token with write access: set HF_TOKEN, pass token=, or run `hf auth login`")
    with tempfile.TemporaryDirectory(prefix="zoo-push-") as tmp:
        staging = Path(tmp) / "push"
        files = _stage(model_or_dir, staging, repo_id)
        api = HfApi(token=token)
        try:
            # private=None is create_repo's default: public unless the organisation defaults to private
            _retrying(lambda: api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True), f"creating {repo_id}")
            if branch != "main":
                _retrying(lambda: api.create_branch(repo_id, branch=branch, exist_ok=True), f"creating branch {branch}")
            message = commit_message or f"Upload {repo_id.split('/')[1]} with SSM Zoo"
            with _progress_bars():  # a retried commit whose first try landed is a no-op: the client skips unchanged files
                info = _retrying(lambda: api.upload_folder(repo_id=repo_id, folder_path=str(staging), revision=branch,
                                                           create_pr=create_pr, commit_message=message), f"pushing to {repo_id}")
        except Exception as exc:
            raise _translate(exc, repo_id=repo_id, revision=branch, offline=False, cache_dir=_cache_dir(None), token=token) from exc
    return PushResult(repo_id, getattr(info, "oid", None), getattr(info, "commit_url", None), branch,
                      getattr(info, "pr_url", None), files)
