#!/usr/bin/env bash
# The hybrid stacks' training record (benchmarks/hybrids/RECORD.md): each hybrid spec trains a few
# epochs on JapaneseVowels (padded and packed batches), its saved best model is scored again from
# the folder (zoo eval: must equal training's test figure), and that folder streams a test sequence
# through step (zoo stream: step = parallel). Run from the repository root:
#   bash benchmarks/hybrids/record.sh [OUT]        (about 8 minutes on 2 CPU cores)
set -euo pipefail
OUT=${1:-runs/hybrids}
ZOO=${ZOO:-.venv/bin/zoo}
for name in griffin-jv jamba-jv; do
  for mode in padded packed; do
    flags=(--epochs 20 --seeds 0,1,2 --plain)
    [ "$mode" = packed ] && flags+=(--pack)
    run="$OUT/$name-$mode"
    echo "== $name ($mode): $ZOO train specs/$name.yaml -o $run ${flags[*]}"
    /usr/bin/time -f "wall %e s" "$ZOO" train "specs/$name.yaml" -o "$run" "${flags[@]}" 2>&1 | grep -E "^seed|test accuracy|packed: padding|^wall" | tail -8
    best=$(python3 -c "import json,sys; m=json.load(open('$run/metrics.json')); print(m['seeds'][0]['model_dir'])")
    echo "-- $ZOO eval $best"
    "$ZOO" eval "$best" | python3 -c "import json,sys; d=json.load(sys.stdin); print('reloaded from the folder: test accuracy', d['fixed_depth']['accuracy'])"
    echo "-- $ZOO stream $best --dataset JapaneseVowels --index 3"
    "$ZOO" stream "$best" --dataset JapaneseVowels --index 3 | grep -E "max \|difference\||streaming state|agreement"
  done
done
