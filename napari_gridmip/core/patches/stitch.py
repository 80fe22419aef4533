"""Registering mosaic tiles whose positions are only roughly known, and the stage grid they come from.

Coordinates: a tile's *origin* is the scene coordinate of its pixel ``(0, ..., 0)``;
its pixel ``k`` sits at ``origin + k``. Axes are the tiles' spatial axes in order
(``(y, x)`` or ``(z, y, x)``). For a pair ``(i, j)`` the *offset* is
``origin_j - origin_i``; the *shift* is how far the measured offset lies from
the stage's: ``shift = measured offset - (stage_j - stage_i)``.

How :func:`register_tiles` works (and where it differs from ASHLAR, MIST and m2stitch):

1. Every pair whose stage footprints overlap is registered on its overlap,
   both regions band-passed first (a difference of Gaussians by normalised
   convolution: structure, not illumination; sharp peaks). Tile ``j``'s part
   of the nominal overlap is matched against tile ``i`` by masked normalised
   cross-correlation (over the pixels both hold at each shift, so the whole
   overlap is used even when ``max_shift`` is close to its width; a shift
   that keeps less than half of it is not a candidate, less than a quarter
   where ``max_shift="auto"`` searches beyond 16 px) for every integer
   shift within ``max_shift`` (FFTs; horizontal pairs transposed into
   vertical ones). Small mosaics on a CPU run a NumPy/SciPy kernel
   (``_stitch_numpy``: nothing to compile, each tile band-passed once);
   large ones, or on an accelerator, one compiled JAX program per pair
   shape, pairs batched and padded to static shapes. Both give the same
   results.
2. A peak counts only if it beats a threshold calibrated on the data: the
   ``1 - false_positive_rate`` quantile of a Gumbel law fitted by moments to
   the peaks of pairs known not to match (each template turned by 180
   degrees against its own search region, and templates against the search
   regions of pairs far apart on the stage), per pair shape. Featureless
   overlaps (zero variance) and peaks on the edge of the search are rejected too.
   A significant peak with a near-equal rival elsewhere in the search (a
   repeat of a periodic texture: 0.9 of its NCC at least, and at most twice
   its mismatch ``1 - NCC``) is *ambiguous*: not taken, but left to the
   neighbours' consensus below.
   Then a second pass refines each significant pair on its whole overlap at
   the coarse offset (searched +-2 px, away from the tiles' borders where the
   overlap has room, up to them where it is narrow, low-passed only):
   Gauss-Newton on ``t = a * f(x + s) + b`` with ``f`` resampled by Keys
   cubic convolution, which also gives each shift its covariance. A pair
   with no room even then (overlaps of a few pixels), or whose refinement
   does not converge, keeps the quadratic fit of its NCC peak (weighted a
   quarter of a typical refined pair): a significant pair is never dropped
   for its refinement.
   A peak next to a shift that keeps less than half the overlap counts as
   on the edge too (a stage error that eats most of the overlap puts the
   true peak beyond the search).
   Then the pairs pass 1 missed between tiles its significant pairs tie
   together are searched again (``_guided_pass``): within ``GUIDED_SHIFT`` px
   of the offset a first placement predicts, on their actual overlap there,
   against each pair's own threshold from null samples of its template's
   size. Narrowed edges (5 px of a nominal 19) and the corners of diagonal
   neighbours are found this way; a guided pair whose refinement runs away
   goes back to pass 1's verdict. An ambiguous pair is searched there too,
   and accepted where the placement predicts it if its peak there is one of
   its repeats (0.9 of its best NCC); else it is left out.
3. All accepted pairs are placed at once by weighted least squares (sparse normal equations, SciPy; each pair
   weighted by the inverse covariance of its shift: a pair whose overlap has
   structure along one direction only constrains that direction only), so
   errors do not pile up along a spanning tree; then pairs whose residual
   disagrees with the rest (above ``max(max_residual, 4 x median)``, the worst
   pair of its neighbourhood) are rejected one neighbourhood at a time and the
   placement solved again.
4. Rejected and unregistered pairs still tie their tiles to the stage: they
   enter the least squares with their stage offset and a weight 10^4 times
   smaller than the median accepted pair, so a tile or a group of tiles with
   no accepted pair keeps its stage position relative to its neighbours, and
   groups linked by accepted pairs move rigidly. A 10^-8 pull towards the
   stage fixes the mosaic's overall translation (its mean stays the stage's).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip.core import validate
from napari_gridmip.core.options import GRID_ORDERS, STITCH_SUBPIXEL
from napari_gridmip.core.patches import _stitch_numpy
from napari_gridmip.core.patches._stitch_shared import (  # noqa: F401 - re-exported for the tests
    CACHE_BYTES,
    GN_ITERATIONS,
    MARGIN,
    MAX_REFINE_STEP,
    MIN_FRACTION,
    RIVAL_SEPARATION,
    _gaussian_spectrum,
    filter_halo,
    filters,
)

__all__ = ["grid_positions", "register_tiles"]

ProgressCallback = Callable[[int, int], None]

FINE_SHIFT = 0  # the refinement pass starts at the coarse peak (within 0.5 px) and may move MAX_REFINE_STEP
WEAK_WEIGHT = 1e-4  # stage ties of rejected pairs, relative to the median accepted pair's weight
PRIOR_WEIGHT = 1e-8  # pull of every tile to its stage position, relative to the same
BATCH_BYTES = 256 * 2**20  # pairs per compiled call: about this much working memory
BATCH_PAIRS = 32  # pairs per compiled call at most: one program serves any mosaic of the same tile geometry
NUMPY_BATCH_PAIRS = 128  # pairs per NumPy call at most (within BATCH_BYTES: batches of BATCH_PAIRS merged)
NUMPY_BUCKET = 4  # NumPy batches group regions whose sizes round up to the same multiple of this (px)
NULL_PER_PAIR = 1  # null (non-matching) samples per registered pair, at least
MIN_NULL = 64  # and at least this many per pair shape
NUMPY_MAX_WORK = 2 * 10**8  # pair work (pixels of search regions, padded batches) below which NumPy runs the kernel
FORCE_ENGINE: str | None = None  # "numpy" or "jax" to override the choice (tests, benchmarks)

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
MIN_REFINE = 3  # the refinement's box must be at least this wide (px) along every axis
GUIDED_SHIFT = 3  # pairs pass 1 missed are searched again within this many px of their predicted offset
GUIDED_NULLS = 24  # null samples per pair searched again (its own threshold)
PEAK_FIT_WEIGHT = 0.25  # a peak-fit pair's weight relative to the median refined pair's (its error is about 2x)
AMBIGUITY_RATIO = 0.9  # a rival peak with at least this fraction of the best's NCC ... (_is_ambiguous)
AMBIGUITY_MISMATCH = 3.0  # ... and at most this many times its mismatch (1 - NCC) makes a pair ambiguous
AUTO_SHIFT = 16  # max_shift="auto" searches at least this far (px) ...
AUTO_REACH = 0.75  # ... and up to this fraction of the typical overlap width ...
AUTO_FRACTION = 0.25  # ... keeping this fraction of the overlap's pixels at least, where it searches beyond AUTO_SHIFT
AUTO_CAP = 64  # ... and at most max(AUTO_CAP, a quarter of the tile's smallest side) px
BROAD_BAND = (2.0, 32.0)  # the second search's band, G_2sigma - G_32sigma (_broad_pass) ...
WEAK_MARGIN = 0.2  # ... for the pairs accepted with a margin (ncc - threshold) / (1 - threshold) under this, or not
BROAD_MIN_EXTENT = 8  # ... whose overlap is at least this many times the band's low width (16 px at sigma 1)
LEARN_MIN = 3  # max_shift="auto": with this many pairs accepted, the rejected ones are searched again within ...
LEARN_FACTOR = 1.25  # ... this many times the largest stage error an accepted pair measured ...
LEARN_SLACK = 4  # ... plus this many px (_learned_reach)


# -- the stage grid ---------------------------------------------------------------------


def grid_indices(grid_shape: Sequence[int], order: str = "row-major") -> np.ndarray:
    """The grid index ``(n, d)`` of each tile in acquisition order.

    ``"row-major"``: the last axis fastest (C order). ``"column-major"``: the
    first axis fastest. ``"snake"``: row-major, with the direction of each
    faster axis reversed on every other pass of the slower ones (boustrophedon),
    as stages that do not fly back scan.
    """
    grid_shape = tuple(int(g) for g in grid_shape)
    if order == "column-major":
        return np.array([idx[::-1] for idx in itertools.product(*(range(g) for g in grid_shape[::-1]))], dtype=np.int64)
    out = np.array(list(itertools.product(*(range(g) for g in grid_shape))), dtype=np.int64)
    if order == "snake":
        visit = out.copy()  # the position along each axis in visiting order, before any reversal
        for axis in range(1, len(grid_shape)):
            # the passes made so far along this axis: the slower axes' positions, flattened in visiting order
            passes = np.zeros(len(out), np.int64)
            for slower in range(axis):
                passes = passes * grid_shape[slower] + visit[:, slower]
            flip = passes % 2 == 1
            out[flip, axis] = grid_shape[axis] - 1 - out[flip, axis]
    return out.reshape(-1, len(grid_shape))


def grid_positions(
    grid_shape: Sequence[int], tile_shape: Sequence[int], overlap: Any, *, order: str = "row-major"
) -> np.ndarray:
    """Stage origins of a regular grid of tiles, in acquisition order.

    Parameters
    ----------
    grid_shape
        Tiles along each axis, ``(rows, cols)`` or ``(planes, rows, cols)``.
    tile_shape
        A tile's spatial shape, same length.
    overlap
        The overlap between neighbours as a *fraction* of the tile (``0 <= overlap < 1``),
        one number for every axis or one per axis. The step between origins is
        ``tile_shape * (1 - overlap)`` pixels, not rounded (stage positions are
        fractional anyway). For an overlap in pixels ``p``, pass ``p / tile_shape``.
    order
        Acquisition order: ``"row-major"`` (the last axis fastest, default),
        ``"column-major"`` (the first axis fastest) or ``"snake"`` (row-major,
        every other row reversed).

    Returns
    -------
    numpy.ndarray
        ``(n, d)`` float64 origins, ``n = prod(grid_shape)``: tile ``t`` (the
        ``t``-th acquired) at grid index ``g`` has origin ``g * step``.

    Raises
    ------
    ValueError
        If the shapes are not positive integers of one length (1 to 3), the
        overlap is outside ``[0, 1)`` or ``order`` is unknown.

    Examples
    --------
    >>> grid_positions((2, 2), (100, 100), 0.1, order="snake").tolist()
    [[0.0, 0.0], [0.0, 90.0], [90.0, 90.0], [90.0, 0.0]]
    """
    grid_shape = validate.int_tuple("grid_shape", grid_shape)
    if not 1 <= len(grid_shape) <= 3:
        raise ValueError(f"grid_shape must have 1 to 3 axes; got {grid_shape}")
    tile_shape = validate.int_tuple("tile_shape", tile_shape, len(grid_shape))
    order = validate.check_choice("order", order, GRID_ORDERS)
    overlap = _overlap_fractions(overlap, len(grid_shape))
    step = np.asarray(tile_shape, np.float64) * (1 - overlap)
    return grid_indices(grid_shape, order).astype(np.float64) * step


def _overlap_fractions(overlap: Any, d: int) -> np.ndarray:
    values = [overlap] * d if np.ndim(overlap) == 0 else list(overlap)
    if len(values) != d:
        raise ValueError(f"overlap must be one fraction or {d}; got {overlap!r}")
    out = np.array([validate.check_finite_scalar("overlap", v) for v in values])
    if np.any(out < 0) or np.any(out >= 1):
        raise ValueError(f"overlap is a fraction of the tile, 0 <= overlap < 1; got {overlap!r}")
    return out


# -- the result -------------------------------------------------------------------------


@dataclass(frozen=True)
class TileRegistration:
    """What :func:`register_tiles` returns (NumPy arrays; ``n`` tiles, ``p`` pairs, ``d`` axes)."""

    positions: np.ndarray
    """``(n, d)`` float64: the refined origins."""
    stage_positions: np.ndarray
    """``(n, d)`` float64: the origins given."""
    pairs: np.ndarray
    """``(p, 2)`` int: the tiles ``(i, j)``, ``i < j``, of every pair whose stage footprints overlap."""
    shift: np.ndarray
    """``(p, d)`` float64: measured offset minus stage offset (NaN where nothing was measured)."""
    ncc: np.ndarray
    """``(p,)`` float64: the pair's normalised cross-correlation at its integer peak, its confidence (NaN where
    not measured)."""
    threshold: np.ndarray
    """``(p,)`` float64: the significance threshold its ``ncc`` had to reach (per pair shape)."""
    accepted: np.ndarray
    """``(p,)`` bool: used by the final placement."""
    reason: np.ndarray
    """``(p,)`` int: index into :data:`REASONS` ("accepted", "not significant", "featureless", ...)."""
    residual: np.ndarray
    """``(p,)`` float64: ``|placed offset - measured offset|`` in pixels (NaN where not measured)."""
    placed_from_stage: np.ndarray
    """``(n,)`` bool: tiles without an accepted pair, placed by their stage offsets to their neighbours."""
    tile_confidence: np.ndarray
    """``(n,)`` float64: the best ``ncc`` among a tile's accepted pairs (0 where none)."""
    median_residual: float
    """The median ``residual`` of the accepted pairs (px; NaN if none)."""
    refinement: np.ndarray
    """``(p,)`` int: index into :data:`REFINEMENTS`, how a significant pair's sub-pixel shift was found:
    ``"refined"`` (Gauss-Newton on the overlap), ``"peak-fit"`` (the quadratic fit of the NCC around its integer
    peak: the overlap left too little room for the refinement, or it did not converge) or ``"none"``."""
    ambiguous: np.ndarray
    """``(p,)`` bool: the pair's significant peak had a rival (one of several near-equal repeats: ruled or
    periodic texture), so it was not taken as found. ``accepted`` too: the neighbours' consensus resolved it
    (the repeat where the other pairs place the tile); reason ``"ambiguous"``: it was left out."""
    second_ncc: np.ndarray
    """``(p,)`` float64: the NCC of the best rival peak of the first search (NaN where none or not measured)."""
    second_shift: np.ndarray
    """``(p, d)`` float64: that rival's shift (measured offset minus stage offset; NaN where none)."""
    max_shift: int
    """The search used, px per axis (``max_shift="auto"`` resolved)."""
    broad_band: np.ndarray
    """``(p,)`` bool: the pair's peak (``shift``, ``ncc``, ``threshold``, the rival) is the broad band's
    (``G_2sigma - G_32sigma``), which the pair was searched again in because the octave band found it weak
    (see Notes of :func:`register_tiles`)."""

    @property
    def refinements(self) -> list[str]:
        """``refinement`` as text, pair by pair."""
        return [REFINEMENTS[r] for r in self.refinement]

    @property
    def reasons(self) -> list[str]:
        """``reason`` as text, pair by pair."""
        return [REASONS[r] for r in self.reason]

    @property
    def rejected_pairs(self) -> np.ndarray:
        """``(r, 2)``: the measured pairs that were not used."""
        return self.pairs[~self.accepted]

    @property
    def tiles_from_stage(self) -> np.ndarray:
        """Indices of the tiles placed from the stage."""
        return np.flatnonzero(self.placed_from_stage)


