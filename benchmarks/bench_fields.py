"""Phase and strain from a displacement field: integrate_gradient and strain_field against NumPy/SciPy.

Peers: the same Poisson solve by ``scipy.fft.dctn``, ``scipy.sparse.linalg.cg`` on the weighted problem, a
Frankot-Chellappa projection by ``scipy.fft.rfft2``, and plane fits from ``scipy.ndimage.correlate1d`` moments.

    python -m benchmarks run fields [--quick] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import scipy.fft as sfft
from _harness import machine, measure, start_run, table
from scipy import ndimage
from scipy.sparse.linalg import LinearOperator, cg

WORKERS = os.cpu_count()


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Fields of 2048 x 2048 float32 (``--quick``: 512 x 512). Each row is timed best
of ``--repeats`` after a warm-up (compile), with the peak extra memory of one
call; NumPy inputs, NumPy-convertible results.

- integrate_gradient, least squares: ours (DCT through one real FFT per axis,
  in JAX) against the same Neumann Poisson solve with ``scipy.fft.dctn`` /
  ``idctn`` (all cores). With 1% scattered NaN and a NaN disc: ours (weighted
  least squares by DCT-preconditioned conjugate gradients, then the membrane
  fill) against SciPy's ``sparse.linalg.cg`` on the same weighted problem
  with the same DCT preconditioner (no membrane fill: less work than ours).
- Frankot-Chellappa: ours against the same projection with ``scipy.fft.rfft2``.
- strain_field, window 15 and 31: ours (separable box sums of the moments,
  fused by XLA) against the same plane fits with the moments from
  ``scipy.ndimage.correlate1d`` (separable, window-long kernels).
"""


def surface_and_gradient(n: int):
    y, x = np.mgrid[:n, :n] / n
    z = np.exp(1.5 * x) * np.sin(2.5 * y + 0.3) + x * y
    gy = (2.5 * np.exp(1.5 * x) * np.cos(2.5 * y + 0.3) + x) / n
    gx = (1.5 * np.exp(1.5 * x) * np.sin(2.5 * y + 0.3) + y) / n
    return z, gy.astype(np.float32), gx.astype(np.float32)


def neumann_eigenvalues(rows: int, cols: int) -> np.ndarray:
    ky = 4 * np.sin(np.pi * np.arange(rows) / (2 * rows)) ** 2
    kx = 4 * np.sin(np.pi * np.arange(cols) / (2 * cols)) ** 2
    eigen = (ky[:, None] + kx[None, :]).astype(np.float32)
    eigen[0, 0] = 1
    return eigen


def divergence(ey: np.ndarray, ex: np.ndarray) -> np.ndarray:
    """D^T (ey, ex) for the forward differences."""
    ey, ex = np.pad(ey, ((1, 1), (0, 0))), np.pad(ex, ((0, 0), (1, 1)))
    return (ey[:-1] - ey[1:]) + (ex[:, :-1] - ex[:, 1:])


def scipy_poisson(b: np.ndarray, eigen: np.ndarray) -> np.ndarray:
    coefficients = sfft.dctn(b, type=2, norm="ortho", workers=WORKERS) / eigen
    coefficients[0, 0] = 0
    return sfft.idctn(coefficients, type=2, norm="ortho", workers=WORKERS)


def scipy_least_squares(gy: np.ndarray, gx: np.ndarray, eigen: np.ndarray) -> np.ndarray:
    return scipy_poisson(divergence((gy[:-1] + gy[1:]) / 2, (gx[:, :-1] + gx[:, 1:]) / 2), eigen)


def scipy_weighted_least_squares(gy: np.ndarray, gx: np.ndarray, eigen: np.ndarray) -> np.ndarray:
    """Ghiglia and Romero's weighted least squares: CG on D^T W D z = D^T W e, DCT-preconditioned."""
    shape = gy.shape
    ey, ex = (gy[:-1] + gy[1:]) / 2, (gx[:, :-1] + gx[:, 1:]) / 2
    wy, wx = np.isfinite(ey).astype(np.float32), np.isfinite(ex).astype(np.float32)
    rhs = divergence(np.nan_to_num(ey) * wy, np.nan_to_num(ex) * wx).ravel()

    def operator(v):
        z = v.reshape(shape)
        return divergence(wy * (z[1:] - z[:-1]), wx * (z[:, 1:] - z[:, :-1])).ravel()

    n = rhs.size
    a = LinearOperator((n, n), matvec=operator, dtype=np.float32)
    m = LinearOperator((n, n), matvec=lambda r: scipy_poisson(r.reshape(shape), eigen).ravel(), dtype=np.float32)
    z, _ = cg(a, rhs, x0=m.matvec(rhs), M=m, rtol=1e-6, maxiter=500)
    return z.reshape(shape)


def scipy_frankot_chellappa(gy: np.ndarray, gx: np.ndarray) -> np.ndarray:
    rows, cols = gy.shape
    ky = (2 * np.pi * np.fft.fftfreq(rows)).astype(np.float32)[:, None]
    kx = (2 * np.pi * np.fft.rfftfreq(cols)).astype(np.float32)[None, :]
    k2 = ky**2 + kx**2
    k2[0, 0] = 1
    spectrum = -1j * (ky * sfft.rfft2(gy, workers=WORKERS) + kx * sfft.rfft2(gx, workers=WORKERS)) / k2
    spectrum[0, 0] = 0
    return sfft.irfft2(spectrum, s=(rows, cols), workers=WORKERS)


