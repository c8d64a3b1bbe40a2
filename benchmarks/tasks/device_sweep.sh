#!/usr/bin/env bash
# Run some cells of a task sweep on a GPU machine lent through the device tool, for a fixed time, and bring
# back what finished: the sweep's results JSONL (per-cell metrics, "device": "cuda", the host's name) and
# every cell's log.txt. Cells still running at the deadline are stopped and lost; the sweep is resumable,
# so they run again wherever the sweep runs next.
#
# Usage (the run tool, carry [".whl", ".zoo-data"], timeout_s = SECONDS + about 90):
#   bash benchmarks/tasks/device_sweep.sh SWEEP.yaml SECONDS WORKERS GLOB [GLOB ...]
# e.g. bash benchmarks/tasks/device_sweep.sh benchmarks/tasks/sweeps/pathfinder.yaml 240 8 's4/Pathfinder32-14/*'
# .whl: pydantic's wheels (see benchmarks/gpu_check.sh, step 1). .zoo-data: optional, a copy of
# ~/.cache/zoo/datasets (generated datasets, so the device does not spend its minutes generating them),
# ignored by git (echo /.zoo-data/ >> .git/info/exclude). Merge the returned lines into the local results
# file by key (python -m benchmarks.tasks.merge_results RETURNED.jsonl LOCAL.jsonl).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
sweep=$1; secs=$2; workers=$3; shift 3
only=(); for g in "$@"; do only+=(--only "$g"); done
out=${OUT:-/tmp/device_sweep}; mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
plugins=(); for p in plugins/zoo-*; do plugins+=(-e "$p"); done
$PY -m pip install -q --no-deps --no-build-isolation --disable-pip-version-check -e . "${plugins[@]}" || exit 1
[ -d .zoo-data ] && export ZOO_DATA_DIR=$PWD/.zoo-data
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout -k 15 "$secs" $PY -m zoo_core.cli sweep --workers "$workers" --plain "$sweep" "${only[@]}"
echo "sweep exit: $? (124: stopped at the deadline)"
# the sweep's own paths (its defaults included): results JSONL, then the run folders
{ read -r results; read -r runs; } < <($PY -c "import sys; from zoo_core.sweep import load_sweep; s = load_sweep(sys.argv[1]); print(s.results); print(s.output)" "$sweep")
[ -f "$results" ] && cp "$results" "$out/results.jsonl"
[ -d "$runs" ] && (cd "$runs" && find . -name log.txt | tar czf "$out/logs.tgz" -T -)
ls -la "$out"
