"""The JAX kernels of digital volume correlation (:mod:`.volumes`): the volumes' spline coefficients and gradients,
the coarse integer search of each point, and the 12-parameter inverse-compositional Gauss-Newton (IC-GN) step.

Every kernel takes a fixed-size chunk of points, so that a whole run compiles one program per kernel and family of
shapes (volume, subset, chunk) whatever the number of points, and the host runs only the points still going.

The warp of a point whose reference subset voxel sits at offset ``o = (zeta, eta, xi)`` from the point is
``o -> o + t + G o`` in the deformed volume: ``t = (w, v, u)`` the displacement ``(dz, dy, dx)`` and ``G`` its
gradient ``d(dz, dy, dx) / d(z, y, x)``; the parameters are ``p = (w, w_z, w_y, w_x, v, v_z, v_y, v_x, u, u_z,
u_y, u_x)``. IC-GN (Pan et al. 2013) linearises the zero-normalised SSD about the reference subset: the
steepest-descent images ``grad f . dW/dp`` and the Hessian are the reference's (computed once per point), and each
step only interpolates the deformed volume (tricubic B-spline), solves for the increment and composes the warp with
the increment's inverse.

References
----------
B. Pan, K. Li, W. Tong, "Fast, robust and accurate digital image correlation calculation without redundant
computations", Exp. Mech. 53, 1277-1289 (2013).
M. Unser, "Splines: a perfect fit for signal and image processing", IEEE Signal Process. Mag. 16(6), 22-38 (1999)
(the cubic B-spline and its prefilter).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.linalg import cho_solve

from napari_gridmip.core.correlation import warp
from napari_gridmip.core.correlation.prefilter import fir_along, radius, taps
from napari_gridmip.core.runtime.precision import HIGHEST

POLE = math.sqrt(3) - 2  # the cubic B-spline prefilter's pole
# taps each side of the prefilter's impulse response: the first left out weighs |POLE|**13 = 3.8e-8 of the centre's
# (under float32's resolution), |POLE|**29 = 3e-17 for float64
PREFILTER_REACH = {np.dtype(np.float32): 12, np.dtype(np.float64): 28}
PARAMETERS = 12
TRANSLATION = np.array([0, 4, 8], np.int32)  # where w, v, u sit in the parameters
CORNER_WEIGHTS = np.array([0, 1, 1, 1] * 3, np.float64)  # 1 on the gradient's parameters
_PRODUCTS = [(a, b) for a in range(3) for b in range(a, 3)]  # the gradient's component pairs
_MONOMIALS = [(i, j) for i in range(4) for j in range(i, 4)]  # the pairs of (1, zeta, eta, xi)


def _hessian_index() -> np.ndarray:
    """Where each entry of the 12 x 12 Hessian sits among the ``(6, 10)`` moments: flat indices ``(144,)``."""
    index = np.zeros((PARAMETERS, PARAMETERS), np.int64)
    for row in range(PARAMETERS):
        for col in range(PARAMETERS):
            a, i = divmod(row, 4)
            b, j = divmod(col, 4)
            product = _PRODUCTS.index((min(a, b), max(a, b)))
            monomial = _MONOMIALS.index((min(i, j), max(i, j)))
            index[row, col] = product * len(_MONOMIALS) + monomial
    return index.ravel().astype(np.int32)  # int32 as the other indices, under 64-bit types too


_HESSIAN_INDEX = _hessian_index()


# -- the volumes -------------------------------------------------------------------------------------------------


def _spline_axis(x: jax.Array, axis: int) -> jax.Array:
    """The cubic B-spline prefilter of ``x`` along ``axis``, ``x`` extended by its edge values: the coefficients
    ``c`` whose ``(1, 4, 1) / 6`` sum is ``x``. Its impulse response ``sqrt(3) POLE**|k|`` (Unser 1999) cut where it
    falls under the dtype's resolution (``PREFILTER_REACH``): one fused pass of slices, which ran 0.44 s at 200^3 on
    2 cores where the recursive filter's scans ran 0.57 s and compiled in half as long again."""
    reach = PREFILTER_REACH[np.dtype(x.dtype)]
    weights = [math.sqrt(3) * POLE ** abs(k) for k in range(-reach, reach + 1)]
    return fir_along(x, weights, axis, mode="edge")


