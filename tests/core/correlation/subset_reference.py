"""Float64 loops over the definitions of the subset correlation and the speckle-tracking model (obviously right, slow).

Imported by the subset tests and the DIC benchmark; never import a test module from another.
"""

from __future__ import annotations

import numpy as np


def zncc(u: np.ndarray, v: np.ndarray) -> float:
    """Zero-normalised cross-correlation of two vectors (any shape, flattened), in float64.

    NaN if either holds a non-finite value; 0 if either is constant; else Pearson's r.
    """
    u = np.asarray(u, np.float64).ravel()
    v = np.asarray(v, np.float64).ravel()
    if not (np.isfinite(u).all() and np.isfinite(v).all()):
        return np.nan
    if np.ptp(u) == 0 or np.ptp(v) == 0:
        return 0.0
    u = u - u.mean()
    v = v - v.mean()
    return float((u * v).sum() / np.sqrt((u * u).sum() * (v * v).sum()))


def reference_map(img1, img2, window, subset, step=1):
    """``out[i, j, a, b]``: img2's K x sh x sw vector around ``(y, x) = (i s + m + hs, j s + n + hw)`` against
    img1's around ``(y + a - m, x + b - n)``; shape ``(ceil(Mo / s), ceil(No / s), wm, wn)``."""
    img1, img2 = np.asarray(img1, np.float64), np.asarray(img2, np.float64)
    if img1.ndim == 2:
        img1, img2 = img1[None], img2[None]
    _, rows, cols = img1.shape
    (wm, wn), (sh, sw) = window, subset
    m, n = wm // 2, wn // 2
    mo, no = rows - 2 * m - (sh - 1), cols - 2 * n - (sw - 1)
    out = np.zeros((len(range(0, mo, step)), len(range(0, no, step)), wm, wn))
    for oi, i in enumerate(range(0, mo, step)):
        for oj, j in enumerate(range(0, no, step)):
            v2 = img2[:, i + m : i + m + sh, j + n : j + n + sw]
            for a in range(wm):
                for b in range(wn):
                    out[oi, oj, a, b] = zncc(img1[:, i + a : i + a + sh, j + b : j + b + sw], v2)
    return out


def umpa_fit(sample_vector, reference_vector, reference_mean):
    """Least-squares ``sample ~ T (Im + D (reference - Im))`` over one vector: ``(T, D, rms residual)``."""
    s = np.asarray(sample_vector, np.float64).ravel()
    r = np.asarray(reference_vector, np.float64).ravel()
    design = np.stack([np.ones_like(r), r], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, s, rcond=None)
    residual = s - design @ np.array([alpha, beta])
    transmission = (alpha + beta * reference_mean) / reference_mean
    return transmission, beta / transmission, float(np.sqrt(np.mean(residual**2)))


def reference_peaks(full_map, method="hessian"):
    """Integer peak (first maximum in C order) and the 3x3 Newton step ("hessian") or no step ("none") of a
    float64 map ``(rows, cols, wm, wn)``: ``(dy, dx, peak)``, NaN displacements where the peak is on the edge.
    Where the 2D step is not a maximum within one pixel, each axis takes its own 1D step, clipped to 0.5."""
    rows, cols, wm, wn = full_map.shape
    dy, dx = np.full((rows, cols), np.nan), np.full((rows, cols), np.nan)
    peak = np.full((rows, cols), np.nan)
    for i in range(rows):
        for j in range(cols):
            c = np.where(np.isnan(full_map[i, j]), -np.inf, full_map[i, j])
            a, b = np.unravel_index(np.argmax(c), c.shape)
            if np.isfinite(c[a, b]):
                peak[i, j] = c[a, b]
            if not np.isfinite(c[a, b]) or (wm > 1 and a in (0, wm - 1)) or (wn > 1 and b in (0, wn - 1)):
                continue
            sy = sx = 0.0
            if method == "hessian":
                h = np.pad(c, 1, mode="edge")[a : a + 3, b : b + 3]
                gy, gx = (h[2, 1] - h[0, 1]) / 2, (h[1, 2] - h[1, 0]) / 2
                hyy, hxx = h[2, 1] - 2 * h[1, 1] + h[0, 1], h[1, 2] - 2 * h[1, 1] + h[1, 0]
                hxy = (h[2, 2] - h[2, 0] - h[0, 2] + h[0, 0]) / 4
                det = hyy * hxx - hxy * hxy
                ok = det > 0 and hyy < 0
                if ok:
                    sy, sx = -(hxx * gy - hxy * gx) / det, -(hyy * gx - hxy * gy) / det
                    ok = abs(sy) <= 1 and abs(sx) <= 1
                if not ok:
                    sy = np.clip(-gy / hyy, -0.5, 0.5) if hyy < 0 else 0.0
                    sx = np.clip(-gx / hxx, -0.5, 0.5) if hxx < 0 else 0.0
                sy, sx = (sy if wm > 1 else 0.0), (sx if wn > 1 else 0.0)
            dy[i, j], dx[i, j] = a - wm // 2 + sy, b - wn // 2 + sx
    return dy, dx, peak