def scipy_strain(dy: np.ndarray, dx: np.ndarray, window: int) -> tuple[np.ndarray, ...]:
    """Plane fits over the window's valid pixels, moments by separable ``correlate1d`` (zero outside)."""
    half = window // 2
    offsets = np.arange(-half, half + 1, dtype=np.float32)
    kernels = [np.ones(window, np.float32), offsets, offsets**2]
    valid = np.isfinite(dy) & np.isfinite(dx)
    w = valid.astype(np.float32)
    u, v = np.where(valid, dx - np.nanmean(dx), 0), np.where(valid, dy - np.nanmean(dy), 0)

    def moment(a, p, q):  # sum of a * (row offset)^p * (column offset)^q; correlate1d's kernel runs along +offsets
        along_x = ndimage.correlate1d(a, kernels[q], axis=1, mode="constant")
        return ndimage.correlate1d(along_x, kernels[p], axis=0, mode="constant")

    s00, s10, s01 = moment(w, 0, 0), moment(w, 1, 0), moment(w, 0, 1)
    s20, s02, s11 = moment(w, 2, 0), moment(w, 0, 2), moment(w, 1, 1)
    n = np.maximum(s00, 1)
    cyy, cxx, cxy = s20 - s10**2 / n, s02 - s01**2 / n, s11 - s10 * s01 / n
    det = cyy * cxx - cxy**2
    ok = valid & (s00 >= 3) & (det > 1e-6 * np.abs(cyy * cxx))
    det = np.where(ok, det, 1)

    def gradient(f):
        f00, f10, f01 = moment(f, 0, 0), moment(f, 1, 0), moment(f, 0, 1)
        fy, fx = f10 - s10 * f00 / n, f01 - s01 * f00 / n
        return (cxx * fy - cxy * fx) / det, (cyy * fx - cxy * fy) / det

    uy, ux = gradient(u)
    vy, vx = gradient(v)
    return tuple(np.where(ok, e, np.nan) for e in (ux, vy, (uy + vx) / 2))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="512 x 512")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    start_run("fields", args)
    n = 512 if args.quick else 2048

    from napari_gridmip import integrate_gradient, strain_field

    z, gy, gx = surface_and_gradient(n)
    eigen = neumann_eigenvalues(n, n)
    rng = np.random.default_rng(0)
    holes = rng.random((n, n)) < 0.01
    yy, xx = np.mgrid[:n, :n]
    holes |= (yy - n // 2) ** 2 + (xx - n // 3) ** 2 < (n // 20) ** 2
    hy, hx = gy.copy(), gx.copy()
    hy[holes], hx[holes] = np.nan, np.nan
    ours = np.asarray(integrate_gradient(gy, gx))
    gap = np.abs(ours - scipy_least_squares(gy, gx, eigen)).max()
    print(f"fields of {n} x {n} float32; {machine()}; ours - SciPy least squares: {gap:.1e}\n")
    r = args.repeats
    rows = [
        measure("integrate_gradient least-squares (ours)", lambda: np.asarray(integrate_gradient(gy, gx)), repeats=r),
        measure("scipy.fft.dctn Poisson solve", lambda: scipy_least_squares(gy, gx, eigen), repeats=r,
                note=f"workers={WORKERS}"),
        measure("integrate_gradient frankot-chellappa (ours)",
                lambda: np.asarray(integrate_gradient(gy, gx, method="frankot-chellappa")), repeats=r),
        measure("scipy.fft.rfft2 Frankot-Chellappa", lambda: scipy_frankot_chellappa(gy, gx), repeats=r,
                note=f"workers={WORKERS}"),
        measure("integrate_gradient, 1% NaN + a disc (ours)", lambda: np.asarray(integrate_gradient(hy, hx)),
                repeats=max(1, r // 2), note="PCG + membrane fill"),
        measure("scipy.sparse.linalg.cg, DCT-preconditioned", lambda: scipy_weighted_least_squares(hy, hx, eigen),
                repeats=max(1, r // 2), note="same weighted problem, no fill"),
    ]  # fmt: skip
    print(table("integrate_gradient", rows, "integrate_gradient least-squares (ours)"))
    print()
    dy = (1e-3 * xx + 2e-3 * yy + rng.normal(0, 0.02, (n, n))).astype(np.float32)
    dx = (3e-3 * xx - 1e-3 * yy + rng.normal(0, 0.02, (n, n))).astype(np.float32)
    dy[holes] = np.nan
    rows = []
    for window in (15, 31):
        got = np.asarray(strain_field(dy, dx, window=window).exx)
        want = scipy_strain(dy, dx, window)[0]
        difference = np.nanmax(np.abs(got - want))
        rows += [
            measure(f"strain_field window {window} (ours)",
                    lambda w=window: [np.asarray(e) for e in strain_field(dy, dx, window=w)], repeats=r,
                    note=f"max diff to SciPy {difference:.0e}"),
            measure(f"scipy.ndimage.correlate1d moments, window {window}", lambda w=window: scipy_strain(dy, dx, w),
                    repeats=r),
        ]  # fmt: skip
    print(table("strain_field (small strain, 1% NaN)", rows, "strain_field window 15 (ours)"))


if __name__ == "__main__":
    main()