# -- pair geometry (NumPy: indices only) ------------------------------------------------


@dataclass
class _Pairs:
    pairs: np.ndarray  # (p, 2)
    delta: np.ndarray  # (p, d) stage offsets, float
    rounded: np.ndarray  # (p, d) int
    lo: np.ndarray  # (p, d) template start in tile j
    extent: np.ndarray  # (p, d) template extent (may be <= 0)
    shape: tuple[int, ...]  # the tiles' spatial shape


def _overlapping_pairs(stage: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``(i, j)``, ``i < j``, whose footprints overlap, and its stage offset."""
    n, d = stage.shape
    i, j = np.triu_indices(n, 1)
    delta = stage[j] - stage[i]
    keep = np.all(np.abs(delta) < np.asarray(shape), axis=1)
    return np.stack([i[keep], j[keep]], 1).reshape(-1, 2), delta[keep].reshape(-1, d)


def _geometry(pairs: np.ndarray, delta: np.ndarray, shape: tuple[int, ...], reach: int, border: int) -> _Pairs:
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
    return _Pairs(pairs, delta, rounded, lo, hi - lo, tuple(shape))


def _fine_geometry(pairs: np.ndarray, delta: np.ndarray, shape: tuple[int, ...], halo: int) -> _Pairs:
    """The refinement's boxes: ``halo`` px inside both tiles where the overlap has room, else at their borders.

    The low-pass is a normalised convolution, so a box that reaches a tile's
    border sees a one-sided (but unbiased in intensity) average there: a
    slightly worse refinement, far better than none. Narrow overlaps (10 to
    20 px, as microscopes take them) leave fewer than ``MIN_REFINE`` px once
    the halo is kept on both sides.
    """
    reach = FINE_SHIFT + MARGIN
    inner = _geometry(pairs, delta, shape, reach, halo)
    tight = _geometry(pairs, delta, shape, reach, 0)
    narrow = np.any(inner.extent < MIN_REFINE, axis=1)[:, None]
    inner.lo = np.where(narrow, tight.lo, inner.lo)
    inner.extent = np.where(narrow, tight.extent, inner.extent)
    return inner


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


def _long_axes(geometry: _Pairs, k: int) -> tuple[bool, ...]:
    return tuple(bool(e > s // 2) for e, s in zip(geometry.extent[k], geometry.shape))


def _canonical(geometry: _Pairs, k: int) -> np.ndarray:
    """The axis order that puts a pair's short axes first: a horizontal pair transposed is a vertical one."""
    return np.argsort(_long_axes(geometry, k), kind="stable")


def _groups(members: Sequence[int], geometry: _Pairs) -> list[list[int]]:
    """Pairs grouped by how many axes their overlap is short along: at most ``d`` groups, one program each.

    (In a 2D grid: the edge pairs, horizontal ones transposed, and the corner pairs.)
    """
    groups: dict[tuple, list[int]] = {}
    for k in members:
        groups.setdefault(tuple(sorted(_long_axes(geometry, k))), []).append(int(k))
    return list(groups.values())


def _static_shape(extents: np.ndarray) -> tuple[int, ...]:
    """A pair shape for a group of templates: the largest extent per axis, rounded up to 8 (fewer compiles)."""
    return tuple(int(8 * math.ceil(e / 8)) for e in extents.max(axis=0))


# -- the pair kernel's pieces shared by both engines (NumPy) ------------------------------------


# the JAX kernel lives in _stitch_jax (imported on first use: small mosaics never import JAX)
_JAX_NAMES = frozenset({
    "_resample", "_spd_solve", "_leading_minors_positive", "_quadratic_nd",
    "_band_pass", "_pair_kernel", "_gauss_newton", "_register_batch",
})  # fmt: skip


def __getattr__(name: str):
    if name in _JAX_NAMES:
        from napari_gridmip.core.patches import _stitch_jax

        return getattr(_stitch_jax, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the global placement (SciPy sparse, float64) ----------------------------------------------


def _place(stage, i, j, offset, weight, prior):
    """Weighted least squares: ``sum_p (x_j - x_i - o_p)^T W_p (x_j - x_i - o_p) + prior * sum |x - stage|^2``.

    The normal equations are sparse (each pair couples two tiles: ``4 d^2``
    entries per pair), so they are assembled as a sparse matrix and solved
    directly (SuperLU): memory and time grow with the pairs, not with the
    square of the tiles, and nothing is compiled.
    """
    from scipy import sparse
    from scipy.sparse.linalg import spsolve

    n, d = stage.shape
    ax = np.arange(d)
    rows, cols, values = [], [], []
    shape = (len(i), d, d)  # block (a, b) of pair p: entry [a d + r, b d + c] += sign * W_p[r, c]
    for a, b, sign in ((i, i, 1.0), (j, j, 1.0), (i, j, -1.0), (j, i, -1.0)):
        rows.append(np.broadcast_to(a[:, None, None] * d + ax[None, :, None], shape))
        cols.append(np.broadcast_to(b[:, None, None] * d + ax[None, None, :], shape))
        values.append(sign * weight)
    rows.append(np.arange(n * d))
    cols.append(np.arange(n * d))
    values.append(np.full(n * d, prior))
    a = sparse.csc_matrix(
        (np.concatenate([v.ravel() for v in values]), (np.concatenate([r.ravel() for r in rows]),
                                                        np.concatenate([c.ravel() for c in cols]))),
        shape=(n * d, n * d),
    )  # fmt: skip
    wo = np.einsum("pab,pb->pa", weight, offset)
    b = np.zeros((n, d))
    np.add.at(b, j, wo)
    np.add.at(b, i, -wo)
    b += prior * stage
    return spsolve(a, b.reshape(-1)).reshape(n, d)


# -- the search's reach and ambiguous peaks -----------------------------------------------------


def _auto_search(geometry: _Pairs, members: np.ndarray) -> tuple[int, float]:
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


def _verdict(peak: float, threshold: float, featureless: bool, on_edge: bool, rival: float) -> int:
    """A search's verdict on a pair, an index into :data:`REASONS`: featureless, its peak at ``max_shift``, not
    significant (under ``threshold``), ambiguous (:func:`_is_ambiguous`), else accepted."""
    if featureless:
        return REASONS.index("featureless")
    if on_edge:
        return REASONS.index("peak at max_shift")
    if not peak >= threshold:
        return REASONS.index("not significant")
    if _is_ambiguous(peak, rival):
        return REASONS.index("ambiguous")
    return REASONS.index("accepted")


def _is_ambiguous(peak: float, rival: float) -> bool:
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


# -- the public function --------------------------------------------------------------------


def _check_tiles(tiles: Any, positions: Any) -> tuple[np.ndarray, int, tuple[int, ...], bool]:
    """(stage positions float64, n, spatial shape, has a channel axis)."""
    positions = validate.as_array("positions", positions)
    validate.check_real("positions", positions)
    pos = np.asarray(positions, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] not in (2, 3):
        raise ValueError(f"positions must be (n, d) with d = 2 or 3 spatial axes; got shape {pos.shape}")
    if not np.all(np.isfinite(pos)):
        raise ValueError("positions must be finite; got NaN or infinity")
    n, d = pos.shape
    validate.check_real("tiles", tiles)
    shape = validate.shape_of(tiles)
    if len(shape) not in (d + 1, d + 2):
        raise ValueError(
            f"tiles must be (n, [C,] *shape) with {d} spatial axes (positions are {d}D); got shape {shape}"
        )
    if shape[0] != n:
        raise ValueError(f"tiles hold {shape[0]} tiles but positions give {n} origins")
    validate.check_nonempty("tiles", shape)
    return pos, n, tuple(int(s) for s in shape[len(shape) - d :]), len(shape) == d + 2


def _report(progress: ProgressCallback | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


class _TileReader:
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


def register_tiles(
    tiles: Any,
    positions: Any,
    *,
    max_shift: int | str = "auto",
    channel: int | None = None,
    subpixel: str = "refine",
    false_positive_rate: float = 0.01,
    max_residual: float = 1.5,
    min_overlap: int = 8,
    filter_sigma: float = 1.0,
    seed: int = 0,
    progress: ProgressCallback | None = None,
) -> TileRegistration:
    """Refine roughly known tile origins by registering every overlapping pair and placing all at once.

    Parameters
    ----------
    tiles
        ``(n, [C,] *shape)``: ``n`` tiles of one spatial shape (2D or 3D),
        with an optional channel axis; NumPy, JAX, dask or Zarr (only the
        overlaps are read into memory, each tile once). Any real dtype.
    positions
        ``(n, d)``: the stage's origin of each tile in pixels, ``d = 2`` or 3
        (the convention in this module's docstring), e.g. from
        :func:`grid_positions`. Fractional values are fine.
    max_shift
        The largest error of the stage's offset between two neighbours to
        search for, in pixels per axis (pairs are searched within
        ``+-max_shift`` of their stage offset; a peak on that boundary is
        rejected, since the truth may lie beyond). An integer searches that far
        and takes only shifts that keep more than half of the nominal overlap
        in both tiles. ``"auto"`` (default) chooses from the overlaps: with
        ``w`` the median over the pairs of the nominal overlap's width (its
        narrowest side along the axes where the two tiles are offset), it
        searches ``floor(0.75 w)`` px, keeping a quarter of the overlap at
        least (so a stage error may eat three quarters of it), capped at
        ``max(64, min(tile) // 4)`` px; where ``floor(0.75 w) <= 16`` (overlaps
        narrower than 23 px) it searches 16 px with the half-overlap rule, as
        ``max_shift=16`` does. E.g. tiles of 128 px with 40% overlap (51 px):
        38 px; 512 px at 10%: 38 px; 192 px at 10%: 16 px. The value used is
        ``TileRegistration.max_shift``. With ``"auto"`` and at least three
        pairs accepted, the pairs still rejected are searched once more (in
        the broad band, see Notes) within 1.25 times the largest stage error
        an accepted pair measured, plus 4 px, where that is shorter: the
        search the mosaic's own stage shows it needs.
    channel
        The channel registered when tiles have a channel axis; None (default)
        registers the channels' mean.
    subpixel
        ``"refine"`` (default): Gauss-Newton on the overlap after the
        quadratic fit (about 0.01 px on textured data); ``"quadratic"``: the
        quadratic fit of the NCC peak only; ``"none"``: integer shifts.
    false_positive_rate
        The chance that a pair that does not match passes the significance
        threshold (ASHLAR's ``alpha``); in ``(0, 0.5)``.
    max_residual
        After placement, a pair whose residual exceeds ``max(max_residual, 4 x
        median residual)`` pixels is rejected (the worst of its neighbourhood
        first) and the placement solved again.
    min_overlap
        Pairs whose nominal overlap (from the stage) is narrower than this
        along an axis are not registered ("overlap too small"). A significant
        pair is never dropped for its refinement: where the overlap at the
        measured offset leaves fewer than 3 px for it (even reaching the
        tiles' borders), or it does not converge, the pair keeps the quadratic
        fit of its NCC peak, weighted down (``refinement`` says which).
    filter_sigma
        Both regions of a pair are band-passed before matching (a difference
        of Gaussians, ``sigma`` and ``2 sigma`` px, by normalised convolution so
        that tile borders add nothing): the NCC then follows structure, not
        uneven illumination, and its peaks are sharp, so that the null peaks
        stay low. A pair this band finds weak is searched again in a broad
        band, ``2 sigma`` to ``32 sigma`` (see Notes). 0: match the raw
        intensities (no second band).
    seed
        Seeds the choice of permuted null pairs (the result is deterministic).
    progress
        Optional ``progress(done, total)``, called between batches of pairs;
        it may raise to stop.

    Returns
    -------
    TileRegistration
        ``positions`` (n, d) float64 refined origins; per pair (every pair
        whose stage footprints overlap): ``pairs``, ``shift`` (measured offset
        minus stage offset), ``ncc`` (confidence), ``threshold``, ``accepted``,
        ``reason`` and ``residual``, ``ambiguous``, ``second_ncc`` and
        ``second_shift`` (the best rival peak); per tile ``placed_from_stage``
        and ``tile_confidence``; ``median_residual`` and ``max_shift``.

    Notes
    -----
    Ambiguous pairs (repetitive texture: ruled paper, grids, regular tissue).
    Besides its best peak, each pair's first search reports its best *rival*:
    the highest local maximum of the NCC (over its 3^d neighbours) more than
    3 px from the peak along some axis. A significant pair is *ambiguous* if
    the rival is near-equal: at least 0.9 of the peak's NCC, and at most twice
    its mismatch ``1 - NCC`` (where NCCs approach 1, as on a lattice with a few
    unique marks, the ratio alone cannot tell 0.95 from 0.99; the mismatch
    can). It is not taken as found: once the unambiguous pairs
    are placed (a first least-squares solve), an ambiguous pair between
    two tiles they tie together is searched again within 3 px of the offset
    that solve predicts, and accepted there if its NCC reaches 0.9 of its
    best peak's (the repeat the neighbours agree on), or its own threshold;
    otherwise it is left out (reason ``"ambiguous"``) and its tiles stay
    where other pairs, or the stage, put them. ``ambiguous`` flags both.

    Noisy tiles with coarse structure (a camera at low magnification, 8-bit
    images, handwriting on paper). The octave band then holds mostly the
    pixels' noise: peaks are low and land on fine repeats. A pair it finds
    weak (not significant, featureless, ambiguous, at ``max_shift``, or,
    where the group's median accepted pair is weak too, accepted with a
    margin ``(ncc - threshold) / (1 - threshold)`` under 0.2), and whose
    overlap is at least 16 sigma wide, is searched again in the broad band
    ``G_2sigma - G_32sigma``, against
    null samples drawn the same way, and takes that peak if it is
    significant and unambiguous there (and, for an accepted pair, has the
    larger margin); ``broad_band`` says which pairs did. A pair that matches
    nothing passes one of the two tests with a chance of at most twice
    ``false_positive_rate``. Clean tiles never take the second search.

    Raises
    ------
    ValueError
        If the shapes disagree (tiles and positions, 2 or 3 spatial axes), a
        position is not finite, ``max_shift`` is not a positive integer or ``"auto"``,
        ``channel`` is out of range, or an option is out of its range.
    TypeError
        If an argument has the wrong type.

    References
    ----------
    ASHLAR (Muhlich et al., Bioinformatics 2022): permutation test for the
    alignment threshold. Lowe, "Distinctive image features from scale-invariant
    keypoints", IJCV 2004: the ratio of the best match to the second best
    (0.8 there) as the test of a distinctive match, which the rival's ratio
    here follows. MIST (Chalfoun et al., Sci. Rep. 2017) and m2stitch:
    pairwise registration, then a maximum spanning tree, which this replaces
    by least squares over all pairs.

    Examples
    --------
    >>> from napari_gridmip._sample_data.mosaic import make_mosaic
    >>> sample = make_mosaic(grid_shape=(2, 3), tile_shape=(160, 160), overlap=0.3, stage_error=6, seed=1)
    >>> result = register_tiles(sample.tiles, sample.stage_positions, max_shift=12)
    >>> error = result.positions - sample.true_positions  # up to one translation, the mean stage error
    >>> bool(np.abs(error - error.mean(axis=0)).max() < 0.1)
    True
    """
    tiles = validate.as_array("tiles", tiles)
    stage, n, shape, has_channels = _check_tiles(tiles, positions)
    d = len(shape)
    if isinstance(max_shift, str):
        if max_shift != "auto":
            raise ValueError(f'max_shift must be a positive integer or "auto"; got {max_shift!r}')
    else:
        max_shift = validate.int_tuple("max_shift", [max_shift])[0]
    min_overlap = validate.int_tuple("min_overlap", [min_overlap])[0]
    seed = validate.int_tuple("seed", [seed], minimum=0)[0]
    subpixel = validate.check_choice("subpixel", subpixel, STITCH_SUBPIXEL)
    alpha = validate.check_finite_scalar("false_positive_rate", false_positive_rate)
    if not 0 < alpha < 0.5:
        raise ValueError(f"false_positive_rate must be in (0, 0.5); got {false_positive_rate!r}")
    sigma = validate.check_finite_scalar("filter_sigma", filter_sigma)
    if sigma < 0:
        raise ValueError(f"filter_sigma must be >= 0 pixels; got {filter_sigma!r}")
    max_residual = validate.check_finite_scalar("max_residual", max_residual)
    if max_residual <= 0:
        raise ValueError(f"max_residual must be > 0 pixels; got {max_residual!r}")
    if channel is not None:
        if not has_channels:
            raise ValueError(f"channel={channel!r} given, but tiles of shape {tiles.shape} have no channel axis")
        if isinstance(channel, bool) or not isinstance(channel, (int, np.integer)):
            raise TypeError(f"channel must be an integer or None; got {channel!r}")
        if not 0 <= channel < tiles.shape[1]:
            raise ValueError(f"channel must be in [0, {tiles.shape[1]}); got {channel}")
        channel = int(channel)
    reader = _TileReader(tiles, channel, has_channels, filter_halo(sigma))
    pairs, delta = _overlapping_pairs(stage, shape)
    p = len(pairs)
    found = _PairResults.empty(p, d)
    # the passes update these in place: the names below are the record's own arrays
    shift, ncc, threshold, info, reason = found.shift, found.ncc, found.threshold, found.info, found.reason
    second_ncc, second_shift, broad_band = found.second_ncc, found.second_shift, found.broad_band
    ambiguous = np.zeros(p, bool)

    # pass 1: the integer peak within max_shift of the stage offset, and its significance
    coarse = _geometry(pairs, delta, shape, 0, 0)  # the whole nominal overlap: masked NCC handles the edges
    registrable = np.flatnonzero(np.all(coarse.extent >= min_overlap, axis=1))
    min_fraction = MIN_FRACTION
    auto = max_shift == "auto"
    if auto:
        max_shift, min_fraction = _auto_search(coarse, registrable)
    groups = _groups(registrable, coarse)
    plans = [_plan_group(members, coarse, stage, max_shift + MARGIN, seed) for members in groups]
    engine = _engine(plans, max_shift)
    if engine == "numpy":  # each tile band-passed once, its regions cut out (the same values, less work)
        spectra: dict = {}  # each tile transformed once for both filters (kept while both need it)
        reader = _stitch_numpy.FilteredTiles(
            _TileReader(tiles, channel, has_channels, 0), sigma, low_only=False, pad=max_shift + MARGIN,
            spectra=spectra if subpixel == "refine" else None,
        )  # fmt: skip
    # pass 2 (refine): Gauss-Newton on the whole overlap at the coarse offset, searched +-FINE_SHIFT around it
    total = sum(plan.batches for plan in plans) * (2 if subpixel == "refine" else 1) + 1
    done = 0
    _report(progress, done, total)
    first = "quadratic" if subpixel == "refine" else subpixel
    for members, plan in zip(groups, plans):
        out, nulls, done = _run_group(
            plan, members, coarse, reader, max_shift, first, sigma, progress, done, total, engine, min_fraction
        )
        group_threshold = _gumbel_quantile(nulls, 1 - alpha)
        for slot, k in enumerate(members):
            s, peak, _, featureless, on_edge, _, rival, rival_shift = (o[slot] for o in out)
            ncc[k], threshold[k] = peak, group_threshold
            shift[k] = s + coarse.rounded[k] - delta[k]
            if np.isfinite(rival):
                second_ncc[k], second_shift[k] = rival, rival_shift + coarse.rounded[k] - delta[k]
            reason[k] = _verdict(peak, group_threshold, featureless, on_edge, rival)
            # an ambiguous pair is left for the neighbours' consensus (_guided_pass) to decide
            ambiguous[k] = reason[k] == REASONS.index("ambiguous")
    search = dict(engine=engine, subpixel=first, alpha=alpha, seed=seed, progress=progress, total=total)
    if filters(sigma):
        broad = dict(search, band=(BROAD_BAND[0] * sigma, BROAD_BAND[1] * sigma), min_fraction=min_fraction)
        source = _TileReader(tiles, channel, has_channels, 0)  # the tiles (each pass reads them with its own reader)
        done = _broad_pass(found, groups, coarse, stage, source, max_shift=max_shift, done=done, **broad)
        learned = _learned_reach(shift, reason) if auto else None
        if learned is not None and learned < max_shift:
            # the rejected pairs once more, within the reach the accepted ones show: fewer candidate shifts, so
            # lower null peaks (the test stays valid: the reach comes from the other pairs, not the pair's own)
            done = _broad_pass(found, groups, coarse, stage, source, max_shift=learned, done=done,
                               rejected_only=True, **broad)  # fmt: skip
    info[:] = np.eye(d)
    guided: dict[int, tuple] = {}
    if max_shift > GUIDED_SHIFT:
        guided = _guided_pass(found, stage, coarse, reader, max_residual=max_residual, sigma=sigma, done=done, **search)
    reader.clear()  # pass 1 is done with its regions: the memory bound holds one pass's cache at a time
    significant = np.flatnonzero(reason == REASONS.index("accepted"))
    refinement = np.full(p, REFINEMENTS.index("none"), np.int64)
    if subpixel != "none":
        refinement[significant] = REFINEMENTS.index("peak-fit")
    if subpixel == "refine" and len(significant):
        fine_reader = _TileReader(tiles, channel, has_channels, filter_halo(sigma, low_only=True))
        fine = _fine_geometry(pairs, delta + shift, shape, fine_reader.halo)
        if engine == "numpy":
            fine_reader = _stitch_numpy.FilteredTiles(
                reader.reader, sigma, low_only=True, pad=2 * MARGIN, spectra=reader.spectra
            )
        # a pair too narrow even for the tight box keeps its quadratic fit of the NCC peak ("peak-fit")
        usable = significant[np.all(fine.extent[significant] >= MIN_REFINE, axis=1)]
        for members in _groups(usable, fine):
            plan = _plan_group(members, fine, stage, FINE_SHIFT + MARGIN, seed, nulls=False)
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
                shift[k] = s + fine.rounded[k] - delta[k]
                info[k] = inv_cov
                refinement[k] = REFINEMENTS.index("refined")
        _peak_fit_information(info, refinement, significant)
    geometry = coarse

    accepted = reason == REASONS.index("accepted")
    positions, residual = _placement(stage, geometry, shift, info, accepted, reason, max_residual)
    _report(progress, total, total)
    accepted = reason == REASONS.index("accepted")
    refinement[~np.isfinite(ncc) | (reason == REASONS.index("overlap too small"))] = REFINEMENTS.index("none")
    placed_from_stage = np.ones(n, bool)
    confidence = np.zeros(n)
    for (i, j), ok, c in zip(geometry.pairs, accepted, ncc):
        if ok:
            placed_from_stage[[i, j]] = False
            confidence[i], confidence[j] = max(confidence[i], c), max(confidence[j], c)
    measured = np.isfinite(ncc)
    residual = np.where(measured, residual, np.nan)
    return TileRegistration(
        positions=positions,
        stage_positions=stage,
        pairs=geometry.pairs,
        shift=np.where(measured[:, None], shift, np.nan),
        ncc=ncc,
        threshold=threshold,
        accepted=accepted,
        reason=reason,
        residual=residual,
        placed_from_stage=placed_from_stage,
        tile_confidence=confidence,
        median_residual=float(np.median(residual[accepted])) if accepted.any() else float("nan"),
        refinement=refinement,
        ambiguous=ambiguous,
        second_ncc=np.where(measured, second_ncc, np.nan),
        second_shift=np.where(measured[:, None], second_shift, np.nan),
        max_shift=int(max_shift),
        broad_band=broad_band,
    )


def _broad_pass(found: _PairResults, groups, coarse, stage, source: _TileReader, *, max_shift, band, engine,
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
    learned reach, :func:`_learned_reach`). Updates ``found`` in place; ``source``: the tiles, unfiltered.
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
        reader = _stitch_numpy.FilteredTiles(_TileReader(*tiles, 0), band, low_only=False, pad=max_shift + MARGIN)
    else:
        reader = _TileReader(*tiles, filter_halo(band))
    for members, pool in zip(todo, groups):
        if not members:
            continue
        _report(progress, done, total)  # (it may stop the run) the total stays the one announced: a few batches
        plan = _plan_group(members, coarse, stage, max_shift + MARGIN, seed, pool=pool)
        out, nulls, _ = _run_group(
            plan, members, coarse, reader, max_shift, subpixel, band, None, done, total, engine, min_fraction
        )
        band_threshold = _gumbel_quantile(nulls, 1 - alpha)
        for slot, k in enumerate(members):
            s, peak, _, featureless, on_edge, _, rival, rival_shift = (o[slot] for o in out)
            if _verdict(peak, band_threshold, featureless, on_edge, rival) != REASONS.index("accepted"):
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


def _learned_reach(shift: np.ndarray, reason: np.ndarray) -> int | None:
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


def _guided_pass(found: _PairResults, stage, coarse, reader, *, max_residual, subpixel, sigma, alpha, seed, progress,
                 done, total, engine):  # fmt: skip
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
    any accepted pair). An ambiguous pair (:func:`_is_ambiguous`: significant,
    but with a near-equal repeat) is searched the same way and accepted if its
    peak there reaches its own threshold or ``AMBIGUITY_RATIO`` of its pass 1
    peak: the repeat the other pairs' placement points to (the consensus).
    Updates ``found`` in place; returns pass 1's
    ``(shift, ncc, threshold, reason)`` of each pair the guided search
    accepted, by pair.
    """
    shift, ncc, threshold, info, reason = found.shift, found.ncc, found.threshold, found.info, found.reason
    accepted_here: dict[int, tuple] = {}
    n, d = stage.shape
    significant = reason == REASONS.index("accepted")
    if not significant.any():
        return accepted_here
    provisional = reason.copy()
    positions, _ = _placement(stage, coarse, shift, info, significant, provisional, max_residual)
    kept = provisional == REASONS.index("accepted")
    component = _components(n, coarse.pairs[kept])
    i, j = coarse.pairs[:, 0], coarse.pairs[:, 1]
    tied = component[i] == component[j]  # (i != j: both tiles then hold kept pairs)
    retry = np.isin(provisional, [REASONS.index(r) for r in ("not significant", "peak at max_shift", "residual",
                                                             "ambiguous")])  # fmt: skip
    predicted = positions[j] - positions[i]
    guided = _geometry(coarse.pairs, predicted, coarse.shape, 0, 0)  # the actual overlap at the predicted offset
    room = np.all(guided.extent >= MIN_REFINE, axis=1)
    candidates = np.flatnonzero(retry & tied & room)
    if not len(candidates):
        return accepted_here
    groups = _groups(candidates, guided)
    plans = [_plan_group(members, guided, positions, GUIDED_SHIFT + MARGIN, seed, windows=True) for members in groups]
    for members, plan in zip(groups, plans):
        _report(progress, done, total)  # (it may stop the run) the total stays the one announced: a few batches
        out, nulls, _ = _run_group(
            plan, members, guided, reader, GUIDED_SHIFT, subpixel, sigma, None, done, total, engine
        )
        owner = np.array([a for a, _, _ in plan.nulls])
        for slot, k in enumerate(members):
            s, peak, _, featureless, on_edge, *_ = (o[slot] for o in out)
            pair_threshold = _gumbel_quantile(nulls[owner == k], 1 - alpha)
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


@dataclass
class _PairResults:
    """What :func:`register_tiles`' passes find, per pair of overlapping tiles (``P`` pairs, ``d`` axes); each pass
    updates the arrays in place where it finds better."""

    shift: np.ndarray  # (P, d): the measured offset's difference from the stage's (px)
    ncc: np.ndarray  # (P,): the peak's NCC
    threshold: np.ndarray  # (P,): the significance threshold it was tested against
    info: np.ndarray  # (P, d, d): the shift's information (inverse covariance), for the placement
    reason: np.ndarray  # (P,): index into REASONS
    second_ncc: np.ndarray  # (P,): the best rival peak's NCC (NaN: none)
    second_shift: np.ndarray  # (P, d): its offset
    broad_band: np.ndarray  # (P,): found in the broad band's second search

    @classmethod
    def empty(cls, pairs: int, axes: int) -> _PairResults:
        """Nothing found yet: NaN, and every pair's reason "overlap too small" until pass 1 searches it."""
        return cls(
            shift=np.full((pairs, axes), np.nan),
            ncc=np.full(pairs, np.nan),
            threshold=np.full(pairs, np.nan),
            info=np.zeros((pairs, axes, axes)),
            reason=np.full(pairs, REASONS.index("overlap too small"), np.int64),
            second_ncc=np.full(pairs, np.nan),
            second_shift=np.full((pairs, axes), np.nan),
            broad_band=np.zeros(pairs, bool),
        )


@dataclass
class _Plan:
    t_shape: tuple[int, ...]
    batch: int
    batches: int
    nulls: list[tuple[int, int, tuple[bool, ...]]]  # (template pair, search pair, flipped axes)
    own_size: bool = False  # null samples: the template pair's size (search regions cut), else the search pair's


def _plan_group(members, geometry, stage, reach, seed, *, nulls=True, windows=False, pool=None) -> _Plan:
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
    return _Plan(t_shape, batch, batches, samples)


def _plan_windows(members, geometry, positions, reach, seed, t_shape, batch) -> _Plan:
    """:func:`_plan_group`'s null samples for the guided pass, each pair's own: ``GUIDED_NULLS`` per pair.

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
    return _Plan(t_shape, batch, batches, samples, own_size=True)


def _engine(plans: Sequence[_Plan], max_shift: int) -> str:
    """``"numpy"`` (SciPy, nothing to compile, JAX not even imported) for small mosaics, else ``"jax"``.

    JAX compiles one program per pair shape and pass, seconds each, once per
    process (and importing it takes a second or two); on a CPU its warm
    kernels are not faster than SciPy's per pixel. So NumPy runs every mosaic
    whose pair work (pairs and null samples times their search regions'
    pixels) stays under ``NUMPY_MAX_WORK``; a larger one goes to the compiled
    programs (on an accelerator, if there is one). The two give the same
    results (tests/core/patches/test_stitch_engines.py).
    """
    if FORCE_ENGINE is not None:
        return FORCE_ENGINE
    work = 0
    for plan in plans:
        pixels = math.prod(t + 2 * (max_shift + MARGIN) for t in plan.t_shape)
        work += pixels * plan.batch * plan.batches
    return "numpy" if work <= NUMPY_MAX_WORK else "jax"


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
    fit = min(NUMPY_BATCH_PAIRS, BATCH_BYTES // (16 * math.prod(s_shape) * 4))  # as _plan_group's bound
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
            _report(progress, done, total)
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


def _gumbel_quantile(samples: np.ndarray, q: float) -> float:
    """The ``q`` quantile of a Gumbel law fitted by moments to the finite ``samples`` (maxima of correlations).

    With fewer than 8 finite samples, a threshold that nothing passes by chance (0.5).
    """
    x = samples[np.isfinite(samples)]
    if len(x) < 8:
        return 0.5
    beta = max(float(np.std(x)) * math.sqrt(6) / math.pi, 1e-6)
    mu = float(np.mean(x)) - 0.5772156649 * beta
    return float(min(mu - beta * math.log(-math.log(q)), 0.999))


def _placement(stage, geometry, shift, info, accepted, reason, max_residual):
    """Weighted least squares, then iterative rejection of pairs whose residual disagrees; updates ``reason``."""
    n, d = stage.shape
    p = len(geometry.pairs)
    if p == 0:
        return stage.copy(), np.zeros(0)
    i, j = geometry.pairs[:, 0], geometry.pairs[:, 1]
    measured = geometry.delta + np.nan_to_num(shift)
    accepted = accepted.copy()
    scale = float(np.median([np.trace(w) / d for w in info[accepted]])) if accepted.any() else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0
    strong = info / scale
    weak = WEAK_WEIGHT * np.eye(d)
    while True:
        weight = np.where(accepted[:, None, None], strong + weak, weak)
        offset = np.where(accepted[:, None], measured, geometry.delta)
        positions = _place(stage, i, j, offset, weight, PRIOR_WEIGHT)
        residual = np.linalg.norm(positions[j] - positions[i] - measured, axis=1)
        if not accepted.any():
            break
        limit = max(max_residual, 4 * float(np.median(residual[accepted])))
        bad = accepted & (residual > limit)
        if not bad.any():
            break
        # reject the pairs that are the worst among the accepted pairs sharing a tile with them
        worst_at = np.zeros(n)
        for k in np.flatnonzero(accepted):
            worst_at[i[k]] = max(worst_at[i[k]], residual[k])
            worst_at[j[k]] = max(worst_at[j[k]], residual[k])
        local = bad & (residual >= worst_at[i]) & (residual >= worst_at[j])
        accepted &= ~local
        reason[local] = REASONS.index("residual")
    return positions, residual