def spline_subset(img, y, x, subset):
    """Like :func:`interpolated_subset` with img1's cubic B-spline (scipy's, on the image extended by 40 edge
    pixels, so that its boundary rule does not reach the image)."""
    from scipy import ndimage

    img = np.asarray(img, np.float64)
    pad = 40
    sh, sw = subset
    out = []
    for frame in img:
        coeffs = ndimage.spline_filter(np.pad(frame, pad, mode="edge"), order=3, mode="mirror")
        yy, xx = np.meshgrid(np.arange(sh) + y + pad, np.arange(sw) + x + pad, indexing="ij")
        out.append(ndimage.map_coordinates(coeffs, [yy, xx], order=3, prefilter=False))
    return np.stack(out)


def affine_spread(img1, img2, params, centres_y, centres_x, subset, prefilter):
    """Predicted standard deviations of IC-GN's six parameters ``(v, v_y, v_x, u, u_y, u_x)`` at each point, from
    the Gauss-Newton Hessian and the residual at the solution, in float64: ``(rows, cols, 6)``.

    ``params``: the solution ``(rows, cols, 6)`` at the reference's (img2's) pixels ``centres_y`` x ``centres_x``;
    ``prefilter``: the Gaussian (px) both images were smoothed by (0: none), with the library's taps. Least squares
    with a residual ``r = f - (|f| / |g|) g`` of covariance ``s^2 R`` (``R``: the filter's normalised
    autocorrelation, which sums to 1; the identity without a filter) give ``cov = s^2 inv(H) (J' R J) inv(H)``,
    ``H = J'J``; ``s^2 R(0)`` is estimated by ``|r|^2 / (n - 8)`` (six parameters, the mean and the scale).
    """
    from scipy import ndimage

    from napari_gridmip.core.correlation.prefilter import taps

    a, b = np.asarray(img1, np.float64), np.asarray(img2, np.float64)
    kernel = np.ones((1, 1))
    if prefilter > 0:
        w = taps(prefilter)
        for axis in (0, 1):
            a = ndimage.correlate1d(a, w, axis=axis, mode="nearest")
            b = ndimage.correlate1d(b, w, axis=axis, mode="nearest")
        r1 = np.correlate(w, w, mode="full")
        kernel = np.outer(r1, r1)  # sums to 1
    coef = ndimage.spline_filter(b, order=3, mode="nearest")
    smooth, slope = [1 / 6, 4 / 6, 1 / 6], [-0.5, 0.0, 0.5]
    grad_y = ndimage.correlate1d(ndimage.correlate1d(coef, slope, axis=0, mode="nearest"), smooth, axis=1,
                                 mode="nearest")  # fmt: skip
    grad_x = ndimage.correlate1d(ndimage.correlate1d(coef, slope, axis=1, mode="nearest"), smooth, axis=0,
                                 mode="nearest")  # fmt: skip
    hs, hw = subset[0] // 2, subset[1] // 2
    eta, zeta = (t.ravel() for t in np.meshgrid(np.arange(-hs, hs + 1.0), np.arange(-hw, hw + 1.0), indexing="ij"))
    out = np.full(np.shape(params), np.nan)
    for i, cy in enumerate(centres_y):
        for j, cx in enumerate(centres_x):
            v, vy, vx, u, uy, ux = params[i, j]
            if not np.isfinite(params[i, j]).all():
                continue
            ry, rx = (cy + eta).astype(int), (cx + zeta).astype(int)
            fy, fx = grad_y[ry, rx], grad_x[ry, rx]
            jac = np.stack([fy, fy * eta, fy * zeta, fx, fx * eta, fx * zeta], -1)
            g = ndimage.map_coordinates(a, [cy + eta + v + vy * eta + vx * zeta, cx + zeta + u + uy * eta + ux * zeta],
                                        order=3, mode="nearest")  # fmt: skip
            f = b[ry, rx] - b[ry, rx].mean()
            g = g - g.mean()
            residual = f - np.linalg.norm(f) / np.linalg.norm(g) * g
            s2 = np.sum(residual**2) / (len(residual) - 8) / kernel[kernel.shape[0] // 2, kernel.shape[1] // 2]
            images = jac.T.reshape(6, 2 * hs + 1, 2 * hw + 1)
            spread = np.stack([ndimage.convolve(im, kernel, mode="constant").ravel() for im in images], -1)
            inverse = np.linalg.inv(jac.T @ jac)
            out[i, j] = np.sqrt(s2 * np.diag(inverse @ (jac.T @ spread) @ inverse))
    return out
