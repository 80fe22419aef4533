"""Digital volume correlation of a time series: a grid of points of the first volume followed through every later
one (DVC's Lagrangian description, as :mod:`.series` does for frames), with the reference policies of the 2D
series.

Each point of a grid on volume 0 is matched in every later volume by the inverse-compositional Gauss-Newton (IC-GN)
of :mod:`._volume_icgn` (12-parameter first-order warp, tricubic B-splines, masked ZNSSD), against its *key
frame*: the volume its reference subset is cut from. Each frame tries a point from, in turn:

1. its position and gradient in the previous frame, carried by its own last frame-to-frame move (or, for a point
   lost there, the affine map fitted to the points found there), and by the whole volume's translation between
   the two frames (phase correlation of the binned volumes, :func:`.volumes.whole_translation`) where it has no
   move of its own: large accumulated motion is followed a frame at a time;
2. for a point not found so, the coarse integer search of :func:`.volumes.correlate_volumes` (``search`` voxels
   around the carried position, on the volumes binned by 2), then the IC-GN from its peak;
3. for a point still not found, the converged warp of its best found neighbour, carried by that neighbour's
   gradient (twice at most, each reaching one grid step further).

A point's result is kept only if its warp converged, its subset stayed in the volume, its ZNCC reaches
``min_zncc`` and it agrees with its found neighbours; otherwise it is NaN with its :class:`Status`, and the next
frame tries it again (a point lost in one frame may be found in a later one).

The key frame follows ``reference``: ``"accumulated"`` keeps volume 0 (no drift, but large strain lowers the match),
``"incremental"`` moves it to every frame the point is found in (any deformation; the increments' errors add up),
``"auto"`` moves it when the ZNCC against the current key falls under ``refresh_zncc``, and matches every point
keyed elsewhere against volume 0 again each frame (from what its key found, or for a point its key lost, from its
neighbours' or its carried guess), going back to volume 0 where that ZNCC reaches ``refresh_zncc`` (a lost point:
where it is a match), so that drift adds up only while volume 0 no longer matches. A key frame's subset is the
axis-aligned cube of voxels centred at the voxel nearest the point's position there; the point's position in a
frame is that voxel's offset carried by the warp, and its gradient the warp's composed with the key's: the
displacements are composed through the points themselves, never through an interpolated field.

Each volume is read whole, one at a time (dask and Zarr series too), and held while it is some point's key frame;
each key frame's subsets (their gradients and Hessians) are prepared once, so that a frame against volume 0 only
interpolates itself. With a region of interest (on volume 0), a later key frame's subsets use the ROI carried by
the affine map fitted to the points found in that frame (else the last one, carried by the whole translation).
The IC-GN and the search are :func:`.volumes.correlate_volumes`' own: their chunks of points are dealt to every
local device (:func:`.sharding.band_devices`), with one device's answers.

References
----------
B. K. Bay, T. S. Smith, D. P. Fyhrie, M. Saad, "Digital volume correlation: three-dimensional strain mapping
using X-ray tomography", Exp. Mech. 39, 217-226 (1999).
B. Pan, K. Li, W. Tong, "Fast, robust and accurate digital image correlation calculation without redundant
computations", Exp. Mech. 53, 1277-1289 (2013) (IC-GN).
J. Blaber, B. Adair, A. Antoniou, "Ncorr: open-source 2D digital image correlation Matlab software", Exp. Mech.
55, 1105-1122 (2015) (seed propagation, reference updates).
E. Andò, O. Stamati, et al., "spam: Software for Practical Analysis of Materials", J. Open Source Softw. 5(51),
2286 (2020) (time series of DVC).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from scipy import ndimage

from napari_gridmip.core import validate
from napari_gridmip.core.correlation import _volume_icgn as kernels
from napari_gridmip.core.correlation import volumes as pair
from napari_gridmip.core.correlation.prefilter import DEFAULT_SIGMA, check_prefilter, radius
from napari_gridmip.core.correlation.status import Status
from napari_gridmip.core.runtime.precision import compute_dtype, precision_scope

__all__ = ["correlate_volume_series"]

REFERENCES = ("accumulated", "incremental", "auto")
PROPAGATION_ROUNDS = 2  # neighbour passes per frame at most (each reaches one grid step further)
MIN_FIT_POINTS = 8  # found points for the affine map of a whole frame (12 unknowns, overdetermined)


@dataclasses.dataclass(frozen=True)
class VolumeSeries:
    """What :func:`correlate_volume_series` returns: ``T`` volumes, a grid of ``P x R x C`` points on volume 0."""

    dz: np.ndarray
    """``(T, P, R, C)`` float32: each point's displacement along z (voxels) in each volume from its position in
    volume 0: ``volumes[t][z + dz, y + dy, x + dx]`` matches ``volumes[0][z, y, x]``; 0 in volume 0, NaN where
    ``status`` is not ok."""
    dy: np.ndarray
    """``(T, P, R, C)`` float32: the displacement along y."""
    dx: np.ndarray
    """``(T, P, R, C)`` float32: the displacement along x."""
    z: np.ndarray
    """``(P,)`` float64: the reference z of each plane of points."""
    y: np.ndarray
    """``(R,)`` float64: the reference y of each row of points."""
    x: np.ndarray
    """``(C,)`` float64: the reference x of each column of points."""
    zncc: np.ndarray
    """``(T, P, R, C)`` float32: the ZNCC of the point's subset with its key frame at the converged warp (1 in
    volume 0); NaN where the warp was not run or did not converge."""
    status: np.ndarray
    """``(T, P, R, C)`` uint8: a :class:`Status` per point and volume."""
    key_frame: np.ndarray
    """``(T, P, R, C)`` int32: the volume each point was matched against (-1 where it was not run)."""
    gradient: np.ndarray
    """``(T, P, R, C, 3, 3)`` float32: the displacement's gradient with respect to volume 0's coordinates,
    ``gradient[..., i, j] = d d_i / d X_j`` with ``d = (dz, dy, dx)`` (the key's warp composed with the key
    frame's own); NaN where ``dz`` is, and everywhere for ``shape="translation"``."""
    motion: np.ndarray
    """``(T, 3, 4)`` float64: the affine map ``(z, y, x, 1) -> (z', y', x')`` from volume 0 to each volume, fitted
    to the points found there (NaN with fewer than 8)."""
    subset: int
    """The subset's side (voxels)."""
    step: int
    """The grid's spacing (voxels)."""
    shape: str
    """The warp: ``"affine"`` or ``"translation"``."""
    reference: str
    """The reference policy: ``"accumulated"``, ``"incremental"`` or ``"auto"``."""


# -- checks --------------------------------------------------------------------------------------------------------


def _check_volumes(volumes: Any) -> tuple[Any, tuple[int, int, int, int]]:
    volumes = validate.as_array("volumes", volumes)
    validate.check_real("volumes", volumes)
    shape = validate.check_ndim("volumes", volumes, ndim=4)
    validate.check_nonempty("volumes", shape)
    if shape[0] < 2:
        raise ValueError(f"volumes must hold at least 2 time points (T, Z, Y, X); got shape {tuple(shape)}")
    return volumes, tuple(int(n) for n in shape)


def _read(volumes: Any, t: int, dtype: np.dtype) -> np.ndarray:
    """Time point ``t`` as a new ``dtype`` array (the caller's is never written), non-finite values refused."""
    out = np.array(volumes[t], dtype=dtype, copy=True)
    if np.dtype(validate.dtype_of(volumes)).kind == "f" and not np.all(np.isfinite(out)):
        raise ValueError(f"volumes[{t}] has non-finite voxels; fill them (and leave them out with roi)")
    return out


# -- the warps: a point's total map from volume 0 against its key frame's local one ---------------------------


def _pack(shift: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """The 12 warp parameters ``(n, 12)`` of translations ``(n, 3)`` and gradients ``(n, 3, 3)``."""
    out = np.empty((len(shift), 12))
    out[:, kernels.TRANSLATION] = shift
    out[:, 1:4], out[:, 5:8], out[:, 9:12] = gradient[:, 0], gradient[:, 1], gradient[:, 2]
    return out


def _local(position, jacobian, centre, offset, key_jacobian, affine: bool) -> np.ndarray:
    """The key-frame warp ``(n, 12)`` of the subset at ``centre`` (the key frame's voxel nearest the point, the
    point ``offset`` from it) that puts the point at ``position`` with the deformation gradient ``jacobian`` from
    volume 0 (``key_jacobian``: the key frame's own)."""
    if affine:
        with np.errstate(invalid="ignore"):
            gradient = np.matmul(jacobian, np.linalg.inv(key_jacobian)) - np.eye(3)
    else:
        gradient = np.zeros((len(position), 3, 3))
    shift = position - centre - offset - np.einsum("pij,pj->pi", gradient, offset)
    return _pack(shift, gradient)


def _total(warp, centre, offset, key_jacobian) -> tuple[np.ndarray, np.ndarray]:
    """The point's position ``(n, 3)`` and deformation gradient from volume 0 ``(n, 3, 3)`` under its key-frame
    warp ``(n, 12)``: the composition through the point itself."""
    gradient = pair._gradient(warp)
    position = centre + offset + warp[:, kernels.TRANSLATION] + np.einsum("pij,pj->pi", gradient, offset)
    return position, np.matmul(np.eye(3) + gradient, key_jacobian)


# -- a key frame -----------------------------------------------------------------------------------------------


class _Key:
    """A key frame: the IC-GN of the points keyed to it (:class:`.volumes._Solver` over its spline gradients and the
    voxels its subsets may use, each point's subset prepared once), which of those subsets are usable, and its
    binned copy for the search."""

    def __init__(self, volume: np.ndarray, weights: np.ndarray, points: int, *, run: _Options, spread: pair._Spread,
                 tick: Callable[[int], None] | None = None):  # fmt: skip
        reference = kernels._reference_gradient(jnp.asarray(volume), sigma=run.sigma)
        # the deformed volume is each frame's, given by use_deformed
        self.solver = pair._Solver(None, reference, jnp.asarray(weights, run.dtype), np.zeros((points, 3), np.int32),
                                   half=run.half, affine=run.affine, max_iterations=run.max_iterations,
                                   tolerance=run.tolerance, chunk=run.chunk, band=run.band, masked=run.masked,
                                   spread=spread, tick=tick)  # fmt: skip
        self.binned = self.mask_c = None
        if run.searching:
            self.binned = _standardised(volume)
            if run.masked_roi:
                self.mask_c = np.asarray(kernels.binned(jnp.asarray(weights, run.dtype))) > 0.999
        self.textured = np.zeros(points, bool)

    def prepare(self, which: np.ndarray, centres: np.ndarray, least: np.ndarray | float = 0.0) -> np.ndarray:
        """The subsets of the points ``which`` centred at ``centres`` ``(n, 3)``; returns which have texture (a
        positive definite Hessian, some variance) and at least ``least`` usable voxels (and more than the warp's
        12 parameters)."""
        index = np.flatnonzero(which)
        if not len(index):
            return np.zeros(0, bool)
        solver = self.solver
        solver.recentre(index, centres)
        solver.prepare(which)
        good = solver.textured()[index] & (solver.count[index] >= np.maximum(least, 13))
        self.textured[index] = good
        return good


@dataclasses.dataclass(frozen=True)
class _Options:
    half: int
    affine: bool
    sigma: float
    band: float
    masked: bool
    masked_roi: bool
    searching: bool
    search: int
    chunk: int
    max_iterations: int
    tolerance: float
    dtype: np.dtype


def _standardised(volume: np.ndarray) -> np.ndarray:
    """The volume binned by 2, less its mean, over its standard deviation (the coarse search's input)."""
    binned = np.asarray(kernels.binned(jnp.asarray(volume)), np.float64)
    return (binned - binned.mean()) / max(float(binned.std()), 1e-30)


class _Frame:
    """One frame's best result of each point over the passes: its position and gradient from volume 0, the key
    it was matched against, its ZNCC, and whether it converged in view."""

    def __init__(self, points: int):
        self.position = np.full((points, 3), np.nan)
        self.jacobian = np.full((points, 3, 3), np.nan)
        self.zncc = np.full(points, np.nan)
        self.converged = np.zeros(points, bool)
        self.view = np.zeros(points, bool)
        self.ran = np.zeros(points, bool)
        self.left = np.zeros(points, bool)  # a try matched well but put the subset out of the volume
        self.key = np.full(points, -1, np.int32)

    def accepted(self, min_zncc: float) -> np.ndarray:
        return self.ran & self.converged & self.view & (np.nan_to_num(self.zncc, nan=-1) >= min_zncc)

    def score(self) -> np.ndarray:
        return np.where(self.converged & self.view, np.nan_to_num(self.zncc, nan=-2.0), np.where(self.ran, -3.0, -4.0))

    def take(self, other: _Frame, which: np.ndarray) -> None:
        for name in ("position", "jacobian", "zncc", "converged", "view", "ran", "key"):
            getattr(self, name)[which] = getattr(other, name)[which]
        self.left |= other.left & which


# -- the series ----------------------------------------------------------------------------------------------------


def correlate_volume_series(
    volumes: Any,
    *,
    subset: int = 21,
    step: int = 10,
    roi: Any = None,
    reference: str = "accumulated",
    shape: str = "affine",
    search: int = 4,
    min_zncc: float = 0.9,
    refresh_zncc: float = 0.95,
    min_inside: float = 0.5,
    max_disagreement: float = 1.0,
    prefilter: float | str | None = None,
    max_iterations: int = pair.MAX_ITERATIONS,
    tolerance: float = pair.TOLERANCE,
    dtype: Any = None,
    progress: Callable[[int, int], Any] | None = None,
) -> VolumeSeries:
    """Follow a grid of points of volume 0 through a time series of volumes (time-lapse DVC).

    Parameters
    ----------
    volumes
        ``(T, Z, Y, X)``, ``T >= 2``, any real dtype; non-finite voxels are not allowed. NumPy, JAX, dask or Zarr:
        one time point is read at a time (each whole), and a volume is held while it is some point's key frame.
        Volume 0 is the reference. Not modified.
    subset
        The subset's side in voxels, odd, at least 5; default 21.
    step
        The grid's spacing in voxels; default 10. The first point is ``subset // 2`` voxels from the corner.
    roi
        ``(Z, Y, X)`` bool mask (or integer labels, > 0 inside) of volume 0, as :func:`correlate_volumes` takes
        it. A later key frame's subsets use the ROI carried by the affine map fitted to the points found in that
        volume. Default: the whole volume.
    reference
        The key frame of each point: ``"accumulated"`` (default): volume 0 for every volume.
        ``"incremental"``: the last volume the point was found in (its position and gradient composed volume by
        volume: any deformation, but the increments' errors add up). ``"auto"``: the key moves to the current
        volume when the ZNCC with it falls under ``refresh_zncc``, and every point keyed elsewhere is matched
        against volume 0 again each volume (a lost one too), going back to it where the ZNCC reaches
        ``refresh_zncc`` (a lost one: where it is a match), so that it keeps every point ``"accumulated"`` would.
    shape
        The subset's warp: ``"affine"`` (12 parameters, the default) or ``"translation"`` (3).
    search
        Voxels: how far from its carried position a point not found from it is searched (every integer shift, on
        the volumes binned by 2) before its IC-GN is run again; 0: no search. Default 4.
    min_zncc
        The least ZNCC of a kept match; default 0.9.
    refresh_zncc
        The ZNCC with a point's key frame under which ``"auto"`` moves the key to the current volume, and the
        ZNCC with volume 0 at which ``"auto"`` takes volume 0's match back; default 0.95. Not used by the other
        policies.
    min_inside
        The least share of a subset inside the (trimmed) ROI, in volume 0 and in a later key frame; default 0.5.
    max_disagreement
        Voxels: a found point farther than this from where its found face neighbours put it (the median of their
        predictions, 3 neighbours at least) is ``ambiguous``; default 1.
    prefilter
        The Gaussian every volume is smoothed by first, as in :func:`correlate_volumes`: None (the default),
        ``"auto"`` (0.8 voxel) or a standard deviation in voxels.
    max_iterations
        IC-GN steps at most per try; default 40.
    tolerance
        Voxels: the IC-GN's stop, as in :func:`correlate_volumes`; default 5e-4.
    dtype
        The compute precision: float32 (default) or float64.
    progress
        Optional ``progress(done, total)``, called after each volume (``total`` the number of volumes), and
        between the chunks of points with the volumes done so far; it may raise to stop the run (the exception
        propagates and nothing is returned), which it can within a volume.

    Returns
    -------
    VolumeSeries
        ``dz``, ``dy``, ``dx``, ``zncc`` ``(T, P, R, C)`` float32 (NaN where ``status`` is not ok; 0 and 1 in
        volume 0), ``status`` ``(T, P, R, C)`` uint8 (:class:`Status`), ``key_frame`` ``(T, P, R, C)`` int32,
        ``gradient`` ``(T, P, R, C, 3, 3)``, ``motion`` ``(T, 3, 4)`` and the grid ``z``, ``y``, ``x``.

    Raises
    ------
    ValueError
        If ``volumes`` is not 4D, holds fewer than 2 time points, is empty, not real or has non-finite voxels,
        ``roi`` is not of one volume's shape, the subset is even, under 5 or larger than a volume, ``reference``
        or ``shape`` is not one of their names, or an option is out of its range.
    TypeError
        If ``roi`` is not a mask, or an option has the wrong type.

    References
    ----------
    B. K. Bay, T. S. Smith, D. P. Fyhrie, M. Saad, Exp. Mech. 39, 217-226 (1999); B. Pan, K. Li, W. Tong, Exp.
    Mech. 53, 1277-1289 (2013); J. Blaber, B. Adair, A. Antoniou, Exp. Mech. 55, 1105-1122 (2015) (reference
    updates); E. Andò, O. Stamati et al., J. Open Source Softw. 5, 2286 (2020) (spam).
    """
    volumes, (count, *size) = _check_volumes(volumes)
    size = tuple(size)
    subset = pair._check_int("subset", subset, minimum=5)
    if subset % 2 == 0:
        raise ValueError(f"subset must be odd (a centre voxel); got {subset}")
    if subset > min(size):
        raise ValueError(f"subset {subset} is larger than the volumes' smallest side (Z, Y, X) = {size}")
    step = pair._check_int("step", step, minimum=1)
    mask = pair._check_roi(roi, size)
    if mask is not None:
        mask = np.asarray(mask) > 0  # one volume's mask: read whole
    for name, value, choices in (("reference", reference, REFERENCES), ("shape", shape, pair.SHAPES)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be one of {choices}; got {value!r} ({type(value).__name__})")
        validate.check_choice(name, value, choices)
    search = pair._check_int("search", search, minimum=0)
    min_zncc = pair._unit_interval("min_zncc", min_zncc)
    refresh_zncc = pair._unit_interval("refresh_zncc", refresh_zncc)
    min_inside = pair._unit_interval("min_inside", min_inside)
    max_disagreement = validate.check_finite_scalar("max_disagreement", max_disagreement)
    if max_disagreement <= 0:
        raise ValueError(f"max_disagreement must be positive (voxels); got {max_disagreement}")
    sigma = check_prefilter(prefilter, default=DEFAULT_SIGMA)
    max_iterations = pair._check_int("max_iterations", max_iterations, minimum=1)
    tolerance = validate.check_finite_scalar("tolerance", tolerance)
    if tolerance <= 0:
        raise ValueError(f"tolerance must be positive (voxels); got {tolerance}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None; got {progress!r} ({type(progress).__name__})")
    dtype = compute_dtype(dtype)
    binnable = min(size) >= 2 * pair.COARSE * 4
    run = _Options(half=subset // 2, affine=shape == "affine", sigma=sigma, band=radius(sigma) if sigma > 0 else -1.0,
                   masked=mask is not None or sigma > 0, masked_roi=mask is not None, searching=search > 0 and binnable,
                   search=search, chunk=pair._chunk(subset), max_iterations=max_iterations, tolerance=tolerance,
                   dtype=dtype)  # fmt: skip
    with precision_scope(dtype):
        return _correlate(volumes, mask, count=count, size=size, subset=subset, step=step, reference=reference,
                          shape=shape, min_zncc=min_zncc, refresh_zncc=refresh_zncc, min_inside=min_inside,
                          max_disagreement=max_disagreement, binnable=binnable, run=run,
                          progress=progress)  # fmt: skip


def _correlate(volumes, mask, *, count, size, subset, step, reference, shape, min_zncc, refresh_zncc, min_inside,
               max_disagreement, binnable, run: _Options, progress) -> VolumeSeries:  # fmt: skip
    half, dtype = run.half, run.dtype
    axes = [np.arange(half, n - half, step, dtype=np.float64) for n in size]
    grid = tuple(len(a) for a in axes)
    origin = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    points = len(origin)
    eye = np.broadcast_to(np.eye(3), (points, 3, 3))

    # the voxels a subset may use: the ROI less the prefilter's and the spline's reach inside its edge, and less the
    # prefilter's reach inside the volume's border (mirrored values there), as correlate_volumes
    border = np.ones(size, bool)
    band = radius(run.sigma)
    if band:
        for axis in range(3):
            edge = [slice(None)] * 3
            edge[axis] = np.r_[0:band, size[axis] - band : size[axis]]
            border[tuple(edge)] = False
    trimmed = None
    if mask is not None:
        trimmed = ndimage.binary_erosion(mask, iterations=band + pair.SPLINE_REACH, border_value=1)

    def key_weights(motion: np.ndarray | None) -> np.ndarray:
        """The voxels a key frame's subsets may use: the trimmed ROI carried by ``motion`` (3, 4) from volume 0."""
        if trimmed is None:
            return border
        if motion is None:
            return trimmed & border
        linear = np.linalg.inv(motion[:, :3])
        offset = -np.matmul(linear, motion[:, 3])
        carried = ndimage.affine_transform(trimmed.astype(np.float32), linear, offset=offset, order=0, cval=0.0)
        return (carried > 0.5) & border

    usable = np.ones(points, bool)
    inside = np.ones(points)
    centres0 = origin.astype(np.int64)
    if mask is not None:
        usable = mask[tuple(centres0.T)] & (pair._inside_share(trimmed, centres0, half) >= min_inside)
        inside = pair._inside_share(trimmed & border, centres0, half)

    shape4 = (count, *grid)
    out = {name: np.full(shape4, np.nan, np.float32) for name in ("dz", "dy", "dx", "zncc")}
    gradient_out = np.full((*shape4, 3, 3), np.nan, np.float32)
    status_out = np.full(shape4, Status.not_significant, np.uint8)
    key_out = np.full(shape4, -1, np.int32)
    motion = np.full((count, 3, 4), np.nan)
    motion[0] = np.eye(3, 4)

    # the devices the chunks of points are dealt to (as correlate_volumes'), the same for every key frame
    spread = pair._spread()
    volume = _read(volumes, 0, dtype)
    # between the solvers' chunks: the volumes done so far again, the chance a raising progress (Cancel) has to stop
    # the run within a volume
    done = [0]
    tick = None if progress is None else (lambda _points: progress(done[0], count))
    keys: dict[int, _Key] = {0: _Key(volume, key_weights(None), points, run=run, spread=spread, tick=tick)}
    textured0 = np.zeros(points, bool)
    textured0[usable] = keys[0].prepare(usable, centres0[usable])
    count0 = keys[0].solver.count.copy()
    tracked = usable & textured0  # the points followed; the others keep their volume-0 status in every volume
    unused = np.full(points, Status.not_significant, np.uint8)
    if mask is not None:
        unused[~usable | (usable & ~textured0 & (inside < 1))] = Status.outside_roi

    def flat(t: int, name: str):
        return out[name][t].reshape(-1)

    flat(0, "dz")[tracked] = flat(0, "dy")[tracked] = flat(0, "dx")[tracked] = 0.0
    flat(0, "zncc")[tracked] = 1.0
    if run.affine:
        gradient_out[0].reshape(-1, 3, 3)[tracked] = 0.0
    status_out[0].reshape(-1)[:] = np.where(tracked, Status.ok, unused)
    key_out[0].reshape(-1)[tracked] = 0
    done[0] = 1
    if progress is not None:
        progress(1, count)

    # each point's key frame: its index, the subset's centre voxel there, the point's offset from it and the
    # deformation gradient from volume 0 to it
    key_index = np.zeros(points, np.int32)
    key_centre = origin.copy()
    key_offset = np.zeros((points, 3))
    key_jacobian = eye.copy()
    # what the previous frames found: each point's position and gradient where found in the last frame, its last
    # frame-to-frame move, and the whole map from volume 0 (the affine fit of the found points)
    position = origin.copy()
    jacobian = eye.copy()
    found_before = tracked.copy()
    velocity = np.full((points, 3), np.nan)
    whole = np.eye(3, 4)
    previous_binned = _standardised(volume) if binnable else volume
    shape_c = np.array([n // pair.COARSE for n in size])

    def attempt(result: _Frame, which, guess_position, guess_jacobian, *, on=None, searched=None):
        """The IC-GN of the points ``which`` against their key frames (or the key frame ``on`` for all) from the
        guesses; with ``searched`` (the frame's binned copy) each start's translation is the coarse search's peak
        around the guess. The results are written into ``result`` where better than what it holds."""
        index = key_index if on is None else np.full(points, on, np.int32)
        centre = key_centre if on is None else origin
        offset = key_offset if on is None else np.zeros((points, 3))
        own = key_jacobian if on is None else eye
        which = which & np.all(np.isfinite(guess_position), 1) & np.all(np.isfinite(guess_jacobian), (1, 2))
        for k in np.unique(index[which]):
            key = keys[int(k)]
            chosen = which & (index == k) & key.textured
            if not chosen.any():
                continue
            start = np.full((points, 12), np.nan)
            start[chosen] = _local(guess_position[chosen], guess_jacobian[chosen], centre[chosen], offset[chosen],
                                   own[chosen], run.affine)  # fmt: skip
            if searched is not None:
                shift, peak = pair._coarse_search(key.binned, searched, key.mask_c, centre[chosen].astype(np.int64),
                                                  start[chosen][:, kernels.TRANSLATION], half=half, search=run.search,
                                                  dtype=dtype, shape_c=shape_c, spread=spread)  # fmt: skip
                rows = np.flatnonzero(chosen)
                start[rows[np.isfinite(peak)][:, None], kernels.TRANSLATION] = shift[np.isfinite(peak)]
                chosen[rows[~np.isfinite(peak)]] = False
                if not chosen.any():
                    continue
            start[chosen, :] = _into_view_start(start[chosen], centre[chosen], half, size)
            got = key.solver.run(chosen, start)
            fresh = _Frame(points)
            fresh.position[chosen], fresh.jacobian[chosen] = _total(got["warp"][chosen], centre[chosen],
                                                                    offset[chosen], own[chosen])  # fmt: skip
            fresh.zncc, fresh.converged, fresh.view = got["zncc"], got["converged"], got["view"]
            fresh.ran = chosen
            fresh.key[chosen] = k
            fresh.left = chosen & ~got["view"] & (np.nan_to_num(got["zncc"], nan=-1) >= min_zncc)
            better = chosen & (fresh.score() > result.score())
            result.take(fresh, better)
            result.left |= fresh.left

    for t in range(1, count):
        volume = _read(volumes, t, dtype)
        # this frame's spline coefficients, put on the devices once for every key frame's solver
        coefficients = spread.put(kernels._coefficients(jnp.asarray(volume), sigma=run.sigma))
        for key in keys.values():
            key.solver.use_deformed(coefficients)
        binned = _standardised(volume) if binnable else volume
        # the whole volume's translation since the previous volume: the move of a point with none of its own
        pace = (pair.COARSE if binnable else 1) * pair.whole_translation(previous_binned, binned)
        result = _Frame(points)

        # 1. from the previous frame's position carried by the point's own last move (else the whole pace)
        carried_whole = np.matmul(origin, whole[:, :3].T) + whole[:, 3]
        base_position = np.where(found_before[:, None], position, carried_whole)
        base_jacobian = np.where(found_before[:, None, None], jacobian, whole[:, :3])
        guess = base_position + np.where(np.isfinite(velocity), velocity, pace)
        attempt(result, tracked, guess, base_jacobian)
        accepted = result.accepted(min_zncc)
        # 2. the coarse search around the previous position carried by the whole pace
        if run.searching and (tracked & ~accepted).any():
            attempt(result, tracked & ~accepted, base_position + pace, base_jacobian, searched=binned)
            accepted = result.accepted(min_zncc)
        # 3. the found neighbours' warps
        tried_from_neighbours = np.zeros(points, bool)
        for _ in range(PROPAGATION_ROUNDS):
            retry, nb_position, nb_jacobian = _neighbour_guesses(grid, origin, result, accepted)
            retry &= tracked & ~accepted & ~tried_from_neighbours
            if not retry.any():
                break
            tried_from_neighbours |= retry
            attempt(result, retry, nb_position, nb_jacobian)
            accepted = result.accepted(min_zncc)

        # "auto": the points keyed elsewhere against volume 0 again
        if reference == "auto" and 0 in keys:
            keyed = tracked & (key_index != 0)
            if keyed.any():
                back = _Frame(points)
                lost = keyed & ~accepted
                guess_position = np.where(accepted[:, None], result.position, np.nan)
                guess_jacobian = np.where(accepted[:, None, None], result.jacobian, np.nan)
                has, nb_position, nb_jacobian = _neighbour_guesses(grid, origin, result, accepted)
                use = lost & has
                guess_position[use], guess_jacobian[use] = nb_position[use], nb_jacobian[use]
                use = lost & ~has
                guess_position[use], guess_jacobian[use] = guess[use], base_jacobian[use]
                attempt(back, keyed, guess_position, guess_jacobian, on=0)
                good = back.accepted(min_zncc)
                take = keyed & good & (lost | (np.nan_to_num(back.zncc) >= refresh_zncc))
                result.take(back, take)
                accepted = result.accepted(min_zncc)

        total_warp = _pack(result.position - origin, result.jacobian - np.eye(3))
        disagreement = pair._disagreement(grid, origin, np.nan_to_num(total_warp), accepted)
        ambiguous = accepted & (disagreement > max_disagreement)
        found = accepted & ~ambiguous

        linear, shift = pair._affine_fit(origin[found], (result.position - origin)[found])
        fitted = None if linear is None else np.concatenate([np.eye(3) + linear, shift[:, None]], 1)
        if fitted is not None:
            motion[t] = fitted
        # out of view: a good match that put the subset outside, or a point not found that the frame's map (else its
        # guess) carries out of the volume: no start inside the volume could have found it
        if fitted is not None:
            predicted_map = fitted
            predicted_position = np.matmul(origin, fitted[:, :3].T) + fitted[:, 3]
        else:
            predicted_map = np.concatenate([whole[:, :3], (whole[:, 3] + pace)[:, None]], 1)
            predicted_position = np.where(found_before[:, None], guess, np.matmul(origin, predicted_map[:, :3].T)
                                          + predicted_map[:, 3])  # fmt: skip
        gradient = np.broadcast_to(predicted_map[:, :3] - np.eye(3), (points, 3, 3))
        gone = ~pair._in_view(predicted_position - origin, gradient, origin, half, size)
        codes = np.full(points, Status.not_significant, np.uint8)
        codes[(result.left | gone) & ~found] = Status.out_of_view
        codes[ambiguous] = Status.ambiguous
        codes[found] = Status.ok
        codes[~tracked] = unused[~tracked]
        status_out[t].reshape(-1)[:] = codes
        key_out[t].reshape(-1)[:] = np.where(result.ran & tracked, result.key, -1)
        displacement = result.position - origin
        for axis, name in enumerate(("dz", "dy", "dx")):
            flat(t, name)[:] = np.where(found, displacement[:, axis], np.nan)
        flat(t, "zncc")[:] = np.where(result.ran & result.converged, result.zncc, np.nan)
        if run.affine:
            gradient_out[t].reshape(-1, 3, 3)[:] = np.where(found[:, None, None], result.jacobian - np.eye(3), np.nan)

        # what the next frame starts from
        velocity = np.where((found & found_before)[:, None], result.position - position, np.nan)
        position = np.where(found[:, None], result.position, position)
        jacobian = np.where(found[:, None, None], result.jacobian, jacobian)
        found_before = found
        whole = fitted if fitted is not None else np.concatenate([whole[:, :3], (whole[:, 3] + pace)[:, None]], 1)
        previous_binned = binned

        # the key frames for the next frame
        if reference == "auto":
            back = found & (result.key == 0) & (key_index != 0)
            key_index[back], key_centre[back], key_offset[back], key_jacobian[back] = 0, origin[back], 0.0, np.eye(3)
        if reference != "accumulated" and t < count - 1:
            move = found & ((reference == "incremental") | (np.nan_to_num(result.zncc) < refresh_zncc))
            centre = np.rint(result.position)
            move &= np.all((centre >= half) & (centre <= np.asarray(size) - 1 - half), 1)  # the subset in the volume
            if move.any():
                key = _Key(volume, key_weights(whole), points, run=run, spread=spread, tick=tick)
                # a carried ROI's subset keeps ``min_inside`` of the voxels it used in volume 0
                least = min_inside * count0[move] if mask is not None else 0.0
                good = key.prepare(move, centre[move].astype(np.int32), least)
                rows = np.flatnonzero(move)[good]
                if len(rows):
                    keys[t] = key
                    key_index[rows], key_centre[rows] = t, centre[rows]
                    key_offset[rows] = result.position[rows] - centre[rows]
                    key_jacobian[rows] = result.jacobian[rows] if run.affine else np.eye(3)
            in_use = set(np.unique(key_index[tracked]).tolist()) | ({0} if reference == "auto" else set())
            for k in [k for k in keys if k not in in_use]:
                del keys[k]  # a volume no point is keyed to any more
        done[0] = t + 1
        if progress is not None:
            progress(t + 1, count)

    return VolumeSeries(dz=out["dz"], dy=out["dy"], dx=out["dx"], z=axes[0], y=axes[1], x=axes[2], zncc=out["zncc"],
                        status=status_out, key_frame=key_out, gradient=gradient_out, motion=motion, subset=subset,
                        step=step, shape=shape, reference=reference)  # fmt: skip


def _into_view_start(start: np.ndarray, centre: np.ndarray, half: int, size) -> np.ndarray:
    """Starts ``(n, 12)`` whose translation is moved the least so that each subset starts inside the volume (as
    :func:`.volumes.correlate_volumes`'s)."""
    out = start.copy()
    out[:, kernels.TRANSLATION] = pair._into_view(start[:, kernels.TRANSLATION], pair._gradient(start), centre, half,
                                                  size)  # fmt: skip
    return out


def _neighbour_guesses(grid, origin, result: _Frame, found) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every point, whether it has a found face neighbour, and the position and gradient from volume 0 carried
    from its best one (highest ZNCC) through that neighbour's gradient."""
    total_warp = _pack(result.position - origin, result.jacobian - np.eye(3))
    carried, has = pair._neighbour_starts(grid, origin, np.nan_to_num(total_warp), found, result.zncc)
    return has, origin + carried[:, kernels.TRANSLATION], np.eye(3) + pair._gradient(carried)
