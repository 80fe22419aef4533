"""Registering mosaic tiles whose positions are only roughly known, and the stage grid they come from.

:func:`grid_positions` gives a regular grid's stage origins. :func:`register_tiles` refines them in two steps: the
pair search (:mod:`~napari_gridmip.core.patches.pair_search`: each overlapping pair's shift, its significance and
its covariance, over several passes) and the global solve here, which places every tile at once.

Coordinates: a tile's *origin* is the scene coordinate of its pixel ``(0, ..., 0)``;
its pixel ``k`` sits at ``origin + k``. Axes are the tiles' spatial axes in order
(``(y, x)`` or ``(z, y, x)``). For a pair ``(i, j)`` the *offset* is
``origin_j - origin_i``; the *shift* is how far the measured offset lies from
the stage's: ``shift = measured offset - (stage_j - stage_i)``.

The global solve (:func:`_placement`), where it differs from MIST and m2stitch (a spanning tree of the pairs):

1. All accepted pairs are placed at once by weighted least squares (sparse normal equations, SciPy; each pair
   weighted by the inverse covariance of its shift: a pair whose overlap has
   structure along one direction only constrains that direction only), so
   errors do not pile up along a spanning tree; then pairs whose residual
   disagrees with the rest (above ``max(max_residual, 4 x median)``, the worst
   pair of its neighbourhood) are rejected one neighbourhood at a time and the
   placement solved again.
2. Rejected and unregistered pairs still tie their tiles to the stage: they
   enter the least squares with their stage offset and a weight 10^4 times
   smaller than the median accepted pair, so a tile or a group of tiles with
   no accepted pair keeps its stage position relative to its neighbours, and
   groups linked by accepted pairs move rigidly. A 10^-8 pull towards the
   stage fixes the mosaic's overall translation (its mean stays the stage's).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip.core import validate
from napari_gridmip.core.options import GRID_ORDERS, STITCH_SUBPIXEL
from napari_gridmip.core.patches import _stitch_numpy, pair_search
from napari_gridmip.core.patches._stitch_shared import (  # noqa: F401 - re-exported for the tests
    GN_ITERATIONS,
    MARGIN,
    MAX_REFINE_STEP,
    MIN_FRACTION,
    RIVAL_SEPARATION,
    filter_halo,
    filters,
)
from napari_gridmip.core.patches.pair_search import REASONS, REFINEMENTS

__all__ = ["grid_positions", "register_tiles"]

ProgressCallback = Callable[[int, int], None]

WEAK_WEIGHT = 1e-4  # stage ties of rejected pairs, relative to the median accepted pair's weight
PRIOR_WEIGHT = 1e-8  # pull of every tile to its stage position, relative to the same
NUMPY_MAX_WORK = 2 * 10**8  # pair work (pixels of search regions, padded batches) below which NumPy runs the kernel
FORCE_ENGINE: str | None = None  # "numpy" or "jax" to override the choice (tests, benchmarks)


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
    pairs, delta = pair_search.overlapping_pairs(stage, shape)
    found = pair_search.PairResults.empty(len(pairs), d)
    coarse = pair_search.pair_geometry(pairs, delta, shape, 0, 0)  # the whole nominal overlap: masked NCC
    registrable = np.flatnonzero(np.all(coarse.extent >= min_overlap, axis=1))
    min_fraction = MIN_FRACTION
    auto = max_shift == "auto"
    if auto:
        max_shift, min_fraction = pair_search.auto_search(coarse, registrable)
    groups = pair_search.group_pairs(registrable, coarse)
    plans = [pair_search.plan_group(members, coarse, stage, max_shift + MARGIN, seed) for members in groups]
    engine = _engine(plans, max_shift)
    # each pass reads the tiles through its own reader (its own cache of regions)
    source = pair_search.TileReader(tiles, channel, has_channels, 0)  # the tiles, unfiltered
    reader = pair_search.TileReader(tiles, channel, has_channels, filter_halo(sigma))
    if engine == "numpy":  # each tile band-passed once, its regions cut out (the same values, less work)
        spectra: dict = {}  # each tile transformed once for both filters (kept while both need it)
        reader = _stitch_numpy.FilteredTiles(
            pair_search.TileReader(tiles, channel, has_channels, 0), sigma, low_only=False, pad=max_shift + MARGIN,
            spectra=spectra if subpixel == "refine" else None,
        )  # fmt: skip
    total = sum(plan.batches for plan in plans) * (2 if subpixel == "refine" else 1) + 1  # the refinement's too
    done = 0
    pair_search.report(progress, done, total)
    first = "quadratic" if subpixel == "refine" else subpixel
    search = dict(engine=engine, subpixel=first, alpha=alpha, progress=progress, total=total)
    done = pair_search.first_pass(found, groups, plans, coarse, reader, max_shift=max_shift,
                                  min_fraction=min_fraction, sigma=sigma, done=done, **search)  # fmt: skip
    if filters(sigma):
        broad = dict(
            search, band=tuple(f * sigma for f in pair_search.BROAD_BAND), min_fraction=min_fraction, seed=seed
        )
        done = pair_search.broad_pass(found, groups, coarse, stage, source, max_shift=max_shift, done=done, **broad)
        learned = pair_search.learned_reach(found.shift, found.reason) if auto else None
        if learned is not None and learned < max_shift:
            # the rejected pairs once more, within the reach the accepted ones show: fewer candidate shifts, so
            # lower null peaks (the test stays valid: the reach comes from the other pairs, not the pair's own)
            done = pair_search.broad_pass(found, groups, coarse, stage, source, max_shift=learned, done=done,
                                          rejected_only=True, **broad)  # fmt: skip
    found.info[:] = np.eye(d)
    guided: dict[int, tuple] = {}
    if max_shift > pair_search.GUIDED_SHIFT:

        def place(accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """A first placement from the pairs ``accepted`` (their quadratic fits), after the residual test."""
            reason = found.reason.copy()
            positions, _ = _placement(stage, coarse, found.shift, found.info, accepted, reason, max_residual)
            return positions, reason

        guided = pair_search.guided_pass(found, stage, coarse, reader, place=place, sigma=sigma, seed=seed,
                                         done=done, **search)  # fmt: skip
    reader.clear()  # pass 1 is done with its regions: the memory bound holds one pass's cache at a time
    significant = np.flatnonzero(found.reason == REASONS.index("accepted"))
    if subpixel != "none":
        found.refinement[significant] = REFINEMENTS.index("peak-fit")
    if subpixel == "refine" and len(significant):
        done = pair_search.refine_pass(found, significant, guided, coarse=coarse, stage=stage, source=source,
                                       first_reader=reader, engine=engine, sigma=sigma, seed=seed,
                                       progress=progress, done=done, total=total)  # fmt: skip

    shift, ncc, reason, refinement = found.shift, found.ncc, found.reason, found.refinement
    accepted = reason == REASONS.index("accepted")
    positions, residual = _placement(stage, coarse, shift, found.info, accepted, reason, max_residual)
    pair_search.report(progress, total, total)
    accepted = reason == REASONS.index("accepted")
    refinement[~np.isfinite(ncc) | (reason == REASONS.index("overlap too small"))] = REFINEMENTS.index("none")
    placed_from_stage = np.ones(n, bool)
    confidence = np.zeros(n)
    for (i, j), ok, c in zip(pairs, accepted, ncc):
        if ok:
            placed_from_stage[[i, j]] = False
            confidence[i], confidence[j] = max(confidence[i], c), max(confidence[j], c)
    measured = np.isfinite(ncc)
    residual = np.where(measured, residual, np.nan)
    return TileRegistration(
        positions=positions,
        stage_positions=stage,
        pairs=pairs,
        shift=np.where(measured[:, None], shift, np.nan),
        ncc=ncc,
        threshold=found.threshold,
        accepted=accepted,
        reason=reason,
        residual=residual,
        placed_from_stage=placed_from_stage,
        tile_confidence=confidence,
        median_residual=float(np.median(residual[accepted])) if accepted.any() else float("nan"),
        refinement=refinement,
        ambiguous=found.ambiguous,
        second_ncc=np.where(measured, found.second_ncc, np.nan),
        second_shift=np.where(measured[:, None], found.second_shift, np.nan),
        max_shift=int(max_shift),
        broad_band=found.broad_band,
    )


def _engine(plans: Sequence[pair_search.Plan], max_shift: int) -> str:
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
