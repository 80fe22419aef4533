"""A Numba subset DIC written as ncorr and DICe write theirs: the peer of ``bench_dic.py --only peer``.

- **Initial guess**: an integer ZNCC search (+-``radius`` px) at the first point of each row of points, then
  each next point starts from its left neighbour's converged warp (the seed propagation of ncorr's
  reliability-guided scan, along rows so that rows run in parallel); a point whose neighbour failed (no
  convergence, or ZNCC below 0.8) is searched again.
- **IC-GN** (Pan, Li and Tong 2013) per subset: the reference's gradients (from its cubic B-spline, at the
  knots) and the Gauss-Newton Hessian ``J'J`` are computed once per subset; each iteration interpolates the
  deformed image by its cubic B-spline (16 taps, coefficients from ``scipy.ndimage.spline_filter``), forms the
  ZNSSD residual, solves for the increment with the inverted Hessian and composes ``W(p) o W(dp)^-1``.
  Translation (2 parameters) or first-order (6) shape functions. Stops when
  ``sqrt(du^2 + dv^2 + (h du_x)^2 + ...) < 1e-3`` (the increment's move of the subset's edge, px) or after 50
  iterations.
- ``@numba.njit(parallel=True, fastmath=True)``, ``prange`` over the rows of points; each row's buffers are
  allocated once.

The convention is ``find_displacement``'s: ``g`` (the deformed image, img1) at ``(y + dy, x + dx)`` matches
``f`` (the reference, img2) at ``(y, x)``; the points are given by the caller (the same grid as ours).

References
----------
B. Pan, K. Li, W. Tong, "Fast, robust and accurate digital image correlation calculation without redundant
computations", Exp. Mech. 53, 1277-1289 (2013).
J. Blaber, B. Adair, A. Antoniou, "Ncorr: open-source 2D digital image correlation Matlab software", Exp. Mech.
55, 1105-1122 (2015).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from scipy import ndimage

TOLERANCE = 1e-3  # px
MAX_ITERATIONS = 50
MIN_ZNCC = 0.8  # below this a neighbour's warp is no start: search again


@njit(cache=False, fastmath=True, inline="always")
def _weights(t, w):
    """Cubic B-spline weights of the four taps ``floor - 1 .. floor + 2`` at fraction ``t``."""
    s = 1.0 - t
    t2 = t * t
    w[0] = s * s * s / 6.0
    w[1] = (3.0 * t2 * t - 6.0 * t2 + 4.0) / 6.0
    w[2] = (-3.0 * t2 * t + 3.0 * t2 + 3.0 * t + 1.0) / 6.0
    w[3] = t2 * t / 6.0


@njit(cache=False, fastmath=True)
def _interp(c, y, x, wy, wx):
    """The bicubic B-spline through coefficients ``c`` at ``(y, x)`` (taps clamped to the image)."""
    rows, cols = c.shape
    iy = int(np.floor(y))
    ix = int(np.floor(x))
    _weights(y - iy, wy)
    _weights(x - ix, wx)
    out = 0.0
    for a in range(4):
        r = min(max(iy - 1 + a, 0), rows - 1)
        acc = 0.0
        for b in range(4):
            q = min(max(ix - 1 + b, 0), cols - 1)
            acc += wx[b] * c[r, q]
        out += wy[a] * acc
    return out


@njit(cache=False, parallel=True, fastmath=True)
def _knot_gradients(c):
    """The reference's value and spline gradient at every pixel: ``B(0) = 4/6, B(+-1) = 1/6, B'(+-1) = -+1/2``."""
    rows, cols = c.shape
    f = np.empty((rows, cols))
    fy = np.empty((rows, cols))
    fx = np.empty((rows, cols))
    smooth = np.array([1.0 / 6.0, 4.0 / 6.0, 1.0 / 6.0])
    slope = np.array([-0.5, 0.0, 0.5])
    for y in prange(rows):
        for x in range(cols):
            v = 0.0
            gy = 0.0
            gx = 0.0
            for a in range(3):
                r = min(max(y - 1 + a, 0), rows - 1)
                for b in range(3):
                    q = min(max(x - 1 + b, 0), cols - 1)
                    cv = c[r, q]
                    v += smooth[a] * smooth[b] * cv
                    gy += slope[a] * smooth[b] * cv
                    gx += smooth[a] * slope[b] * cv
            f[y, x] = v
            fy[y, x] = gy
            fx[y, x] = gx
    return f, fy, fx


@njit(cache=False, fastmath=True)
def _integer_search(f_img, g_img, cy, cx, hs, hw, radius):
    """The integer offset (dy, dx) of largest ZNCC within +-radius, of the raw images."""
    rows, cols = g_img.shape
    n = (2 * hs + 1) * (2 * hw + 1)
    sf = 0.0
    qf = 0.0
    for i in range(-hs, hs + 1):
        for j in range(-hw, hw + 1):
            v = f_img[cy + i, cx + j]
            sf += v
            qf += v * v
    mf = sf / n
    nf = np.sqrt(max(qf - sf * mf, 1e-30))
    best = -2.0
    by = 0
    bx = 0
    for a in range(-radius, radius + 1):
        for b in range(-radius, radius + 1):
            if cy + a - hs < 0 or cy + a + hs >= rows or cx + b - hw < 0 or cx + b + hw >= cols:
                continue
            sg = 0.0
            qg = 0.0
            cross = 0.0
            for i in range(-hs, hs + 1):
                for j in range(-hw, hw + 1):
                    v = g_img[cy + a + i, cx + b + j]
                    sg += v
                    qg += v * v
                    cross += v * f_img[cy + i, cx + j]
            ng = np.sqrt(max(qg - sg * sg / n, 1e-30))
            r = (cross - sf * sg / n) / (nf * ng)
            if r > best:
                best = r
                by = a
                bx = b
    return by, bx


@njit(cache=False, fastmath=True, inline="always")
def _centre(v, size, mean):
    """Subtract ``mean`` from the first ``size`` values of ``v`` in place; their norm after."""
    norm = 0.0
    for s in range(size):
        v[s] -= mean
        norm += v[s] * v[s]
    return np.sqrt(norm)


@njit(cache=False, fastmath=True)
def _compose(p, dp, out):
    """``W(p) o W(dp)^-1`` for affine parameters ``(v, v_y, v_x, u, u_y, u_x)``."""
    # W = [[1 + vy, vx, v], [uy, 1 + ux, u], [0, 0, 1]]
    a11, a12, a13 = 1.0 + p[1], p[2], p[0]
    a21, a22, a23 = p[4], 1.0 + p[5], p[3]
    b11, b12, b13 = 1.0 + dp[1], dp[2], dp[0]
    b21, b22, b23 = dp[4], 1.0 + dp[5], dp[3]
    det = b11 * b22 - b12 * b21
    i11, i12 = b22 / det, -b12 / det
    i21, i22 = -b21 / det, b11 / det
    i13 = -(i11 * b13 + i12 * b23)
    i23 = -(i21 * b13 + i22 * b23)
    out[1] = a11 * i11 + a12 * i21 - 1.0
    out[2] = a11 * i12 + a12 * i22
    out[0] = a11 * i13 + a12 * i23 + a13
    out[4] = a21 * i11 + a22 * i21
    out[5] = a21 * i12 + a22 * i22 - 1.0
    out[3] = a21 * i13 + a22 * i23 + a23


@njit(cache=False, parallel=True, fastmath=True)
def _icgn(f_img, fy_img, fx_img, g_img, g_coef, grid_y, grid_x, hs, hw, radius, affine, tolerance):
    """IC-GN at every point of the grid: ``(params (rows, cols, 6), zncc, iterations)``."""
    rows, cols = grid_y.size, grid_x.size
    npar = 6 if affine else 2
    params = np.full((rows, cols, 6), np.nan)
    zncc = np.full((rows, cols), np.nan)
    iterations = np.zeros((rows, cols), np.int32)
    size = (2 * hs + 1) * (2 * hw + 1)
    for i in prange(rows):
        # per-row buffers
        fc = np.empty(size)
        jac = np.empty((size, npar))
        gv = np.empty(size)
        eta = np.empty(size)
        zeta = np.empty(size)
        wy = np.empty(4)
        wx = np.empty(4)
        hess = np.empty((npar, npar))
        p = np.zeros(6)
        dp = np.zeros(6)
        newp = np.zeros(6)
        rhs = np.empty(npar)
        have_start = False
        cy = grid_y[i]
        for j in range(cols):
            cx = grid_x[j]
            # the reference subset, its gradients and the Hessian: once per subset
            s = 0
            mean = 0.0
            for a in range(-hs, hs + 1):
                for b in range(-hw, hw + 1):
                    fc[s] = f_img[cy + a, cx + b]
                    mean += fc[s]
                    eta[s] = a
                    zeta[s] = b
                    gy = fy_img[cy + a, cx + b]
                    gx = fx_img[cy + a, cx + b]
                    if affine:
                        jac[s, 0] = gy
                        jac[s, 1] = gy * a
                        jac[s, 2] = gy * b
                        jac[s, 3] = gx
                        jac[s, 4] = gx * a
                        jac[s, 5] = gx * b
                    else:
                        jac[s, 0] = gy
                        jac[s, 1] = gx
                    s += 1
            norm_f = _centre(fc, size, mean / size)
            for r in range(npar):
                for q in range(r, npar):
                    acc = 0.0
                    for s in range(size):
                        acc += jac[s, r] * jac[s, q]
                    hess[r, q] = acc
                    hess[q, r] = acc
            hinv = np.linalg.inv(hess)
            if not have_start:
                oy, ox = _integer_search(f_img, g_img, cy, cx, hs, hw, radius)
                for q in range(6):
                    p[q] = 0.0
                p[0] = oy
                p[3] = ox
            converged = False
            it = 0
            r_value = np.nan
            while it < MAX_ITERATIONS:
                it += 1
                mean_g = 0.0
                for s in range(size):
                    py = cy + eta[s] + p[0] + p[1] * eta[s] + p[2] * zeta[s]
                    px = cx + zeta[s] + p[3] + p[4] * eta[s] + p[5] * zeta[s]
                    gv[s] = _interp(g_coef, py, px, wy, wx)
                    mean_g += gv[s]
                norm_g = _centre(gv, size, mean_g / size)
                if norm_g == 0.0:
                    break
                scale = norm_f / norm_g
                for q in range(npar):
                    rhs[q] = 0.0
                for s in range(size):
                    res = fc[s] - scale * gv[s]
                    for q in range(npar):
                        rhs[q] += jac[s, q] * res
                if affine:
                    for q in range(6):
                        acc = 0.0
                        for r in range(6):
                            acc -= hinv[q, r] * rhs[r]
                        dp[q] = acc
                    _compose(p, dp, newp)
                    for q in range(6):
                        p[q] = newp[q]
                    move = np.sqrt(dp[0] ** 2 + dp[3] ** 2 + (hs * dp[1]) ** 2 + (hw * dp[2]) ** 2
                                   + (hs * dp[4]) ** 2 + (hw * dp[5]) ** 2)  # fmt: skip
                else:
                    d0 = -(hinv[0, 0] * rhs[0] + hinv[0, 1] * rhs[1])
                    d1 = -(hinv[1, 0] * rhs[0] + hinv[1, 1] * rhs[1])
                    p[0] -= d0  # the inverse of a translation, composed
                    p[3] -= d1
                    move = np.sqrt(d0 * d0 + d1 * d1)
                if move < tolerance:
                    converged = True
                    # the ZNCC at the increment's start (as ncorr reports its last evaluation)
                    cross = 0.0
                    for s in range(size):
                        cross += fc[s] * gv[s]
                    r_value = cross / (norm_f * norm_g)
                    break
            iterations[i, j] = it
            if converged and np.isfinite(p[0]) and np.isfinite(p[3]):
                for q in range(6):
                    params[i, j, q] = p[q]
                zncc[i, j] = r_value
                have_start = r_value >= MIN_ZNCC
            else:
                have_start = False
            if not have_start:
                for q in range(6):
                    p[q] = 0.0
    return params, zncc, iterations


def icgn_dic(deformed, reference, grid_y, grid_x, *, subset=31, radius=10, shape="affine", tolerance=TOLERANCE):
    """Subset DIC of ``deformed`` against ``reference`` (2D arrays) at the points ``grid_y`` x ``grid_x`` (the
    reference's pixels, 1D int arrays); ``tolerance``: px, the increment's norm that stops a point. A dict of
    ``(rows, cols)`` arrays ``dy, dx, zncc, iterations`` and, for ``shape="affine"``, ``dy_y, dy_x, dx_y, dx_x``."""
    reference = np.asarray(reference, np.float64)
    deformed = np.asarray(deformed, np.float64)
    f_coef = ndimage.spline_filter(reference, order=3, mode="mirror")
    g_coef = ndimage.spline_filter(deformed, order=3, mode="mirror")
    f_img, fy_img, fx_img = _knot_gradients(f_coef)
    half = subset // 2
    params, zncc, iterations = _icgn(f_img, fy_img, fx_img, deformed, g_coef, np.asarray(grid_y, np.int64),
                                     np.asarray(grid_x, np.int64), half, half, radius, shape == "affine",
                                     float(tolerance))  # fmt: skip
    out = {"dy": params[..., 0], "dx": params[..., 3], "zncc": zncc, "iterations": iterations}
    if shape == "affine":
        out.update(dy_y=params[..., 1], dy_x=params[..., 2], dx_y=params[..., 4], dx_x=params[..., 5])
    return out
