"""From a displacement field to what it measures: a surface (:func:`integrate_gradient`), X-ray speckle tracking's
phase (:func:`phase_from_displacement`) and DIC's strains (:func:`strain_field`).

``y`` runs along axis -2, ``x`` along axis -1, both increasing with the index; leading axes are a batch. The
displacement is :func:`~napari_gridmip.find_displacement`'s: ``img1[y + dy, x + dx]`` matches ``img2[y, x]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import validate
from napari_gridmip.core.correlation._dct import dct2, idct2
from napari_gridmip.core.runtime import strategy
from napari_gridmip.core.runtime.precision import compute_dtype, precision_scope
from napari_gridmip.core.runtime.transfer import to_device

__all__ = ["integrate_gradient", "phase_from_displacement", "strain_field"]

INTEGRATION_METHODS = ("least-squares", "frankot-chellappa")
SAMPLINGS = ("centred", "forward")
STRAIN_KINDS = ("small", "green-lagrange")

# Holes: conjugate gradients, until the residual falls below this fraction of the right-hand side
# (float32; float64 uses FILL_TOLERANCE_64), or after FILL_ITERATIONS steps (the membrane fill of
# pixels with no known slope: 4 (M + N) steps).
FILL_TOLERANCE = 1e-6
FILL_TOLERANCE_64 = 1e-12
FILL_ITERATIONS = 500
# A plane fit needs three points off one line: windows whose valid pixels are (nearly) collinear give NaN.
COLLINEAR = 1e-6


class Strain(NamedTuple):
    """What :func:`strain_field` returns: three arrays of the displacement's shape, which unpack as
    ``exx, eyy, exy``."""

    exx: Any
    """Normal strain along x (axis -1)."""
    eyy: Any
    """Normal strain along y (axis -2)."""
    exy: Any
    """Shear: the tensor component, half the engineering shear strain ``gamma_xy``."""


# -- validation ------------------------------------------------------------------------


def _check_pair(names: tuple[str, str], a: Any, b: Any, *, min_ndim: int = 2) -> tuple[int, ...]:
    for name, value in zip(names, (a, b)):
        validate.check_real(name, value)
        validate.check_ndim(name, value, min_ndim=min_ndim)
    shape_a, shape_b = validate.shape_of(a), validate.shape_of(b)
    if shape_a != shape_b:
        raise ValueError(f"{names[0]} and {names[1]} must have the same shape; got {shape_a} and {shape_b}")
    validate.check_nonempty(names[0], shape_a)
    return shape_a


def _positive_pair(name: str, value: Any) -> tuple[float, float]:
    """``spacing``-like options: one positive number for both axes, or a ``(y, x)`` pair."""
    items = [value, value] if np.ndim(value) == 0 else list(value)
    if len(items) != 2:
        raise ValueError(f"{name} must be a number or a (y, x) pair; got {value!r}")
    out = tuple(validate.check_finite_scalar(name, item) for item in items)
    if any(v <= 0 for v in out):
        raise ValueError(f"{name} must be positive; got {value!r}")
    return out  # type: ignore[return-value]


def _positive(name: str, value: Any) -> float:
    out = validate.check_finite_scalar(name, value)
    if out <= 0:
        raise ValueError(f"{name} must be positive; got {value!r}")
    return out


def _as_compute(array: Any, dtype: np.dtype) -> jax.Array:
    """A JAX array of the compute ``dtype``; NumPy data is cast by NumPy (64-bit data is never narrowed by JAX)."""
    if isinstance(array, jax.Array):  # tracers included
        return array.astype(dtype)
    return to_device(np.asarray(array).astype(dtype, copy=False))


def _any_unknown(*arrays: jax.Array) -> bool | None:
    """Whether any value is NaN or infinite; None when the arrays are being traced (a caller's jit)."""
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        return None
    return not bool(jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in arrays])))


def _flat(array: jax.Array) -> jax.Array:
    """``(..., M, N)`` as ``(B, M, N)``."""
    return array.reshape((-1,) + array.shape[-2:])


# -- the two integrators -------------------------------------------------------------------
#
# Each integrator compares a surface z with target slopes e through a linear map ``slopes(z)``
# (least squares: forward differences between neighbouring pixels, the "edges"; Frankot-Chellappa:
# spectral derivatives at the pixels) and minimises sum w (slopes(z) - e)^2 with weights w of 1
# (known slope) or 0 (unknown). ``unweighted(r)`` applies the pseudo-inverse of slopes^T slopes
# (one DCT or FFT pair): with every slope known, z = unweighted(slopes^T e) is the whole solution;
# with holes it preconditions conjugate gradients.


def _neumann_eigenvalues(rows: int, cols: int, dtype: np.dtype) -> np.ndarray:
    """Eigenvalues of the Neumann Laplacian (the forward differences' D^T D), in :func:`dct2`'s transposed
    layout ``(cols, rows)``; 1 at the constant mode, whose coefficient is set to 0 instead."""
    ky = 4 * np.sin(np.pi * np.arange(rows) / (2 * rows)) ** 2
    kx = 4 * np.sin(np.pi * np.arange(cols) / (2 * cols)) ** 2
    eigen = kx[:, None] + ky[None, :]
    eigen[0, 0] = 1
    return eigen.astype(dtype)


def _differences_transposed(ey: jax.Array, ex: jax.Array) -> jax.Array:
    """``D^T (ey, ex)`` for the forward differences ``D``: ``ey[i-1] - ey[i] + ex[j-1] - ex[j]`` (0 outside)."""
    pad_y = [(0, 0)] * (ey.ndim - 2) + [(1, 1), (0, 0)]
    pad_x = [(0, 0)] * (ex.ndim - 2) + [(0, 0), (1, 1)]
    ey, ex = jnp.pad(ey, pad_y), jnp.pad(ex, pad_x)
    return (ey[..., :-1, :] - ey[..., 1:, :]) + (ex[..., :, :-1] - ex[..., :, 1:])


