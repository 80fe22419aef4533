"""Obviously right float64 references for the fields and timeseries kernels (loops over the definitions)."""

from __future__ import annotations

import itertools

import numpy as np


def forward_difference_matrix(rows: int, cols: int) -> np.ndarray:
    """``D`` with ``D @ z.ravel()`` = the y forward differences (row-major) then the x ones."""
    index = np.arange(rows * cols).reshape(rows, cols)
    lines = []
    for i, j in itertools.product(range(rows - 1), range(cols)):
        line = np.zeros(rows * cols)
        line[index[i + 1, j]], line[index[i, j]] = 1, -1
        lines.append(line)
    for i, j in itertools.product(range(rows), range(cols - 1)):
        line = np.zeros(rows * cols)
        line[index[i, j + 1]], line[index[i, j]] = 1, -1
        lines.append(line)
    return np.array(lines).reshape(-1, rows * cols)


def least_squares_surface(gy, gx, sampling="centred"):
    """The minimum-norm (so zero-mean) least-squares surface of the forward differences, by a dense solve."""
    gy, gx = np.asarray(gy, np.float64), np.asarray(gx, np.float64)
    rows, cols = gy.shape
    if sampling == "centred":
        ey, ex = (gy[:-1] + gy[1:]) / 2, (gx[:, :-1] + gx[:, 1:]) / 2
    else:
        ey, ex = gy[:-1], gx[:, :-1]
    d = forward_difference_matrix(rows, cols)
    if d.shape[0] == 0:
        return np.zeros((rows, cols))
    z = np.linalg.lstsq(d, np.concatenate([ey.ravel(), ex.ravel()]), rcond=None)[0]
    return z.reshape(rows, cols)


def frankot_chellappa(gy, gx):
    """The Fourier projection, written out with NumPy's complex FFT (Nyquist derivatives zeroed)."""
    gy, gx = np.asarray(gy, np.float64), np.asarray(gx, np.float64)
    rows, cols = gy.shape
    fy, fx = np.meshgrid(np.fft.fftfreq(rows), np.fft.fftfreq(cols), indexing="ij")
    ky, kx = 2 * np.pi * fy, 2 * np.pi * fx
    ky[np.abs(fy) == 0.5] = 0
    kx[np.abs(fx) == 0.5] = 0
    k2 = ky**2 + kx**2
    z = -1j * (ky * np.fft.fft2(gy) + kx * np.fft.fft2(gx)) / np.where(k2 > 0, k2, 1)
    z[k2 == 0] = 0
    return np.fft.ifft2(z).real


def plane_fit_gradients(field, window, valid):
    """``(d/dy, d/dx)`` of ``field`` at each pixel: a least-squares plane over the window's valid in-image
    pixels (NaN where fewer than 3, collinear, or the pixel itself is invalid)."""
    field = np.asarray(field, np.float64)
    rows, cols = field.shape
    hy, hx = window[0] // 2, window[1] // 2
    gy, gx = np.full((rows, cols), np.nan), np.full((rows, cols), np.nan)
    for i, j in itertools.product(range(rows), range(cols)):
        if not valid[i, j]:
            continue
        points = [
            (a, b, field[i + a, j + b])
            for a in range(-hy, hy + 1)
            for b in range(-hx, hx + 1)
            if 0 <= i + a < rows and 0 <= j + b < cols and valid[i + a, j + b]
        ]
        if len(points) < 3:
            continue
        design = np.array([[1, a, b] for a, b, _ in points], float)
        if np.linalg.matrix_rank(design) < 3:
            continue
        coef = np.linalg.lstsq(design, np.array([v for *_, v in points]), rcond=None)[0]
        gy[i, j], gx[i, j] = coef[1], coef[2]
    return gy, gx


def strain(dy, dx, window, kind="small", spacing=(1.0, 1.0)):
    """``(exx, eyy, exy)`` from :func:`plane_fit_gradients` of ``u = dx`` and ``v = dy``."""
    dy, dx = np.asarray(dy, np.float64), np.asarray(dx, np.float64)
    valid = np.isfinite(dy) & np.isfinite(dx)
    uy, ux = plane_fit_gradients(np.where(valid, dx, 0), window, valid)
    vy, vx = plane_fit_gradients(np.where(valid, dy, 0), window, valid)
    uy, vy, ux, vx = uy / spacing[0], vy / spacing[0], ux / spacing[1], vx / spacing[1]
    if kind == "small":
        return ux, vy, (uy + vx) / 2
    return (
        ux + (ux**2 + vx**2) / 2,
        vy + (uy**2 + vy**2) / 2,
        (uy + vx + ux * uy + vx * vy) / 2,
    )


def pearson(u, v):
    u = u - u.mean()
    v = v - v.mean()
    den = np.sqrt((u * u).sum() * (v * v).sum())
    return (u * v).sum() / den if den > 0 else 0.0


def local_correlation_image(movie, neighbours=8):
    """CaImAn's definition, one pixel and one neighbour at a time, in float64."""
    movie = np.asarray(movie, np.float64)
    _, rows, cols = movie.shape
    offsets = [
        (a, b) for a in (-1, 0, 1) for b in (-1, 0, 1) if (a, b) != (0, 0) and (neighbours == 8 or a == 0 or b == 0)
    ]
    out = np.full((rows, cols), np.nan)
    for i, j in itertools.product(range(rows), range(cols)):
        values = [
            pearson(movie[:, i, j], movie[:, i + a, j + b])
            for a, b in offsets
            if 0 <= i + a < rows and 0 <= j + b < cols
        ]
        if values:
            out[i, j] = np.mean(values)
    return out


def caiman_fft_formula(movie, neighbours=8):
    """CaImAn's ``local_correlations_fft`` written with NumPy (z-scored frames, a 3x3 neighbour sum, the
    mean product over time divided by the neighbour count)."""
    y = np.asarray(movie, np.float64).copy()
    y -= y.mean(axis=0)
    std = y.std(axis=0)
    std[std == 0] = np.inf
    y /= std
    rows, cols = y.shape[1:]
    summed = np.zeros_like(y)
    count = np.zeros((rows, cols))
    for a, b in itertools.product((-1, 0, 1), repeat=2):
        if (a, b) == (0, 0) or (neighbours == 4 and a and b):
            continue
        dst = (slice(max(0, -a), rows - max(0, a)), slice(max(0, -b), cols - max(0, b)))
        src = (slice(max(0, a), rows - max(0, -a)), slice(max(0, b), cols - max(0, -b)))
        summed[(slice(None), *dst)] += y[(slice(None), *src)]
        count[dst] += 1
    return np.mean(summed * y, axis=0) / count
