"""``zoo sweep``: run a sweep file's cells (locally or on Ray), list them, or render its report."""

from __future__ import annotations

import argparse
import fnmatch
from pathlib import Path
from typing import Any

from ..errors import ZooError
from ..train.progress import Progress
from .config import Cell, load_sweep
from .execute import command, payload
from .report import render_report
from .runner import run_sweep, split_done


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--workers takes a positive integer, not {text!r}")
    return n


def _report(args: argparse.Namespace) -> int:
    src = Path(args.sweep)
    keep: dict[str, str] | None = None
    if src.is_dir():
        results, out, title = src / "results.jsonl", src / "report", src.name
    else:
        sweep = load_sweep(src, output=args.output, validate=False)
        results, out, title = sweep.results, sweep.output / "report", sweep.name
        keep = {cell.key: cell.config_hash for cell in sweep.cells}  # rows of this sweep's cells, as they are now
    if not results.is_file():
        raise ZooError(f"no results to report: {results} does not exist (run `zoo sweep {args.sweep}` first)")
    md, pngs = render_report(results, Path(args.report_dir) if args.report_dir else out, title=title, keep=keep)
    print(md.read_text(encoding="utf-8"))
    print(f"report: {md}" + (f" (+ {len(pngs)} plot(s))" if pngs else ""))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.report:
        return _report(args)
    sweep = load_sweep(args.sweep, output=args.output)

    def only(cell: Cell) -> bool:
        return not args.only or any(fnmatch.fnmatch(cell.key, pat) for pat in args.only)

    if args.list:
        listed = [c for c in sweep.cells if only(c)]
        if args.missing:
            listed = split_done(sweep, listed, missing=True)[0]
        for cell in listed:
            print(f"{cell.key}\t{command(payload(sweep, cell))}")
        return 0
    summary = run_sweep(sweep, workers=args.workers, ray=args.ray, only=only, missing=args.missing,
                        progress=Progress(quiet=args.quiet, bar=False if args.plain else None))
    failed = summary.failed
    print(f"{sweep.name}: {summary.total} cells: {summary.skipped} finished before, {len(summary.rows) - len(failed)} "
          f"finished now, {len(failed)} failed; results: {sweep.results}")
    for r in failed:
        print(f"  failed: {r['key']}: {(r.get('error') or '').splitlines()[0]} (log: {sweep.output / r['run_dir'] / 'log.txt'})")
    print(f"tables and plots: zoo sweep --report {args.sweep}" + (f" -o {args.output}" if args.output else ""))
    return 1 if failed else 0


def register_cli(sub: Any) -> None:
    """Add ``sweep`` to the ``zoo`` subparsers."""
    s = sub.add_parser("sweep", help="run a grid of zoo train cells (specs × datasets × seeds × lrs), locally or on Ray",
                       description="Run SWEEP's cells, each a `zoo train` subprocess in its own folder, appending one "
                       "JSON line per cell to results.jsonl. Rerunning skips finished cells and resumes half-done ones.")
    s.add_argument("sweep", help="a sweep YAML (with --report: the YAML or its output folder)")
    s.add_argument("-o", "--output",
                   help="run folders and results.jsonl (default: the file's output: and results:, else runs/sweeps/<name>)")
    s.add_argument("--workers", type=_positive, help="cells at once (default: CPUs / the cells' num_cpus)")
    s.add_argument("--ray", metavar="ADDRESS", help="one Ray task per cell: 'auto' starts a local cluster "
                   "(--workers × num_cpus CPUs), or a running cluster's address (needs zoo-core[sweep-ray])")
    s.add_argument("--only", action="append", metavar="GLOB", help="only the cells whose key matches (repeatable)")
    s.add_argument("--missing", action="store_true",
                   help="only the cells results.jsonl has no finished row for, whether or not their run folders are here "
                   "(on a fresh clone: add new cells without training the committed ones again)")
    s.add_argument("--list", action="store_true",
                   help="print every cell's key and zoo train command (with --missing: those it would run), run nothing")
    s.add_argument("--report", action="store_true", help="render report.md and PNG plots from results.jsonl")
    s.add_argument("--report-dir", help="where --report writes (default: <output>/report)")
    s.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(fn=cmd_sweep)