class _LeastSquares:
    """Forward differences between neighbouring pixels; D^T D inverted by the DCT (Neumann boundaries)."""

    def __init__(self, rows: int, cols: int, dtype: np.dtype, sampling: str):
        self.sampling = sampling
        self.eigen = _neumann_eigenvalues(rows, cols, dtype)
        self.keep = np.ones((cols, rows), dtype)
        self.keep[0, 0] = 0  # the mean: zero

    def targets(self, gy: jax.Array, gx: jax.Array) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        """Slopes between neighbours and whether they are known (both ends finite for ``centred``)."""
        finite_y, finite_x = jnp.isfinite(gy), jnp.isfinite(gx)
        if self.sampling == "forward":
            edges = (gy[..., :-1, :], gx[..., :, :-1])
            known = (finite_y[..., :-1, :], finite_x[..., :, :-1])
        else:  # the trapezoid rule between two samples at pixel centres
            edges = ((gy[..., :-1, :] + gy[..., 1:, :]) / 2, (gx[..., :, :-1] + gx[..., :, 1:]) / 2)
            known = (finite_y[..., :-1, :] & finite_y[..., 1:, :], finite_x[..., :, :-1] & finite_x[..., :, 1:])
        return edges, known

    def slopes(self, z: jax.Array) -> tuple[jax.Array, ...]:
        return (z[..., 1:, :] - z[..., :-1, :], z[..., :, 1:] - z[..., :, :-1])

    def slopes_transposed(self, edges: tuple[jax.Array, ...]) -> jax.Array:
        return _differences_transposed(*edges)

    def unweighted(self, r: jax.Array) -> jax.Array:
        """``(D^T D)^+ r``: the Neumann Poisson solve, mean 0."""
        return idct2(dct2(r) / self.eigen * self.keep)


def _wavenumbers(n: int, *, real: bool, dtype: np.dtype) -> np.ndarray:
    """``2 pi f`` of an FFT axis; 0 at the Nyquist frequency (a real signal's derivative has none there)."""
    freq = np.fft.rfftfreq(n) if real else np.fft.fftfreq(n)
    k = 2 * np.pi * freq
    if n % 2 == 0:
        k[np.abs(freq) == 0.5] = 0
    return k.astype(dtype)


class _FrankotChellappa:
    """Spectral derivatives of a periodic surface (optionally of the surface mirrored evenly, twice as large)."""

    def __init__(self, rows: int, cols: int, dtype: np.dtype, mirror: bool):
        self.shape = (rows, cols)
        self.mirror = mirror
        self.big = (2 * rows, 2 * cols) if mirror else (rows, cols)
        self.ky = _wavenumbers(self.big[0], real=False, dtype=dtype)[:, None]
        self.kx = _wavenumbers(self.big[1], real=True, dtype=dtype)[None, :]
        k2 = self.ky**2 + self.kx**2
        self.inverse_k2 = np.where(k2 > 0, 1 / np.where(k2 > 0, k2, 1), 0).astype(dtype)  # the mean: zero

    def targets(self, gy: jax.Array, gx: jax.Array) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        return (gy, gx), (jnp.isfinite(gy), jnp.isfinite(gx))

    def _extend(self, a: jax.Array, odd_y: bool = False, odd_x: bool = False) -> jax.Array:
        """The even (along an ``odd`` axis, odd) mirror image of ``a``, twice as large; ``a`` without ``mirror``."""
        if not self.mirror:
            return a
        flip_y = jnp.flip(a, -2)
        a = jnp.concatenate([a, -flip_y if odd_y else flip_y], axis=-2)
        flip_x = jnp.flip(a, -1)
        return jnp.concatenate([a, -flip_x if odd_x else flip_x], axis=-1)

    def _crop(self, a: jax.Array) -> jax.Array:
        return a[..., : self.shape[0], : self.shape[1]]

    def slopes(self, z: jax.Array) -> tuple[jax.Array, ...]:
        spectrum = jnp.fft.rfft2(self._extend(z))
        return tuple(self._crop(jnp.fft.irfft2(1j * k * spectrum, s=self.big)) for k in (self.ky, self.kx))

    def slopes_transposed(self, edges: tuple[jax.Array, ...]) -> jax.Array:
        """``-div``: the spectral derivatives' adjoint (of the mirrored fields: their y-slope odd along y, x-slope
        odd along x, so that the crop's adjoint, the mirror, is exact up to its factor 4, which
        :meth:`unweighted` undoes)."""
        gy, gx = self._extend(edges[0], odd_y=True), self._extend(edges[1], odd_x=True)
        spectrum = -1j * (self.ky * jnp.fft.rfft2(gy) + self.kx * jnp.fft.rfft2(gx))
        return self._crop(jnp.fft.irfft2(spectrum, s=self.big))

    def unweighted(self, r: jax.Array) -> jax.Array:
        """``(S^T S)^+ r`` for the spectral derivatives ``S``: ``1 / k^2`` in Fourier space, mean 0."""
        return self._crop(jnp.fft.irfft2(jnp.fft.rfft2(self._extend(r)) * self.inverse_k2, s=self.big))


# -- holes ----------------------------------------------------------------------------------


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """Per batch item: ``sum(a * b)`` over the image, shaped ``(B, 1, 1)``."""
    return jnp.sum(a * b, axis=(-2, -1), keepdims=True)


def _conjugate_gradients(operator, precondition, rhs, start, tolerance, iterations):
    """Preconditioned conjugate gradients, every batch item on its own (converged items stop moving).

    Stops when every item's residual is below ``tolerance`` times its right-hand side's, or after
    ``iterations`` steps.
    """
    r = rhs - operator(start)
    z = precondition(r)
    limit = (tolerance**2) * _dot(rhs, rhs)

    def not_done(state):
        step, _, r, _, _ = state
        return (step < iterations) & jnp.any(_dot(r, r) > limit)

    def iterate(state):
        step, x, r, p, rz = state
        active = _dot(r, r) > limit
        hp = operator(p)
        php = _dot(p, hp)
        alpha = jnp.where(active & (php > 0), rz / jnp.where(php > 0, php, 1), 0)
        x = x + alpha * p
        r = r - alpha * hp
        z = precondition(r)
        rz_new = _dot(r, z)
        beta = jnp.where(active & (rz != 0), rz_new / jnp.where(rz != 0, rz, 1), 0)
        return step + 1, x, r, z + beta * p, rz_new

    _, x, _, _, _ = lax.while_loop(not_done, iterate, (jnp.int32(0), start, r, z, _dot(r, z)))
    return x


