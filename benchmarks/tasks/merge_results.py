"""Merge sweep results run elsewhere (``benchmarks/tasks/device_sweep.sh`` on a GPU machine, a colleague's
machine) into a local results JSONL: every finished cell of RETURNED whose key LOCAL does not hold yet is
appended, as it is; cells LOCAL already holds are kept and reported when the two disagree on settings.

    python -m benchmarks.tasks.merge_results RETURNED.jsonl benchmarks/tasks/results/pathfinder.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zoo_core.sweep.results import append, latest, read_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("returned", type=Path)
    p.add_argument("local", type=Path)
    a = p.parse_args(argv)
    have = {k: r for k, r in latest(a.local).items() if r.get("status") == "ok"}
    new = []
    for r in read_rows(a.returned):
        if r.get("status") != "ok":
            continue
        if r["key"] in have:
            if have[r["key"]].get("config_hash") != r.get("config_hash"):
                print(f"kept the local {r['key']}: the returned one ran other settings ({r.get('config_hash')})")
            continue
        new.append(r)
        have[r["key"]] = r
    for r in new:  # the sweep's own append: fsynced, and mends a line a killed writer left unfinished
        append(a.local, r)
        print(f"added {r['key']}: test {r.get('metric')} {r['test'].get(r.get('metric'))} on {r.get('device')} ({r.get('host')})")
    print(f"{len(new)} cell(s) added to {a.local}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
