"""Pathfinder: a positive's markers are joined by one drawn path and a negative's are not, checked
twice without the generator's bookkeeping (snake ids): on the drawn geometry (paddles and markers)
and on the rendered ink (a flood fill that bridges a path's dashes but not the space between
paths); paths have the difficulty's paddle count and bounded turns; classes balanced; images
deterministic from the seed; the registered sets load through zoo-core's checks."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import numpy as np
import pytest

from zoo_core.datasets import Dataset, get_dataset
from zoo_longrange import pathfinder as pf


def _points(seg: np.ndarray, k: int = 41) -> np.ndarray:
    t = np.linspace(0.0, 1.0, k)[:, None]
    return seg[None, 0:2] * (1 - t) + seg[None, 2:4] * t  # (k, 2)


def _dist(s: np.ndarray, t: np.ndarray) -> float:
    """Distance of two segments by dense sampling (independent of the generator's closed form)."""
    p, q = _points(s), _points(t)
    return float(np.sqrt(((p[:, None] - q[None]) ** 2).sum(-1)).min())


def geometric_components(sample: pf.Sample, cfg: pf.PathfinderConfig) -> tuple[list[set[int]], list[int]]:
    """Paddles joined when their ends are within a path's gap; each marker's component (None: no paddle)."""
    m = len(sample.segments)
    parent = list(range(m))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(m):
        for j in range(i + 1, m):
            if _dist(sample.segments[i], sample.segments[j]) <= cfg.gap + 0.05:
                parent[root(i)] = root(j)
    comps: dict[int, set[int]] = {}
    for i in range(m):
        comps.setdefault(root(i), set()).add(i)
    marker_comp = []
    for mk in sample.markers:
        touching = {root(i) for i in range(m) if _dist(np.concatenate([mk, mk]), sample.segments[i]) <= cfg.marker_radius}
        assert len(touching) == 1, f"a marker touches {len(touching)} paths"
        marker_comp.append(touching.pop())
    return [comps[r] for r in marker_comp], marker_comp


def ink_connected(ink: np.ndarray, a: tuple[int, int], b: tuple[int, int], bridge: int) -> bool:
    """Flood fill over ink pixels, stepping to any ink pixel within ``bridge`` pixels (a path's gaps)."""
    offsets = [(dy, dx) for dy in range(-bridge, bridge + 1) for dx in range(-bridge, bridge + 1)
               if 0 < dy * dy + dx * dx <= bridge * bridge]
    h, w = ink.shape
    seen = np.zeros_like(ink)
    queue = deque([a])
    seen[a] = True
    while queue:
        y, x = queue.popleft()
        if (y, x) == b:
            return True
        for dy, dx in offsets:
            v, u = y + dy, x + dx
            if 0 <= v < h and 0 <= u < w and ink[v, u] and not seen[v, u]:
                seen[v, u] = True
                queue.append((v, u))
    return False


def _samples(contour_length: int, n: int, seed: int) -> tuple[pf.PathfinderConfig, list[pf.Sample]]:
    cfg = pf.PathfinderConfig(contour_length=contour_length)
    rng = np.random.default_rng(seed)
    return cfg, [pf.generate_sample(rng, cfg, label) for label in [1, 0] * (n // 2)]


@pytest.mark.parametrize("contour_length", [6, 14])
def test_positive_iff_the_markers_lie_on_one_drawn_path(contour_length):
    cfg, samples = _samples(contour_length, 8, seed=contour_length)
    limit = math.pi / (2 * cfg.continuity) + 1e-6
    for s in samples:
        comps, roots = geometric_components(s, cfg)
        assert (roots[0] == roots[1]) == (s.label == 1)
        for comp in comps:  # each marked path is a target: the difficulty's paddle count, bounded turns
            assert len(comp) == contour_length
            segs = s.segments[sorted(comp)]
            ang = np.arctan2(segs[:, 3] - segs[:, 1], segs[:, 2] - segs[:, 0])
            turns = np.abs((np.diff(ang) + np.pi) % (2 * np.pi) - np.pi)
            assert (turns <= limit).all()
        others = set(range(len(s.segments))) - set().union(*comps)
        assert others  # distractor paddles were drawn


@pytest.mark.parametrize("contour_length", [6, 14])
def test_positive_iff_the_markers_are_connected_through_rendered_ink(contour_length):
    cfg, samples = _samples(contour_length, 6, seed=100 + contour_length)
    aa = 12  # rendering samples per pixel side: a path's ink gaps <= gap * aa, other paths >= (clearance - thickness) * aa
    bridge = int(round(aa * (cfg.gap + (cfg.clearance - cfg.thickness)) / 2))
    assert cfg.gap * aa + 2 < bridge < (cfg.clearance - cfg.thickness) * aa
    for s in samples:
        ink = pf.render(s, cfg, aa=aa, antialias=False)
        a, b = (tuple(int(v * aa) for v in mk[::-1]) for mk in s.markers)  # (x, y) -> (row, col)
        assert ink[a] and ink[b]
        assert ink_connected(ink, a, b, bridge) == (s.label == 1)


def test_images_balanced_deterministic_and_in_range():
    cfg = pf.PathfinderConfig(contour_length=6)
    X, y = pf.generate.__wrapped__(10, 5, cfg)
    assert X.shape == (10, 1024, 1) and X.dtype == np.float32 and y.dtype == np.int64
    assert y.sum() == 5 and 0.0 <= X.min() and X.max() <= 1.0 and X.max() == 1.0  # markers are full ink
    X2, y2 = pf.generate.__wrapped__(10, 5, cfg)
    assert np.array_equal(X, X2) and np.array_equal(y, y2)
    assert not np.array_equal(X, pf.generate.__wrapped__(10, 6, cfg)[0])


def test_parameters_that_would_let_paths_touch_are_refused():
    with pytest.raises(ValueError, match="clearance"):
        pf.PathfinderConfig(clearance=1.5)
    with pytest.raises(ValueError, match="seed_distance"):
        pf.PathfinderConfig(seed_distance=2.0)


def test_registered_difficulties_load_through_the_split_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path))
    for cl in (6, 9, 14):
        info = get_dataset(f"Pathfinder32-{cl}").info
        assert (info.channels, info.classes, info.length) == (1, 2, 1024)
    assert get_dataset("Pathfinder32-14-LRA").info.sizes == {"train": 160000, "val": 20000, "test": 20000}
    ds, sizes = get_dataset("Pathfinder32-6"), {"train": 4, "val": 2, "test": 2}
    small = Dataset(replace(ds.info, sizes=sizes), pf.load, {**ds._params, "sizes": sizes})
    val = small.load("val")
    assert val.X.shape == (2, 1024, 1) and sorted(val.y.tolist()) == [0, 1]
    assert not np.array_equal(val.X, small.load("test").X)  # each split its own stream
    monkeypatch.setattr(pf, "generate", lambda *a: pytest.fail("generated again instead of reading the cache"))
    assert np.array_equal(small.load("val").X, val.X)
