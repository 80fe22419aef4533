"""The pair search of :func:`~napari_gridmip.core.patches.stitch.register_tiles`: each overlapping pair's shift.

Every pair of tiles whose stage footprints overlap is matched on its overlap, and what the passes below find goes
into one record per mosaic, :class:`PairResults`, that :mod:`~napari_gridmip.core.patches.stitch` turns into the
tiles' positions by its global solve. The search lives apart from the solve so that how far each pass reaches can
be read in one place:

1. :func:`first_pass`: every pair within ``max_shift`` px of its stage offset, in the octave band.
2. :func:`broad_pass`: the pairs the octave band found weak, again in the broad band, within ``max_shift``; with
   ``max_shift="auto"``, the rejected ones once more within :func:`learned_reach`.
3. :func:`guided_pass`: the pairs still missed between tiles that accepted pairs tie together, within
   ``GUIDED_SHIFT`` px of where a first placement (the caller's solve) puts them.
4. :func:`refine_pass`: the accepted pairs' sub-pixel shifts, ``FINE_SHIFT`` px around their integer peaks.

Each pass runs its pairs and their null samples in batches through one kernel (:func:`_run_group`; NumPy in
``_stitch_numpy`` or JAX in ``_stitch_jax``) and tests the peaks against thresholds calibrated on the null samples
(:func:`plan_group`, :func:`gumbel_quantile`). Nothing here imports :mod:`~napari_gridmip.core.patches.stitch`.
The module is internal (the package's API is flat): its names without a leading underscore are what stitch calls.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip.core.patches import _stitch_numpy
from napari_gridmip.core.patches._stitch_shared import CACHE_BYTES, MARGIN, MIN_FRACTION, filter_halo

__all__: list[str] = []  # internal: the names without a leading underscore are its API for stitch

ProgressCallback = Callable[[int, int], None]
Placement = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]

REASONS = (
    "accepted",
    "not significant",
    "featureless",
    "peak at max_shift",
    "refinement failed",
    "residual",
    "overlap too small",
    "ambiguous",
)
"""Why a pair was (not) used: ``TileRegistration.reason`` indexes this tuple."""

REFINEMENTS = ("none", "peak-fit", "refined")
"""How a pair's sub-pixel shift was found: ``TileRegistration.refinement`` indexes this tuple."""

# how far the passes search (px), besides the caller's max_shift
AUTO_SHIFT = 16  # max_shift="auto" searches at least this far (px) ...
AUTO_REACH = 0.75  # ... and up to this fraction of the typical overlap width ...
AUTO_FRACTION = 0.25  # ... keeping this fraction of the overlap's pixels at least, where it searches beyond AUTO_SHIFT
AUTO_CAP = 64  # ... and at most max(AUTO_CAP, a quarter of the tile's smallest side) px
LEARN_MIN = 3  # max_shift="auto": with this many pairs accepted, the rejected ones are searched again within ...
LEARN_FACTOR = 1.25  # ... this many times the largest stage error an accepted pair measured ...
LEARN_SLACK = 4  # ... plus this many px (learned_reach)
GUIDED_SHIFT = 3  # pairs pass 1 missed are searched again within this many px of their predicted offset
FINE_SHIFT = 0  # the refinement pass starts at the coarse peak (within 0.5 px) and may move MAX_REFINE_STEP
MIN_REFINE = 3  # the refinement's box must be at least this wide (px) along every axis
# the verdict on a peak, and the broad band's second search
AMBIGUITY_RATIO = 0.9  # a rival peak with at least this fraction of the best's NCC ... (is_ambiguous)
AMBIGUITY_MISMATCH = 3.0  # ... and at most this many times its mismatch (1 - NCC) makes a pair ambiguous
BROAD_BAND = (2.0, 32.0)  # the second search's band, G_2sigma - G_32sigma (broad_pass) ...
WEAK_MARGIN = 0.2  # ... for the pairs accepted with a margin (ncc - threshold) / (1 - threshold) under this, or not
BROAD_MIN_EXTENT = 8  # ... whose overlap is at least this many times the band's low width (16 px at sigma 1)
# the null samples behind the thresholds, and the weights of the pairs that keep their peak fit
NULL_PER_PAIR = 1  # null (non-matching) samples per registered pair, at least
MIN_NULL = 64  # and at least this many per pair shape
GUIDED_NULLS = 24  # null samples per pair searched again (its own threshold)
PEAK_FIT_WEIGHT = 0.25  # a peak-fit pair's weight relative to the median refined pair's (its error is about 2x)
# the kernels' batches
BATCH_BYTES = 256 * 2**20  # pairs per compiled call: about this much working memory
BATCH_PAIRS = 32  # pairs per compiled call at most: one program serves any mosaic of the same tile geometry
NUMPY_BATCH_PAIRS = 128  # pairs per NumPy call at most (within BATCH_BYTES: batches of BATCH_PAIRS merged)
NUMPY_BUCKET = 4  # NumPy batches group regions whose sizes round up to the same multiple of this (px)


# -- the records ------------------------------------------------------------------------------------------------------


def report(progress: ProgressCallback | None, done: int, total: int) -> None:
    """Tell ``progress`` (if any) that ``done`` of ``total`` steps are done; it may raise to stop the run."""
    if progress is not None:
        progress(done, total)


@dataclass
class PairResults:
    """What the passes find, per pair of overlapping tiles (``P`` pairs, ``d`` axes); each pass updates the arrays
    in place where it finds better, and the placement reads them (and marks its rejections in ``reason``)."""

    shift: np.ndarray  # (P, d): the measured offset's difference from the stage's (px)
    ncc: np.ndarray  # (P,): the peak's NCC
    threshold: np.ndarray  # (P,): the significance threshold it was tested against
    info: np.ndarray  # (P, d, d): the shift's information (inverse covariance), for the placement
    reason: np.ndarray  # (P,): index into REASONS
    ambiguous: np.ndarray  # (P,): the first search's peak had a near-equal rival (is_ambiguous)
    refinement: np.ndarray  # (P,): index into REFINEMENTS
    second_ncc: np.ndarray  # (P,): the best rival peak's NCC (NaN: none)
    second_shift: np.ndarray  # (P, d): its offset
    broad_band: np.ndarray  # (P,): found in the broad band's second search

    @classmethod
    def empty(cls, pairs: int, axes: int) -> PairResults:
        """Nothing found yet: NaN, and every pair's reason "overlap too small" until pass 1 searches it."""
        return cls(
            shift=np.full((pairs, axes), np.nan),
            ncc=np.full(pairs, np.nan),
            threshold=np.full(pairs, np.nan),
            info=np.zeros((pairs, axes, axes)),
            reason=np.full(pairs, REASONS.index("overlap too small"), np.int64),
            ambiguous=np.zeros(pairs, bool),
            refinement=np.full(pairs, REFINEMENTS.index("none"), np.int64),
            second_ncc=np.full(pairs, np.nan),
            second_shift=np.full((pairs, axes), np.nan),
            broad_band=np.zeros(pairs, bool),
        )