def _gaussian_axis(x: jax.Array, weights: np.ndarray, axis: int) -> jax.Array:
    return fir_along(x, weights, axis, mode="symmetric")  # scipy.ndimage's "reflect"


def smooth(volume: jax.Array, sigma: float) -> jax.Array:
    """``volume`` smoothed by a Gaussian of ``sigma`` voxels along each axis (as ``scipy.ndimage.gaussian_filter``,
    borders mirrored); unchanged for ``sigma`` 0."""
    if sigma <= 0:
        return volume
    weights = taps(sigma)
    for axis in range(3):
        if volume.shape[axis] > radius(sigma):
            volume = _gaussian_axis(volume, weights, axis)
    return volume


def prepared_volumes(reference: jax.Array, deformed: jax.Array, *, sigma: float) -> tuple[jax.Array, ...]:
    """What the IC-GN reads, from both (float) volumes, after the Gaussian prefilter of ``sigma`` voxels:
    the deformed volume's spline coefficients edge-padded by 2 ``(Z + 4, Y + 4, X + 4)``, and the reference's
    values and spline gradient at the voxels ``(4, Z, Y, X)`` (value, d/dz, d/dy, d/dx).

    The gradient along an axis at the knots needs the prefilter along that axis only: the spline's ``(1, 4, 1) / 6``
    sum along the other two undoes their prefilter. Two programs, one a volume: one program held both volumes'
    passes at once (at 512 x 512 planes, 1.9 GB against the outputs' 0.56 GB a slab of 114 planes)."""
    return _coefficients(deformed, sigma=sigma), _reference_gradient(reference, sigma=sigma)


@partial(jax.jit, static_argnames=("sigma",))
def _coefficients(deformed: jax.Array, *, sigma: float) -> jax.Array:
    coefficients = jnp.pad(smooth(deformed, sigma), 2, mode="edge")
    for axis in range(3):
        coefficients = _spline_axis(coefficients, axis)
    return coefficients


@partial(jax.jit, static_argnames=("sigma",))
def _reference_gradient(reference: jax.Array, *, sigma: float) -> jax.Array:
    reference = smooth(reference, sigma)
    out = [reference]
    for axis in range(3):
        widths = [(0, 0)] * 3
        widths[axis] = (1, 1)
        along = _spline_axis(jnp.pad(reference, widths, mode="edge"), axis)
        size = reference.shape[axis]
        out.append((lax.slice_in_dim(along, 2, size + 2, axis=axis) - lax.slice_in_dim(along, 0, size, axis=axis)) / 2)
    return jnp.stack(out)


