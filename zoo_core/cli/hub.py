"""``zoo push`` / ``zoo pull`` (flag names as ``hf upload`` / ``hf download``), and the pieces of
``zoo list --pretrained`` and ``zoo info arch.tag``.

``register_cli(subparsers)`` adds push and pull to the ``zoo`` parser; ``cmd_list_pretrained`` and
``cmd_info_pretrained`` are what ``zoo list --pretrained`` and ``zoo info NAME`` call for catalogue
names. ``python -m zoo_core.cli.hub`` runs the same commands on their own.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..hub.catalogue import load_catalogue
from ..hub.pulling import pull
from ..hub.pushing import push_to_hub
from .runner import run

if TYPE_CHECKING:
    from ..hub.pulling import PullResult


def cmd_push(args: argparse.Namespace) -> int:
    res = push_to_hub(args.directory, args.repo_id, revision=args.revision, private=True if args.private else None,
                      commit_message=args.commit_message, create_pr=args.create_pr)
    if getattr(args, "json", False):
        print(json.dumps(res.__dict__, indent=2))
        return 0
    print(f"pushed {', '.join(sorted(res.files))} to {res.repo_id} ({res.revision})")
    print(f"commit: {res.commit}" + (f"\npull request: {res.pr_url}" if res.pr_url else ""))
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    res = pull(args.ref, revision=args.revision, cache_dir=args.cache_dir, local_dir=args.local_dir,
               force_download=args.force_download, source=args.source, require_verified=args.require_verified or None)
    if args.json:
        print(json.dumps(res.to_json(), indent=2, sort_keys=True))
        return 0
    where = f"{res.repo_id}@{res.commit}" if res.commit else res.source
    print(f"{res.ref}: {where} ({len(res.files)} files, {_check_text(res)})")
    print(res.path)
    return 0


def _check_text(res: PullResult) -> str:
    """How the files were checked, in words; never "verified" for a file nothing vouched for."""
    if res.unverified:
        return f"unverified: {', '.join(res.unverified)} (nothing trusted vouches for their content; see the warning)"
    if res.pinned:
        return "sha256 matches registry.yaml's pins"
    if res.source == "hub" or res.verified:
        how = sorted(set(res.verified.values()))
        return "verified against " + ("; ".join(how) if how else "the Hub's hashes")
    return "read from a local folder"


def register_cli(subparsers: Any) -> None:
    """Add ``push`` and ``pull`` to the ``zoo`` sub-command parser."""
    s = subparsers.add_parser("push", help="publish a saved model folder to the Hugging Face Hub (as `hf upload`)")
    s.add_argument("directory", help="a folder written by save_pretrained / zoo build -o")
    s.add_argument("repo_id", help="the Hub repo, org/name (created if missing)")
    s.add_argument("--revision", help="branch to commit to (created from main if missing)")
    s.add_argument("--private", action="store_true", help="create the repo private (no effect on an existing repo)")
    s.add_argument("--commit-message", help="the commit's summary")
    s.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_push)
    s = subparsers.add_parser("pull", help="download a pretrained model into the HF cache and verify it (as `hf download`)")
    s.add_argument("ref", help="arch.tag, hf-hub:org/name[@revision] or local-dir:path")
    s.add_argument("--revision", help="branch, tag or commit sha (hf-hub: references)")
    s.add_argument("--cache-dir", help="HF cache folder (default: HF_HUB_CACHE)")
    s.add_argument("--local-dir", help="copy the files into this folder instead of the cache view")
    s.add_argument("--force-download", action="store_true", help="download again even if cached")
    s.add_argument("--source", choices=("auto", "hub", "bundled"), default="auto",
                   help="for catalogue names: the bundled copy, the Hub, or whichever is there (auto)")
    s.add_argument("--require-verified", action="store_true",
                   help="refuse files no trusted sha256 vouches for (as ZOO_HUB_REQUIRE_VERIFIED=1); exit 3")
    s.add_argument("--json", action="store_true", help="print the record: commit sha, path, sha256 per file, unverified files")
    s.set_defaults(fn=cmd_pull)


def list_pretrained_rows(pattern: str = "*", *, path: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``zoo list --pretrained``: one per catalogued ``arch.tag`` matching ``pattern``."""
    return [e.row() for e in load_catalogue(path).filter(pattern)]


def cmd_list_pretrained(args: argparse.Namespace) -> int:
    rows = list_pretrained_rows(getattr(args, "pattern", "*") or "*")
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no pretrained weights are catalogued yet (registry.yaml: pretrained)")
    for r in rows:
        metric = ", ".join(f"{m['metric']} {m['value']:.4g} ({m['dataset']} {m['split']})" for m in r["metrics"][:2])
        where = r["hub"] or "bundled only"
        print(f"  {r['name']:<32}{r['core'] or '?':<10}{where:<40}{metric}")
    return 0


def info_pretrained(name: str, *, path: str | None = None) -> dict[str, Any]:
    """Everything the catalogue knows about ``arch.tag`` (or ``arch``'s default tag)."""
    e = load_catalogue(path).get(name)
    return {**e.row(), "kind": "pretrained", "spec": e.spec, "files": e.files, "card": str(e.card) if e.card else None,
            "datasets": list(e.datasets), "description": e.description}


def cmd_info_pretrained(args: argparse.Namespace) -> int:
    info = info_pretrained(args.name)
    if getattr(args, "json", False):
        print(json.dumps(info, indent=2, default=str))
        return 0
    for key, value in info.items():
        text = json.dumps(value, indent=2, default=str) if isinstance(value, (dict, list)) else str(value)
        print(f"{key}: {text}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m zoo_core.cli.hub {push,pull} ...``: the same exit codes as ``zoo``."""
    parser = argparse.ArgumentParser(prog="zoo", description="SSM Zoo: push and pull pretrained models.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_cli(sub)
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