@dataclass
class Pairs:
    """The pairs' boxes for one search: each template's start and extent in tile ``j`` (see
    :func:`pair_geometry`), with the stage offsets they were made for."""

    pairs: np.ndarray  # (p, 2)
    delta: np.ndarray  # (p, d) stage offsets, float
    rounded: np.ndarray  # (p, d) int
    lo: np.ndarray  # (p, d) template start in tile j
    extent: np.ndarray  # (p, d) template extent (may be <= 0)
    shape: tuple[int, ...]  # the tiles' spatial shape


def overlapping_pairs(stage: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``(i, j)``, ``i < j``, whose footprints overlap, and its stage offset."""
    n, d = stage.shape
    i, j = np.triu_indices(n, 1)
    delta = stage[j] - stage[i]
    keep = np.all(np.abs(delta) < np.asarray(shape), axis=1)
    return np.stack([i[keep], j[keep]], 1).reshape(-1, 2), delta[keep].reshape(-1, d)


def pair_geometry(pairs: np.ndarray, delta: np.ndarray, shape: tuple[int, ...], reach: int, border: int) -> Pairs:
    """Each pair's template box in tile j for offsets ``delta`` searched ``reach`` px around.

    The template holds the pixels of tile j at least ``border`` px inside
    both tiles for every shift within ``reach``:
    ``[max(b, reach + b - r), min(S - b, S - reach - b - r))`` per axis for the
    rounded offset ``r``. (The band-pass sees a truncated neighbourhood
    within ``border`` of a tile's edge, which differs between the two tiles.)
    """
    size = np.asarray(shape)
    rounded = np.round(delta).astype(np.int64)
    lo = np.maximum(border, reach + border - rounded)
    hi = np.minimum(size - border, size - reach - border - rounded)
    return Pairs(pairs, delta, rounded, lo, hi - lo, tuple(shape))


def _fine_geometry(pairs: np.ndarray, delta: np.ndarray, shape: tuple[int, ...], halo: int) -> Pairs:
    """The refinement's boxes: ``halo`` px inside both tiles where the overlap has room, else at their borders.

    The low-pass is a normalised convolution, so a box that reaches a tile's
    border sees a one-sided (but unbiased in intensity) average there: a
    slightly worse refinement, far better than none. Narrow overlaps (10 to
    20 px, as microscopes take them) leave fewer than ``MIN_REFINE`` px once
    the halo is kept on both sides.
    """
    reach = FINE_SHIFT + MARGIN
    inner = pair_geometry(pairs, delta, shape, reach, halo)
    tight = pair_geometry(pairs, delta, shape, reach, 0)
    narrow = np.any(inner.extent < MIN_REFINE, axis=1)[:, None]
    inner.lo = np.where(narrow, tight.lo, inner.lo)
    inner.extent = np.where(narrow, tight.extent, inner.extent)
    return inner


class TileReader:
    """Regions of the registration channel of the tiles as float32 NumPy (dask and Zarr read only them).

    The regions read are kept, up to ``CACHE_BYTES`` (least recently used
    dropped first): a tile's regions serve its pairs and their null samples,
    which come close together, so a mosaic of any size registers in bounded
    memory, and one that fits reads every region once.
    """

    def __init__(self, tiles: Any, channel: int | None, has_channels: bool, halo: int):
        self.tiles, self.channel, self.has_channels, self.halo = tiles, channel, has_channels, halo
        self.shape = tuple(int(n) for n in tiles.shape[1 + int(has_channels) :])
        self.cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.cached_bytes = 0

    def read(self, index: int, start: Sequence[int], extent: Sequence[int], halo: int | None = None) -> np.ndarray:
        """The region ``[start - halo, start + extent + halo)`` of tile ``index``, float32, NaN beyond the tile.

        Not kept. Channels are averaged unless one was chosen.
        """
        h = self.halo if halo is None else halo
        lo = [max(int(s) - h, 0) for s in start]
        hi = [min(int(s) + int(e) + h, n) for s, e, n in zip(start, extent, self.shape)]
        out = np.full(tuple(int(e) + 2 * h for e in extent), np.nan, np.float32)
        if any(b <= a for a, b in zip(lo, hi)):
            return out
        spatial = tuple(slice(a, b) for a, b in zip(lo, hi))
        if not self.has_channels:
            data = np.asarray(self.tiles[(int(index), *spatial)], dtype=np.float32)
        elif self.channel is not None:
            data = np.asarray(self.tiles[(int(index), self.channel, *spatial)], dtype=np.float32)
        else:
            data = np.asarray(self.tiles[(int(index), slice(None), *spatial)], dtype=np.float32).mean(axis=0)
        out[tuple(slice(a - (int(s) - h), b - (int(s) - h)) for a, b, s in zip(lo, hi, start))] = data
        return out

    def clear(self) -> None:
        self.cache.clear()
        self.cached_bytes = 0

    def region(self, index: int, start: Sequence[int], extent: Sequence[int]) -> np.ndarray:
        """:meth:`read`, kept for the next request of the same region (up to ``CACHE_BYTES`` in all)."""
        key = (int(index), *map(int, start), *map(int, extent))
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        out = self.read(index, start, extent)
        self.cache[key] = out
        self.cached_bytes += out.nbytes
        while self.cached_bytes > CACHE_BYTES and len(self.cache) > 1:
            _, dropped = self.cache.popitem(last=False)
            self.cached_bytes -= dropped.nbytes
        return out


# -- the passes, in the order register_tiles runs them ----------------------------------------------------------------


def first_pass(found: PairResults, groups: Sequence[list[int]], plans: Sequence[Plan], coarse: Pairs, reader, *,
               max_shift: int, min_fraction: float, subpixel: str, sigma: float, alpha: float, engine: str,
               progress: ProgressCallback | None, done: int, total: int) -> int:  # fmt: skip
    """Search every pair of ``groups`` within ``max_shift`` px of its stage offset; returns the progress count.

    Tile ``j``'s part of the nominal overlap (``coarse``) is matched against
    tile ``i`` by masked normalised cross-correlation, both band-passed by
    ``reader`` (a difference of Gaussians by normalised convolution:
    structure, not illumination; sharp peaks), for every integer shift within
    ``max_shift``; a shift is a candidate while more than ``min_fraction`` of
    the template meets the search's data. A peak counts only if it beats the
    group's threshold: the ``1 - alpha`` quantile of a Gumbel law fitted to
    the peaks of its null samples (:func:`plan_group`'s ``plans``, one per
    group). :func:`verdict` then calls each pair featureless (zero
    variance), at ``max_shift`` (its peak on the search's edge, or next to a
    shift that keeps too little of the overlap: a stage error that eats most
    of it puts the true peak beyond the search), not significant, ambiguous
    (left for :func:`guided_pass`) or accepted. ``subpixel``: the kernel's sub-pixel
    fit of the peaks ("quadratic" where :func:`refine_pass` follows). Fills
    ``found`` for these pairs.
    """
    for members, plan in zip(groups, plans):
        out, nulls, done = _run_group(
            plan, members, coarse, reader, max_shift, subpixel, sigma, progress, done, total, engine, min_fraction
        )
        group_threshold = gumbel_quantile(nulls, 1 - alpha)
        for slot, k in enumerate(members):
            s, peak, _, featureless, on_edge, _, rival, rival_shift = (o[slot] for o in out)
            found.ncc[k], found.threshold[k] = peak, group_threshold
            found.shift[k] = s + coarse.rounded[k] - coarse.delta[k]
            if np.isfinite(rival):
                found.second_ncc[k] = rival
                found.second_shift[k] = rival_shift + coarse.rounded[k] - coarse.delta[k]
            found.reason[k] = verdict(peak, group_threshold, featureless, on_edge, rival)
            # an ambiguous pair is left for the neighbours' consensus (guided_pass) to decide
            found.ambiguous[k] = found.reason[k] == REASONS.index("ambiguous")
    return done


def broad_pass(found: PairResults, groups, coarse, stage, source: TileReader, *, max_shift, band, engine,
                subpixel, alpha, seed, min_fraction, progress, done, total, rejected_only=False) -> int:  # fmt: skip
    """Search the pairs the octave band found weak again in the broad ``band``; returns the progress count.

    The octave band (``G_sigma - G_2sigma``) keeps the finest structure: the
    sharpest peaks and the lowest null peaks where the tiles are clean. In a
    noisy camera image it holds mostly the pixels' noise, and a pair whose
    overlap shows a few large shapes (handwriting, grid lines, cells at low
    magnification) peaks low or at a repeat of a fine pattern. Such a pair:
    not significant, featureless, ambiguous, at ``max_shift``, or accepted
    with a margin ``(ncc - threshold) / (1 - threshold)`` under
    ``WEAK_MARGIN``, is searched again in the broad band (``BROAD_BAND``
    times ``sigma``), against null samples drawn the same way from its whole
    group, at the same ``false_positive_rate`` (so a pair that matches
    nothing passes one of the two tests with a chance of at most twice the
    rate). Its broad peak is taken if significant and unambiguous there,
    and, for a pair the octave band accepted, with a larger margin.
    ``rejected_only``: the pairs not accepted alone (the search within the
    learned reach, :func:`learned_reach`). Updates ``found`` in place; ``source``: the tiles, unfiltered.
    """
    shift, ncc, threshold, reason = found.shift, found.ncc, found.threshold, found.reason
    margin = (ncc - threshold) / np.maximum(1 - threshold, 1e-6)
    again = [REASONS.index(r) for r in ("not significant", "featureless", "peak at max_shift", "ambiguous")]
    accepted = reason == REASONS.index("accepted")
    # an overlap narrower than the band's low-pass reach holds nothing the octave band missed (a corner between
    # diagonal neighbours, a 6% overlap): searching it again costs a second filter of every tile for nothing
    wide = coarse.extent.min(axis=1) >= BROAD_MIN_EXTENT * band[0]
    rejected = np.isin(reason, again) & wide
    weak_accepted = accepted & ~(margin >= WEAK_MARGIN) & wide
    todo = []
    for members in groups:
        members = np.asarray(members)
        margins = margin[members][accepted[members]]
        # where the octave band is weak across the group (a noisy camera), not a pair here or there, its weak
        # accepted pairs too (on clean tiles a few low margins are ordinary and their peaks right)
        group_weak = not rejected_only and (not len(margins) or np.median(margins) < WEAK_MARGIN)
        todo.append([int(k) for k in members if rejected[k] or (group_weak and weak_accepted[k])])
    if not any(todo):
        return done
    tiles = (source.tiles, source.channel, source.has_channels)  # a reader of this pass's own: its own cache
    if engine == "numpy":
        reader = _stitch_numpy.FilteredTiles(TileReader(*tiles, 0), band, low_only=False, pad=max_shift + MARGIN)
    else:
        reader = TileReader(*tiles, filter_halo(band))
    for members, pool in zip(todo, groups):
        if not members:
            continue
        report(progress, done, total)  # (it may stop the run) the total stays the one announced: a few batches
        plan = plan_group(members, coarse, stage, max_shift + MARGIN, seed, pool=pool)
        out, nulls, _ = _run_group(
            plan, members, coarse, reader, max_shift, subpixel, band, None, done, total, engine, min_fraction
        )
        band_threshold = gumbel_quantile(nulls, 1 - alpha)
        for slot, k in enumerate(members):
            s, peak, _, featureless, on_edge, _, rival, rival_shift = (o[slot] for o in out)
            if verdict(peak, band_threshold, featureless, on_edge, rival) != REASONS.index("accepted"):
                continue  # the octave band's verdict stands
            if reason[k] == REASONS.index("accepted") and margin[k] >= (peak - band_threshold) / (1 - band_threshold):
                continue
            ncc[k], threshold[k] = peak, band_threshold
            shift[k] = s + coarse.rounded[k] - coarse.delta[k]
            found.second_ncc[k], found.second_shift[k] = np.nan, np.nan
            if np.isfinite(rival):
                found.second_ncc[k], found.second_shift[k] = rival, rival_shift + coarse.rounded[k] - coarse.delta[k]
            reason[k] = REASONS.index("accepted")
            found.broad_band[k] = True
    reader.clear()
    return done


def learned_reach(shift: np.ndarray, reason: np.ndarray) -> int | None:
    """``max_shift="auto"``: the search the accepted pairs show the stage needs, or None (fewer than
    ``LEARN_MIN`` accepted pairs).

    ``LEARN_FACTOR`` times the largest stage error any accepted pair measured
    (along any axis), plus ``LEARN_SLACK`` px, at least ``AUTO_SHIFT``. A
    wrong accepted shift can only widen it (a random peak lies anywhere in
    the search); a pair whose stage error exceeds it peaks at its border and
    stays rejected.
    """
    accepted = reason == REASONS.index("accepted")
    if accepted.sum() < LEARN_MIN:
        return None
    largest = float(np.abs(shift[accepted]).max())
    return max(AUTO_SHIFT, int(math.ceil(LEARN_FACTOR * largest)) + LEARN_SLACK)


def guided_pass(found: PairResults, stage, coarse, reader, *, place: Placement, subpixel, sigma, alpha, seed, progress,
                done, total, engine) -> dict[int, tuple]:  # fmt: skip
    """Search again, within ``GUIDED_SHIFT`` px of where the significant pairs place them, the pairs pass 1 missed.

    Pass 1 searches each pair on its *nominal* overlap within ``max_shift``,
    so a pair whose true overlap is less than half the nominal one (the stage
    error eats it: 5 px of a nominal 19) cannot be found, and a small overlap
    (a corner between diagonal neighbours) searched over the whole window has
    null peaks so high (an NCC of 0.8 for 19x19 px at +-16 px) that right peaks
    fail the test. Once the significant pairs are placed (the quadratic fits,
    residual test included), a rejected pair between two tiles that they tie
    together (one connected component) has a predicted offset good to a pixel
    or so: its *actual* overlap at that offset is searched within
    ``+-GUIDED_SHIFT`` px, against a threshold calibrated the same way on null
    samples of the same shape and window (templates against the search regions
    of pairs far apart). A pair significant there is accepted (its shift,
    peak and threshold replaced) and refined with the others; one that is not
    keeps pass 1's result and reason (one that pass 1 accepted but the first
    placement doubted is then refined and decided by the final placement, as
    any accepted pair). An ambiguous pair (:func:`is_ambiguous`: significant,
    but with a near-equal repeat) is searched the same way and accepted if its
    peak there reaches its own threshold or ``AMBIGUITY_RATIO`` of its pass 1
    peak: the repeat the other pairs' placement points to (the consensus).
    ``place(accepted)``: the caller's placement of the tiles from the pairs
    ``accepted`` (a boolean mask) with ``found``'s shifts and information,
    after its residual test; the positions ``(n, d)`` and the reasons after
    that test (a copy: ``found`` keeps its own).
    Updates ``found`` in place; returns pass 1's
    ``(shift, ncc, threshold, reason)`` of each pair the guided search
    accepted, by pair.
    """
    shift, ncc, threshold, reason = found.shift, found.ncc, found.threshold, found.reason
    accepted_here: dict[int, tuple] = {}
    n = len(stage)
    significant = reason == REASONS.index("accepted")
    if not significant.any():
        return accepted_here
    positions, provisional = place(significant)
    kept = provisional == REASONS.index("accepted")
    component = _components(n, coarse.pairs[kept])
    i, j = coarse.pairs[:, 0], coarse.pairs[:, 1]
    tied = component[i] == component[j]  # (i != j: both tiles then hold kept pairs)
    retry = np.isin(provisional, [REASONS.index(r) for r in ("not significant", "peak at max_shift", "residual",
                                                             "ambiguous")])  # fmt: skip
    predicted = positions[j] - positions[i]
    guided = pair_geometry(coarse.pairs, predicted, coarse.shape, 0, 0)  # the actual overlap at the predicted offset
    room = np.all(guided.extent >= MIN_REFINE, axis=1)
    candidates = np.flatnonzero(retry & tied & room)
    if not len(candidates):
        return accepted_here
    groups = group_pairs(candidates, guided)
    plans = [plan_group(members, guided, positions, GUIDED_SHIFT + MARGIN, seed, windows=True) for members in groups]
    for members, plan in zip(groups, plans):
        report(progress, done, total)  # (it may stop the run) the total stays the one announced: a few batches
        out, nulls, _ = _run_group(
            plan, members, guided, reader, GUIDED_SHIFT, subpixel, sigma, None, done, total, engine
        )
        owner = np.array([a for a, _, _ in plan.nulls])
        for slot, k in enumerate(members):
            s, peak, _, featureless, on_edge, *_ = (o[slot] for o in out)
            pair_threshold = gumbel_quantile(nulls[owner == k], 1 - alpha)
            if reason[k] == REASONS.index("ambiguous"):
                # pass 1 found the pair significant, but not where among its near-equal repeats: the one at the
                # placement's prediction is taken if it is one of them (within AMBIGUITY_RATIO of the best)
                pair_threshold = min(pair_threshold, AMBIGUITY_RATIO * float(ncc[k]))
            if featureless or on_edge or not peak >= pair_threshold:
                # not found here: pass 1's verdict stands; a pair pass 1 accepted (that the provisional
                # placement doubted) goes on to the refinement and the final placement, which decide it
                continue
            accepted_here[k] = (shift[k].copy(), ncc[k], threshold[k], reason[k])
            ncc[k], threshold[k] = peak, pair_threshold
            shift[k] = s + guided.rounded[k] - coarse.delta[k]
            reason[k] = REASONS.index("accepted")
    return accepted_here


def _components(n: int, pairs: np.ndarray) -> np.ndarray:
    """The connected component of each of ``n`` tiles in the graph of ``pairs`` (union-find; labels are roots)."""
    root = np.arange(n)

    def find(a):
        while root[a] != a:
            root[a] = root[root[a]]
            a = root[a]
        return a

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            root[max(ra, rb)] = min(ra, rb)
    return np.array([find(a) for a in range(n)])


def refine_pass(found: PairResults, significant: np.ndarray, guided: dict[int, tuple], *, coarse: Pairs, stage,
                source: TileReader, first_reader, engine, sigma, seed, progress, done, total) -> int:  # fmt: skip
    """Refine the significant pairs' shifts to sub-pixel precision; returns the progress count.

    Each pair in ``significant`` (indices) is refined on its whole overlap at
    its coarse offset (:func:`_fine_geometry`: away from the tiles' borders
    where the overlap has room, up to them where it is narrow; low-passed
    only), searched ``FINE_SHIFT`` px around it: Gauss-Newton on
    ``t = a * f(x + s) + b`` with ``f`` resampled by Keys cubic convolution,
    which also gives each shift its covariance (its inverse, ``found.info``,
    weights the pair in the placement). A pair with no room even then
    (overlaps of a few pixels), or whose refinement does not converge, keeps
    the quadratic fit of its NCC peak (``found.refinement`` "peak-fit",
    weighted ``PEAK_FIT_WEIGHT`` of a typical refined pair): a significant
    pair is never dropped for its refinement, but one the guided search found
    (``guided``: pass 1's ``(shift, ncc, threshold, reason)`` by pair) goes
    back to pass 1's verdict. ``source``: the tiles, unfiltered;
    ``first_reader``: :func:`first_pass`'s reader (the NumPy engine reuses
    its tiles' transforms). Updates ``found`` in place.
    """
    shift, ncc, threshold, reason, refinement = found.shift, found.ncc, found.threshold, found.reason, found.refinement
    fine_reader = TileReader(source.tiles, source.channel, source.has_channels, filter_halo(sigma, low_only=True))
    fine = _fine_geometry(coarse.pairs, coarse.delta + shift, coarse.shape, fine_reader.halo)
    if engine == "numpy":
        fine_reader = _stitch_numpy.FilteredTiles(
            first_reader.reader, sigma, low_only=True, pad=2 * MARGIN, spectra=first_reader.spectra
        )
    # a pair too narrow even for the tight box keeps its quadratic fit of the NCC peak ("peak-fit")
    usable = significant[np.all(fine.extent[significant] >= MIN_REFINE, axis=1)]
    for members in group_pairs(usable, fine):
        plan = plan_group(members, fine, stage, FINE_SHIFT + MARGIN, seed, nulls=False)
        out, _, done = _run_group(
            plan, members, fine, fine_reader, FINE_SHIFT, "refine", sigma, progress, done, total, engine
        )
        for slot, k in enumerate(members):
            s, _, inv_cov, featureless, on_edge, failed, *_ = (o[slot] for o in out)
            if featureless or on_edge or failed or not np.all(np.isfinite(inv_cov)):
                # the integer peak was significant: keep its peak fit (weighted down) rather than drop the
                # pair; the placement's residual test still rejects it if it disagrees with the others. A
                # pair the guided search found (within a few px of where the others place it) whose
                # refinement runs away was a near miss: it goes back to what pass 1 found
                if k in guided:  # (a pair pass 1 accepted keeps its peak fit, for the final placement)
                    shift[k], ncc[k], threshold[k], reason[k] = guided[k]
                    if reason[k] != REASONS.index("accepted"):
                        refinement[k] = REFINEMENTS.index("none")
                continue
            shift[k] = s + fine.rounded[k] - coarse.delta[k]
            found.info[k] = inv_cov
            refinement[k] = REFINEMENTS.index("refined")
    _peak_fit_information(found.info, refinement, significant)
    return done


def _peak_fit_information(info: np.ndarray, refinement: np.ndarray, significant: np.ndarray) -> None:
    """Weights for the pairs that kept their peak fit: ``PEAK_FIT_WEIGHT`` of the median refined pair's, isotropic.

    (The refinement's inverse covariances carry the data's scale; the peak fit
    has none, and its error is about twice the refinement's.)
    """
    refined = significant[refinement[significant] == REFINEMENTS.index("refined")]
    peak = significant[refinement[significant] == REFINEMENTS.index("peak-fit")]
    if not len(peak):
        return
    d = info.shape[1]
    typical = float(np.median([np.trace(info[k]) / d for k in refined])) if len(refined) else 1.0
    info[peak] = PEAK_FIT_WEIGHT * (typical if np.isfinite(typical) and typical > 0 else 1.0) * np.eye(d)


# -- the search's reach and the verdict on a peak ---------------------------------------------------------------------


def auto_search(geometry: Pairs, members: np.ndarray) -> tuple[int, float]:
    """``max_shift="auto"``: the search and the candidates' least share of the template, from the overlaps.

    ``w``: the median, over the pairs to register, of the nominal overlap's
    narrowest width along the axes where the pair's tiles are offset. The
    search reaches ``AUTO_REACH * w`` (three quarters of it: a stage error that
    narrows the overlap still leaves a quarter, ``AUTO_FRACTION``, to match),
    at least ``AUTO_SHIFT`` and at most ``max(AUTO_CAP, min(tile) // 4)`` px.
    Where that is no more than ``AUTO_SHIFT`` (overlaps up to 22 px wide), it is
    ``AUTO_SHIFT`` with candidates keeping half the template, as an integer
    ``max_shift`` searches (``MIN_FRACTION``); else the candidates keep
    ``AUTO_FRACTION`` of it.
    """
    widths = []
    for k in members:
        offset = np.abs(geometry.delta[k]) > 0.5
        if offset.any():
            widths.append(int(geometry.extent[k][offset].min()))
    if not widths:
        return AUTO_SHIFT, MIN_FRACTION
    reach = int(AUTO_REACH * float(np.median(widths)))
    if reach <= AUTO_SHIFT:
        return AUTO_SHIFT, MIN_FRACTION
    return min(reach, max(AUTO_CAP, min(geometry.shape) // 4)), AUTO_FRACTION


def verdict(peak: float, threshold: float, featureless: bool, on_edge: bool, rival: float) -> int:
    """A search's verdict on a pair, an index into :data:`REASONS`: featureless, its peak at ``max_shift``, not
    significant (under ``threshold``), ambiguous (:func:`is_ambiguous`), else accepted."""
    if featureless:
        return REASONS.index("featureless")
    if on_edge:
        return REASONS.index("peak at max_shift")
    if not peak >= threshold:
        return REASONS.index("not significant")
    if is_ambiguous(peak, rival):
        return REASONS.index("ambiguous")
    return REASONS.index("accepted")


def is_ambiguous(peak: float, rival: float) -> bool:
    """Whether a significant peak is one of several near-equal repeats.

    ``rival`` is the best local maximum of the pair's NCC more than
    ``RIVAL_SEPARATION`` (3) px from the peak along some axis. The peak is
    ambiguous if the rival is near-equal on both scales: it reaches
    ``AMBIGUITY_RATIO`` (0.9) of the peak's NCC, and its mismatch ``1 - NCC``
    is at most ``AMBIGUITY_MISMATCH`` (2) times the peak's. The ratio alone
    would call every lattice with a few unique marks ambiguous (a repeat at
    0.95 against the truth at 0.99: a mismatch five times larger, which the
    overlap's thousands of pixels tell apart); the mismatch alone, every weak
    pair (0.3 against 0.35). A pair whose NCCs all sit near 1 and agree to
    within the noise (0.995 against 0.997) is ambiguous, as is a weak one
    with a near-equal rival (0.33 against 0.35).
    """
    near = rival >= AMBIGUITY_RATIO * peak and 1 - rival <= AMBIGUITY_MISMATCH * (1 - peak)
    return bool(np.isfinite(rival) and near)


def gumbel_quantile(samples: np.ndarray, q: float) -> float:
    """The ``q`` quantile of a Gumbel law fitted by moments to the finite ``samples`` (maxima of correlations).

    With fewer than 8 finite samples, a threshold that nothing passes by chance (0.5).
    """
    x = samples[np.isfinite(samples)]
    if len(x) < 8:
        return 0.5
    beta = max(float(np.std(x)) * math.sqrt(6) / math.pi, 1e-6)
    mu = float(np.mean(x)) - 0.5772156649 * beta
    return float(min(mu - beta * math.log(-math.log(q)), 0.999))


# -- a group of pairs and its null samples through a kernel -----------------------------------------------------------


def group_pairs(members: Sequence[int], geometry: Pairs) -> list[list[int]]:
    """Pairs grouped by how many axes their overlap is short along: at most ``d`` groups, one program each.

    (In a 2D grid: the edge pairs, horizontal ones transposed, and the corner pairs.)
    """
    groups: dict[tuple, list[int]] = {}
    for k in members:
        groups.setdefault(tuple(sorted(_long_axes(geometry, k))), []).append(int(k))
    return list(groups.values())


def _long_axes(geometry: Pairs, k: int) -> tuple[bool, ...]:
    return tuple(bool(e > s // 2) for e, s in zip(geometry.extent[k], geometry.shape))


def _canonical(geometry: Pairs, k: int) -> np.ndarray:
    """The axis order that puts a pair's short axes first: a horizontal pair transposed is a vertical one."""
    return np.argsort(_long_axes(geometry, k), kind="stable")


def _static_shape(extents: np.ndarray) -> tuple[int, ...]:
    """A pair shape for a group of templates: the largest extent per axis, rounded up to 8 (fewer compiles)."""
    return tuple(int(8 * math.ceil(e / 8)) for e in extents.max(axis=0))


@dataclass
class Plan:
    t_shape: tuple[int, ...]
    batch: int
    batches: int
    nulls: list[tuple[int, int, tuple[bool, ...]]]  # (template pair, search pair, flipped axes)
    own_size: bool = False  # null samples: the template pair's size (search regions cut), else the search pair's


def plan_group(members, geometry, stage, reach, seed, *, nulls=True, windows=False, pool=None) -> Plan:
    """The static pair shape, the batch size and the null (non-matching) samples of one group of pairs.

    Null samples: each template turned by 180 degrees (mirrored along every
    axis) against its own search region, then templates against the search
    regions of pairs far apart on the stage, drawn at random (``seed``) from
    ``pool`` (default: ``members``; pairs of one static shape), up to
    ``max(MIN_NULL, NULL_PER_PAIR * pairs)`` in all; with a single pair to
    draw from, its template mirrored along every combination of axes.
    ``windows``: each pair's own nulls instead (:func:`_plan_windows`).
    """
    pool = members if pool is None else pool
    d = stage.shape[1]
    # (the pool's largest: its templates serve the null samples)
    t_shape = _static_shape(np.stack([geometry.extent[k][_canonical(geometry, k)] for k in pool]))
    per_pair = 16 * math.prod(t + 2 * reach for t in t_shape) * 4  # FFT work arrays, float32
    batch = max(1, min(BATCH_BYTES // per_pair, BATCH_PAIRS))
    samples: list[tuple[int, int, tuple[bool, ...]]] = []
    if nulls:
        flips = [f for f in itertools.product((False, True), repeat=d) if any(f)]
        if windows:
            return _plan_windows(members, geometry, stage, reach, seed, t_shape, batch)
        if len(pool) > 1:
            flips = [(True,) * d]
        samples = [(k, k, f) for k in members for f in flips]
        wanted = max(MIN_NULL, NULL_PER_PAIR * len(members))
        rng = np.random.default_rng(seed)
        tries = 0
        while len(pool) > 1 and len(samples) < wanted and tries < 20 * wanted:
            tries += 1
            a, b = rng.choice(pool, 2, replace=False)
            if _far_apart(a, b, geometry, stage, reach):
                samples.append((int(a), int(b), (False,) * d))
    batches = math.ceil(len(members) / batch) + math.ceil(len(samples) / batch)
    return Plan(t_shape, batch, batches, samples)


def _plan_windows(members, geometry, positions, reach, seed, t_shape, batch) -> Plan:
    """:func:`plan_group`'s null samples for the guided pass, each pair's own: ``GUIDED_NULLS`` per pair.

    A pair's template (its whole overlap) turned by 180 degrees against its
    own search region, then against windows of its search region's size cut
    at random from random tiles, away from the template's content (placed by
    ``positions``): the nulls have the template's size, which sets how high
    chance peaks reach (a corner of 6x19 px far higher than an edge of 15x180
    px), so each pair gets its own threshold.
    """
    n, d = positions.shape
    rng = np.random.default_rng(seed)
    integers = rng.integers
    origins = positions.tolist()  # (Python numbers: the draws below are many and each tiny)
    samples: list[tuple] = []
    for a in members:
        j = geometry.pairs[a][1]
        extent = (geometry.extent[a] + 2 * reach).tolist()
        room = [max(int(m - e), 0) + 1 for m, e in zip(geometry.shape, extent)]
        # a window is away from the template's content when it lies 2 reach px beyond it along some axis
        after = (positions[j] + geometry.lo[a] + geometry.extent[a] + 2 * reach).tolist()
        before = (positions[j] + geometry.lo[a] - 2 * reach - np.asarray(extent)).tolist()
        samples.append((a, None, (True,) * d))
        drawn = 1
        for _ in range(20 * GUIDED_NULLS):
            if drawn >= GUIDED_NULLS:
                break
            tile = int(integers(n))
            start = tuple(int(integers(0, r)) for r in room)
            origin = origins[tile]
            if any(after[k] <= origin[k] + start[k] or origin[k] + start[k] <= before[k] for k in range(d)):
                samples.append((a, (tile, start), (False,) * d))
                drawn += 1
    batches = math.ceil(len(members) / batch) + math.ceil(len(samples) / batch)
    return Plan(t_shape, batch, batches, samples, own_size=True)


def _far_apart(a, b, geometry, stage, reach) -> bool:
    """Whether pair ``a``'s template (in tile j_a) and pair ``b``'s search region (in tile i_b) can share content."""
    ja, ib = geometry.pairs[a][1], geometry.pairs[b][0]
    t_lo = stage[ja] + geometry.lo[a]
    t_hi = t_lo + geometry.extent[a]
    s_lo = stage[ib] + geometry.lo[b] + geometry.rounded[b] - reach
    s_hi = s_lo + geometry.extent[b] + 2 * reach
    margin = 2 * reach
    return bool(np.any((t_hi + margin <= s_lo) | (s_hi + margin <= t_lo)))


def _run_group(plan, members, geometry, reader, max_shift, subpixel, sigma, progress, done, total, engine="jax",
               min_fraction=MIN_FRACTION):  # fmt: skip
    """Register a group's pairs and its null samples in batches of one static shape (axes in canonical order).

    Returns the pairs' results (the kernels' eight outputs: shift, information
    and the rival's shift in the tiles' axis order), the null samples' peaks
    and the progress count. ``min_fraction``: a shift is a candidate while
    more than this share of the template meets the search's data.
    """
    # the NumPy engine's integer search cuts its regions 1 px beyond max_shift (its peak's neighbours: the NCC at
    # a shift does not depend on how far the region reaches past it), not MARGIN: smaller transforms and sums.
    # The JAX engine keeps one region shape for both passes' programs; the refinement needs MARGIN to resample
    margin = 1 if engine == "numpy" and subpixel != "refine" else MARGIN
    reach = max_shift + margin
    t_shape = plan.t_shape
    s_shape = tuple(t + 2 * reach for t in t_shape)
    h = reader.halo

    orders: dict[int, tuple[int, ...]] = {}
    made: dict[tuple, tuple] = {}  # a pair's regions serve many items: each request made once

    def order_of(k):
        if k not in orders:
            orders[k] = tuple(_canonical(geometry, k).tolist())
        return orders[k]

    def ints(values) -> tuple[int, ...]:
        return tuple(int(v) for v in values)

    # a region: (tile, start, order, cut, flips), Python integers (hashable: a batch's distinct regions are
    # found by it): [start, start + cut) along the tile's axes ``order`` (cut in that order), its axes ``order``
    # first, flipped along ``flips``; cut to the batch's shape by the caller
    def template_of(k, flips=None, limit=None):
        """Pair k's template (canonical axes, cut to ``limit``, flipped)."""
        key = ("t", k, flips, None if limit is None else ints(limit))
        if key not in made:
            order = list(order_of(k))
            extent = geometry.extent[k][order] if limit is None else np.minimum(geometry.extent[k][order], limit)
            made[key] = (int(geometry.pairs[k][1]), ints(geometry.lo[k]), order_of(k), ints(extent),
                         None if flips is None else tuple(bool(f) for f in flips))  # fmt: skip
        return made[key]

    def search_of(k):
        key = ("s", k)
        if key not in made:
            order = list(order_of(k))
            made[key] = (int(geometry.pairs[k][0]), ints(geometry.lo[k] + geometry.rounded[k] - reach), order_of(k),
                         ints((geometry.extent[k] + 2 * reach)[order]), None)  # fmt: skip
        return made[key]

    def window_of(k, tile, start):  # pair k's search region's shape, cut from elsewhere (the plan's window, drawn
        search = search_of(k)  # MARGIN px beyond max_shift: its inner part when the regions reach less far)
        return (int(tile), tuple(int(x) + MARGIN - margin for x in start), search[2], search[3], None)

    def cut_region(tile, start, order, cut, flips):
        """One region, read through the reader (with its halo), as the batch wants it."""
        inverse = np.argsort(order)
        region = reader.region(tile, np.asarray(start), np.asarray(cut)[inverse]).transpose(order)
        if flips is not None and any(flips):
            region = np.flip(region, axis=tuple(a for a, f in enumerate(flips) if f))
        return region

    def corner(shape):
        return tuple(slice(0, int(n)) for n in shape)

    # NumPy: several of the plan's batches at once (fewer, larger array operations; the same results); JAX: one
    # batch of the plan's static size per call
    fit = min(NUMPY_BATCH_PAIRS, BATCH_BYTES // (16 * math.prod(s_shape) * 4))  # as plan_group's bound
    step = plan.batch * (max(1, fit // plan.batch) if engine == "numpy" else 1)
    gather = getattr(reader, "gather", None)

    def batches(items):
        """``(indices, template shape, search shape)`` per batch. JAX: the plan's static shapes, in order. NumPy:
        items of one region size together (sizes rounded up to ``NUMPY_BUCKET`` px), each batch as large as its
        items need (nothing compiled: no shape to share; a group's corners or a pass's nulls vary in size)."""
        if engine != "numpy":
            return [(list(range(a, min(a + step, len(items)))), t_shape, s_shape) for a in range(0, len(items), step)]
        coarse = subpixel == "refine"
        keys = np.concatenate([_bucket(np.array([item[q][3] for item in items]), coarse) for q in (1, 0)], axis=1)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        out = []
        for u, key in enumerate(unique):
            indices = np.flatnonzero(inverse.reshape(-1) == u).tolist()
            t_cut, s_cut = key[: len(t_shape)], key[len(t_shape) :]
            t_b = tuple(min(int(c), n) for c, n in zip(t_cut, t_shape))
            s_b = tuple(min(max(int(c), t + 2 * reach), n) for c, t, n in zip(s_cut, t_b, s_shape))
            out += [(indices[a : a + step], t_b, s_b) for a in range(0, len(indices), step)]
        return out

    def run(items):
        nonlocal done
        start, finished, calls = done, 0, 0
        results: list = [None] * 8
        for indices, t_b, s_b in batches(items):
            chunk = [items[i] for i in indices]
            shared = None
            if engine == "numpy":  # each distinct region once (a pair and its null samples share some)
                search_list, template_list, shared = _distinct(chunk)
            else:
                search_list, template_list = [s for s, _ in chunk], [t for _, t in chunk]
            size = len(chunk) if engine == "numpy" else plan.batch  # JAX: padded to one compiled shape
            n_s, n_t = (len(search_list), len(template_list)) if shared else (size, size)
            searches = np.full((n_s, *(n + 2 * h for n in s_b)), np.nan, np.float32)
            templates = np.full((n_t, *(n + 2 * h for n in t_b)), np.nan, np.float32)
            cuts = np.zeros((n_t, len(t_b)), np.int64)
            cuts[: len(template_list)] = [template[3] for template in template_list]
            inside = np.ones((n_t, *t_b), bool)  # each template's mask: [0, cut) along every axis
            for a, n in enumerate(t_b):
                inside &= (np.arange(n)[None, :] < cuts[:, a : a + 1]).reshape(
                    (n_t, *(n if b == a else 1 for b in range(len(t_b))))
                )
            masks = inside.astype(np.float32)
            if engine != "numpy":
                searches[len(chunk) :] = 0
                templates[len(chunk) :] = 0
            # band-passed tiles in one stack: the regions cut from it in place; else one by one (with a halo)
            if not (gather is not None and gather(search_list, searches) and gather(template_list, templates)):
                for slot, search in enumerate(search_list):  # written in place: no padded copies to stack
                    region = cut_region(*search)
                    searches[slot][corner(region.shape)] = region
                for slot, template in enumerate(template_list):
                    region = cut_region(*template)
                    templates[slot][corner(region.shape)] = region
            if engine == "numpy":  # nothing compiled: no need for one batch shape
                out = _stitch_numpy.register_batch(
                    searches, templates, masks, max_shift=max_shift, subpixel=subpixel, sigma=sigma,
                    filtered=isinstance(reader, _stitch_numpy.FilteredTiles), items=shared, margin=margin,
                    min_fraction=min_fraction,
                )  # fmt: skip
            else:
                import jax.numpy as jnp

                from napari_gridmip.core.patches._stitch_jax import _register_batch

                out = _register_batch(
                    jnp.asarray(searches),
                    jnp.asarray(templates),
                    jnp.asarray(masks),
                    max_shift=max_shift,
                    subpixel=subpixel,
                    sigma=sigma,
                    min_fraction=min_fraction,
                )
            for q, x in enumerate(out):
                x = np.asarray(x)[: len(chunk)]
                if results[q] is None:
                    results[q] = np.empty((len(items), *x.shape[1:]), x.dtype)
                results[q][indices] = x
            finished, calls = finished + len(chunk), calls + 1
            # one step per batch run, but never past the plan's count of batches for the items done
            done = start + min(calls, math.ceil(finished / plan.batch))
            report(progress, done, total)
        return results

    items = [(search_of(k), template_of(k)) for k in members]
    if plan.own_size:  # (pair, None: its own search region | (tile, start): a window, flips)
        items += [(search_of(a) if w is None else window_of(a, *w), template_of(a, f)) for a, w, f in plan.nulls]
    else:
        for a, b, f in plan.nulls:
            items.append((search_of(b), template_of(a, f, limit=geometry.extent[b][list(order_of(b))])))
    # the pairs and their null samples in one run: a pair's regions serve its null samples too (NumPy)
    results = run(items)
    out, nulls = [r[: len(members)] for r in results], results[1][len(members) :]
    for slot, k in enumerate(members):  # back to the tiles' axis order
        order = list(order_of(k))
        shift, info, rival = out[0][slot].copy(), out[2][slot].copy(), out[7][slot].copy()
        out[0][slot][order] = shift
        out[2][slot][np.ix_(order, order)] = info
        out[7][slot][order] = rival
    return out, nulls, done


def _distinct(chunk) -> tuple[list, list, tuple[np.ndarray, np.ndarray]]:
    """A batch's distinct search and template regions, and ``(si, ti)``: which of them each item pairs."""
    keys: tuple[dict, dict] = ({}, {})
    lists: tuple[list, list] = ([], [])
    index = np.zeros((2, len(chunk)), np.int64)
    for slot, item in enumerate(chunk):
        for q, key in enumerate(item):  # (a region is a tuple of Python integers: its own key)
            if key not in keys[q]:
                keys[q][key] = len(lists[q])
                lists[q].append(key)
            index[q, slot] = keys[q][key]
    return lists[0], lists[1], (index[0], index[1])


def _bucket(extent, coarse: bool) -> np.ndarray:
    """A region's extent rounded up to ``NUMPY_BUCKET`` px (twice that when ``coarse``), or to 8 times that
    along long axes (64 px and more), so that a NumPy batch holds regions of similar sizes and batches are few."""
    extent = np.asarray(extent)
    step = np.where(extent >= 64, 8 * NUMPY_BUCKET, NUMPY_BUCKET * (2 if coarse else 1))
    return -(-extent // step) * step