def _neumann_laplacian(z: jax.Array) -> jax.Array:
    """The 5-point Laplacian with Neumann boundaries, ``D^T D z`` (degree times z minus the neighbours)."""
    return _differences_transposed(z[..., 1:, :] - z[..., :-1, :], z[..., :, 1:] - z[..., :, :-1])


def _membrane_fill(z: jax.Array, free: jax.Array, tolerance: float) -> jax.Array:
    """``z`` with its ``free`` pixels replaced by the harmonic interpolation of the others.

    Solves the 5-point Laplace equation on the free pixels with the others as boundary values
    (Dirichlet), by conjugate gradients preconditioned by the diagonal: about one iteration per
    pixel of the widest hole's diameter.
    """
    rows, cols = z.shape[-2:]
    degree = _neumann_laplacian(jnp.ones_like(z))
    weight = free.astype(z.dtype)

    def operator(v):
        return weight * _neumann_laplacian(weight * v)

    rhs = -weight * _neumann_laplacian(z * (1 - weight))
    degree = jnp.where(degree > 0, degree, 1)  # a 1x1 image
    # from the values conjugate gradients left there (smooth, near the membrane): fewer iterations than from 0
    filled = _conjugate_gradients(
        operator, lambda r: weight * r / degree, rhs, weight * z, tolerance, 4 * (rows + cols)
    )
    return jnp.where(free, filled, z)


def _choose(holes: bool | None, plain: Callable, with_holes: Callable, known: Any, operand: Any) -> Any:
    """``with_holes(operand)`` or ``plain(operand)``: decided by the caller (``holes`` True or False, from the
    data it holds; the programs stay small) or, under a caller's jit (None), by ``known`` on the device."""
    if holes is None:
        all_known = jnp.all(jnp.stack([jnp.all(k) for k in known]))
        return lax.cond(all_known, plain, with_holes, operand)
    return with_holes(operand) if holes else plain(operand)


def _least_squares(gy: jax.Array, gx: jax.Array, sampling: str, tolerance: float, holes: bool | None) -> jax.Array:
    """The least-squares surface of ``(B, M, N)`` slopes per pixel, NaN slopes left out and filled."""
    rows, cols = gy.shape[-2:]
    solver = _LeastSquares(rows, cols, np.dtype(gy.dtype), sampling)
    edges, known = solver.targets(gy, gx)
    weights = tuple(k.astype(gy.dtype) for k in known)
    rhs = solver.slopes_transposed(tuple(jnp.where(k, e, 0) for k, e in zip(known, edges)))
    start = solver.unweighted(rhs)  # the whole solution when every slope is known

    def with_holes(start):
        def operator(z):  # D^T W D
            return solver.slopes_transposed(tuple(w * s for w, s in zip(weights, solver.slopes(z))))

        z = _conjugate_gradients(operator, solver.unweighted, rhs, start, tolerance, FILL_ITERATIONS)
        z = _membrane_fill(z, _known_edges_at(weights) == 0, tolerance)  # pixels with no known slope
        return z - jnp.mean(z, axis=(-2, -1), keepdims=True)

    return _choose(holes, lambda s: s, with_holes, known, start)


def _central_differences(z: jax.Array, axis: int) -> jax.Array:
    """``(z[i+1] - z[i-1]) / 2``, one-sided at the ends (as ``numpy.gradient``); 0 along an axis of length 1."""
    n = z.shape[axis]
    if n == 1:
        return jnp.zeros_like(z)
    forward = jnp.diff(z, axis=axis)
    pad = [(0, 0)] * z.ndim
    pad[axis] = (1, 0)
    before = jnp.pad(forward, pad, mode="edge")
    pad[axis] = (0, 1)
    after = jnp.pad(forward, pad, mode="edge")
    return (before + after) / 2


@partial(jax.jit, static_argnames=("method", "sampling", "mirror", "holes"))
def _integrate(gy, gx, spacing, *, method, sampling, mirror, holes):
    """The surface of ``(B, M, N)`` gradients (already of the compute dtype); ``spacing`` a ``(2,)`` array;
    ``holes``: whether any slope is NaN or infinite (None: not known on the host)."""
    rows, cols = gy.shape[-2:]
    dtype = np.dtype(gy.dtype)
    tolerance = FILL_TOLERANCE_64 if dtype == np.float64 else FILL_TOLERANCE
    gy, gx = gy * spacing[0], gx * spacing[1]  # slopes per pixel
    finite_y, finite_x = jnp.isfinite(gy), jnp.isfinite(gx)
    if method == "least-squares":
        z = _least_squares(gy, gx, sampling, tolerance, holes)
    else:
        solver = _FrankotChellappa(rows, cols, dtype, mirror)

        def filled(slopes):  # unknown samples: the slopes of the least-squares surface, holes filled
            gy, gx = slopes
            z = _least_squares(gy, gx, "centred", tolerance, True)
            return (
                jnp.where(finite_y, gy, _central_differences(z, -2)),
                jnp.where(finite_x, gx, _central_differences(z, -1)),
            )

        gy, gx = _choose(holes, lambda s: s, filled, (finite_y, finite_x), (gy, gx))
        z = solver.unweighted(solver.slopes_transposed((gy, gx)))
    # nothing known at all: no surface (a single pixel has no edges, and its surface is 0)
    if rows * cols > 1 and holes is not False:
        anything = jnp.any(finite_y | finite_x, axis=(-2, -1), keepdims=True)
        z = jnp.where(anything, z, jnp.nan)
    return z


