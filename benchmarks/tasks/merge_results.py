"""Merge sweep results run elsewhere (``benchmarks/tasks/device_sweep.sh`` on a GPU machine, a colleague's
machine) into a local results JSONL: every finished cell of RETURNED whose key LOCAL does not hold yet is
appended, as it is; cells LOCAL already holds are kept and reported when the two disagree on settings.

    python -m benchmarks.tasks.merge_results RETURNED.jsonl benchmarks/tasks/results/pathfinder.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("returned", type=Path)
    p.add_argument("local", type=Path)
    a = p.parse_args(argv)
    have = {r["key"]: r for r in read(a.local) if r.get("status") == "ok"}
    new = []
    for r in read(a.returned):
        if r.get("status") != "ok":
            continue
        if r["key"] in have:
            if have[r["key"]].get("config_hash") != r.get("config_hash"):
                print(f"kept the local {r['key']}: the returned one ran other settings ({r.get('config_hash')})")
            continue
        new.append(r)
        have[r["key"]] = r
    with a.local.open("a") as f:  # one write: safe beside a sweep appending its own cells
        f.write("".join(json.dumps(r) + "\n" for r in new))
    for r in new:
        print(f"added {r['key']}: test {r.get('metric')} {r['test'].get(r.get('metric'))} on {r.get('device')} ({r.get('host')})")
    print(f"{len(new)} cell(s) added to {a.local}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
