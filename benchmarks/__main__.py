"""``python -m benchmarks list | run | report | child``: the harness's one command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.harness import ROOT


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="families, their implementations and default sizes")
    ls.add_argument("pattern", nargs="?", default="*", help="a family glob ('s4d/*') or a core name ('s5')")
    r = sub.add_parser("run", help="check, time and measure the families matching PATTERN")
    r.add_argument("patterns", nargs="+", metavar="PATTERN")
    r.add_argument("--L", type=int, nargs="+", default=None, help="lengths (default: the family's)")
    r.add_argument("--B", type=int, nargs="+", default=None, help="batch sizes (default: the family's)")
    r.add_argument("--H", type=int, default=None, help="channels d_model")
    r.add_argument("--N", type=int, default=None, help="state size d_state")
    r.add_argument("--modes", nargs="+", default=None, help="fwd, fwdbwd (default: the family's)")
    r.add_argument("--impls", nargs="+", default=None, metavar="GLOB",
                   help="implementations to run (globs; default: the family's defaults)")
    r.add_argument("--repeats", type=int, default=5)
    r.add_argument("--quiet-wait", type=float, default=30.0,
                   help="seconds each table waits at most for a quiet machine (< 0.25 foreign cores)")
    r.add_argument("--round-wait", type=float, default=0.0, help="and each round (0: per table only)")
    r.add_argument("--threads", type=int, default=None, help="intra-op threads (default: the family's, else 2)")
    r.add_argument("--max-call-s", type=float, default=60.0, help="skip a call predicted to take longer")
    r.add_argument("--slow-call-s", type=float, default=8.0,
                   help="a call predicted to take longer is timed in the first --slow-repeats rounds only")
    r.add_argument("--slow-repeats", type=int, default=2)
    r.add_argument("--max-mem-gib", type=float, default=12.0,
                   help="skip a call whose peak, extrapolated from a shorter L, would exceed this")
    r.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak-memory rows")
    r.add_argument("--no-check", action="store_true", help="skip the agreement check (not for published rows)")
    r.add_argument("--profile", action="store_true", help="record torch.profiler's top operators instead of timing")
    r.add_argument("--out", type=Path, default=ROOT / "build" / "bench.jsonl",
                   help="JSONL to append to (default: a git-ignored scratch file; the reports read "
                        "benchmarks/results/<name>.jsonl)")
    rep = sub.add_parser("report", help="render benchmarks/REPORT*.md from their results")
    rep.add_argument("name", nargs="?", default=None, help="REPORT.md, REPORT_S4.md, ... (default: all)")
    rep.add_argument("--results", type=Path, default=None, help="read this JSONL instead of the report's own")
    rep.add_argument("--out", type=Path, default=None, help="write here instead of benchmarks/NAME")
    child = sub.add_parser("child", help=argparse.SUPPRESS)
    child.add_argument("spec")
    return p.parse_args(argv)


def cmd_list(pattern: str) -> int:
    from benchmarks.catalog import select

    fams = select(pattern)
    if not fams:
        print(f"no benchmark family matches {pattern!r}; `python -m benchmarks list` shows them all", file=sys.stderr)
        return 2
    for f in fams:
        sizes = ", ".join(f"{k}={v}" for k, v in f.sizes.items() if v)
        batch = f"B={list(f.batches)}" if f.batches else ("B=16384//L" if f.batch_for else "")
        print(f"{f.name}  [{f.kind} -> {f.report}]  L={list(f.lengths)} {batch} {sizes}; modes {', '.join(f.modes)}")
        if f.doc:
            print(f"    {f.doc}")
        try:
            impls = f.impls()
        except Exception as exc:  # a broken plugin costs only its own family in the listing
            print(f"    unavailable: {type(exc).__name__}: {exc}")
            continue
        default = {i.name for i in f.chosen(None)}
        for i in impls:
            why = i.unavailable()
            tags = [i.origin] + (["default"] if i.name in default else []) + ([f"unavailable: {why}"] if why else [])
            print(f"    - {i.name}  ({', '.join(tags)})")
        if not impls and f.extra.get("needs"):
            print(f"    (nothing to run yet: {f.extra['needs']})")
    return 0


def cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    from benchmarks.catalog import select
    from benchmarks.runner import Options, run

    fams = [f for p in args.patterns for f in select(p)]
    if not fams:
        print(f"no benchmark family matches {args.patterns}; `python -m benchmarks list` shows them all",
              file=sys.stderr)
        return 2
    run(fams, Options(lengths=args.L, batches=args.B, H=args.H, N=args.N, modes=args.modes, impls=args.impls,
                      repeats=args.repeats, quiet_wait=args.quiet_wait, round_wait=args.round_wait,
                      threads=args.threads, memory=not args.no_memory, check=not args.no_check,
                      profile=args.profile, max_call_s=args.max_call_s, slow_call_s=args.slow_call_s,
                      slow_repeats=args.slow_repeats, max_mem_gib=args.max_mem_gib, out=args.out, argv=argv))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from benchmarks.render import REPORTS, write

    names = [args.name] if args.name else list(REPORTS)
    unknown = [n for n in names if n not in REPORTS]
    if unknown:
        print(f"no report {unknown[0]!r}; reports: {', '.join(REPORTS)}", file=sys.stderr)
        return 2
    for name in names:
        dest = write(name, args.results, args.out)
        print(f"wrote {dest}" if dest else f"{name}: no results yet (benchmarks/results/{REPORTS[name].results}); "
              "run its commands first")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.cmd == "list":
        return cmd_list(args.pattern)
    if args.cmd == "run":
        return cmd_run(args, argv)
    if args.cmd == "report":
        return cmd_report(args)
    from benchmarks.runner import memory_child

    print(json.dumps(memory_child(json.loads(args.spec))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