def _known_edges_at(weights: tuple[jax.Array, jax.Array]) -> jax.Array:
    """How many known edges touch each pixel."""
    wy, wx = weights
    pad_y = [(0, 0)] * (wy.ndim - 2) + [(1, 1), (0, 0)]
    pad_x = [(0, 0)] * (wx.ndim - 2) + [(0, 0), (1, 1)]
    wy, wx = jnp.pad(wy, pad_y), jnp.pad(wx, pad_x)
    return wy[..., :-1, :] + wy[..., 1:, :] + wx[..., :, :-1] + wx[..., :, 1:]


# -- strain: local plane fits from box sums of moments -------------------------------------


# The strain's steps are written once for both array libraries (``xp``: jax.numpy, or NumPy for small fields,
# where compiling them would cost more than computing: see NUMPY_STRAIN_MAX): the same operations in the same
# order, so the two agree to rounding (tests/core/correlation/test_fields.py runs every strain test on both).


def _window_moments(g: Any, half: int, axis: int, degree: int, xp: Any = jnp) -> tuple[Any, ...]:
    """``sum_{a=-half}^{half} g[i + a] * a**p`` along ``axis`` for ``p = 0 .. degree``, zero outside the array.

    Direct sums of the window's static slices, which XLA fuses into one
    vectorised loop per moment: ``degree + 1`` multiply-adds per sample and
    window offset (the 2D sums are two such passes, never a loop over the
    window's area). Wider windows go through :func:`_runs_pass` instead.
    """
    pad = [(0, 0)] * g.ndim
    pad[axis] = (half, half)
    padded = xp.pad(g, pad)
    length = g.shape[axis]
    axis = axis % g.ndim
    out: list[Any] = [None] * (degree + 1)
    for a in range(-half, half + 1):
        sample = padded[(slice(None),) * axis + (slice(a + half, a + half + length),)]
        for p in range(degree + 1):
            term = sample if p == 0 else sample * float(a**p)
            out[p] = term if out[p] is None else out[p] + term
    return tuple(out)


def _inputs_of(dy: Any, dx: Any, xp: Any = jnp) -> tuple[Any, Any]:
    """The pixels that take part (both values finite) and the stack ``(3, B, M, N)``: their mask, then
    ``u = dx`` and ``v = dy`` minus their mean (a constant changes no slope, and without it the sums
    would lose digits to the field's offset), 0 where left out."""
    valid = xp.isfinite(dy) & xp.isfinite(dx)
    w = valid.astype(dy.dtype)
    count = xp.maximum(xp.sum(w, axis=(-2, -1), keepdims=True), 1)

    def centred(field):
        mean = xp.sum(xp.where(valid, field, 0), axis=(-2, -1), keepdims=True) / count
        return xp.where(valid, field - mean, 0)

    return valid, xp.stack([w, centred(dx), centred(dy)])


_strain_inputs = jax.jit(_inputs_of)


@partial(jax.jit, static_argnames=("half", "axis"))
def _direct_pass(stack: jax.Array, *, half: int, axis: int) -> tuple[jax.Array, ...]:
    """Window moments 0..2 along ``axis`` of every image of a stack, by direct sums, each returned whole."""
    return _window_moments(stack, half, axis, 2)


