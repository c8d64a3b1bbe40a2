"""Pathfinder (Linsley et al. 2018; Long Range Arena's Pathfinder-32, Tay et al. 2020), generated.

Two markers (dots) and curved dashed paths ("snakes") made of short straight paddles; the image is
positive iff one path joins the two markers. Our own generator, written after reading the
original (drewlinsley/pathfinder ``snakes.py``/``snakes2.py``), with its rules:

* a snake is ``n`` paddles of length ``paddle_length``; each next paddle starts ``gap`` after the
  previous one (half the gap along the old direction to a pivot, half along the new one, as the
  original's pivot construction), in a direction sampled with weight
  ``cos(min(continuity * |turn|, pi/2))**2`` (the original's curvature rule: the turn is bounded by
  ``pi / (2 * continuity)``, 50 degrees at the original's continuity 1.8);
* a paddle keeps ``clearance`` from every other paddle already drawn (other snakes, and its own
  snake except the paddle it continues) and from the image border; a snake that gets stuck is
  redrawn (targets) or dropped (distractors, as the original's ``allow_incomplete``);
* two target snakes of ``contour_length`` paddles start ``seed_distance`` apart and grow one
  paddle each in turn; then distractor snakes of ``contour_length // 3`` paddles;
* markers: the origin tip of one target snake and the terminal tip of the same snake (positive) or
  of the other (negative), so a negative's markers lie on different snakes.

Difficulty is the contour length: LRA's Pathfinder sets are 6 (``curv_baseline``), 9 and 14
(``curv_contour_length_14``, the one LRA reports). Everything is drawn in continuous coordinates
on a ``size`` x ``size`` image (LRA: 32), rendered by super-sampling (``aa`` x ``aa`` samples per
pixel, flat-capped strokes and round markers) into intensities in [0, 1], flattened row by row
into ``size**2`` steps of one channel.

Scale: the original draws at 300 px (paddle 5 px, gap ~6 px, stroke 2 px, marker radius 5, the
two seeds 27 px apart). At 32 px, with a 14-paddle path that must fit, we use a 1 px paddle, a
0.6 px gap, a 1 px stroke, marker radius 1, seeds 4.5 px apart, and keep every other paddle at
least ``clearance`` = 2 px away (centre lines): the dashes of one path (ink gaps <= 0.6 px) are
then always closer than two different paths (ink gaps >= 1 px), which makes "connected" decidable
from the pixels (the original's clearance equals its gap; at 300 px the pixels resolve both).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from zoo_core.datasets import SplitData

from .cache import cached

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class PathfinderConfig:
    """The generator's parameters (lengths in pixels of the final image)."""

    size: int = 32
    contour_length: int = 14  # paddles per target path: the difficulty (LRA: 6, 9, 14)
    distractor_length: int | None = None  # default contour_length // 3, as the original
    distractor_paddles: int = 16  # paddles spent on distractors: num_distractors = this // distractor_length
    paddle_length: float = 1.0
    gap: float = 0.6
    thickness: float = 1.0
    continuity: float = 1.8  # the original's: the turn is at most pi / (2 * continuity)
    clearance: float = 2.0  # centre-line distance a paddle keeps from every other one
    seed_distance: float = 4.5  # between the origin tips of the two target paths
    target_margin: float = 5.0  # the first target starts this far from the border (original: 2 * seed distance = 18%)
    marker_radius: float = 1.0
    border: float = 1.0
    angle_step: float = 5.0  # degrees between candidate directions of the next paddle
    max_trials: int = 4  # redraws of a paddle start / a distractor snake, as the original's retrials
    aa: int = 4  # super-sampling per pixel side

    def __post_init__(self) -> None:
        if self.clearance < self.paddle_length / 2 or self.clearance <= self.gap + self.thickness:
            raise ValueError(f"Pathfinder: clearance {self.clearance} must be at least paddle_length / 2 ({self.paddle_length / 2}) "
                             f"and more than gap + thickness ({self.gap + self.thickness}), or two paths could touch or cross")
        if self.seed_distance < self.tip_clearance:
            raise ValueError(f"Pathfinder: seed_distance {self.seed_distance} must be at least clearance + marker_radius "
                             f"({self.tip_clearance}): the two paths start that close")

    @property
    def n_distractor_paddles(self) -> int:
        return self.distractor_length if self.distractor_length is not None else max(1, self.contour_length // 3)

    @property
    def num_distractors(self) -> int:
        return self.distractor_paddles // self.n_distractor_paddles

    @property
    def tip_clearance(self) -> float:
        """How far other snakes stay from a target tip: a marker there keeps ``clearance`` too."""
        return self.clearance + self.marker_radius


@dataclass
class Sample:
    """One image's geometry: paddles (m, 4) as x0, y0, x1, y1, their snake ids, the markers."""

    segments: np.ndarray
    snake: np.ndarray
    markers: np.ndarray  # (2, 2) x, y
    label: int
    targets: tuple[int, int] = (0, 1)
    meta: dict[str, float] = field(default_factory=dict)


class GenerationError(RuntimeError):
    """The parameters leave no room for the target paths (too long for the image, clearance too big)."""


def seg_dist(p: np.ndarray, segs: np.ndarray) -> np.ndarray:
    """Distance from each point ``p`` (k, 2) to each segment of ``segs`` (m, 4) -> (k, m)."""
    a, b = segs[None, :, 0:2], segs[None, :, 2:4]  # (1, m, 2)
    d = b - a
    t = np.clip(((p[:, None, :] - a) * d).sum(-1) / np.maximum((d * d).sum(-1), 1e-12), 0.0, 1.0)  # (k, m)
    r = p[:, None, :] - (a + t[..., None] * d)  # (k, m, 2)
    return np.sqrt((r * r).sum(-1))


def end_distances(s: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(k, m): the least distance from an end of one segment to the other segment, over both ends
    of both: the segments' distance unless they cross (then at least one is 0 by ``_crosses``)."""
    k, m = len(s), len(t)
    d = seg_dist(s.reshape(2 * k, 2), t).reshape(k, 2, m).min(1)  # s's ends to t
    return np.minimum(d, seg_dist(t.reshape(2 * m, 2), s).reshape(m, 2, k).min(1).T)  # t's ends to s


def segment_distances(s: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Shortest distance between each segment of ``s`` (k, 4) and each of ``t`` (m, 4) -> (k, m); 0 where they cross."""
    return np.where(_crosses(s, t), 0.0, end_distances(s, t))


def _crosses(s: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(k, m): whether segment i of ``s`` properly crosses segment j of ``t``."""

    def side(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:  # sign of the turn a -> b -> c
        return np.sign((b[..., 0] - a[..., 0]) * (c[..., 1] - a[..., 1]) - (b[..., 1] - a[..., 1]) * (c[..., 0] - a[..., 0]))

    sa, sb = s[:, None, 0:2], s[:, None, 2:4]  # (k, 1, 2)
    ta, tb = t[None, :, 0:2], t[None, :, 2:4]  # (1, m, 2)
    return (side(sa, sb, ta) * side(sa, sb, tb) < 0) & (side(ta, tb, sa) * side(ta, tb, sb) < 0)


class _Canvas:
    """The paddles drawn so far and the rules a new one must satisfy."""

    def __init__(self, cfg: PathfinderConfig) -> None:
        self.cfg = cfg
        self.segs = np.zeros((0, 4))
        self.snake = np.zeros(0, dtype=np.int64)
        self.keep_out = np.zeros((0, 2))  # target tips: other snakes stay tip_clearance away
        self.keep_out_owner = np.zeros(0, dtype=np.int64)  # the snake each tip belongs to
        self.mid = np.zeros((0, 2))  # paddle midpoints, to skip the far ones
        self.reach = 2 * cfg.paddle_length + cfg.gap + cfg.clearance

    def fits(self, cand: np.ndarray, snake: int, continues: int | None) -> np.ndarray:
        """(k,) which candidate paddles (k, 4) keep the rules: inside, clear of the others and of foreign tips."""
        c = self.cfg
        ok = (cand.min(1) >= c.border) & (cand.max(1) <= c.size - c.border)
        others = np.ones(len(self.segs), dtype=bool)
        if continues is not None:
            others[continues] = False
        near = others & (np.abs(self.mid - cand[:, 0:2].mean(0)).max(1) < self.reach)  # the rest cannot be close
        if near.any():
            # two crossing paddles have an end within paddle_length / 2 <= clearance of the other (checked
            # in PathfinderConfig), so the ends' distances decide and the crossing test is not needed
            ok &= (end_distances(cand, self.segs[near]) >= c.clearance).all(1)
        foreign = self.keep_out_owner != snake
        if foreign.any():
            ok &= (seg_dist(self.keep_out[foreign], cand) >= c.tip_clearance).all(0)
        return ok

    def add(self, seg: np.ndarray, snake: int) -> int:
        self.segs = np.vstack([self.segs, seg[None]])
        self.mid = np.vstack([self.mid, 0.5 * (seg[None, 0:2] + seg[None, 2:4])])
        self.snake = np.append(self.snake, snake)
        return len(self.segs) - 1

    def truncate(self, m: int) -> None:
        self.segs, self.snake, self.mid = self.segs[:m], self.snake[:m], self.mid[:m]


def _unit(theta: float) -> np.ndarray:
    return np.array([math.cos(theta), math.sin(theta)])


def _first(rng: np.random.Generator, cv: _Canvas, snake: int, near: np.ndarray | None = None,
           margin: float | None = None) -> tuple[int, float] | None:
    """Seed a snake: a random whole-degree direction (as the original) from a random point at least
    ``margin`` from the border, or ``seed_distance`` from ``near`` in a random whole-degree direction."""
    c = cv.cfg
    lo = c.border if margin is None else margin
    for _ in range(c.max_trials + 1):
        theta = math.radians(int(rng.integers(-180, 180)))
        if near is None:
            a = rng.uniform(lo, c.size - lo, size=2)
        else:
            a = near + c.seed_distance * _unit(math.radians(int(rng.integers(0, 360))))
        seg = np.concatenate([a, a + c.paddle_length * _unit(theta)])
        if cv.fits(seg[None], snake, None)[0]:
            return cv.add(seg, snake), theta
    return None


def _extend(rng: np.random.Generator, cv: _Canvas, snake: int, last: int, theta: float) -> tuple[int, float] | None:
    """Add the next paddle after paddle ``last`` (direction ``theta``), or None at a dead end."""
    c = cv.cfg
    pivot = cv.segs[last, 2:4] + 0.5 * c.gap * _unit(theta)
    turns, weights = _turns(c.angle_step, c.continuity)
    new = theta + turns  # (k,)
    u = np.stack([np.cos(new), np.sin(new)], axis=1)  # (k, 2)
    a = pivot + 0.5 * c.gap * u
    cands = np.concatenate([a, a + c.paddle_length * u], axis=1)  # (k, 4)
    cmf = np.cumsum(np.where(cv.fits(cands, snake, last), weights, 0.0))
    if cmf[-1] <= 0:
        return None
    k = int(np.searchsorted(cmf, rng.random() * cmf[-1], side="right"))  # inverse CDF, as the original
    return cv.add(cands[k], snake), float(new[k])


@functools.lru_cache(maxsize=16)
def _turns(step: float, continuity: float) -> tuple[np.ndarray, np.ndarray]:
    """The candidate turns (radians) with a non-zero weight, and the original's weights for them."""
    turns = np.radians(np.arange(-180.0, 180.0, step))
    weights = np.cos(np.minimum(np.abs(turns) * continuity, np.pi / 2)) ** 2
    keep = weights > 1e-12
    return turns[keep], weights[keep]


def _two_targets(rng: np.random.Generator, cv: _Canvas) -> tuple[list[int], list[int]] | None:
    """The two target snakes, grown one paddle each in turn; their paddle indices, or None."""
    c = cv.cfg
    a = _first(rng, cv, 0, margin=c.target_margin)
    if a is None:
        return None
    b = _first(rng, cv, 1, near=cv.segs[a[0], 0:2])
    if b is None:
        return None
    heads, paths = [a, b], [[a[0]], [b[0]]]
    for _ in range(c.contour_length - 1):
        for s in (0, 1):
            nxt = _extend(rng, cv, s, heads[s][0], heads[s][1])
            if nxt is None:
                return None
            heads[s] = nxt
            paths[s].append(nxt[0])
    tips = np.array([cv.segs[paths[s][i], 0:2] if i == 0 else cv.segs[paths[s][i], 2:4] for s in (0, 1) for i in (0, -1)])
    owner = np.array([0, 0, 1, 1])
    for s in (0, 1):  # each target's tips stay clear of the other target (markers may sit there)
        if (seg_dist(tips[owner != s], cv.segs[paths[s]]) < c.tip_clearance).any():
            return None
    cv.keep_out, cv.keep_out_owner = tips, owner
    return paths[0], paths[1]


def _distractor(rng: np.random.Generator, cv: _Canvas, snake: int) -> None:
    c = cv.cfg
    for _ in range(c.max_trials + 1):
        m = len(cv.segs)
        head = _first(rng, cv, snake)
        for _ in range(c.n_distractor_paddles - 1):
            if head is None:
                break
            head = _extend(rng, cv, snake, head[0], head[1])
        if head is not None:
            return
        cv.truncate(m)


def generate_sample(rng: np.random.Generator, cfg: PathfinderConfig, label: int) -> Sample:
    """One image's geometry with the given label (1: the markers are the two ends of one path)."""
    for _ in range(1000):
        cv = _Canvas(cfg)
        paths = _two_targets(rng, cv)
        if paths is not None:
            break
    else:
        raise GenerationError(
            f"Pathfinder: no room for two paths of {cfg.contour_length} paddles in a {cfg.size}x{cfg.size} image after 1000 "
            f"tries (paddle {cfg.paddle_length}, gap {cfg.gap}, clearance {cfg.clearance}); use a shorter contour_length, "
            f"a larger size or a smaller clearance")
    for k in range(cfg.num_distractors):
        _distractor(rng, cv, 2 + k)
    origin = int(rng.integers(0, 2))
    terminal = origin if label == 1 else 1 - origin
    markers = np.stack([cv.segs[paths[origin][0], 0:2], cv.segs[paths[terminal][-1], 2:4]])
    return Sample(cv.segs, cv.snake, markers, label)


def render(sample: Sample, cfg: PathfinderConfig, aa: int | None = None, antialias: bool = True) -> np.ndarray:
    """The image: (size, size) float32 intensities in [0, 1] (``antialias=False``: the (size*aa)^2
    binary ink mask the intensities average)."""
    k = aa or cfg.aa
    n = cfg.size * k
    centres = (np.arange(n) + 0.5) / k
    px, py = np.meshgrid(centres, centres)  # (n, n): x along columns, y along rows
    ink = np.zeros((n, n), dtype=bool)
    for x0, y0, x1, y1 in sample.segments:
        dx, dy = x1 - x0, y1 - y0
        length = math.hypot(dx, dy)
        ux, uy = dx / length, dy / length
        along = (px - x0) * ux + (py - y0) * uy
        across = np.abs(-(px - x0) * uy + (py - y0) * ux)
        ink |= (along >= 0) & (along <= length) & (across <= cfg.thickness / 2)  # flat caps, as a drawn line
    for mx, my in sample.markers:
        ink |= (px - mx) ** 2 + (py - my) ** 2 <= cfg.marker_radius**2
    if not antialias:
        return ink
    return ink.reshape(cfg.size, k, cfg.size, k).mean(axis=(1, 3)).astype(np.float32)


@functools.lru_cache(maxsize=8)
def generate(n: int, seed: int | tuple[int, ...], cfg: PathfinderConfig) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images, half positive in a shuffled order: X float32 (n, size**2, 1), y int64 (n,)."""
    rng = np.random.default_rng(seed)  # an int or (seed, split index): numpy's SeedSequence entropy
    labels = rng.permutation(np.arange(n) % 2)
    X = np.empty((n, cfg.size * cfg.size, 1), dtype=np.float32)
    for i, label in enumerate(labels):
        X[i, :, 0] = render(generate_sample(rng, cfg, int(label)), cfg).ravel()  # row-major, as LRA flattens
    return X, labels.astype(np.int64)


VERSION = 1  # bump when the generator changes what a seed draws (the disk cache keys on it)


def load(split: str, *, sizes: dict[str, int], seed: int = 0, contour_length: int = 14, **params: Any) -> SplitData:
    """The loader ``zoo_register_datasets`` names: one split, its own stream of ``seed`` (splits do not
    share a random stream, so each split is the same whatever the other sizes)."""
    cfg = PathfinderConfig(contour_length=contour_length, **params)
    n, stream = sizes[split], (seed, SPLITS.index(split))

    def make() -> dict[str, np.ndarray]:
        X, y = generate(n, stream, cfg)
        return {"X": X, "y": y}

    arrays = cached("pathfinder", VERSION, {"n": n, "stream": stream, **asdict(cfg)}, make)
    return SplitData(arrays["X"], arrays["y"])
