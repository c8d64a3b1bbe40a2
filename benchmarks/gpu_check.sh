#!/usr/bin/env bash
# GPU check of issue 16 (the Triton selective scan): install the working tree, run the kernel tests
# compiled on CUDA and the Mamba plugin's tests, check a Mamba layer through backend='triton' and every core
# built on CPU then moved to the GPU (one training step each; results in benchmarks/REPORT_GPU.md), and time
# the Triton selective scan against the chunked PyTorch path (and mamba-ssm if it imports) at B=8 L=4096 Di=128
# N=16 and B=16 L=8192 Di=1536 N=16, and the Triton diagonal scan against the parallel PyTorch scan at
# B=32 L=4096 H=64 N=64 (float32, complex64). Writes $OUT/gpu_check.json (else benchmarks/results/gpu_check.json).
# Budget: under 8 minutes: about 1 to install, then the driver (skips phases past --budget-s, 360 s; killed at 420 s).
#
# How to run, in a session lent a device (`status`: can_start_another true):
#   1. once, here: the device has no pydantic (zoo_core needs it); bring it as wheels, ignored by git:
#        grep -qx /.whl/ .git/info/exclude || echo /.whl/ >> .git/info/exclude
#        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#          -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions
#   2. the `run` tool: command `bash benchmarks/gpu_check.sh`, carry [".whl"], timeout_s 540;
#      the JSON comes back under files_at; copy it to benchmarks/results/gpu_check.json and commit it.
# Here, without a GPU: `bash benchmarks/gpu_check.sh --dry-run` (no install; CPU, Triton's interpreter, tiny sizes).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "${1:-}" = "--dry-run" ] && PY=.venv/bin/python
export PYTHONUNBUFFERED=1
if [ "${1:-}" != "--dry-run" ]; then
    if ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels (step 1 above), beside the image's packages
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    # the project from this working tree, nothing fetched (the device has no network)
    plugins=(); for p in plugins/zoo-*; do plugins+=(-e "$p"); done
    $PY -m pip install -q --no-deps --no-build-isolation --disable-pip-version-check -e . "${plugins[@]}"
    $PY -c "import pydantic, zoo_core, zoo_mamba" || { echo "zoo_core does not import: see step 1 above"; exit 1; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
exec timeout 420 $PY benchmarks/gpu_check.py "$@"