@jax.jit
def binned(volume: jax.Array) -> jax.Array:
    """The mean of each 2 x 2 x 2 block (odd sizes lose their last plane): the coarse level of the search."""
    z, y, x = (n // 2 for n in volume.shape)
    v = volume[: 2 * z, : 2 * y, : 2 * x].reshape(z, 2, y, 2, x, 2)
    return v.mean(axis=(1, 3, 5))


# -- tricubic interpolation ----------------------------------------------------------------------------------------


def interpolate(coefficients: jax.Array, pz: jax.Array, py: jax.Array, px: jax.Array) -> jax.Array:
    """The tricubic spline through ``coefficients`` ``(Z + 4, Y + 4, X + 4)`` (edge-padded by 2) at the voxel
    positions ``(pz, py, px)`` (any shape, each clipped to the volume): the 64 coefficients around each position,
    weighted by the product of the three axes' weights."""
    depth, rows, cols = coefficients.shape
    # clipped (a NaN to 0): every tap is then inside the padded coefficients, and the gathers skip their own clamp
    pz, py, px = (jnp.clip(jnp.where(jnp.isfinite(q), q, 0), 0, n - 5) for q, n in ((pz, depth), (py, rows),
                                                                                     (px, cols)))  # fmt: skip
    z0, y0, x0 = jnp.floor(pz), jnp.floor(py), jnp.floor(px)
    wz, wy, wx = (warp.spline_weights(t) for t in (pz - z0, py - y0, px - x0))
    # tap (-1, -1, -1) sits at padded (z0 + 1, y0 + 1, x0 + 1)
    base = ((z0.astype(jnp.int32) + 1) * rows + y0.astype(jnp.int32) + 1) * cols + x0.astype(jnp.int32) + 1
    flat = coefficients.ravel()
    out = 0
    for a in range(4):
        plane = 0
        for b in range(4):
            row = 0
            for c in range(4):
                row = row + wx[c] * flat.at[base + ((a * rows + b) * cols + c)].get(mode="promise_in_bounds")
            plane = plane + wy[b] * row
        out = out + wz[a] * plane
    return out


# -- the points' subsets -----------------------------------------------------------------------------------------


def offsets(half: int, dtype) -> jax.Array:
    """The subset's voxel offsets from its centre ``(3, S)`` (z, y, x), z slowest."""
    r = jnp.arange(-half, half + 1, dtype=dtype)
    return jnp.stack([a.ravel() for a in jnp.meshgrid(r, r, r, indexing="ij")])


def _subsets(volumes: jax.Array, corner: jax.Array, size: int) -> jax.Array:
    """The ``size``-cube of each of ``volumes`` ``(V, Z, Y, X)`` from each corner ``(n, 3)`` (int32, inside):
    ``(n, V, size**3)``."""
    count = volumes.shape[0]

    def one(c):
        return lax.dynamic_slice(volumes, (jnp.zeros_like(c[0]), c[0], c[1], c[2]), (count, size, size, size))

    return jax.vmap(one)(corner).reshape(corner.shape[0], count, size**3)


def _masked_centre(f: jax.Array, m: jax.Array, count: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(f - mean) m`` over the used voxels ``m`` and its norm."""
    mean = jnp.sum(m * f, 1, keepdims=True) / count[:, None]
    centred = (f - mean) * m
    return centred, jnp.sqrt(jnp.sum(centred * centred, 1))


@partial(jax.jit, static_argnames=("half", "affine"))
def prepare(reference: jax.Array, mask: jax.Array, centre: jax.Array, *, half: int, affine: bool):
    """Each point's Hessian, once: ``(inverse Hessian (n, 12, 12), used voxels (n,), reference norm (n,))``.

    ``reference`` ``(4, Z, Y, X)`` (:func:`prepared_volumes`), ``mask`` ``(Z, Y, X)`` (1: a voxel the subsets may
    use), ``centre`` ``(n, 3)`` int32 (every subset inside). With ``affine`` False only the translation's block is
    inverted (the gradient's increments are then 0). Singular Hessians (no texture) give non-finite inverses."""
    size = 2 * half + 1
    dtype = reference.dtype
    data = _subsets(reference, centre - half, size)  # each volume sliced apart: joined, they were copied whole
    f, grads, m = data[:, 0], data[:, 1:4], _subsets(mask[None].astype(dtype), centre - half, size)[:, 0]
    count = jnp.sum(m, 1)
    _, norm = _masked_centre(f, m, jnp.maximum(count, 1))
    # H = sum over the voxels of (grad_a f grad_b f) (o_i o_j), o = (1, zeta, eta, xi): the 6 products of the
    # gradient's components against the 10 of the offsets, one matrix product (where J'J, 12 x 12 x S a point,
    # cost twice as much)
    offset = offsets(half, dtype)
    basis = jnp.concatenate([jnp.ones((1, size**3), dtype), offset])  # (4, S)
    monomials = jnp.stack([basis[i] * basis[j] for i, j in _MONOMIALS])  # (10, S)
    products = jnp.stack([grads[:, a] * grads[:, b] * m for a, b in _PRODUCTS], 1)  # (n, 6, S)
    moments = jnp.einsum("nps,ks->npk", products, monomials, precision=HIGHEST).reshape(-1, 60)
    hessian = moments[:, _HESSIAN_INDEX].reshape(-1, PARAMETERS, PARAMETERS)
    if not affine:
        hessian = hessian[:, TRANSLATION][:, :, TRANSLATION]
    # a Hessian that is not positive definite (flat or clipped subsets) has no Cholesky factor: NaN, not run
    factor = jnp.linalg.cholesky(hessian)
    eye = jnp.broadcast_to(jnp.eye(hessian.shape[-1], dtype=dtype), hessian.shape)
    inverse = cho_solve((factor, True), eye)
    inverse = jnp.where(jnp.all(jnp.isfinite(factor), (1, 2))[:, None, None], inverse, jnp.nan)
    if not affine:
        inverse = (
            jnp.zeros((inverse.shape[0], PARAMETERS, PARAMETERS), dtype)
            .at[:, TRANSLATION[:, None], TRANSLATION]
            .set(inverse)
        )
    return inverse, count, norm


def compose(p: jax.Array, dp: jax.Array) -> jax.Array:
    """The warp ``W(p) o W(dp)^-1`` ``(n, 12)``: ``A(p) A(dp)^-1`` and ``t(p) - A(p) A(dp)^-1 t(dp)``, its gradient
    part formed as ``(A(p) - A(dp)) A(dp)^-1`` (no ``1 + small - 1`` rounding)."""
    grad_p = jnp.stack([p[:, 1:4], p[:, 5:8], p[:, 9:12]], 1)  # (n, 3, 3)
    grad_d = jnp.stack([dp[:, 1:4], dp[:, 5:8], dp[:, 9:12]], 1)
    t_p, t_d = p[:, TRANSLATION], dp[:, TRANSLATION]
    a = grad_d + jnp.eye(3, dtype=p.dtype)
    # the inverse of A(dp) by its adjugate (a batched LAPACK call per chunk would cost more than the rest)
    cof = jnp.stack(
        [
            jnp.stack([a[:, 1, 1] * a[:, 2, 2] - a[:, 1, 2] * a[:, 2, 1],
                       a[:, 0, 2] * a[:, 2, 1] - a[:, 0, 1] * a[:, 2, 2],
                       a[:, 0, 1] * a[:, 1, 2] - a[:, 0, 2] * a[:, 1, 1]], -1),
            jnp.stack([a[:, 1, 2] * a[:, 2, 0] - a[:, 1, 0] * a[:, 2, 2],
                       a[:, 0, 0] * a[:, 2, 2] - a[:, 0, 2] * a[:, 2, 0],
                       a[:, 0, 2] * a[:, 1, 0] - a[:, 0, 0] * a[:, 1, 2]], -1),
            jnp.stack([a[:, 1, 0] * a[:, 2, 1] - a[:, 1, 1] * a[:, 2, 0],
                       a[:, 0, 1] * a[:, 2, 0] - a[:, 0, 0] * a[:, 2, 1],
                       a[:, 0, 0] * a[:, 1, 1] - a[:, 0, 1] * a[:, 1, 0]], -1),
        ],
        1,
    )  # fmt: skip
    det = jnp.sum(a[:, 0] * cof[:, :, 0], -1)
    inverse = cof / det[:, None, None]
    grad = jnp.einsum("nij,njk->nik", grad_p - grad_d, inverse, precision=HIGHEST)
    shift = t_p - jnp.einsum("nij,nj->ni", grad + jnp.eye(3, dtype=p.dtype), t_d, precision=HIGHEST)
    return jnp.concatenate([shift[:, :1], grad[:, 0], shift[:, 1:2], grad[:, 1], shift[:, 2:], grad[:, 2]], 1)


def warped(centre: jax.Array, p: jax.Array, offset: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The deformed-volume positions ``(n, S)`` each of z, y, x of the subsets' voxels under the warps ``p``."""
    out = []
    for axis in range(3):
        q = p[:, 4 * axis : 4 * axis + 4]
        out.append(centre[:, axis : axis + 1] + offset[axis] + q[:, :1] + q[:, 1:2] * offset[0]
                   + q[:, 2:3] * offset[1] + q[:, 3:4] * offset[2])  # fmt: skip
    return tuple(out)


@partial(jax.jit, static_argnames=("half", "masked"))
def step(coefficients, reference, mask, centre, p, inverse, band, bounds=None, *, half, masked=True):
    """One IC-GN step of a chunk of points from their warps ``p`` ``(n, 12)``.

    ``coefficients``, ``reference`` as :func:`prepared_volumes` makes them, ``mask`` as :func:`prepare` takes it,
    ``centre`` ``(n, 3)`` int32, ``inverse`` the inverse Hessians :func:`prepare` gives. ``band`` (voxels, a
    scalar): the deformed volume's border band whose values the prefilter made from mirrored ones; a voxel warped
    into it does not count in this step, one in the voxel before it counts in part (the fixed point is then the
    criterion's over the voxels that do: the Hessian only sets the pace); -1: none. Returns the composed warp
    ``(n, 12)``, how far the increment moves the subset's corner (voxels), and at ``p``: the ZNCC, the residual's
    variance per voxel (in the reference's units, for the predicted sigma) and whether every used voxel's position
    lies inside the volume (within half a voxel of its border voxels). With ``masked`` False (no ROI, no band)
    neither ``mask`` nor ``band`` is read: every voxel counts. ``bounds`` ``(2, 3)``: the volume's first and last
    voxel along each axis in the frame of these arrays, where they hold a slab of it (the view and the band are the
    whole volume's); None: the arrays' own."""
    size = 2 * half + 1
    dtype = reference.dtype
    offset = offsets(half, dtype)
    data = _subsets(reference, centre - half, size)  # each volume sliced apart: joined, they were copied whole
    f, grads = data[:, 0], data[:, 1:4]
    m = _subsets(mask[None].astype(dtype), centre - half, size)[:, 0] if masked else jnp.ones((), dtype)
    if bounds is None:
        pz, py, px = warped(centre.astype(dtype), p, offset)
        first, last = [0.0] * 3, [n - 5 for n in coefficients.shape]  # the volume's first and last voxel index
    else:
        first, last = [bounds[0, a].astype(dtype) for a in range(3)], [bounds[1, a].astype(dtype) for a in range(3)]
        # the positions in the whole volume's frame, then moved (exactly: an integer off a float no smaller) into
        # the slab's, so that a slab rounds them as the whole volume does
        pz, py, px = warped(centre.astype(dtype) - jnp.stack(first), p, offset)
        pz, py, px = pz + first[0], py + first[1], px + first[2]
    inside = [(q >= start - 0.5) & (q <= end + 0.5) for q, start, end in zip((pz, py, px), first, last)]
    view = jnp.all((inside[0] & inside[1] & inside[2]) | (m == 0), 1)
    if masked:
        # a voxel's weight ramps from 0 to 1 over the voxel before the band's edge: a criterion that moves
        # continuously with the warp (a voxel that jumps in and out stalls the steps)
        for q, start, end in zip((pz, py, px), first, last):
            m = m * jnp.clip(jnp.minimum(q - start - band, end - band - q) + 1, 0, 1)
        count = jnp.maximum(jnp.sum(m, 1), 1)
    else:
        count = jnp.full(f.shape[:1], float(size**3), dtype)
    fc, df = _masked_centre(f, m, count)
    g = interpolate(coefficients, pz, py, px)
    gc, dg = _masked_centre(g, m, count)
    r = fc - (df / jnp.where(dg > 0, dg, 1))[:, None] * gc
    basis = jnp.concatenate([jnp.ones((1, size**3), dtype), offset])  # (4, S)
    # J' r without J: each gradient component times the residual, summed against 1, zeta, eta, xi
    b = jnp.einsum("nas,ks->nak", grads * r[:, None], basis, precision=HIGHEST).reshape(-1, PARAMETERS)
    dp = -jnp.einsum("nij,nj->ni", inverse, b, precision=HIGHEST)
    new = compose(p, dp)
    # the increment's largest move of a subset corner along any axis: its translation there plus its gradient
    # part's row times the half-width
    weights = jnp.asarray(CORNER_WEIGHTS * half + (CORNER_WEIGHTS == 0), dtype)
    moved = jnp.max(jnp.sum((jnp.abs(dp) * weights).reshape(-1, 3, 4), 2), 1)
    zncc = jnp.sum(fc * gc, 1) / (df * dg)
    variance = jnp.sum(r * r, 1) / jnp.maximum(count - PARAMETERS, 1)
    return new, moved, zncc, variance, view


# -- the coarse integer search -----------------------------------------------------------------------------------


@partial(jax.jit, static_argnames=("half", "reach", "masked"))
def search(reference: jax.Array, deformed: jax.Array, mask: jax.Array, ref_corner: jax.Array, window_corner: jax.Array,
           *, half: int, reach: int, masked: bool) -> jax.Array:  # fmt: skip
    """The ZNCC of each point's reference subset (``2 half + 1`` cubed from ``ref_corner`` ``(n, 3)``) with the
    deformed volume at every integer shift of a ``2 reach + 1`` cube: ``(n, (2 reach + 1)**3)``, shift ``k`` of the
    window from ``window_corner`` (the window ``2 (half + reach) + 1`` cubed; both corners inside the volumes).
    With ``masked``, only the subset's voxels where ``mask`` (the reference's shape, 1 inside) is 1 count (masked
    normalised correlation); else ``mask`` is not read. ``deformed`` holds NaN outside the volume: a shift whose
    used voxels read one is ``-inf``; a shift with no variance (no texture) is 0. Both volumes are expected
    standardised (the sums of squares are formed in the compute dtype)."""
    size, shifts = 2 * half + 1, 2 * reach + 1
    width = size + 2 * reach
    f = jax.vmap(lambda c: lax.dynamic_slice(reference, (c[0], c[1], c[2]), (size,) * 3))(ref_corner)
    w = jax.vmap(lambda c: lax.dynamic_slice(deformed, (c[0], c[1], c[2]), (width,) * 3))(window_corner)
    if masked:
        m = jax.vmap(lambda c: lax.dynamic_slice(mask, (c[0], c[1], c[2]), (size,) * 3))(ref_corner)
    else:
        m = jnp.ones_like(f)
    count = jnp.maximum(jnp.sum(m, (1, 2, 3)), 1)
    fc = (f - (jnp.sum(m * f, (1, 2, 3)) / count)[:, None, None, None]) * m
    norm = jnp.sqrt(jnp.sum(fc * fc, (1, 2, 3)))
    bad = (~jnp.isfinite(w)).astype(w.dtype)
    w = jnp.where(bad > 0, 0, w)
    n = w.shape[0]

    def window(v, k):
        a, b, c = k // (shifts * shifts), (k // shifts) % shifts, k % shifts
        zero = jnp.zeros_like(a)
        return lax.dynamic_slice(v, (zero, a, b, c), (n, size, size, size))

    # a loop over the shifts: one small program where 125 unrolled sums compiled for 11 s
    if masked:

        def shift(k, sums):
            moved, lost = window(w, k), window(bad, k)
            new = [jnp.sum(fc * moved, (1, 2, 3)), jnp.sum(m * moved, (1, 2, 3)),
                   jnp.sum(m * moved * moved, (1, 2, 3)), jnp.sum(m * lost, (1, 2, 3))]  # fmt: skip
            return tuple(s.at[:, k].set(v) for s, v in zip(sums, new))

        empty = jnp.zeros((n, shifts**3), w.dtype)
        cross, total, squares, lost = lax.fori_loop(0, shifts**3, shift, (empty,) * 4)
    else:

        def boxes(v):  # the subset-sized box sums of v at every shift: sliding sums along each axis in turn
            for axis in (1, 2, 3):  # (a summed-volume table by cumsums cost three times the whole search)
                v = sum(lax.slice_in_dim(v, i, i + shifts, axis=axis) for i in range(size))
            return v.reshape(n, shifts**3)

        total, squares, lost = boxes(w), boxes(w * w), boxes(bad)

        def shift(k, cross):
            return cross.at[:, k].set(jnp.sum(fc * window(w, k), (1, 2, 3)))

        cross = lax.fori_loop(0, shifts**3, shift, jnp.zeros((n, shifts**3), w.dtype))
    variance = jnp.maximum(squares - total * total / count[:, None], 0)
    scale = norm[:, None] * jnp.sqrt(variance)
    zncc = jnp.where(scale > 0, cross / jnp.where(scale > 0, scale, 1), 0)
    return jnp.where(lost < 0.5, zncc, -jnp.inf)
