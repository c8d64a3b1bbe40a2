"""Reproduction of the seed paper's grid (seed 001, "Reshape and Recur"): training runs and tables.

Run from the repository root as modules: ``python -m benchmarks.repro.run_grid ...`` trains,
``python -m benchmarks.repro.make_tables`` renders benchmarks/REPRO.md.
"""
