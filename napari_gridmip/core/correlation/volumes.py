"""Digital volume correlation (DVC): the displacement, its gradient and its quality at a grid of points of a
reference volume, found in a deformed volume (a micro-CT scan before and after a load).

The pipeline, each stage starting the next:

1. the whole volume's translation, by phase correlation of the two volumes binned by 2 (the integer peak and,
   along each axis, the sub-voxel offset its larger neighbour's share gives: Foroosh et al.);
2. each point's integer displacement around it, by the ZNCC of its subset (binned by 2) over every shift of a
   cube ``search`` voxels wide each way, with a parabola's sub-voxel step; the displacement's gradient from the
   neighbouring points';
3. the inverse-compositional Gauss-Newton (IC-GN) of a 12-parameter first-order warp (:mod:`._volume_icgn`),
   the deformed volume interpolated by tricubic B-splines (its coefficients computed once), the reference
   subset's gradient and Hessian once per point; the points run in fixed-size chunks (one compiled program), each
   step only the points still going, and a point stops when its increment, or the next one its contracting
   increments predict, moves no corner of its subset by more than ``tolerance``;
4. the points that failed, once more from the converged warp of their best neighbour (carried by its gradient),
   then the checks that give every point a :class:`Status`: a lost point is NaN with its reason, never a
   plausible number.

A region of interest clips the subsets: only its voxels enter the sums (masked ZNCC), less a band at its edge as
wide as the prefilter's and the spline's reach, so that no voxel outside it enters a match (but for the spline
prefilter's tail, under 0.5% of a value).

On 2 cores, a 200^3 pair (subset 21, step 10: 5832 points) takes 2.4 s warm, 70% of it the IC-GN's steps, most
of those the tricubic interpolation's 64 gathers a voxel (``benchmarks/bench_volumes.py``).

Dask and Zarr volumes are never read whole: the whole translation comes from a copy binned as far as
``DOWNSAMPLED_VOXELS`` (read in blocks of planes), and each stage runs over slabs of point planes along z, each
reading its planes and a halo wide enough that every value its points' matches read is the whole volume's: the
answers of the volumes in memory (where the whole translation is the same), in memory bounded by a slab's.

Beyond one device: where JAX has several local devices of the call's platform (``.runtime.sharding.band_devices``),
the chunks of points go to them side by side, one chunk a device, each device running the one device's program on
the same chunk (the same answers, bit for bit; ``NAPARI_GRIDMIP_SHARD_BANDS=0`` keeps one device). Beyond one
machine: with ``compute`` (a ``dask.distributed`` client's), each stage of the slab plan of lazy volumes is a task a
slab, whose dependencies read its planes and halo on a worker; the results are joined here in order (the answers of
the slabs run here, bit for bit).

References
----------
B. K. Bay, T. S. Smith, D. P. Fyhrie, M. Saad, "Digital volume correlation: three-dimensional strain mapping
using X-ray tomography", Exp. Mech. 39, 217-226 (1999).
B. Pan, K. Li, W. Tong, "Fast, robust and accurate digital image correlation calculation without redundant
computations", Exp. Mech. 53, 1277-1289 (2013) (IC-GN).
E. Andò, O. Stamati, et al., "spam: Software for Practical Analysis of Materials", J. Open Source Softw. 5(51),
2286 (2020).
H. Foroosh, J. B. Zerubia, M. Berthod, "Extension of phase correlation to subpixel registration", IEEE Trans.
Image Process. 11(3), 188-200 (2002).
J. Yang, K. Bhattacharya, "Augmented Lagrangian digital image correlation", Exp. Mech. 59, 187-205 (2019);
J. Yang, L. Hazlett, A. K. Landauer, C. Franck, "Augmented Lagrangian digital volume correlation (ALDVC)",
Exp. Mech. 60, 1205-1223 (2020).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import fft as scipy_fft
from scipy import ndimage

from napari_gridmip.core import validate
from napari_gridmip.core.correlation import _volume_icgn as kernels
from napari_gridmip.core.correlation.prefilter import DEFAULT_SIGMA, check_prefilter, radius
from napari_gridmip.core.correlation.status import Status
from napari_gridmip.core.runtime import sharding, strategy
from napari_gridmip.core.runtime.precision import compute_dtype, precision_scope

SHAPES = ("affine", "translation")
MAX_ITERATIONS = 40  # IC-GN steps at most; from the search's start 2 are typical
# voxels: a point has converged when its increment moves no subset corner by more than this along any axis, or when
# its increments contract so that the next one would move it by less than PREDICTED_SHARE of it (the predictive
# stop): on the 96^3 affine pair, 2.08 steps a point from the search's start (2.95 without the prediction), the same
# 0.0024 voxel RMS. The prediction (the last ratio of increments) errs low where the first step made up the search's
# coarse start: at the full tolerance, identical volumes kept 1.06e-3 voxel at one point; at half, 3.7e-4 at most
TOLERANCE = 5e-4
PREDICTED_SHARE = 0.5
# points x subset voxels per compiled call (16 subsets of 21^3: each step's arrays, 0.6 MB, stay in the cache; at
# 200^3, 3.0 to 5.0 s a call against 32 subsets' 5.0 to 5.5 s on the shared 2 cores, 8 as 16)
CHUNK_VOXELS = 2**18
PROPAGATION_ROUNDS = 2  # retries of the failed points from their found neighbours
AFFINE_ROUNDS = 3  # retries of the points the search did not reach, from the affine map of the points found
# IC-GN steps of the first pass: a point still moving then is mostly one the search did not reach (a rotation's far
# point, wandering to the step limit: 8.2 of a 160^3 rotation's 10.5 s), which the affine map's start then finds in
# about 2 steps; a point that nothing else finds goes on from where it stopped, to MAX_ITERATIONS in all
FIRST_PASS_STEPS = 10
# voxels a cubic spline's value reads around its position: its 4 taps, and 4 more of its coefficients'
# prefilter, whose weight falls by 0.27 a voxel (to 0.5% at 4)
SPLINE_REACH = 6
COARSE = 2  # the search's binning
SEARCH_CHUNK = 256  # points per call of the coarse search
# lazy volumes (dask, Zarr) are read in slabs of planes of about this many voxels (each array of a slab: 128 MiB
# float32), each slab with a halo of planes (the subset, search, translation and spline's reach) around its
# points, so that memory holds one slab's arrays however deep the volume. A 512^3 uint8 Zarr pair (subset 21, step
# 20) peaked at 2.7 GB (44 s on 2 cores) where in memory it peaked at 10.2 GB (29 s); 2**24 voxels: 2.0 GB, 75 s
# (the halo, 37 planes each side, then outweighs the slab's single plane of points). The halo is at least one
# slab: planes of many more voxels than this hold more
SLAB_VOXELS = 2**25
SLAB_SLACK = 4  # planes of the halo beyond the search's reach: the start gradient's move of a subset corner
# the whole translation of lazy volumes is found on a copy binned by a power of 2 until it has fewer voxels
DOWNSAMPLED_VOXELS = 2**21


@dataclasses.dataclass(frozen=True)
class VolumeCorrelation:
    """What :func:`correlate_volumes` returns: a grid of ``P x R x C`` points on the reference volume."""

    dz: np.ndarray
    """``(P, R, C)`` float32: each point's displacement along z (voxels): ``deformed[z + dz, y + dy, x + dx]``
    matches ``reference[z, y, x]``; NaN where ``status`` is not ok."""
    dy: np.ndarray
    """``(P, R, C)`` float32: the displacement along y."""
    dx: np.ndarray
    """``(P, R, C)`` float32: the displacement along x."""
    z: np.ndarray
    """``(P,)`` float64: the reference z of each plane of points."""
    y: np.ndarray
    """``(R,)`` float64: the reference y of each row of points."""
    x: np.ndarray
    """``(C,)`` float64: the reference x of each column of points."""
    zncc: np.ndarray
    """``(P, R, C)`` float32: the zero-normalised correlation of the subset with the deformed volume at the
    converged warp; NaN where the warp was not run or did not converge."""
    sigma: np.ndarray
    """``(P, R, C, 3)`` float32: the predicted standard deviation of ``(dz, dy, dx)`` (voxels): the residual's
    variance per voxel times the inverse Gauss-Newton Hessian's diagonal (it grows with the noise and with what the
    warp cannot follow, and shrinks with the subset's gradients); NaN where ``dz`` is."""
    status: np.ndarray
    """``(P, R, C)`` uint8: a :class:`Status` per point."""
    gradient: np.ndarray
    """``(P, R, C, 3, 3)`` float32: the displacement's gradient from the subset's warp, ``gradient[..., i, j] =
    d d_i / d x_j`` with ``d = (dz, dy, dx)`` and ``x = (z, y, x)``; NaN where ``dz`` is, and everywhere for
    ``shape="translation"``."""
    iterations: np.ndarray
    """``(P, R, C)`` int16: the IC-GN steps each point took (0 where it was not run)."""
    translation: np.ndarray
    """``(3,)`` float64: the whole volume's translation (dz, dy, dx) found by phase correlation."""
    subset: int
    """The subset's side (voxels)."""
    step: int
    """The grid's spacing (voxels)."""
    shape: str
    """The warp: ``"affine"`` or ``"translation"``."""


