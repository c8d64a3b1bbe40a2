"""benchmarks/repro/make_tables.py's full-protocol rows: each seed's lr picked on validation as zoo train
picks it, and the full-protocol suites kept out of the one-lr tables."""

from __future__ import annotations

from benchmarks.repro import make_tables as mt


def _row(suite: str, seed: int, lr: float, val: float, test: float, c: int | None = None) -> dict:
    return {"suite": suite, "dataset": "JapaneseVowels" if "jv" in suite else "ACSF1", "core": "lru", "pattern": "ABCDEF",
            "loss": "final", "c": c, "seed": seed, "lr": lr, "epochs": 60, "val": {"accuracy": val},
            "test": {"accuracy": test}}


def test_pick_on_validation_takes_the_best_and_the_larger_rate_of_equals():
    runs = [_row("jv-lru-full", 1, 1e-5, 0.9, 0.1), _row("jv-lru-full", 1, 1e-3, 0.8, 0.2), _row("jv-lru-full", 1, 1e-4, 0.9, 0.3)]
    assert mt.pick_on_validation(runs)["lr"] == 1e-4  # 1e-4 and 1e-5 tie on validation: the larger rate


def test_full_protocol_rows_read_seeds_and_lr_pick_apart():
    every = [_row("jv-lru", s, 1e-3, 0.9, 0.90) for s in (1, 2, 3)]
    every += [_row("jv-lru-full", s, 1e-3, 0.9, 0.80) for s in range(5)]
    every += [_row("jv-lru-full", s, 1e-4, 0.95 if s < 2 else 0.5, 1.0) for s in range(5)]
    lines = mt.full_protocol_table(every)
    jv = [ln for ln in lines if ln.startswith("| JapaneseVowels")]
    assert "| 3 seeds, lr 1e-3 (tables above) | 90.00 ± 0.00 | 3 |" in jv[0]
    assert "| 5 seeds, lr 1e-3 | 80.00 ± 0.00 | 5 |" in jv[1]
    assert "| 88.00 ± 10.95 | 5 | 0.001 × 3, 0.0001 × 2 |" in jv[2]  # two seeds pick 1e-4 (test 100), three 1e-3 (80)
    assert any(ln.startswith("| ACSF1 | c = 16 | full protocol | not run yet") for ln in lines)


def test_full_protocol_summary_says_what_changed_from_the_rows():
    every = [_row("jv-lru", s, 1e-3, 0.9, t) for s, t in ((1, 0.90), (2, 0.92), (3, 0.94))]
    every += [_row("jv-lru-full", s, 1e-3, 0.9, 0.80) for s in range(5)]
    every += [_row("jv-lru-full", s, 1e-4, 0.95 if s < 2 else 0.5, 1.0) for s in range(5)]
    (jv,) = mt.full_protocol_summary(every)  # ACSF1 has not run: no sentence
    assert jv.startswith("- **JapaneseVowels**: validation picked lr 0.001 for 3 of 5 seeds, 0.0001 for 2 of 5 seeds;")
    assert "moved -4.00 points from 3 seeds to 5, more than one standard deviation." in jv  # 92 -> 88
    only_1e3 = [r for r in every if r["lr"] == 1e-3]
    assert "(so the full protocol is the 5-seed lr-1e-3 row)" in mt.full_protocol_summary(only_1e3)[0]


def test_the_full_protocol_suites_are_the_ones_rows_keeps_apart():
    from benchmarks.repro import run_grid

    assert mt.FULL and all(suite.endswith(run_grid.FULL_SUFFIX) for suite in mt.FULL)