@partial(jax.jit, static_argnames=("half", "axis"))
def _padded(g: jax.Array, *, half: int, axis: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The run of one sample: ``(g, 0, 0)``, zero-padded by ``half`` at both ends along ``axis``."""
    pad = [(0, 0)] * g.ndim
    pad[axis] = (half, half)
    g = jnp.pad(g, pad)
    return g, jnp.zeros_like(g), jnp.zeros_like(g)


@partial(jax.jit, static_argnames=("width", "axis"))
def _prepend(first: tuple, second: tuple, *, width: int, axis: int) -> tuple:
    """Sums over a run of ``width`` samples followed by the run ``second`` (read ``width`` samples on), as one
    run: each run ``(sum g, sum k g, sum k^2 g)``, ``k`` counted from its start, one value per start."""
    a0, a1, a2 = first
    b0, b1, b2 = (_ahead(b, width, axis) for b in second)
    return a0 + b0, a1 + b1 + width * b0, a2 + b2 + (2 * width) * b1 + (width * width) * b0


@partial(jax.jit, static_argnames=("half", "axis"))
def _centred(run: tuple, *, half: int, axis: int) -> tuple[jax.Array, ...]:
    s0, s1, s2 = (lax.slice_in_dim(x, 0, x.shape[axis] - 2 * half, axis=axis) for x in run)
    return s0, s1 - half * s0, s2 - (2 * half) * s1 + (half * half) * s0


def _ahead(a: jax.Array, shift: int, axis: int) -> jax.Array:
    """``a[p + shift]`` along ``axis`` at every ``p`` (0 past the end): the same shape as ``a``."""
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, shift)
    return lax.slice_in_dim(jnp.pad(a, pad), shift, shift + a.shape[axis], axis=axis)


def _runs_pass(stack: jax.Array, *, half: int, axis: int) -> tuple[jax.Array, ...]:
    """Window moments 0..2 along ``axis`` from runs of 1, 2, 4, ... samples: ``log2`` of the width in steps.

    The run of ``2^k`` samples (the join of two of ``2^(k-1)``) is put in front of what the window
    has so far wherever the width has binary digit ``k``. One compiled step per join (a dozen for
    a 63-wide window), so that each run is materialised once: in one program XLA fused the runs
    into their users and recomputed them there, twice more work per level.
    """
    width = 2 * half + 1
    run = _padded(stack, half=half, axis=axis)
    acc = None
    size = 1
    while size <= width:
        if width & size:
            acc = run if acc is None else _prepend(run, acc, width=size, axis=axis)
        if size * 2 <= width:
            run = _prepend(run, run, width=size, axis=axis)
        size *= 2
    return _centred(acc, half=half, axis=axis)


# Window sizes up to this: direct sums; wider: runs, whose cost grows with log2 of the size. Direct sums were
# faster up to 63 (7 images of 1024^2 along y: 0.26 s at 15, 1.6 s at 63, against 1.6 s and 2.2 s for runs).
DIRECT_WINDOW = 63


def _moments_pass(stack: jax.Array, *, half: int, axis: int) -> tuple[jax.Array, ...]:
    """Window moments 0..2 along ``axis`` of every image of a stack (direct sums, or runs for wide windows)."""
    if 2 * half + 1 <= DIRECT_WINDOW:
        return _direct_pass(stack, half=half, axis=axis)
    return _runs_pass(stack, half=half, axis=axis)


def _fits(valid: Any, along_y: Sequence[Sequence[Any]], spacing: Any, *, kind: str, xp: Any = jnp) -> tuple[Any, ...]:
    """``(exx, eyy, exy)`` from the 2D window sums ``along_y[q][k]``: moment ``q`` along y of input ``k``,
    the inputs being, along x, the mask's moments 0, 1, 2 and each field's moments 0 and 1."""
    m0, m1, m2 = along_y
    s00, s10, s20 = m0[0], m1[0], m2[0]  # s_pq: the sum of w a^p b^q (a the row offset, b the column offset)
    s01, s11, s02 = m0[1], m1[1], m0[2]
    u_sums, v_sums = (m0[3], m1[3], m0[4]), (m0[5], m1[5], m0[6])  # the fields': f00, f10, f01
    n = xp.where(s00 > 0, s00, 1)
    cyy, cxx, cxy = s20 - s10 * s10 / n, s02 - s01 * s01 / n, s11 - s10 * s01 / n  # about the centroid
    det = cyy * cxx - cxy * cxy
    ok = valid & (s00 >= 3) & (det > COLLINEAR * xp.abs(cyy * cxx))
    safe = xp.where(ok, det, 1)

    def gradient(sums):
        f00, f10, f01 = sums
        fy, fx = f10 - s10 * f00 / n, f01 - s01 * f00 / n
        return (cxx * fy - cxy * fx) / safe / spacing[0], (cyy * fx - cxy * fy) / safe / spacing[1]

    uy, ux = gradient(u_sums)  # u = dx: du/dy, du/dx
    vy, vx = gradient(v_sums)  # v = dy: dv/dy, dv/dx
    exx, eyy, exy = _tensor(vy, vx, uy, ux, kind=kind)
    nan = xp.asarray(np.nan, exx.dtype)
    return tuple(xp.where(ok, e, nan) for e in (exx, eyy, exy))


_strain_from_sums = jax.jit(_fits, static_argnames=("kind",))


def _strain_of_gradients(gradients: Any, shape: tuple[int, ...], kind: str, dtype: np.dtype) -> tuple[Any, ...]:
    """:func:`strain_field`'s strains of given gradients: jax.Arrays, or dask arrays for dask gradients."""
    names = ("dy_y", "dy_x", "dx_y", "dx_x")
    if isinstance(gradients, (str, bytes)) or not hasattr(gradients, "__len__") or len(gradients) != 4:
        raise TypeError(f"gradients must be four arrays {names}; got {type(gradients).__name__}")
    parts = []
    for name, g in zip(names, gradients):
        g = validate.as_array(f"gradients' {name}", g)
        validate.check_real(f"gradients' {name}", g)
        if validate.shape_of(g) != shape:
            raise ValueError(f"gradients' {name} must have dy's shape {shape}; got {validate.shape_of(g)}")
        parts.append(g)
    if any(validate.is_dask(g) for g in parts):
        import dask.array as da  # only dask input needs it: dask.array takes 0.5 s to import

        return _tensor(*(da.asarray(g).astype(dtype) for g in parts), kind=kind)
    with precision_scope(dtype):
        return _tensor(*(_as_compute(g, dtype) for g in parts), kind=kind)


def _tensor(vy: Any, vx: Any, uy: Any, ux: Any, *, kind: str) -> tuple[Any, Any, Any]:
    """``(exx, eyy, exy)`` from the displacement gradients (``v = dy``, ``u = dx``); arithmetic only, so NumPy,
    JAX and dask arrays alike."""
    if kind == "small":
        return ux, vy, (uy + vx) / 2
    # Green-Lagrange: E = (F^T F - I) / 2, F = I + grad(u)
    return ux + (ux * ux + vx * vx) / 2, vy + (uy * uy + vy * vy) / 2, (uy + vx + ux * uy + vx * vy) / 2


def _stacked_inputs(x0: Any, x1: Any, x2: Any, xp: Any = jnp) -> Any:
    """The inputs of the pass along y: the mask's moments 0, 1, 2 along x, then ``u``'s and ``v``'s 0 and 1."""
    return xp.stack([x0[0], x1[0], x2[0], x0[1], x1[1], x0[2], x1[2]])


_gather_inputs = jax.jit(_stacked_inputs)


def _numpy_moments(stack: np.ndarray, *, half: int, axis: int) -> tuple[np.ndarray, ...]:
    """:func:`_moments_pass` in NumPy (direct sums: the NumPy path takes windows up to ``DIRECT_WINDOW``)."""
    return _window_moments(stack, half, axis, 2, np)


# (inputs, window moments, the inputs along y, fits): compiled JAX steps, or the same functions in NumPy
_JAX_STEPS = (_strain_inputs, _moments_pass, _gather_inputs, _strain_from_sums)
_NUMPY_STEPS = (partial(_inputs_of, xp=np), _numpy_moments, partial(_stacked_inputs, xp=np), partial(_fits, xp=np))


def _strain(dy, dx, spacing, *, window, kind, numpy=False):
    """``(exx, eyy, exy)`` of ``(B, M, N)`` displacements (already of the compute dtype; NumPy arrays with
    ``numpy``, whose steps are then NumPy's, for small fields).

    Compiled steps: the inputs, the window sums along x (mask and fields stacked), along y (of
    the seven of those the fits use), and the fits. As one program, XLA fused every window sum
    into each of its many users and recomputed it there: a 63-wide window took 16 s on 1024^2,
    10x the time of these steps. (Inside a caller's jit the steps become one program again:
    the same results, slower for wide windows.)
    """
    inputs_of, moments_pass, stacked_inputs, fits = _NUMPY_STEPS if numpy else _JAX_STEPS
    valid, stack = inputs_of(dy, dx)
    x0, x1, x2 = moments_pass(stack, half=window[1] // 2, axis=-1)  # moment q along x of (w, u, v)
    # the mask's moments 0..2 along x, then u's and v's 0 and 1
    along_y = moments_pass(stacked_inputs(x0, x1, x2), half=window[0] // 2, axis=-2)
    return fits(valid, along_y, spacing, kind=kind)


# Fields of at most this many values (times the window's two sides) are fitted in NumPy, where compiling the
# JAX steps (four programs, 0.43 s on a first call; 0.3 to 0.8 s of the DIC widget's first Run) costs more than
# computing: 11-wide window, NumPy 2.9 ms for a 120 x 120 field (the DIC sample's), against 2.2 ms for JAX once
# compiled. Larger fields, or traced ones, go through JAX, whose steady state is then faster by more than a
# few ms a call (256 x 256: NumPy 17 ms against 5.2 ms).
NUMPY_STRAIN_MAX = 128 * 128 * 22


# -- public API -------------------------------------------------------------------------------


def integrate_gradient(
    gy: Any,
    gx: Any,
    *,
    method: str = "least-squares",
    spacing: float | Sequence[float] = 1.0,
    sampling: str = "centred",
    mirror: bool = False,
    dtype: Any = None,
) -> jax.Array:
    """The surface whose gradient is ``(gy, gx)``, with zero mean.

    Parameters
    ----------
    gy, gx
        The surface's derivative along y (axis -2) and along x (axis -1), in
        surface units per unit of ``spacing``: arrays of one shape ``(..., M, N)``
        (leading axes are a batch, each image integrated on its own), bool,
        integer or real float. NaN and infinite values mark unknown slopes (see
        Returns). NumPy, JAX or dask arrays.
    method
        ``"least-squares"`` (default): the surface ``z`` minimising
        ``sum (z[i+1, j] - z[i, j] - ey[i, j])^2 + sum (z[i, j+1] - z[i, j] - ex[i, j])^2``
        over all pairs of neighbouring pixels (no periodicity assumed: the
        Neumann boundary conditions of that sum), solved exactly by a discrete
        cosine transform (Simchony et al. 1990). ``"frankot-chellappa"``: the
        least-squares projection onto periodic surfaces in Fourier space
        (spectral derivatives ``i k``, Frankot and Chellappa 1988): exact for
        periodic band-limited surfaces, wrong near the borders of others
        unless ``mirror``.
    spacing
        The pixel spacing ``(sy, sx)`` (or one number for both) in the unit
        the gradients are per; default 1 (gradients per pixel).
    sampling
        Least squares only: where the gradients were sampled. ``"centred"``
        (default): at the pixel centres, as displacement fields are; the slope
        between two neighbours is then the mean of their two values
        (``ey[i] = (gy[i] + gy[i+1]) / 2``, the trapezoid rule), exact for
        quadratic surfaces and second-order accurate for smooth ones.
        ``"forward"``: ``gy[i, j]`` is ``z[i+1, j] - z[i, j]`` (and ``gx`` likewise),
        the last row of ``gy`` and column of ``gx`` unused: the solution is
        then exact for these forward differences, whatever the surface.
    mirror
        Frankot-Chellappa only: integrate the field mirrored evenly across its
        borders (4x the work), so that a non-periodic surface is not forced to
        be periodic.
    dtype
        ``float32`` (default) or ``float64`` (JAX's x64 switch enabled for this
        call only).

    Returns
    -------
    jax.Array, or dask.array.Array for dask inputs
        ``z`` of shape ``(..., M, N)``, ``dtype``, in surface units, mean 0 over
        each image. Unknown slopes (NaN or infinite values; with least squares
        and ``centred`` sampling, every pair of neighbours with either value
        unknown) take no part in the fit, and the surface is filled across
        them: of all the surfaces that fit the known slopes best, the one whose
        slopes at the unknown places have the least sum of squares, which inside
        a hole is the membrane (harmonic) interpolation of the hole's rim. It
        is found by conjugate gradients on the unknown slopes (at most
        1000 iterations, to a relative residual of 1e-5 in float32, 1e-11 in
        float64); no NaN reaches the output, except where an image has no
        known slope at all (all NaN). A dask input gives a lazy dask array,
        one task per image (each image whole in memory).

    Raises
    ------
    ValueError
        If the shapes differ, have fewer than 2 axes or a zero-length axis,
        a dtype is not real, ``method`` or ``sampling`` is not one of the
        choices, ``sampling="forward"`` or ``mirror`` goes with the other
        method, or ``spacing`` is not positive.
    TypeError
        If ``mirror`` is not a bool or ``spacing`` not a number.

    References
    ----------
    R. T. Frankot and R. Chellappa, "A method for enforcing integrability in
    shape from shading algorithms", IEEE Trans. PAMI 10(4), 439-451 (1988).
    T. Simchony, R. Chellappa and M. Shao, "Direct analytical methods for
    solving Poisson equations in computer vision problems", IEEE Trans. PAMI
    12(5), 435-446 (1990).

    Examples
    --------
    >>> import numpy as np
    >>> y, x = np.mgrid[:64, :80] / 10.0
    >>> z = y**2 - 0.5 * x * y + x
    >>> out = integrate_gradient(2 * y - 0.5 * x, 1 - 0.5 * y, spacing=0.1, dtype=np.float64)
    >>> bool(np.allclose(out, z - z.mean()))
    True
    """
    gy, gx = validate.as_array("gy", gy), validate.as_array("gx", gx)
    _check_pair(("gy", "gx"), gy, gx)
    method = validate.check_choice("method", method, INTEGRATION_METHODS)
    sampling = validate.check_choice("sampling", sampling, SAMPLINGS)
    mirror = validate.check_bool("mirror", mirror)
    spacing = _positive_pair("spacing", spacing)
    if method == "frankot-chellappa" and sampling != "centred":
        raise ValueError('sampling="forward" is a least-squares discretisation; Frankot-Chellappa samples at pixels')
    if method == "least-squares" and mirror:
        raise ValueError("mirror is a Frankot-Chellappa option: least squares never assumes periodicity")
    dtype = compute_dtype(dtype)
    kernel = partial(_integrated, dtype=dtype, method=method, sampling=sampling, mirror=mirror, spacing=spacing)
    if validate.is_dask(gy) or validate.is_dask(gx):
        from napari_gridmip.core.correlation import _chunked  # the dask twin: dask.array takes 0.5 s to import

        return _chunked.integrate_gradient(gy, gx, dtype, kernel)
    return kernel(gy, gx)


def _integrated(gy, gx, *, dtype, spacing, **options) -> jax.Array:
    """:func:`integrate_gradient`'s in-memory kernel, for arguments already checked (the dask twin runs it on
    every block)."""
    shape = validate.shape_of(gy)
    with precision_scope(dtype):
        gy, gx = _flat(_as_compute(gy, dtype)), _flat(_as_compute(gx, dtype))
        spacing = jnp.asarray(spacing, dtype)
        return _integrate(gy, gx, spacing, holes=_any_unknown(gy, gx), **options).reshape(shape)


def phase_from_displacement(
    dy: Any,
    dx: Any,
    *,
    pixel_size: float,
    distance: float,
    wavelength: float,
    magnification: float = 1.0,
    method: str = "least-squares",
    mirror: bool = False,
    dtype: Any = None,
) -> jax.Array:
    """X-ray speckle tracking: the phase shift (radians) of the sample from the speckle displacement.

    The speckle pattern seen through the sample is displaced by the refraction
    angle times the propagation distance. With the displacement ``(dy, dx)`` in
    detector pixels, the refraction angle is ``alpha = d * pixel_size / distance``,
    the phase gradient in the sample plane is ``grad(phi) = (2 pi / wavelength) * alpha``,
    and the phase is that gradient integrated over the sample plane's pixel
    ``pixel_size / magnification``::

        phi = 2 pi pixel_size**2 / (wavelength * distance * magnification) * integrate_gradient(dy, dx)

    Parameters
    ----------
    dy, dx
        The speckle displacement in detector pixels, ``(..., M, N)``, as
        :func:`~napari_gridmip.find_displacement` returns it with the sample
        stack as img1 and the reference (no sample) stack as img2:
        ``sample[y + dy, x + dx]`` matches ``reference[y, x]``. NaN (peaks on the
        window's edge) is filled as :func:`integrate_gradient` says. Swapping
        img1 and img2 flips the sign of the phase.
    pixel_size
        The detector's pixel size.
    distance
        The propagation distance from the sample to the detector (same unit as
        ``pixel_size`` and ``wavelength``).
    wavelength
        The X-ray wavelength (12.398 / E[keV] angstrom).
    magnification
        The geometric magnification of a cone beam, ``(z1 + z2) / z1``; 1
        (default) for a parallel beam. ``distance`` is then the sample-detector
        distance ``z2``.
    method, mirror, dtype
        As for :func:`integrate_gradient`.

    Returns
    -------
    jax.Array, or dask.array.Array for dask inputs
        ``phi``, radians, ``(..., M, N)``, mean 0 over each image (speckle
        tracking measures the phase up to a constant), with the sign
        convention of a wave ``exp(i (k z + phi))``: the beam, and the speckle,
        is deflected towards increasing ``phi``. For X-rays (refractive index
        ``1 - delta``), ``phi = -k * integral(delta dz)`` plus a constant.

    Raises
    ------
    ValueError
        As for :func:`integrate_gradient`, and if a length is not positive.
    TypeError
        If a length is not a number.

    References
    ----------
    S. Berujon, H. Wang and K. Sawhney, "X-ray multimodal imaging using a
    random-phase object", Phys. Rev. A 86, 063813 (2012).
    I. Zanette, T. Zhou, A. Burvall et al., "Speckle-based X-ray phase-contrast
    and dark-field imaging with a laboratory source", Phys. Rev. Lett. 112,
    253903 (2014).
    M.-C. Zdora, P. Thibault, T. Zhou et al., "X-ray phase-contrast imaging
    and metrology through unified modulated pattern analysis", Phys. Rev. Lett.
    118, 203903 (2017); M.-C. Zdora, "State of the art of X-ray speckle-based
    phase-contrast and dark-field imaging", J. Imaging 4(5), 60 (2018).
    """
    pixel_size = _positive("pixel_size", pixel_size)
    distance = _positive("distance", distance)
    wavelength = _positive("wavelength", wavelength)
    magnification = _positive("magnification", magnification)
    surface = integrate_gradient(dy, dx, method=method, mirror=mirror, dtype=dtype)
    scale = 2 * math.pi * pixel_size**2 / (wavelength * distance * magnification)
    if validate.is_dask(surface):
        return surface * np.asarray(scale, surface.dtype)
    with precision_scope(surface.dtype):
        return surface * jnp.asarray(scale, surface.dtype)


def strain_field(
    dy: Any,
    dx: Any,
    *,
    window: int | Sequence[int] = 11,
    kind: str = "small",
    spacing: float | Sequence[float] = 1.0,
    gradients: Sequence[Any] | None = None,
    dtype: Any = None,
) -> Strain:
    """Strains of a displacement field from local least-squares plane fits (DIC's virtual strain gauge).

    Around each pixel, ``u = dx`` and ``v = dy`` are each fitted by a plane
    ``c + a y + b x`` over the window's pixels (as ncorr does over its strain
    radius); the planes' slopes are the displacement gradients. The fit uses
    the part of the window inside the image and leaves out NaN pixels, so
    values are valid up to the borders. The sums the fits need (of the
    pixels' offsets, their squares and products, and of ``u`` and ``v`` times
    1, y and x) are separable box sums of moments: the cost per pixel grows
    with the window's side, not its area.

    Parameters
    ----------
    dy, dx
        The displacement along y (axis -2) and x (axis -1), ``(..., M, N)``, in
        the unit of ``spacing`` (pixels by default), e.g. from
        :func:`~napari_gridmip.find_displacement`. NaN or infinite values (in
        either) leave that pixel out of every fit.
    window
        The strain window, odd sizes ``(wy, wx)`` of at least 3 (one number for
        both); default 11 (ncorr's strain radius 5). Larger windows average
        more noise away and blur strain gradients.
    kind
        ``"small"`` (default): the infinitesimal strain
        ``exx = du/dx, eyy = dv/dy, exy = (du/dy + dv/dx) / 2``.
        ``"green-lagrange"``: ``E = (F^T F - I) / 2`` with ``F = I + grad(u, v)``:
        ``exx = du/dx + ((du/dx)^2 + (dv/dx)^2) / 2``,
        ``eyy = dv/dy + ((du/dy)^2 + (dv/dy)^2) / 2``,
        ``exy = (du/dy + dv/dx + du/dx du/dy + dv/dx dv/dy) / 2``, in the
        reference image's coordinates (find_displacement's field is Lagrangian).
    spacing
        The grid step ``(sy, sx)`` of the displacement's samples (or one number
        for both), in the displacement's unit; default 1.
    gradients
        The displacement gradients ``(d dy / dy, d dy / dx, d dx / dy, d dx / dx)`` of every sample, four
        arrays of ``dy``'s shape, e.g. ``find_displacement(..., shape="affine")``'s ``dy_y, dy_x, dx_y,
        dx_x``: the strains are then theirs, with no plane fit and no second differentiation (``window``
        and ``spacing`` are not used; NaN stays NaN).
    dtype
        ``float32`` (default) or ``float64``.

    Returns
    -------
    Strain
        A named tuple ``(exx, eyy, exy)`` of jax.Arrays (dask arrays for dask
        inputs, lazy, computed in blocks with the half-window as a halo), each
        ``(..., M, N)``, ``dtype``, dimensionless. ``exy`` is the tensor
        component (half the engineering shear ``gamma_xy``). NaN where the
        pixel's own displacement is NaN, or where the window's valid pixels
        are fewer than 3 or lie on one line. A plane fit is exact for a linear
        displacement everywhere, and for a quadratic one wherever the window
        is whole and free of NaN (its symmetry cancels the quadratic terms); at
        the borders a quadratic's gradient is off by its curvature times the
        window's off-centre shift.

    Raises
    ------
    ValueError
        If the shapes differ, have fewer than 2 axes or a zero-length axis, a
        dtype is not real, ``window`` is not odd and at least 3, ``kind`` is
        not one of the choices, or ``spacing`` is not positive.

    References
    ----------
    J. Blaber, B. Adair and A. Antoniou, "Ncorr: open-source 2D digital image
    correlation Matlab software", Exp. Mech. 55, 1105-1122 (2015).
    B. Pan, H. Xie, Z. Guo and T. Hua, "Full-field strain measurement using a
    two-dimensional Savitzky-Golay digital differentiator in digital image
    correlation", Opt. Eng. 46(3), 033601 (2007).
    """
    dy, dx = validate.as_array("dy", dy), validate.as_array("dx", dx)
    shape = _check_pair(("dy", "dx"), dy, dx)
    window = validate.int_tuple("window", window, 2, minimum=3)
    if any(w % 2 == 0 for w in window):
        raise ValueError(f"window sizes must be odd; got {window}")
    kind = validate.check_choice("kind", kind, STRAIN_KINDS)
    spacing = _positive_pair("spacing", spacing)
    dtype = compute_dtype(dtype)
    if gradients is not None:
        return Strain(*_strain_of_gradients(gradients, shape, kind, dtype))
    kernel = partial(_strained, dtype=dtype, window=window, kind=kind, spacing=spacing)
    if validate.is_dask(dy) or validate.is_dask(dx):
        from napari_gridmip.core.correlation import _chunked  # the dask twin: dask.array takes 0.5 s to import

        return Strain(*_chunked.strain_field(dy, dx, window, dtype, kernel))
    return kernel(dy, dx)


def _strained(dy, dx, *, dtype, spacing, window, kind) -> Strain:
    """:func:`strain_field`'s in-memory kernel (the plane fits), for arguments already checked (the dask twin
    runs it on every block)."""
    shape = validate.shape_of(dy)
    # NumPy for small fields on the host or the CPU backend (an accelerator's array stays there: the round trip and
    # NumPy's speed there would cost more than the one compile)
    on_device = any(isinstance(a, jax.Array) for a in (dy, dx)) and not strategy.on_cpu()
    traced = isinstance(dy, jax.core.Tracer) or isinstance(dx, jax.core.Tracer)
    small = math.prod(shape) * (window[0] + window[1]) <= NUMPY_STRAIN_MAX and max(window) <= DIRECT_WINDOW
    if small and not traced and not on_device:
        # small: NumPy, in the compute dtype, handed back as device arrays (device_put compiles nothing)
        flat = [np.asarray(a, dtype=dtype).reshape((-1,) + tuple(shape[-2:])) for a in (dy, dx)]
        with np.errstate(invalid="ignore", divide="ignore"):
            parts = _strain(*flat, np.asarray(spacing, dtype), window=window, kind=kind, numpy=True)
        with precision_scope(dtype):
            return Strain(*(jax.device_put(np.ascontiguousarray(p.reshape(shape), dtype=dtype)) for p in parts))
    with precision_scope(dtype):
        spacing = jnp.asarray(spacing, dtype)
        parts = _strain(_flat(_as_compute(dy, dtype)), _flat(_as_compute(dx, dtype)), spacing, window=window, kind=kind)
        return Strain(*(p.reshape(shape) for p in parts))