# -- checks --------------------------------------------------------------------------------------------------------


def _check_volume(name: str, volume: Any) -> tuple[Any, tuple[int, int, int]]:
    volume = validate.as_array(name, volume)
    validate.check_real(name, volume)
    shape = validate.check_ndim(name, volume, ndim=3)
    validate.check_nonempty(name, shape)
    return volume, shape


def _check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer >= {minimum}; got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value}")
    return int(value)


def _unit_interval(name: str, value: Any) -> float:
    value = validate.check_finite_scalar(name, value)
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1]; got {value}")
    return value


def _check_roi(roi: Any, shape: tuple[int, int, int]) -> Any:
    if roi is None:
        return None
    roi = validate.as_array("roi", roi)
    if tuple(roi.shape) != shape:
        raise ValueError(f"roi must be a mask of the reference's shape {shape}; got shape {tuple(roi.shape)}")
    kind = np.dtype(validate.dtype_of(roi))
    if kind.kind != "b" and not np.issubdtype(kind, np.integer):
        raise TypeError(f"roi must be a bool mask or integer labels (> 0 inside); got dtype {kind}")
    return roi if _is_lazy(roi) else np.asarray(roi) > 0  # a lazy one is read by slabs


def _read(name: str, volume: Any, dtype: np.dtype) -> np.ndarray:
    """The volume as a new ``dtype`` array (the caller's is never written), non-finite values refused."""
    out = np.array(volume, dtype=dtype, copy=True)
    if np.dtype(validate.dtype_of(volume)).kind == "f" and not np.all(np.isfinite(out)):
        raise ValueError(f"{name} has non-finite voxels; fill them (and leave them out with roi)")
    return out


# -- the whole volume's translation ----------------------------------------------------------------------------


