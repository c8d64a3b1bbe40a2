"""Shared by the generator tests: a chi-square goodness-of-fit test without scipy (the tests run with
zoo-core's base dependencies), as the fixture ``chi2_fits``."""

from __future__ import annotations

import math

import numpy as np
import pytest


def chi2_quantile(df: int, p: float = 0.999) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (within ~1% for df >= 3)."""
    z = {0.999: 3.090232, 0.99: 2.326348}[p]
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def chi2_fits(observed: np.ndarray, expected_p: np.ndarray, p: float = 0.999) -> tuple[bool, float, float]:
    """(fits, statistic, critical): Pearson's statistic of counts against probabilities, bins with an
    expected count under 5 merged into their neighbour so the approximation holds."""
    n = observed.sum()
    obs, exp = [], []
    o_acc = e_acc = 0.0
    for o, e in zip(observed.tolist(), (expected_p * n).tolist(), strict=True):
        o_acc, e_acc = o_acc + o, e_acc + e
        if e_acc >= 5:
            obs.append(o_acc)
            exp.append(e_acc)
            o_acc = e_acc = 0.0
    if e_acc:
        obs[-1] += o_acc
        exp[-1] += e_acc
    o_arr, e_arr = np.array(obs), np.array(exp)
    stat = float(((o_arr - e_arr) ** 2 / e_arr).sum())
    crit = chi2_quantile(len(obs) - 1, p)
    return stat <= crit, stat, crit


@pytest.fixture(name="chi2_fits")
def _chi2_fits_fixture() -> object:
    return chi2_fits
