"""SSM Zoo benchmarks: one harness, run from the repository root as ``python -m benchmarks``.

    python -m benchmarks list [PATTERN]             # the families and their implementations
    python -m benchmarks run PATTERN... [--L ...]   # time them, rows appended to a JSONL file
    python -m benchmarks report [NAME]              # JSONL -> benchmarks/REPORT*.md

Modules: ``harness`` (the method: quiet-machine waits, interleaved rounds, peak RSS, fmt_t),
``cases`` (families generated from the plugin registry), ``peers`` (extra implementations and
special cases), ``catalog`` (all families), ``runner`` (check, time, memory child), ``render``
(one renderer; findings in ``findings/*.md``). ``repro/`` reproduces the seed paper's grid.
"""