def _parabola(low: np.ndarray, mid: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The vertex offset of the parabola through three samples at -1, 0, 1 (0 where it is not a maximum)."""
    curve = low - 2 * mid + high
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(curve < 0, (low - high) / (2 * curve), 0.0)
    return np.clip(np.nan_to_num(out), -0.5, 0.5)


def whole_translation(reference: np.ndarray, deformed: np.ndarray) -> np.ndarray:
    """The translation ``s`` (voxels, float64 ``(3,)``) with ``deformed[x + s] ~ reference[x]``, by phase
    correlation (both volumes less their means, under a Hann window) and the sub-voxel offset along each axis
    from the larger neighbour of the peak (Foroosh et al. 2002)."""
    window = 1.0
    for axis, n in enumerate(reference.shape):
        shape = [1, 1, 1]
        shape[axis] = n
        window = window * np.hanning(n + 2)[1:-1].reshape(shape)
    a = scipy_fft.rfftn((reference - reference.mean()) * window, workers=-1)
    b = scipy_fft.rfftn((deformed - deformed.mean()) * window, workers=-1)
    cross = b * np.conj(a)
    cross /= np.abs(cross) + 1e-12 * np.abs(cross).max()
    surface = scipy_fft.irfftn(cross, s=reference.shape, workers=-1)
    peak = np.unravel_index(np.argmax(surface), surface.shape)
    out = np.zeros(3)
    for axis, n in enumerate(surface.shape):
        around = []
        for k in (-1, 0, 1):
            index = list(peak)
            index[axis] = (index[axis] + k) % n
            around.append(surface[tuple(index)])
        whole = peak[axis] - n if peak[axis] > n // 2 else peak[axis]
        low, mid, high = (max(float(v), 0.0) for v in around)
        # a phase correlation peak is a sampled sinc, not a parabola: Foroosh et al.'s ratio of the larger neighbour
        out[axis] = whole + (high / (high + mid) if high >= low else -low / (low + mid)) if mid > 0 else whole
    return out


# -- chunks of points ----------------------------------------------------------------------------------------------


def _chunk(subset: int) -> int:
    """The points of one compiled call: the largest power of two with at most ``CHUNK_VOXELS`` subset voxels."""
    return 1 << max(0, int(np.floor(np.log2(max(CHUNK_VOXELS // subset**3, 1)))))


class _Copies(tuple):
    """An array the chunks share, one copy on each device of a :class:`_Spread`, in its order."""


class _Spread:
    """Where the chunks of points run: the call's device alone, or side by side on every local device of its
    platform (:func:`.sharding.band_devices`: the call's device first, ``NAPARI_GRIDMIP_SHARD_BANDS=0`` keeps one),
    the chunks dealt to them in turn. A device runs the very chunk program one device runs, on the same chunk: the
    same answers. (One program over every device, ``sharding.per_device``, stalled XLA's CPU client on 4 host
    devices of 2 cores, waiting on the IC-GN Hessians' group of chunks; chunks put on their own devices did not.)"""

    def __init__(self, devices: tuple[Any, ...]):
        self.devices = tuple(devices)

    @property
    def many(self) -> bool:
        return len(self.devices) > 1

    def put(self, value: Any) -> Any:
        """``value`` (an array the chunks share: a volume, a scalar) on every device, once; itself on one device."""
        if not self.many or value is None:
            return value
        return _Copies(jax.device_put(value, device) for device in self.devices)


def _spread() -> _Spread:
    """The run's devices, where the work is placed now (inside the run's precision scope)."""
    return _Spread(sharding.band_devices())


def _chunked(program: Callable, shared: tuple[Any, ...], index: np.ndarray, per_point: tuple[np.ndarray, ...],
             chunk: int, on_chunk: Callable[[int], None] | None = None, *, static: dict[str, Any],
             spread: _Spread | None = None) -> tuple[np.ndarray, ...]:  # fmt: skip
    """``program(*shared, *chunk_arrays, **static)`` over the points ``index`` in chunks of ``chunk`` (the last
    padded by its first point), each per-point array taken at those points; the outputs (a tuple of arrays, or one
    array) joined on the host, trimmed to ``index``. ``on_chunk(points)``, where given, is called once each chunk
    has been computed (its real points' count): the progress report, whose raising stops the run there.

    With ``spread`` over several devices (``shared`` put on each by :meth:`_Spread.put`), chunk ``i`` goes to
    device ``i mod n``: its arrays put there and its program dispatched without waiting, so that the devices run
    side by side; with ``on_chunk``, each round of ``n`` chunks is waited for and reported together. The outputs
    are gathered in order."""
    count = len(index)
    padded = np.concatenate([index, np.full(-count % chunk, index[0])]) if count else index
    starts = list(range(0, len(padded), chunk))
    devices = spread.devices if spread is not None and spread.many else (None,)
    outs = []
    for r in range(0, len(starts), len(devices)):
        for k, s in enumerate(starts[r : r + len(devices)]):
            arrays = [a[padded[s : s + chunk]] for a in per_point]
            if devices[k] is not None:
                arrays = [jax.device_put(a, devices[k]) for a in arrays]
            own = [v[k] if isinstance(v, _Copies) else v for v in shared]
            outs.append(program(*own, *arrays, **static))
        if on_chunk is not None:
            done = outs[r:]
            jax.block_until_ready(done)  # so that the report means these chunks are done
            on_chunk(min(len(done) * chunk, count - starts[r]))
    outs = [o if isinstance(o, tuple) else (o,) for o in jax.device_get(outs)]
    return tuple(np.concatenate([np.asarray(o[i]) for o in outs])[:count] for i in range(len(outs[0])))


# -- the coarse search -------------------------------------------------------------------------------------------


def _coarse_search(ref_c: np.ndarray, def_c: np.ndarray, mask_c: np.ndarray | None, centres: np.ndarray,
                   guess: np.ndarray, *, half: int, search: int, dtype: np.dtype, shape_c: np.ndarray,
                   offset_c: int = 0, on_chunk: Callable[[int], None] | None = None,
                   spread: _Spread | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each point's displacement ``(N, 3)`` near ``guess`` (voxels, the whole translation) by the ZNCC of its
    subset over every integer shift within ``search`` voxels, on both volumes binned by 2 (and standardised), with
    a parabola's sub-voxel step; and the peak's ZNCC ``(N,)`` (-inf where every shift leaves the volume). With
    ``mask_c`` (the binned voxels wholly inside the voxels the subsets may use), those voxels only.

    ``ref_c``, ``def_c`` (and ``mask_c``) are the binned planes from ``offset_c`` of the whole binned volume of
    shape ``shape_c`` (a slab of it, or all of it); ``centres`` are the points' voxels in the whole volume."""
    half_c = int(min(max(2, half // COARSE), (shape_c.min() - 1) // 2))
    reach = max(1, -(-search // COARSE))
    pad = half_c + reach + 1
    padded = np.pad(def_c, pad, constant_values=np.nan)
    width = 2 * (half_c + reach) + 1
    centre_c = np.clip(np.rint((centres - 0.5) / COARSE).astype(np.int64), half_c, shape_c - 1 - half_c)
    shift_c = np.rint(guess / COARSE).astype(np.int64)
    ref_corner = centre_c - half_c
    window = np.clip(centre_c + shift_c - half_c - reach + pad, 0, shape_c + 2 * pad - width)
    # in the slab's frame: the slab's halo holds every window whose start is not far out of the volume
    offset = np.array([offset_c, 0, 0])
    local_window = np.clip(window - offset, 0, np.array(padded.shape) - width).astype(np.int32)
    spread = spread or _Spread((None,))
    ref_j, def_j = spread.put(jnp.asarray(ref_c, dtype)), spread.put(jnp.asarray(padded, dtype))
    masked = mask_c is not None
    mask_j = spread.put(jnp.asarray(mask_c, dtype)) if masked else ref_j
    local_corner = (ref_corner - offset).astype(np.int32)
    (zncc,) = _chunked(kernels.search, (ref_j, def_j, mask_j), np.arange(len(centres)), (local_corner, local_window),
                       SEARCH_CHUNK, on_chunk, static=dict(half=half_c, reach=reach, masked=masked),
                       spread=spread)  # fmt: skip
    shifts = 2 * reach + 1
    best = np.argmax(zncc, 1)
    peak = zncc[np.arange(len(zncc)), best]
    k = np.stack(np.unravel_index(best, (shifts,) * 3), -1)
    cube = zncc.reshape(-1, shifts, shifts, shifts)
    sub = np.zeros((len(zncc), 3))
    rows = np.arange(len(zncc))
    for axis in range(3):
        inner = (k[:, axis] > 0) & (k[:, axis] < shifts - 1)
        lo, hi = k.copy(), k.copy()
        lo[:, axis] = np.clip(k[:, axis] - 1, 0, shifts - 1)
        hi[:, axis] = np.clip(k[:, axis] + 1, 0, shifts - 1)
        values = [cube[rows, v[:, 0], v[:, 1], v[:, 2]] for v in (lo, k, hi)]
        finite = inner & np.all(np.isfinite(values), 0)
        sub[finite, axis] = _parabola(*(v[finite] for v in values))
    moved = (local_window + offset).astype(np.float64) - pad + k + sub - ref_corner  # coarse voxels
    return COARSE * moved, peak


# -- the IC-GN over every point ------------------------------------------------------------------------------------


def _step(coefficients, reference, mask, band, bounds, centre, p, inverse, *, half: int, masked: bool):
    """:func:`._volume_icgn.step` with the arrays a solver's chunks share first (:func:`_chunked`'s order)."""
    return kernels.step(coefficients, reference, mask, centre, p, inverse, band, bounds, half=half, masked=masked)


class _Solver:
    """The IC-GN of chosen points from chosen starts, over the prepared volumes (each point's Hessian once)."""

    def __init__(self, coefficients, reference, mask, centres, *, half, affine, max_iterations, tolerance, chunk,
                 band, masked, bounds=None, tick=None, spread=None):  # fmt: skip
        # the volumes on each device the chunks run on, once (``spread``: the call's device alone by default)
        self.spread = spread = spread or _Spread((None,))
        self.dtype = reference.dtype
        self.coefficients, self.reference, self.mask = (spread.put(v) for v in (coefficients, reference, mask))
        # the whole volume's first and last voxel in the arrays' frame (a slab's), and the progress report
        self.bounds, self.tick = spread.put(bounds), tick
        self.band, self.masked = spread.put(np.asarray(band, reference.dtype)), masked
        self.centres = centres.astype(np.int32)
        self.half, self.affine, self.chunk = half, affine, chunk
        self.max_iterations, self.tolerance = max_iterations, tolerance
        points = len(centres)
        self.inverse = np.full((points, 12, 12), np.nan, np.float64)
        self.count = np.zeros(points)
        self.norm = np.zeros(points)
        self.prepared = np.zeros(points, bool)

    def prepare(self, which: np.ndarray) -> None:
        index = np.flatnonzero(which & ~self.prepared)
        if not len(index):
            return

        inverse, count, norm = _chunked(kernels.prepare, (self.reference, self.mask), index, (self.centres,),
                                        self.chunk, self._tick(0), static=dict(half=self.half, affine=self.affine),
                                        spread=self.spread)  # fmt: skip
        self.inverse[index], self.count[index], self.norm[index] = inverse, count, norm
        self.prepared[index] = True

    def recentre(self, which: np.ndarray, centres: np.ndarray) -> None:
        """Cut the subsets of the points ``which`` (a mask or indices) around ``centres`` ``(n, 3)`` instead (a
        time series' new key frame): their Hessians are forgotten, for :meth:`prepare` to make again."""
        self.centres[which] = centres
        self.inverse[which], self.count[which], self.norm[which] = np.nan, 0.0, 0.0
        self.prepared[which] = False

    def use_deformed(self, coefficients: Any) -> None:
        """Match against another deformed volume from now on (a time series' next frame): its spline
        ``coefficients`` (in the reference's frame), put on the spread's devices; a value :meth:`_Spread.put` already
        put there (one put for several solvers) is taken as is."""
        self.coefficients = coefficients if isinstance(coefficients, _Copies) else self.spread.put(coefficients)

    def _tick(self, share: int) -> Callable[[int], None] | None:
        """A chunk's report: ``share`` points done each (0: a report that only gives Cancel its chance)."""
        tick = self.tick
        return None if tick is None else lambda points: tick(share * points)

    def textured(self) -> np.ndarray:
        """The prepared points whose subset has texture: a positive definite Hessian and some variance."""
        return self.prepared & np.all(np.isfinite(self.inverse), (1, 2)) & (self.norm > 0)

    def run(self, which: np.ndarray, start: np.ndarray, *, counted: bool = True,
            steps: int | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        """IC-GN of the points ``which`` from ``start`` ``(N, 12)``, ``steps`` at most (default
        ``max_iterations``): each point's warp, ZNCC, residual variance, steps, and whether it converged, started in
        view and stayed in view (NaN and False elsewhere). With ``counted``, each point that stops is reported
        done."""
        points = len(which)
        p = np.where(which[:, None], start, np.nan)
        out = dict(zncc=np.full(points, np.nan), variance=np.full(points, np.nan),
                   steps=np.zeros(points, np.int16), converged=np.zeros(points, bool),
                   started=np.zeros(points, bool), view=np.zeros(points, bool))  # fmt: skip
        dtype = self.dtype
        inverse = self.inverse.astype(dtype)
        active = which.copy()
        last = np.full(points, np.inf)  # each point's previous increment (voxels)
        for iteration in range(self.max_iterations if steps is None else steps):
            index = np.flatnonzero(active)
            if not len(index):
                break

            shared = (self.coefficients, self.reference, self.mask, self.band, self.bounds)
            new, moved, zncc, variance, view = _chunked(
                _step, shared, index, (self.centres, p.astype(dtype), inverse), self.chunk, self._tick(0),
                static=dict(half=self.half, masked=self.masked), spread=self.spread,
            )  # fmt: skip
            out["zncc"][index], out["variance"][index] = zncc, variance
            out["view"][index] = view
            if iteration == 0:
                out["started"][index] = view
            out["steps"][index] += 1
            good = view & np.all(np.isfinite(new), 1)
            p[index[good]] = new[good]
            # converged: this increment was under the tolerance, or the increments contract so that the next one
            # would be (Gauss-Newton's steps shrink by about their ratio each time; ALDVC's predictive stop)
            with np.errstate(divide="ignore", invalid="ignore"):
                predicted = np.where(
                    np.isfinite(last[index]) & (last[index] > moved), moved * moved / last[index], np.inf
                )
            done = good & ((moved <= self.tolerance) | (predicted <= self.tolerance * PREDICTED_SHARE))
            last[index] = moved
            out["converged"][index[done]] = True
            active[index] = good & ~done
            if counted and self.tick is not None:
                self.tick(int(np.count_nonzero(~active[index])))
        if counted and self.tick is not None:
            self.tick(int(np.count_nonzero(active)))  # those the last step left going
        out["warp"] = p
        return out


def _neighbour_starts(grid: tuple[int, int, int], origin: np.ndarray, warp: np.ndarray, found: np.ndarray,
                      zncc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """For every point, the warp ``(N, 12)`` carried from its best found face neighbour (highest ZNCC) by that
    neighbour's gradient, and whether it has one."""
    points = len(origin)
    best = np.full(points, -np.inf)
    out = np.full((points, 12), np.nan)
    score = np.where(found, np.nan_to_num(zncc, nan=-1.0), -np.inf)
    for here, there in _face_pairs(grid):
        better = score[there] > best[here]
        h, t = here[better], there[better]
        best[h] = score[t]
        gradient = _gradient(warp[t])
        shift = warp[t][:, kernels.TRANSLATION] + np.einsum("pij,pj->pi", gradient, origin[h] - origin[t])
        carried = warp[t].copy()
        carried[:, kernels.TRANSLATION] = shift
        out[h] = carried
    return out, np.isfinite(best)


def _face_pairs(grid: tuple[int, int, int]):
    """For each of the 6 face directions, the flat indices ``(here, there)`` of every point with a neighbour that
    way and of that neighbour."""
    index = np.arange(int(np.prod(grid))).reshape(grid)
    for axis in range(3):
        for sign in (-1, 1):
            lo = [slice(None)] * 3
            hi = [slice(None)] * 3
            lo[axis], hi[axis] = slice(0, -1), slice(1, None)
            here, there = (index[tuple(lo)], index[tuple(hi)]) if sign > 0 else (index[tuple(hi)], index[tuple(lo)])
            yield here.ravel(), there.ravel()


def _gradient(warp: np.ndarray) -> np.ndarray:
    """The displacement gradient ``(n, 3, 3)`` of warps ``(n, 12)``."""
    return np.stack([warp[:, 1:4], warp[:, 5:8], warp[:, 9:12]], 1)


def _disagreement(grid, origin, warp, found) -> np.ndarray:
    """Each found point's median distance (voxels) from the displacements its found face neighbours predict for it
    through their own gradients; NaN with fewer than 3 found neighbours."""
    points = len(origin)
    distances = np.full((6, points), np.nan)
    shift = warp[:, kernels.TRANSLATION]
    for k, (here, there) in enumerate(_face_pairs(grid)):
        both = found[here] & found[there]
        h, t = here[both], there[both]
        predicted = shift[t] + np.einsum("pij,pj->pi", _gradient(warp[t]), origin[h] - origin[t])
        distances[k, h] = np.linalg.norm(shift[h] - predicted, axis=1)
    enough = np.sum(np.isfinite(distances), 0) >= 3
    median = np.full(points, np.nan)
    median[enough] = np.nanmedian(distances[:, enough], 0)
    return median


def _corners(gradient: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """The least and greatest offset ``(N, 3)`` of a subset's voxels from its centre under the warps' gradients
    ``(N, 3, 3)`` (the extremes of a linear map over a cube are at its corners)."""
    corners = half * np.array(list(np.ndindex(2, 2, 2)), np.float64) * 2 - half  # (8, 3)
    moved = corners[None] + np.einsum("pij,kj->pki", gradient, corners)
    return moved.min(1), moved.max(1)


def _in_view(shift: np.ndarray, gradient: np.ndarray, origin: np.ndarray, half: int, size) -> np.ndarray:
    """Whether each subset, carried by the translation ``shift`` ``(N, 3)`` and the gradient, lies in the volume
    (within half a voxel of its border voxels, as the IC-GN's check)."""
    low, high = _corners(gradient, half)
    top = np.asarray(size, np.float64) - 0.5
    return np.all((origin + shift + low >= -0.5) & (origin + shift + high <= top), 1)


def _into_view(shift: np.ndarray, gradient: np.ndarray, origin: np.ndarray, half: int, size) -> np.ndarray:
    """The start translations moved the least into the volume, so that each subset starts inside it: the coarse
    search's step and its binned subset (one voxel narrower) may put a subset at the border a voxel out, where a
    point inside the volume still has its match."""
    low, high = _corners(gradient, half)
    lower = -0.5 - origin - low
    upper = np.asarray(size, np.float64) - 0.5 - origin - high
    return np.where(lower <= upper, np.clip(shift, lower, np.maximum(lower, upper)), shift)


def _affine_fit(origin: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The least-squares displacement gradient ``(3, 3)`` and translation ``(3,)`` of the points ``origin`` ``(n,
    3)`` moved by ``shift``; None with fewer than 8 points."""
    if len(origin) < 8:
        return None, None
    design = np.concatenate([origin, np.ones((len(origin), 1))], 1)
    solution, *_ = np.linalg.lstsq(design, shift, rcond=None)
    return solution[:3].T, solution[3]


def _start_gradient(displacement: np.ndarray, grid: tuple[int, int, int], step: int) -> np.ndarray:
    """The displacement's gradient ``(N, 3, 3)`` across the grid's neighbours (central differences over ``step``
    voxels, one-sided at the edges), 0 where it is not finite or the grid is one point thick."""
    field = displacement.reshape(*grid, 3)
    out = np.zeros((*grid, 3, 3))
    for axis in range(3):
        if grid[axis] > 1:
            slope = np.gradient(field, float(step), axis=axis)
            out[..., :, axis] = np.where(np.isfinite(slope), slope, 0)
    return out.reshape(-1, 3, 3)


def correlate_volumes(
    reference: Any,
    deformed: Any,
    *,
    subset: int = 21,
    step: int = 10,
    roi: Any = None,
    shape: str = "affine",
    search: int = 4,
    min_zncc: float = 0.9,
    min_inside: float = 0.5,
    max_disagreement: float = 1.0,
    prefilter: float | str | None = None,
    max_iterations: int = MAX_ITERATIONS,
    tolerance: float = TOLERANCE,
    dtype: Any = None,
    progress: Callable[[int, int], Any] | None = None,
    compute: Callable[[list[Any]], Any] | None = None,
) -> VolumeCorrelation:
    """Digital volume correlation: the displacement of a grid of reference points in a deformed volume.

    Parameters
    ----------
    reference, deformed
        ``(Z, Y, X)`` volumes of the same shape, any real dtype; non-finite voxels are not allowed. Neither is
        modified. NumPy (and JAX) volumes are worked on whole. Dask and Zarr volumes are never read whole: the
        whole translation is found on a copy binned (read in blocks) to under ``DOWNSAMPLED_VOXELS`` voxels, and
        the grid runs in slabs of point planes along z, each reading only its planes and a halo (the subset, the
        translation, the search, the spline's reach) of about ``SLAB_VOXELS`` voxels in all, with the answers of
        the volumes in memory (where the whole translation is the same: a volume binned by 2 within
        ``DOWNSAMPLED_VOXELS``); a warp that wanders beyond the halo reads its slab's edge planes.
    subset
        The subset's side in voxels, odd, at least 5; default 21.
    step
        The grid's spacing in voxels; default 10. The first point is ``subset // 2`` voxels from the corner, so
        every reference subset is inside the volume.
    roi
        ``(Z, Y, X)`` bool mask (or integer labels, > 0 inside) of the reference: the subsets use only its voxels,
        less a band along its edge as wide as the prefilter's and the spline's reach (``round(4 sigma) + 6``
        voxels: the spline's taps and its coefficients' decaying tail), in masked sums. A point whose centre is
        outside, with less than ``min_inside`` of its subset inside, or whose clipped subset has no texture, is
        ``outside_roi``. Default: the whole volume.
    shape
        The subset's warp: ``"affine"`` (12 parameters, the default) or ``"translation"`` (3).
    search
        Voxels: how far a point's displacement may be from the whole volume's translation; each point is searched
        over every integer shift within it (on the volumes binned by 2) before the IC-GN. 0: start every point from
        the whole translation. Default 4. A point not found from there (a rotation's far points lie beyond any
        practical search) starts again from the affine map fitted to the points found (up to ``AFFINE_ROUNDS``
        rounds while they find more), then from its found neighbours' warps (``PROPAGATION_ROUNDS``).
    min_zncc
        The least ZNCC of a kept match; default 0.9.
    min_inside
        The least share of a subset inside the (trimmed) ROI; default 0.5.
    max_disagreement
        Voxels: a found point farther than this from where its found face neighbours put it (the median of their
        predictions through their own gradients, 3 neighbours at least) is ``ambiguous``; default 1.
    prefilter
        The Gaussian both volumes are smoothed by first (the 2D functions' remedy for the noise-induced bias):
        None (the default), ``"auto"`` (0.8 voxel, as in 2D) or a standard deviation in voxels. On the micro-CT-like
        pairs of :mod:`napari_gridmip._sample_data.dvc` (uint8, 1% noise, subset 21) 0.8 voxel left the error where
        none did (0.0023 voxel RMS), for 6 more passes over both volumes. Where it smooths, the subsets leave out
        its reach inside the reference's border, and a voxel warped into that band of the deformed volume does not
        count (both hold mirrored values there).
    max_iterations
        IC-GN steps at most; default 40.
    tolerance
        Voxels: a point has converged when its increment moves no corner of its subset by more than this along
        any axis, or when its increments shrink so that the next one (their ratio times the last) would move it by
        less than half of this; default 5e-4.
    dtype
        The compute precision: float32 (default) or float64.
    progress
        Optional ``progress(done, total)``, called after each chunk of points: ``done`` counts the points
        searched and the points whose IC-GN has stopped (never decreasing), ``total`` twice the grid's points
        (once without the search); the last call has ``done == total``. It may raise to stop the run (the
        widgets' Cancel): the exception propagates and nothing is returned. Where ``compute`` runs the slabs, it
        is called between the stages (each stage's slabs reported at once) and a stop waits for the stage.
    compute
        How to run the slabs of dask and Zarr volumes as a dask graph's tasks, on a ``dask.distributed`` cluster
        (as :func:`~napari_gridmip.io.write_mipmap` takes it; the command line's ``--scheduler``): given a list of
        dask collections, returns their results: ``dask.compute`` (on the ``distributed.Client`` made last, where
        there is one), or ``lambda collections: client.gather(client.compute(collections))``. Each stage of the
        slab plan (the binned copy's blocks, the search, the first IC-GN, each retry round) is then one task per
        slab (or block of planes), whose dependencies read its planes and halo where it runs, and the results are
        joined here in order: the answers of the slabs run in this process, bit for bit. Default None: every slab
        in this process. Volumes in memory run in this process either way.

    Returns
    -------
    VolumeCorrelation
        ``dz``, ``dy``, ``dx``, ``zncc`` ``(P, R, C)`` float32 (NaN where ``status`` is not ok), ``sigma``
        ``(P, R, C, 3)``, ``gradient`` ``(P, R, C, 3, 3)``, ``status`` ``(P, R, C)`` uint8 (:class:`Status`),
        ``iterations``, the grid ``z``, ``y``, ``x`` (reference voxels) and the whole ``translation``.

    Raises
    ------
    ValueError
        If a volume is not 3D or empty, the shapes differ, ``roi`` has another shape, the subset is even, under 5
        or larger than the volume, or an option is out of its range.
    TypeError
        If a volume is not real, ``roi`` is not a mask, or an option has the wrong type.

    References
    ----------
    B. K. Bay, T. S. Smith, D. P. Fyhrie, M. Saad, Exp. Mech. 39, 217-226 (1999); B. Pan, K. Li, W. Tong, Exp.
    Mech. 53, 1277-1289 (2013); E. Andò, O. Stamati et al., J. Open Source Softw. 5, 2286 (2020) (spam); J. Yang,
    L. Hazlett, A. K. Landauer, C. Franck, Exp. Mech. 60, 1205-1223 (2020) (ALDVC).
    """
    reference, size = _check_volume("reference", reference)
    deformed, other = _check_volume("deformed", deformed)
    if other != size:
        raise ValueError(f"deformed must have the reference's shape {size}; got shape {other}")
    subset = _check_int("subset", subset, minimum=5)
    if subset % 2 == 0:
        raise ValueError(f"subset must be odd (a centre voxel); got {subset}")
    if subset > min(size):
        raise ValueError(f"subset {subset} is larger than the volumes' smallest side (shape {size})")
    step = _check_int("step", step, minimum=1)
    mask = _check_roi(roi, size)
    if not isinstance(shape, str):
        raise TypeError(f"shape must be one of {SHAPES}; got {shape!r} ({type(shape).__name__})")
    validate.check_choice("shape", shape, SHAPES)
    search = _check_int("search", search, minimum=0)
    min_zncc = _unit_interval("min_zncc", min_zncc)
    min_inside = _unit_interval("min_inside", min_inside)
    max_disagreement = validate.check_finite_scalar("max_disagreement", max_disagreement)
    if max_disagreement <= 0:
        raise ValueError(f"max_disagreement must be positive (voxels); got {max_disagreement}")
    sigma = check_prefilter(prefilter, default=DEFAULT_SIGMA)
    max_iterations = _check_int("max_iterations", max_iterations, minimum=1)
    tolerance = validate.check_finite_scalar("tolerance", tolerance)
    if tolerance <= 0:
        raise ValueError(f"tolerance must be positive (voxels); got {tolerance}")
    if compute is not None and not callable(compute):
        raise TypeError(f"compute must be a callable, compute(tasks) -> their results; got {type(compute).__name__}")
    dtype = compute_dtype(dtype)
    with precision_scope(dtype):
        return _correlate(reference, deformed, mask, subset=subset, step=step, shape=shape, search=search,
                          min_zncc=min_zncc, min_inside=min_inside, max_disagreement=max_disagreement, sigma=sigma,
                          max_iterations=max_iterations, tolerance=tolerance, dtype=dtype,
                          progress=progress, compute=compute)  # fmt: skip


def _inside_share(mask: np.ndarray, centres: np.ndarray, half: int) -> np.ndarray:
    """The share of each subset's voxels inside ``mask`` (box sums of its summed-volume table)."""
    table = np.pad(mask.astype(np.float64).cumsum(0).cumsum(1).cumsum(2), ((1, 0), (1, 0), (1, 0)))
    lo, hi = centres - half, centres + half + 1
    total = 0.0
    for corner in np.ndindex(2, 2, 2):
        at = [np.where(c, hi[:, a], lo[:, a]) for a, c in enumerate(corner)]
        total = total + (-1) ** (3 - sum(corner)) * table[at[0], at[1], at[2]]
    return total / (2 * half + 1) ** 3


def _is_lazy(volume: Any) -> bool:
    """Whether ``volume`` is read by slabs (dask, Zarr: anything not already in memory)."""
    return volume is not None and not isinstance(volume, (np.ndarray, jax.Array))


def _halo(half: int, search: int, translation: float, sigma: float, dtype: np.dtype) -> int:
    """The planes a slab reads beyond its points' along z: the subset, the whole translation, the search's window
    (its reach and binning), ``SLAB_SLACK`` for the start gradient's move of a corner, the spline's taps and the
    reach of its prefilter and of the Gaussian, so that every value a point's match reads is the whole volume's."""
    spline = 2 + kernels.PREFILTER_REACH[np.dtype(dtype)] + radius(sigma)
    return half + int(np.ceil(abs(translation))) + search + 2 + SLAB_SLACK + spline


def _slabs(size: tuple[int, int, int], planes: np.ndarray, halo: int, step: int) -> list[tuple[range, int, int]]:
    """The grid's point planes in slabs: ``(planes, first, stop)`` each, the volume's planes ``first:stop`` it
    reads; all read as many planes (one compiled program), starting on an even plane (the search's binning), or
    one slab that reads the whole volume."""
    depth = size[0]
    per_slab = max(1, (SLAB_VOXELS // (size[1] * size[2]) - 2 * halo - 2) // step + 1)
    length = (per_slab - 1) * step + 2 * halo + 2
    length += (depth - length) % 2  # so that the last slab, ending at the volume's end, starts on an even plane
    if length >= depth or per_slab >= len(planes):
        return [(range(len(planes)), 0, depth)]
    out = []
    for first in range(0, len(planes), per_slab):
        start = int(np.clip(planes[first] - halo, 0, depth - length))
        start -= start % 2
        out.append((range(first, min(first + per_slab, len(planes))), start, start + length))
    return out


def _downsampled_block(name: str, planes: Any, dtype: np.dtype, factor: int) -> tuple[np.ndarray, float, float, int]:
    """A block of planes binned by ``factor``, and the sum, the sum of squares and the count of its values binned
    by 2 (float64): one block of :func:`_downsampled`, in this process or as a cluster's task."""
    binned = kernels.binned(jnp.asarray(_read(name, planes, dtype)))
    values = np.asarray(binned, np.float64)
    sums = (float(values.sum()), float(np.sum(values * values)), int(values.size))
    for _ in range(int(np.log2(factor)) - 1):
        binned = kernels.binned(binned)
    return (np.asarray(binned), *sums)


def _downsampled(name: str, volume: Any, dtype: np.dtype, factor: int, report: Callable[[], None],
                 compute: Callable | None = None) -> tuple[np.ndarray, float, float]:  # fmt: skip
    """``volume`` binned by ``factor`` (a power of 2) read in blocks of planes, and the mean and standard
    deviation of it binned by 2 (the search's standardisation), never the whole volume in memory; ``report()``
    after each block (Cancel's chance). With ``compute``, each block is a task of a dask graph that it runs (a
    cluster's), the sums added here in the blocks' order (the same sums)."""
    depth = 2 * (volume.shape[0] // 2)
    plane = volume.shape[1] * volume.shape[2]
    block = max(factor, SLAB_VOXELS // plane // factor * factor)
    starts = range(0, depth, block)
    if compute is None:
        blocks = (_downsampled_block(name, volume[s : min(s + block, depth)], dtype, factor) for s in starts)
    else:
        lazy = _as_dask(volume)
        blocks = _tasks(compute, [(_downsampled_block, name, lazy[s : min(s + block, depth)], dtype, factor)
                                  for s in starts], dtype)  # fmt: skip
    parts, total, squares, count = [], 0.0, 0.0, 0
    for part, block_total, block_squares, block_count in blocks:
        total, squares, count = total + block_total, squares + block_squares, count + block_count
        parts.append(part)
        report()
    mean = total / count
    return np.concatenate(parts), mean, float(np.sqrt(max(squares / count - mean * mean, 0.0)))


def _as_dask(volume: Any) -> Any:
    """A lazy (or NumPy) volume as a dask array, whose slices a cluster's tasks read (a dask array: itself), in
    blocks of whole planes: a Zarr array's own chunks' depth, else blocks of about ``2**22`` voxels (a slab's
    slice then reads its own blocks only)."""
    import dask.array as da

    if validate.is_dask(volume):
        return volume
    stored = getattr(volume, "chunks", None)
    depth = int(stored[0]) if stored else max(1, 2**22 // (volume.shape[1] * volume.shape[2]))
    return da.from_array(volume, chunks=(depth, *volume.shape[1:]))


_ONE_TASK_AT_A_TIME = threading.Lock()


def _in_scope(dtype: np.dtype, function: Callable, *args: Any) -> Any:
    """``function(*args)`` in the run's precision scope, as a cluster's task (its thread has not entered the scope).

    One such task at a time in a process: a task's chunks take the process's devices (and their cores) already,
    and two slabs' programs side by side in a worker's two threads stalled XLA's CPU client on 2 cores (each
    waiting on work queued behind the other's), never finishing."""
    with _ONE_TASK_AT_A_TIME, precision_scope(dtype):
        return function(*args)


class _Joined(tuple):
    """The results of one stage's tasks, joined by one last task (told apart from the wrapping ``compute`` adds)."""


def _joined(*results: Any) -> _Joined:
    return _Joined(results)


def _tasks(compute: Callable, calls: list[tuple], dtype: np.dtype) -> list[Any]:
    """``function(*args)`` of each of ``calls`` as a task of one dask graph (dask arrays among the arguments: the
    planes it reads, read by the task's own dependencies), run by ``compute``; the results in order. Each runs in
    the run's precision scope, and on the host CPU where the run is placed there (:func:`.strategy.keep_place`).

    ``compute`` is handed one collection, the tasks joined, in a list: ``dask.compute`` (which wraps its results
    in a tuple) and the command line's runner (a list) both do."""
    import dask

    work = strategy.keep_place(_in_scope)
    tasks = [dask.delayed(work, pure=False)(dtype, *call) for call in calls]
    out = compute([dask.delayed(_joined, pure=False)(*tasks)])
    for _ in range(3):  # a list around it (the runner's), a tuple around that (dask.compute's)
        if isinstance(out, _Joined):
            return list(out)
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            break
        out = out[0]
    raise TypeError(
        "compute must run a list of dask collections and return their results (as dask.compute, or lambda "
        f"collections: client.gather(client.compute(collections))); got {type(out).__name__}"
    )


class _Report:
    """The run's ``progress(done, total)``: points searched and points whose IC-GN stopped, each counted once."""

    def __init__(self, progress: Callable[[int, int], Any] | None, total: int):
        self.progress, self.total, self.done = progress, max(int(total), 1), 0

    def __call__(self, points: int = 0) -> None:
        self.done = min(self.done + int(points), self.total)
        if self.progress is not None:
            self.progress(self.done, self.total)


@dataclasses.dataclass(frozen=True)
class _SlabRun:
    """What a slab's work needs beside its planes: the run's constants (small and picklable: a cluster's tasks
    take them)."""

    size: tuple[int, int, int]
    half: int
    sigma: float
    dtype: np.dtype
    search: int
    searching: bool
    roi: bool  # whether there is a region of interest
    affine: bool
    max_iterations: int
    tolerance: float
    chunk: int
    min_inside: float
    translation: np.ndarray
    stats: Any  # the binned volumes' (mean, spread) each, for the search


def _slab_masks(run: _SlabRun, roi: Any, first: int, stop: int) -> tuple[Any, Any, np.ndarray]:
    """The planes ``first:stop``'s ROI less its edge band, the voxels the subsets may use (that, less the
    prefilter's reach inside the volume's border) and the ROI there (``roi``: its raw planes, or None)."""
    size = run.size
    if roi is None:
        roi = trimmed = None
        weights = np.ones((stop - first, *size[1:]), bool)
    else:
        roi = np.asarray(roi) > 0
        # the ROI less the prefilter's and the spline's reach inside its edge (a slab's own edges inside the
        # volume erode only its halo)
        trimmed = ndimage.binary_erosion(roi, iterations=radius(run.sigma) + SPLINE_REACH, border_value=1)
        weights = trimmed.copy()
    # and less the prefilter's reach inside the volume's border, where it smoothed mirrored values that the
    # deformed volume, carried, does not hold (the deformed side's band: the IC-GN's ``band``)
    band = radius(run.sigma)
    if band:
        planes = np.arange(first, stop)
        weights[(planes < band) | (planes >= size[0] - band)] = False
        for axis in (1, 2):
            edge = [slice(None)] * 3
            edge[axis] = np.r_[0:band, size[axis] - band : size[axis]]
            weights[tuple(edge)] = False
    return trimmed, weights, roi


def _slab_search(run: _SlabRun, ref: np.ndarray, dfm: np.ndarray, roi: Any, first: int, centres: np.ndarray, *,
                 spread: _Spread, on_chunk: Callable[[int], None] | None = None) -> tuple[np.ndarray, ...]:  # fmt: skip
    """A slab's points (``centres``, whole-volume voxels) from its planes ``ref``, ``dfm`` (compute dtype) and
    ``roi`` (raw planes or None) from ``first``: whether each is usable, its share of usable voxels, its start
    displacement and whether the search found one."""
    count, half = len(centres), run.half
    usable, inside, searched = np.ones(count, bool), np.ones(count), np.ones(count, bool)
    shift = np.broadcast_to(run.translation, (count, 3)).copy()
    trimmed, weights, roi = _slab_masks(run, roi, first, first + len(ref))
    local = centres - [first, 0, 0]
    if roi is not None:
        usable = roi[tuple(local.T)] & (_inside_share(trimmed, local, half) >= run.min_inside)
        inside = _inside_share(weights, local, half)
    if run.searching:
        ref_c, def_c = (
            (np.asarray(kernels.binned(jnp.asarray(v)), np.float64) - mean) / max(deviation, 1e-30)
            for v, (mean, deviation) in zip((ref, dfm), run.stats)
        )
        mask_c = None
        if roi is not None:
            mask_c = np.asarray(kernels.binned(jnp.asarray(weights, run.dtype))) > 0.999
        shape_c = np.array([n // COARSE for n in run.size])
        shift, peak = _coarse_search(ref_c, def_c, mask_c, centres, run.translation, half=half, search=run.search,
                                     dtype=run.dtype, shape_c=shape_c, offset_c=first // COARSE, on_chunk=on_chunk,
                                     spread=spread)  # fmt: skip
        searched = np.isfinite(peak)
    return usable, inside, shift, searched


def _slab_solver(run: _SlabRun, ref: np.ndarray, dfm: np.ndarray, roi: Any, first: int, centres: np.ndarray, *,
                 spread: _Spread, tick: Callable[[int], None] | None = None) -> _Solver:  # fmt: skip
    """A slab's solver over its prepared planes (as :func:`_slab_search` takes them)."""
    _, weights, _ = _slab_masks(run, roi, first, first + len(ref))
    coefficients, prepared = kernels.prepared_volumes(jnp.asarray(ref), jnp.asarray(dfm), sigma=run.sigma)
    size, dtype = run.size, run.dtype
    bounds = jnp.asarray([[-first, 0, 0], [size[0] - 1 - first, size[1] - 1, size[2] - 1]], dtype)
    return _Solver(coefficients, prepared, jnp.asarray(weights, dtype), centres - [first, 0, 0], half=run.half,
                   affine=run.affine, max_iterations=run.max_iterations, tolerance=run.tolerance, chunk=run.chunk,
                   band=radius(run.sigma) if run.sigma > 0 else -1.0, masked=run.roi or run.sigma > 0, bounds=bounds,
                   tick=tick, spread=spread)  # fmt: skip


def _slab_first(solver: _Solver, usable: np.ndarray, searched: np.ndarray, start: np.ndarray) -> tuple:
    """A slab's Hessians and first IC-GN: which points are textured and prepared, their inverse Hessians'
    translation diagonal, the run's arrays and how many points ran."""
    solver.prepare(usable)
    textured = solver.textured()
    diagonal = np.diagonal(solver.inverse, axis1=1, axis2=2)[:, kernels.TRANSLATION]
    run_here = usable & textured & searched
    first = solver.run(run_here, start, steps=min(FIRST_PASS_STEPS, solver.max_iterations))
    return textured, solver.prepared.copy(), diagonal, first, int(np.count_nonzero(run_here))


def _slab_again(solver: _Solver, which: np.ndarray, begin: np.ndarray,
                steps: int | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """A slab's IC-GN of the points ``which`` from ``begin`` (a retry), ``steps`` at most, uncounted."""
    solver.prepare(which)
    return solver.run(which, begin, counted=False, steps=steps)


def _slab_task(stage: str, run: _SlabRun, first: int, centres: np.ndarray, reference: Any, deformed: Any, roi: Any,
               *inputs: Any) -> Any:  # fmt: skip
    """One slab's ``stage`` (``"search"``, ``"first"``, ``"again"``) as a cluster's task: its planes (and halo)
    ``reference``, ``deformed``, ``roi`` read by the task's dependencies, its chunks on the worker's default device;
    what the run in this process computes for the slab."""
    # the worker's call device alone: chunks spread over a worker's host devices from its task threads stalled
    # XLA's CPU client (4 host devices, dask.distributed's threads), where the same spread ran in a main thread
    spread = _Spread((None,))
    ref, dfm = _read("reference", reference, run.dtype), _read("deformed", deformed, run.dtype)
    if stage == "search":
        return _slab_search(run, ref, dfm, roi, first, centres, spread=spread)
    solver = _slab_solver(run, ref, dfm, roi, first, centres, spread=spread)
    return _slab_first(solver, *inputs) if stage == "first" else _slab_again(solver, *inputs)


def _correlate(reference, deformed, mask, *, subset, step, shape, search, min_zncc, min_inside, max_disagreement,
               sigma, max_iterations, tolerance, dtype, progress=None, compute=None) -> VolumeCorrelation:  # fmt: skip
    size = tuple(reference.shape)
    half = subset // 2
    axes = [np.arange(half, n - half, step, dtype=np.float64) for n in size]
    grid = tuple(len(a) for a in axes)
    origin = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    centres = origin.astype(np.int64)
    points = len(origin)
    plane_points = grid[1] * grid[2]
    binnable = min(size) >= 2 * COARSE * 4
    searching = search > 0 and binnable
    report = _Report(progress, points * (2 if searching else 1))
    tick = report if progress is not None else None
    report()

    # the whole translation, and the binned volumes' mean and spread (the search's standardisation): from the
    # volumes in memory, or, for lazy ones, from a copy binned as far as DOWNSAMPLED_VOXELS asks, read in blocks
    held = None
    lazy = any(_is_lazy(v) for v in (reference, deformed, mask))
    # a cluster's tasks (compute) run the slab plan of lazy volumes; the rest runs here
    distributed = compute is not None and lazy and binnable
    stats = None
    if lazy and binnable:
        factor = COARSE
        while np.prod([n // (2 * factor) for n in size]) >= DOWNSAMPLED_VOXELS and min(size) // (2 * factor) >= 8:
            factor *= 2
        blocks_by = compute if distributed else None
        ref_f, *ref_stats = _downsampled("reference", reference, dtype, factor, report, blocks_by)
        def_f, *def_stats = _downsampled("deformed", deformed, dtype, factor, report, blocks_by)
        translation = factor * whole_translation(ref_f, def_f)
        stats = (ref_stats, def_stats)
        del ref_f, def_f
        slabs = _slabs(size, axes[0], _halo(half, search, translation[0], sigma, dtype), step)
    else:
        slabs = [(range(grid[0]), 0, size[0])]
    if len(slabs) == 1 and not distributed:
        held = (_read("reference", reference, dtype), _read("deformed", deformed, dtype))
        if not lazy or not binnable:
            ref, dfm = held
            if binnable:
                ref_c, def_c = (np.asarray(kernels.binned(jnp.asarray(v))) for v in (ref, dfm))
                translation = COARSE * whole_translation(ref_c, def_c)
                stats = [(v.astype(np.float64).mean(), v.astype(np.float64).std()) for v in (ref_c, def_c)]
            else:
                translation = whole_translation(ref, dfm)

    affine = shape == "affine"
    constants = _SlabRun(size=size, half=half, sigma=sigma, dtype=dtype, search=search, searching=searching,
                   roi=mask is not None, affine=affine, max_iterations=max_iterations, tolerance=tolerance,
                   chunk=_chunk(subset), min_inside=min_inside, translation=translation, stats=stats)  # fmt: skip
    spread = _spread()  # this process's devices (a cluster's task finds its worker's own)

    def load(first: int, stop: int) -> tuple[np.ndarray, np.ndarray, Any]:
        """The planes ``first:stop`` of both volumes (compute dtype) and of the ROI (raw, or None)."""
        if held is not None:
            ref, dfm = held
        else:
            report()  # Cancel's chance before each slab's read
            ref, dfm = (_read(name, v[first:stop], dtype) for name, v in (("reference", reference),
                                                                          ("deformed", deformed)))  # fmt: skip
        return ref, dfm, None if mask is None else mask[first:stop]

    def slab_points(planes: range) -> np.ndarray:
        return np.arange(planes.start * plane_points, planes.stop * plane_points)

    if distributed:
        lazy_volumes = [None if v is None else _as_dask(v) for v in (reference, deformed, mask)]

    def on_slabs(stage: str, ks: list[int], inputs: Callable[[np.ndarray], tuple]) -> list[Any]:
        """Slab ``k``'s ``stage`` for each of ``ks``, with ``inputs(index)`` (its points' arrays): as one
        graph's tasks where a cluster runs them (the results then reported at once), else one slab after the
        other here (each slab's read giving Cancel its chance)."""
        calls = []
        for k in ks:
            planes, first, stop = slabs[k]
            index = slab_points(planes)
            planes_of = [None if v is None else v[first:stop] for v in lazy_volumes]
            calls.append((_slab_task, stage, constants, first, centres[index], *planes_of, *inputs(index)))
        return _tasks(compute, calls, dtype)

    # the usable points (centre in the ROI, enough of the subset inside it) and, for the outside_roi status, the
    # share of each subset's voxels the subsets may use; each point's start from the search
    usable = np.ones(points, bool)
    inside = np.ones(points)
    start_shift = np.broadcast_to(translation, (points, 3)).copy()
    searched = np.ones(points, bool)
    if mask is not None or searching:
        if distributed:
            found_here = on_slabs("search", list(range(len(slabs))), lambda index: ())
        for k, (planes, first, stop) in enumerate(slabs):
            index = slab_points(planes)
            if distributed:
                part = found_here[k]
                report(len(index) if searching else 0)
            else:
                ref, dfm, roi = load(first, stop)
                part = _slab_search(constants, ref, dfm, roi, first, centres[index], spread=spread, on_chunk=tick)
                ref = dfm = roi = None  # before the next slab's volumes are read
            usable[index], inside[index], start_shift[index], searched[index] = part
    start_shift[~searched] = np.nan
    start_gradient = _start_gradient(start_shift, grid, step) if affine else np.zeros((points, 3, 3))
    start = np.zeros((points, 12))
    start[:, kernels.TRANSLATION] = _into_view(start_shift, start_gradient, origin, half, size)
    start[:, 1:4], start[:, 5:8], start[:, 9:12] = (start_gradient[:, a] for a in range(3))

    solvers: dict[int, _Solver] = {}

    def solver_of(k: int) -> _Solver:
        """Slab ``k``'s solver over its prepared volumes (kept where the volumes are in memory)."""
        if k in solvers:
            return solvers[k]
        planes, first, stop = slabs[k]
        ref, dfm, roi = load(first, stop)
        out = _slab_solver(constants, ref, dfm, roi, first, centres[slab_points(planes)], spread=spread, tick=tick)
        if held is not None:
            solvers[k] = out
        return out

    def run_slabs(which: np.ndarray, begin: np.ndarray, steps: int | None = None) -> dict[str, np.ndarray]:
        """The IC-GN of the points ``which`` from ``begin`` (``steps`` at most), slab by slab, joined into the
        whole grid's arrays."""
        out = dict(zncc=np.full(points, np.nan), variance=np.full(points, np.nan), steps=np.zeros(points, np.int16),
                   converged=np.zeros(points, bool), started=np.zeros(points, bool), view=np.zeros(points, bool),
                   warp=np.full((points, 12), np.nan))  # fmt: skip
        ks = [k for k, (planes, _, _) in enumerate(slabs) if which[slab_points(planes)].any()]
        if distributed:
            parts = on_slabs("again", ks, lambda index: (which[index], begin[index], steps))
            report()  # Cancel's chance
        for n, k in enumerate(ks):
            index = slab_points(slabs[k][0])
            part = parts[n] if distributed else _slab_again(solver_of(k), which[index], begin[index], steps)
            for key, v in part.items():
                out[key][index] = v
            part = None  # before the next slab's volumes are read
        return out

    # each point's Hessian (slab by slab), then the IC-GN of the usable, textured, searched points
    textured = np.zeros(points, bool)
    prepared_points = np.zeros(points, bool)
    inverse_diagonal = np.full((points, 3), np.nan)
    result = None
    if distributed:
        every = list(range(len(slabs)))
        firsts = on_slabs("first", every, lambda index: (usable[index], searched[index], start[index]))
    for k, (planes, _, _) in enumerate(slabs):
        index = slab_points(planes)
        if distributed:
            textured[index], prepared_points[index], inverse_diagonal[index], part, _ = firsts[k]
            firsts[k] = None
            report(len(index))  # every point of the slab has stopped or was not run
        else:
            solver = solver_of(k)
            textured[index], prepared_points[index], inverse_diagonal[index], part, ran = _slab_first(
                solver, usable[index], searched[index], start[index]
            )
            report(len(index) - ran)  # the points not run are done too
            del solver  # before the next slab's volumes are read
        if result is None:
            result = {key: np.zeros((points, *v.shape[1:]), v.dtype) for key, v in part.items()}
        for key, v in part.items():
            result[key][index] = v
        del part
    run = usable & textured & searched
    status = np.full(points, Status.not_significant, np.uint8)
    affine_tried = np.zeros(points, bool)

    def accepted(r):
        return r["converged"] & r["view"] & (np.nan_to_num(r["zncc"], nan=-1) >= min_zncc)

    found = accepted(result)
    tried = run.copy()
    # the first pass's points still moving when it stopped (FIRST_PASS_STEPS)
    first_steps = min(FIRST_PASS_STEPS, max_iterations)
    moving = run & ~result["converged"] & result["view"] & (result["steps"] >= first_steps)
    moving &= np.all(np.isfinite(result["warp"]), 1)
    # the points not found from the search (beyond its reach of the whole translation: a rotation's far points),
    # from the affine map fitted to the points found, a round again while it finds more: a rigid or homogeneous
    # motion is then found wherever its subsets stay in the volume, whatever the search
    for _ in range(AFFINE_ROUNDS):
        linear, shift = _affine_fit(origin[found], result["warp"][found][:, kernels.TRANSLATION])
        if linear is None:
            break
        gradient_guess = np.broadcast_to(linear, (points, 3, 3))
        predicted = np.matmul(origin, linear.T) + shift  # NumPy, on the host
        retry = usable & textured & ~found & ~affine_tried & _in_view(predicted, gradient_guess, origin, half, size)
        if not retry.any():
            break
        begin = np.zeros((points, 12))
        begin[:, kernels.TRANSLATION] = predicted
        begin[:, 1:4], begin[:, 5:8], begin[:, 9:12] = linear[0], linear[1], linear[2]
        again = run_slabs(retry, begin)
        better = retry & (accepted(again) | ~tried)
        for key in result:
            result[key][better] = again[key][better]
        tried |= retry
        affine_tried |= retry & ~accepted(again)  # a point the map's guess did not find is not tried so again
        before, found = found, accepted(result)
        if found.sum() == before.sum():
            break

    def propagate(found: np.ndarray) -> np.ndarray:
        """The points not found, from their found neighbours' warps, a round again while any is left; the points
        found then."""
        for _ in range(PROPAGATION_ROUNDS):
            carried, has = _neighbour_starts(grid, origin, result["warp"], found, result["zncc"])
            retry = usable & textured & ~found & has & np.all(np.isfinite(carried), 1)
            if not retry.any():
                break
            again = run_slabs(retry, carried)
            better = retry & (accepted(again) | ~tried)
            for key in result:
                result[key][better] = again[key][better]
            np.logical_or(tried, retry, out=tried)
            found = accepted(result)
        return found

    found = propagate(found)
    # the first pass's points still moving that nothing since has found go on from where they stopped, to
    # max_iterations steps in all (a retry's failure left their first pass's warp in place): what one pass of
    # max_iterations steps would have given them; their neighbours then from them
    moving &= ~found
    if moving.any() and max_iterations > first_steps:
        again = run_slabs(moving, result["warp"], steps=max_iterations - first_steps)
        again["steps"] = again["steps"] + first_steps
        for key in result:
            result[key][moving] = again[key][moving]
        before, found = found, accepted(result)
        if found.sum() > before.sum():
            found = propagate(found)

    disagreement = _disagreement(grid, origin, result["warp"], found)
    ambiguous = found & (disagreement > max_disagreement)
    found &= ~ambiguous
    # out of view: a match good enough to keep put the subset outside (a warp that wandered off from its start,
    # which is always inside, found nothing: not significant)
    good_zncc = np.nan_to_num(result["zncc"], nan=-1) >= min_zncc
    left = tried & ~result["view"] & good_zncc
    # and a point not found where the whole field (the affine map of the points found, else the whole
    # translation) carries its subset out of the volume: no start inside the volume could have found it
    linear, shift = _affine_fit(origin[found], result["warp"][found][:, kernels.TRANSLATION])
    if linear is None:
        linear, shift = np.zeros((3, 3)), translation
    predicted = np.matmul(origin, linear.T) + shift  # NumPy, on the host
    carried = ~_in_view(predicted, np.broadcast_to(linear, (points, 3, 3)), origin, half, size)
    status[left | ~searched | (carried & ~found & ~ambiguous)] = Status.out_of_view
    status[ambiguous] = Status.ambiguous
    status[found] = Status.ok
    if mask is not None:
        status[~usable | (prepared_points & ~textured & (inside < 1))] = Status.outside_roi

    report(report.total)  # every point: the rest were retried or not run
    warp = np.where(found[:, None], result["warp"], np.nan)
    sigma_out = np.sqrt(np.maximum(result["variance"], 0)[:, None] * inverse_diagonal)
    gradient = _gradient(warp) if affine else np.full((points, 3, 3), np.nan)

    def field(values, tail=()):
        return np.asarray(values, np.float32).reshape(*grid, *tail)

    return VolumeCorrelation(
        dz=field(warp[:, 0]), dy=field(warp[:, 4]), dx=field(warp[:, 8]), z=axes[0], y=axes[1], x=axes[2],
        zncc=field(np.where(result["converged"], result["zncc"], np.nan)),
        sigma=field(np.where(found[:, None], sigma_out, np.nan), (3,)), status=status.reshape(grid),
        gradient=field(gradient, (3, 3)), iterations=result["steps"].reshape(grid), translation=translation,
        subset=subset, step=step, shape=shape,
    )  # fmt: skip
