"""Model references in timm's grammar.

- ``arch``: a pretrained architecture from the catalogue (``registry.yaml``); its default tag.
- ``arch.tag``: one set of trained weights from the catalogue, e.g. ``lru-uea.heartbeat``.
- ``hf-hub:org/name`` or ``hf-hub:org/name@revision``: a Hub repo at a branch, tag or commit sha.
- ``local-dir:path``: a folder written by ``save_pretrained`` (or pulled with ``--local-dir``).

A bare ``org/name`` is ambiguous (a Hub repo or a relative folder?) and is refused with both
corrected spellings, as timm does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import HubError

HUB_PREFIX = "hf-hub:"
LOCAL_PREFIX = "local-dir:"

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_ARCH = re.compile(r"[a-z0-9][a-z0-9_-]*")
_TAG = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")


@dataclass(frozen=True)
class ModelRef:
    """A parsed reference. ``kind`` is one of ``arch``, ``tag``, ``hub``, ``local``."""

    kind: str
    text: str
    arch: str | None = None
    tag: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    path: Path | None = None

    @property
    def name(self) -> str | None:
        """``arch.tag`` for catalogue references (``arch`` alone when no tag was given)."""
        if self.arch is None:
            return None
        return f"{self.arch}.{self.tag}" if self.tag else self.arch


def check_repo_id(repo_id: str) -> str:
    """Refuse repo ids the Hub would refuse: ``org/name`` with letters, digits, ``.``, ``_``, ``-``."""
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id or "--" in repo_id or repo_id.endswith((".", ".git")):
        raise HubError(
            f"{repo_id!r} is not a Hub repo id: write it as org/name (letters, digits, '.', '_', '-'; "
            "no '..' or '--'; at most 96 characters per part)"
        )
    return repo_id


def check_revision(revision: str) -> str:
    """A branch, tag or commit sha: no spaces, no '..', no leading '-' or '/'."""
    if not _REVISION.fullmatch(revision) or ".." in revision or revision.endswith(("/", ".lock")):
        raise HubError(f"{revision!r} is not a valid revision: use a branch, a tag or a 40-character commit sha")
    return revision


def parse_ref(text: str, *, revision: str | None = None) -> ModelRef:
    """Parse a model reference; ``revision`` (if given) applies to ``hf-hub:`` references.

    Raises:
        HubError: the reference is malformed, a bare ``org/name``, or names two revisions.
    """
    if not isinstance(text, str) or not text.strip():
        raise HubError("empty model reference: name an arch, arch.tag, hf-hub:org/name[@revision] or local-dir:path")
    text = text.strip()
    if text.startswith(HUB_PREFIX):
        body = text[len(HUB_PREFIX) :]
        repo_id, sep, rev = body.partition("@")
        if sep and not rev:
            raise HubError(f"{text!r}: nothing after '@'; write hf-hub:{repo_id}@<branch, tag or commit sha>")
        if rev and revision and rev != revision:
            raise HubError(f"{text!r} names revision {rev!r} but revision={revision!r} was also given; keep one")
        chosen = rev or revision
        return ModelRef("hub", text, repo_id=check_repo_id(repo_id), revision=check_revision(chosen) if chosen else None)
    if text.startswith(LOCAL_PREFIX):
        path = text[len(LOCAL_PREFIX) :]
        if not path:
            raise HubError("local-dir: needs a folder, e.g. local-dir:./my-model")
        return ModelRef("local", text, path=Path(path).expanduser())
    if "/" in text or "\\" in text or "@" in text:
        stem = text.split("@")[0]
        raise HubError(
            f"{text!r} is ambiguous: write hf-hub:{text} for a repo on the Hugging Face Hub, "
            f"or local-dir:{stem} for a folder on this machine"
        )
    arch, _, tag = text.partition(".")
    if not _ARCH.fullmatch(arch) or (tag and not _TAG.fullmatch(tag)):
        raise HubError(
            f"{text!r} is not a model name: use arch or arch.tag (lowercase letters, digits, '-', '_'), "
            "hf-hub:org/name[@revision] or local-dir:path"
        )
    if revision is not None:
        raise HubError(f"{text!r} is a catalogue name pinned by registry.yaml; revision= applies only to hf-hub: references")
    return ModelRef("tag" if tag else "arch", text, arch=arch, tag=tag or None)
