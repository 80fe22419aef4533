"""Windowed Pearson maps and displacement fields: ours against Numba and NumPy.

    python benchmarks/bench_correlation.py [--size 900] [--frames 10] [--window 15] [--repeats 3]

All in one run, after a warm-up, best of ``--repeats`` (the slow baselines:
``--baseline-repeats``): the full float32 and float64 maps, and
find_displacement, against a Numba ``prange`` loop written like the question's
(plus an argmax for the displacement), a NumPy loop over the offsets, and
sliding_window_view + einsum where its intermediate fits in memory. Peak extra
resident memory of one call is reported beside each time.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine, measure, table  # noqa: E402

from napari_gridmip import find_displacement, windowed_pearson  # noqa: E402


def numba_kernels():
    import numba
    from numba import prange

    @numba.njit(inline="always", cache=True)
    def pair_pearson(img1, img2, y1, x1, y2, x2):
        """Pearson over K of img1[:, y1, x1] and img2[:, y2, x2], from raw sums in one pass."""
        k_frames = img1.shape[0]
        s1 = 0.0
        s2 = 0.0
        s11 = 0.0
        s22 = 0.0
        s12 = 0.0
        for k in range(k_frames):
            x = img1[k, y1, x1]
            y = img2[k, y2, x2]
            s1 += x
            s2 += y
            s11 += x * x
            s22 += y * y
            s12 += x * y
        cov = s12 - s1 * s2 / k_frames
        den = np.sqrt((s11 - s1 * s1 / k_frames) * (s22 - s2 * s2 / k_frames))
        return cov / den if den > 0 else 0.0

    @numba.njit(parallel=True, cache=True)
    def numba_pearson_map(img1, img2, wm, wn):
        """Like the question's loop: every pair's Pearson from raw sums, one output element at a time."""
        _, rows, cols = img1.shape
        m, n = wm // 2, wn // 2
        out = np.empty((rows - 2 * m, cols - 2 * n, wm, wn), dtype=img1.dtype)
        for i in prange(rows - 2 * m):
            for j in range(cols - 2 * n):
                for a in range(wm):
                    for b in range(wn):
                        out[i, j, a, b] = pair_pearson(img1, img2, i + a, j + b, i + m, j + n)
        return out

    @numba.njit(parallel=True, cache=True)
    def numba_pearson_planes(img1, img2, wm, wn):
        """The same loop for the offsets-first layout ``(wm, wn, rows, cols)``: columns innermost."""
        _, rows, cols = img1.shape
        m, n = wm // 2, wn // 2
        out = np.empty((wm, wn, rows - 2 * m, cols - 2 * n), dtype=img1.dtype)
        for i in prange(rows - 2 * m):
            for a in range(wm):
                for b in range(wn):
                    for j in range(cols - 2 * n):
                        out[a, b, i, j] = pair_pearson(img1, img2, i + a, j + b, i + m, j + n)
        return out

    @numba.njit(parallel=True, cache=True)
    def argmax_offsets(full):
        rows, cols, wm, wn = full.shape
        dy = np.empty((rows, cols), np.float32)
        dx = np.empty((rows, cols), np.float32)
        for i in prange(rows):
            for j in range(cols):
                best = -np.inf
                for a in range(wm):
                    for b in range(wn):
                        if full[i, j, a, b] > best:
                            best = full[i, j, a, b]
                            dy[i, j] = a - wm // 2
                            dx[i, j] = b - wn // 2
        return dy, dx

    return numba_pearson_map, numba_pearson_planes, argmax_offsets


def standardize_numpy(x):
    d = x - x.mean(axis=0)
    norm = np.sqrt((d * d).sum(axis=0))
    return np.where(norm > 0, d / np.where(norm > 0, norm, 1), 0)


def numpy_offset_loop(img1, img2, window):
    """A NumPy loop over the window offsets, one shifted multiply-sum over K each."""
    wm, wn = window
    m, n = wm // 2, wn // 2
    z1, z2 = standardize_numpy(img1), standardize_numpy(img2)
    rows, cols = img1.shape[1] - 2 * m, img1.shape[2] - 2 * n
    z2c = z2[:, m : m + rows, n : n + cols]
    out = np.empty((rows, cols, wm, wn), img1.dtype)
    for a in range(wm):
        for b in range(wn):
            out[:, :, a, b] = np.einsum("kij,kij->ij", z1[:, a : a + rows, b : b + cols], z2c)
    return out


def sliding_window_einsum(img1, img2, window):
    """The usual NumPy route: sliding_window_view then einsum (builds K x window x image)."""
    from numpy.lib.stride_tricks import sliding_window_view

    wm, wn = window
    m, n = wm // 2, wn // 2
    z1, z2 = standardize_numpy(img1), standardize_numpy(img2)
    windows = sliding_window_view(z1, window, axis=(1, 2))  # (K, rows, cols, wm, wn), a view
    z2c = z2[:, m : z2.shape[1] - m, n : z2.shape[2] - n]
    return np.einsum("kijab,kij->ijab", windows, z2c, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=900)
    parser.add_argument("--frames", type=int, default=10)
    parser.add_argument("--window", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-repeats", type=int, default=1)
    args = parser.parse_args()
    k, size, w = args.frames, args.size, args.window
    window = (w, w)
    rng = np.random.default_rng(0)
    img1 = rng.random((k, size, size), dtype=np.float32)
    img2 = rng.random((k, size, size), dtype=np.float32)
    inputs_mb = 2 * img1.nbytes / 2**20
    out_mb = (size - w + 1) ** 2 * w * w * 4 / 2**20
    numba_map, numba_planes, numba_argmax = numba_kernels()
    for kernel in (numba_map, numba_planes):  # compile outside the timings
        kernel(img1[:, :40, :40], img2[:, :40, :40], w, w)
        kernel(img1[:, :40, :40].astype(np.float64), img2[:, :40, :40].astype(np.float64), w, w)
    numba_argmax(np.zeros((2, 2, w, w), np.float32))

    print(
        f"K={k}, {size}x{size}, window {w}x{w}: the float32 map is {out_mb:.0f} MiB, the two inputs "
        f"{inputs_mb:.0f} MiB; {machine()}\n"
    )
    small = (slice(None), slice(0, 60), slice(0, 60))
    assert np.allclose(
        np.asarray(windowed_pearson(img1[small], img2[small], window)),
        numba_map(img1[small], img2[small], w, w),
        atol=1e-5,
    )
    assert np.allclose(
        np.asarray(windowed_pearson(img1[small], img2[small], window, offsets_first=True)),
        numba_planes(img1[small], img2[small], w, w),
        atol=1e-5,
    )

    r = args.repeats
    b = args.baseline_repeats
    rows = [
        measure("windowed_pearson float32 (ours)", lambda: windowed_pearson(img1, img2, window), repeats=r),
        measure(
            "windowed_pearson float32 offsets_first (ours)",
            lambda: windowed_pearson(img1, img2, window, offsets_first=True),
            repeats=r,
        ),
        measure("Numba prange loop float32", lambda: numba_map(img1, img2, w, w), repeats=b),
        measure("Numba prange loop float32, offsets first", lambda: numba_planes(img1, img2, w, w), repeats=b),
        measure("NumPy loop over offsets float32", lambda: numpy_offset_loop(img1, img2, window), repeats=b),
    ]
    swv_gib = k * (size - w + 1) ** 2 * w * w * 4 / 2**30
    avail_gib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    if swv_gib < avail_gib / 3:
        rows.append(
            measure(
                "sliding_window_view + einsum float32", lambda: sliding_window_einsum(img1, img2, window), repeats=b
            )
        )
        swv_note = ""
    else:
        swv_note = (
            f"sliding_window_view + einsum: not run, its K x window x image intermediate needs "
            f"{swv_gib:.1f} GiB (available: {avail_gib:.1f} GiB)"
        )
    print(table("Full map, float32", rows, "windowed_pearson float32 (ours)"))
    if swv_note:
        print(f"\n{swv_note}")
    print()

    d1, d2 = img1.astype(np.float64), img2.astype(np.float64)
    rows = [
        measure(
            "windowed_pearson float64 (ours)", lambda: windowed_pearson(img1, img2, window, dtype=np.float64), repeats=r
        ),
        measure(
            "windowed_pearson float64 offsets_first (ours)",
            lambda: windowed_pearson(img1, img2, window, dtype=np.float64, offsets_first=True),
            repeats=r,
        ),
        measure("Numba prange loop float64", lambda: numba_map(d1, d2, w, w), repeats=b),
        measure("Numba prange loop float64, offsets first", lambda: numba_planes(d1, d2, w, w), repeats=b),
    ]
    print(table("Full map, float64", rows, "windowed_pearson float64 (ours)"))
    print()

    rows = [
        measure(
            "find_displacement hessian (ours)",
            lambda: find_displacement(img1, img2, window),
            repeats=r,
            note="never builds the map",
        ),
        measure(
            "find_displacement refine (ours)",
            lambda: find_displacement(img1, img2, window, subpixel="refine"),
            repeats=r,
        ),
        measure("Numba prange loop + argmax", lambda: numba_argmax(numba_map(img1, img2, w, w)), repeats=b),
    ]
    print(table("Displacement field, float32", rows, "find_displacement hessian (ours)"))
    print(
        f"\nPeak extra memory of find_displacement: {rows[0].peak_mb:.0f} MiB = "
        f"{rows[0].peak_mb / inputs_mb:.2f}x the two inputs ({inputs_mb:.0f} MiB); target <= 3x."
    )


if __name__ == "__main__":
    main()
