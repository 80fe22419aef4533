"""Windowed Pearson maps and displacement fields: ours against the problem statement's Numba recipe.

Peers: the statement's ``@njit(parallel=True)`` recipe (float64 and float32), the same recipe with its loops
reordered, and the recipe fused into the peak search; alternating in one process.

    python -m benchmarks run correlation [--quick] [--size 900 --frames 10 --window 15 --rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import alternate, machine, ratio, start_run, table  # noqa: E402

from napari_gridmip import find_displacement, windowed_pearson  # noqa: E402

# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Every row of a table is timed in one process, alternating (``--rounds`` rounds,
each calling every row once, after a warm-up); the tables give the best and the
median, and the ratios between rows of one run are the figures to read.

The baseline is the statement's own recipe (its "Numba version, optimised"),
written here in our own code: ``@njit(fastmath=True, parallel=True)``, img1
centred and squared once, per output pixel img2's centred K-vector and its
norm, two accumulators (numerator and img1's sum of squares) per offset, a
float64 map. It is timed on float64 inputs, as the statement expects, and on
float32 inputs. Beside it, the same recipe with its loops ordered for the
offsets-first layout (columns innermost, so the two accumulators vectorise over
a row of columns: the strongest loop we found for that layout) and that loop
writing pixels first. The displacement is timed against the recipe's map plus
an argmax and the same 3x3 Hessian step as ours, and against the recipe fused
into the peak search (the strongest Numba we wrote: no map, a running argmax
per column, the 3x3 neighbourhood recomputed at the peak).
"""


def numba_kernels():
    """The Numba baselines, compiled on first call (``cache=True``: once per machine)."""
    import numba
    from numba import prange

    @numba.njit(fastmath=True, parallel=True, cache=True)
    def centre_and_square(img):
        """img's K-vectors minus their mean, and those squared: computed once, in img's dtype."""
        k, rows, cols = img.shape
        centred = np.empty_like(img)
        squared = np.empty_like(img)
        for y in prange(rows):
            for x in range(cols):
                total = 0.0
                for f in range(k):
                    total += img[f, y, x]
                mean = total / k
                for f in range(k):
                    d = img[f, y, x] - mean
                    centred[f, y, x] = d
                    squared[f, y, x] = d * d
        return centred, squared

    @numba.njit(fastmath=True, inline="always")
    def centred_row(img2, y, x0, v, norm2):
        """Per pixel of row ``y`` from column ``x0``: img2's centred K-vector into ``v[:, j]``, its squared norm."""
        k = img2.shape[0]
        for j in range(v.shape[1]):
            total = 0.0
            for f in range(k):
                total += img2[f, y, x0 + j]
            mean = total / k
            s = 0.0
            for f in range(k):
                d = img2[f, y, x0 + j] - mean
                v[f, j] = d
                s += d * d
            norm2[j] = s

    @numba.njit(fastmath=True, parallel=True, cache=True)
    def recipe_pixels_first(img1, img2, wm, wn, out):
        """The statement's loop order: per output pixel, its K-vector, then every offset (K innermost)."""
        k = img1.shape[0]
        m, n = wm // 2, wn // 2
        c1, sq1 = centre_and_square(img1)
        rows, cols = out.shape[0], out.shape[1]
        for i in prange(rows):
            v = np.empty(k, np.float64)  # one buffer per row, not per pixel
            for j in range(cols):
                total = 0.0
                for f in range(k):
                    total += img2[f, i + m, j + n]
                mean = total / k
                norm2 = 0.0
                for f in range(k):
                    d = img2[f, i + m, j + n] - mean
                    v[f] = d
                    norm2 += d * d
                for a in range(wm):
                    for b in range(wn):
                        num = 0.0
                        den = 0.0
                        for f in range(k):
                            num += c1[f, i + a, j + b] * v[f]
                            den += sq1[f, i + a, j + b]
                        out[i, j, a, b] = num / np.sqrt(den * norm2)
        return out

    @numba.njit(fastmath=True, parallel=True, cache=True)
    def recipe_by_columns(img1, img2, wm, wn, out, offsets_first):
        """The same recipe with the columns innermost: per row and offset, both accumulators over a row of columns.

        Writes ``out[a, b, i, j]`` (offsets first: contiguous rows) or ``out[i, j, a, b]``.
        """
        k = img1.shape[0]
        m, n = wm // 2, wn // 2
        c1, sq1 = centre_and_square(img1)
        rows, cols = (out.shape[2], out.shape[3]) if offsets_first else (out.shape[0], out.shape[1])
        for i in prange(rows):
            v = np.empty((k, cols), np.float64)
            norm2 = np.empty(cols, np.float64)
            num = np.empty(cols, np.float64)
            den = np.empty(cols, np.float64)
            centred_row(img2, i + m, n, v, norm2)
            for a in range(wm):
                for b in range(wn):
                    num[:] = 0.0
                    den[:] = 0.0
                    for f in range(k):
                        for j in range(cols):
                            num[j] += c1[f, i + a, j + b] * v[f, j]
                            den[j] += sq1[f, i + a, j + b]
                    if offsets_first:
                        for j in range(cols):
                            out[a, b, i, j] = num[j] / np.sqrt(den[j] * norm2[j])
                    else:
                        for j in range(cols):
                            out[i, j, a, b] = num[j] / np.sqrt(den[j] * norm2[j])
        return out

    @numba.njit(fastmath=True, inline="always")
    def hessian_step(c):
        """The Newton step on a 3x3 neighbourhood ``c`` of the peak, as ``core/peak.py`` (1D fallbacks)."""
        gy = (c[2, 1] - c[0, 1]) / 2
        gx = (c[1, 2] - c[1, 0]) / 2
        hyy = c[2, 1] - 2 * c[1, 1] + c[0, 1]
        hxx = c[1, 2] - 2 * c[1, 1] + c[1, 0]
        hxy = (c[2, 2] - c[2, 0] - c[0, 2] + c[0, 0]) / 4
        det = hyy * hxx - hxy * hxy
        if det > 0 and hyy < 0:
            dy = -(hxx * gy - hxy * gx) / det
            dx = -(hyy * gx - hxy * gy) / det
            if abs(dy) <= 1 and abs(dx) <= 1:
                return dy, dx
        dy = min(max(-gy / hyy, -0.5), 0.5) if hyy < 0 else 0.0
        dx = min(max(-gx / hxx, -0.5), 0.5) if hxx < 0 else 0.0
        return dy, dx

    @numba.njit(fastmath=True, parallel=True, cache=True)
    def argmax_hessian(full):
        """(dy, dx, peak) float32 from a pixels-first map: first maximum, NaN on the window's edge, Hessian step."""
        rows, cols, wm, wn = full.shape
        dy = np.empty((rows, cols), np.float32)
        dx = np.empty((rows, cols), np.float32)
        peak = np.empty((rows, cols), np.float32)
        for i in prange(rows):
            for j in range(cols):
                best = -np.inf
                ba = 0
                bb = 0
                for a in range(wm):
                    for b in range(wn):
                        if full[i, j, a, b] > best:
                            best = full[i, j, a, b]
                            ba = a
                            bb = b
                peak[i, j] = best
                if ba == 0 or ba == wm - 1 or bb == 0 or bb == wn - 1:
                    dy[i, j] = np.nan
                    dx[i, j] = np.nan
                else:
                    sy, sx = hessian_step(full[i, j, ba - 1 : ba + 2, bb - 1 : bb + 2])
                    dy[i, j] = ba - wm // 2 + sy
                    dx[i, j] = bb - wn // 2 + sx
        return dy, dx, peak

    @numba.njit(fastmath=True, parallel=True, cache=True)
    def recipe_displacement(img1, img2, wm, wn):
        """The recipe fused into the peak search: per row, a running argmax per column; no map is stored.

        The 3x3 neighbourhood of each pixel's peak is recomputed (9 more correlations) for the Hessian step.
        """
        k, height, width = img1.shape
        m, n = wm // 2, wn // 2
        rows, cols = height - 2 * m, width - 2 * n
        c1, sq1 = centre_and_square(img1)
        dy = np.empty((rows, cols), np.float32)
        dx = np.empty((rows, cols), np.float32)
        peak = np.empty((rows, cols), np.float32)
        for i in prange(rows):
            v = np.empty((k, cols), np.float64)
            norm2 = np.empty(cols, np.float64)
            num = np.empty(cols, np.float64)
            den = np.empty(cols, np.float64)
            best = np.full(cols, -np.inf)
            where = np.zeros(cols, np.int64)
            hood = np.empty((3, 3), np.float64)
            centred_row(img2, i + m, n, v, norm2)
            for a in range(wm):
                for b in range(wn):
                    num[:] = 0.0
                    den[:] = 0.0
                    for f in range(k):
                        for j in range(cols):
                            num[j] += c1[f, i + a, j + b] * v[f, j]
                            den[j] += sq1[f, i + a, j + b]
                    for j in range(cols):
                        c = num[j] / np.sqrt(den[j] * norm2[j])
                        if c > best[j]:
                            best[j] = c
                            where[j] = a * wn + b
            for j in range(cols):
                ba, bb = where[j] // wn, where[j] % wn
                peak[i, j] = best[j]
                if ba == 0 or ba == wm - 1 or bb == 0 or bb == wn - 1:
                    dy[i, j] = np.nan
                    dx[i, j] = np.nan
                    continue
                for p in range(3):
                    for q in range(3):
                        y, x = i + ba + p - 1, j + bb + q - 1
                        s = 0.0
                        t = 0.0
                        for f in range(k):
                            s += c1[f, y, x] * v[f, j]
                            t += sq1[f, y, x]
                        hood[p, q] = s / np.sqrt(t * norm2[j])
                sy, sx = hessian_step(hood)
                dy[i, j] = ba - m + sy
                dx[i, j] = bb - n + sx
        return dy, dx, peak

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
    def raw_sums_loop(img1, img2, wm, wn):
        """The loop earlier versions of these tables used: every pair from raw sums, no fastmath."""
        _, rows, cols = img1.shape
        m, n = wm // 2, wn // 2
        out = np.empty((rows - 2 * m, cols - 2 * n, wm, wn), dtype=img1.dtype)
        for i in prange(rows - 2 * m):
            for j in range(cols - 2 * n):
                for a in range(wm):
                    for b in range(wn):
                        out[i, j, a, b] = pair_pearson(img1, img2, i + a, j + b, i + m, j + n)
        return out

    def out_shape(img1, wm, wn, offsets_first):
        k, rows, cols = img1.shape
        pixels = (rows - 2 * (wm // 2), cols - 2 * (wn // 2))
        return (wm, wn) + pixels if offsets_first else pixels + (wm, wn)

    def statement_map(img1, img2, wm, wn, dtype=np.float64):
        return recipe_pixels_first(img1, img2, wm, wn, np.empty(out_shape(img1, wm, wn, False), dtype))

    def columns_map(img1, img2, wm, wn, offsets_first, dtype=np.float64):
        out = np.empty(out_shape(img1, wm, wn, offsets_first), dtype)
        return recipe_by_columns(img1, img2, wm, wn, out, offsets_first)

    def statement_displacement(img1, img2, wm, wn):
        return argmax_hessian(statement_map(img1, img2, wm, wn))

    return {
        "statement_map": statement_map,
        "columns_map": columns_map,
        "statement_displacement": statement_displacement,
        "fused_displacement": recipe_displacement,
        "raw_sums_loop": raw_sums_loop,
    }


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


def check(kernels, img1, img2, w):
    """Ours against every baseline on a corner: float32 to 1e-5, float64 to 1e-12; the same peaks."""
    window = (w, w)
    corner = (slice(None), slice(0, 4 * w), slice(0, 4 * w))
    s1, s2 = img1[corner], img2[corner]
    d1, d2 = s1.astype(np.float64), s2.astype(np.float64)
    reference = kernels["statement_map"](d1, d2, w, w)
    planes = np.moveaxis(reference, (2, 3), (0, 1))
    np.testing.assert_allclose(kernels["statement_map"](s1, s2, w, w), reference, rtol=0, atol=1e-5)
    np.testing.assert_allclose(kernels["columns_map"](d1, d2, w, w, False), reference, rtol=0, atol=1e-12)
    np.testing.assert_allclose(kernels["columns_map"](d1, d2, w, w, True), planes, rtol=0, atol=1e-12)
    np.testing.assert_allclose(kernels["raw_sums_loop"](d1, d2, w, w), reference, rtol=0, atol=1e-9)
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        ours = np.asarray(windowed_pearson(d1, d2, window, dtype=dtype))
        np.testing.assert_allclose(ours, reference, rtol=0, atol=tol)
        ours = np.asarray(windowed_pearson(d1, d2, window, dtype=dtype, offsets_first=True))
        np.testing.assert_allclose(ours, planes, rtol=0, atol=tol)
    ours = [np.asarray(r) for r in find_displacement(d1, d2, window, dtype=np.float64)]
    for name in ("statement_displacement", "fused_displacement"):
        theirs = kernels[name](d1, d2, w, w)
        np.testing.assert_array_equal(np.isnan(theirs[0]), np.isnan(ours[0]))
        for a, b in zip(theirs, ours):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, equal_nan=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=900)
    parser.add_argument("--frames", type=int, default=10)
    parser.add_argument("--window", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="160x160, window 9, 2 rounds: a check in seconds")
    args = parser.parse_args()
    start_run("correlation", args)
    if args.quick:
        args.size, args.window, args.rounds = 160, 9, 2
    k, size, w = args.frames, args.size, args.window
    window = (w, w)
    rng = np.random.default_rng(0)
    img1 = rng.random((k, size, size), dtype=np.float32)
    img2 = rng.random((k, size, size), dtype=np.float32)
    d1, d2 = img1.astype(np.float64), img2.astype(np.float64)
    out_values = (size - w + 1) ** 2 * w * w
    kernels = numba_kernels()
    check(kernels, img1, img2, w)  # compiles every kernel too

    print(
        f"K={k}, {size}x{size}, window {w}x{w}: the map is {out_values * 8 / 2**20:.0f} MiB in float64, "
        f"{out_values * 4 / 2**20:.0f} MiB in float32; the two inputs {2 * d1.nbytes / 2**20:.0f} MiB in float64; "
        f"{machine()}; {args.rounds} rounds, alternating\n"
    )
    statement, columns = kernels["statement_map"], kernels["columns_map"]
    rounds = args.rounds

    ours64, ours64_planes = "windowed_pearson float64 (ours)", "windowed_pearson float64 offsets_first (ours)"
    stmt64, planes64, columns64 = (
        "statement's recipe (Numba), pixels first",
        "statement's recipe (Numba), offsets first, columns innermost",
        "statement's recipe (Numba), columns innermost, pixels first",
    )
    rows64 = alternate(
        [
            (ours64, lambda: windowed_pearson(d1, d2, window, dtype=np.float64)),
            (ours64_planes, lambda: windowed_pearson(d1, d2, window, dtype=np.float64, offsets_first=True)),
            (stmt64, lambda: statement(d1, d2, w, w), "the statement's loop order"),
            (planes64, lambda: columns(d1, d2, w, w, True)),
            (columns64, lambda: columns(d1, d2, w, w, False)),
        ],
        rounds=rounds,
    )
    print(table("Full map, float64 inputs, float64 map", rows64, ours64))
    print()

    ours32, ours32_planes = "windowed_pearson float32 (ours)", "windowed_pearson float32 offsets_first (ours)"
    stmt32, planes32, columns32 = (
        "statement's recipe (Numba), pixels first, float64 map",
        "statement's recipe (Numba), offsets first, columns innermost, float32 map",
        "statement's recipe (Numba), columns innermost, pixels first, float32 map",
    )
    raw = kernels["raw_sums_loop"]
    rows = [
        (ours32, lambda: windowed_pearson(img1, img2, window)),
        (ours32_planes, lambda: windowed_pearson(img1, img2, window, offsets_first=True)),
        (stmt32, lambda: statement(img1, img2, w, w), "as the statement writes it"),
        (planes32, lambda: columns(img1, img2, w, w, True, np.float32)),
        (columns32, lambda: columns(img1, img2, w, w, False, np.float32)),
        ("raw-sums Numba loop float32 (earlier tables)", lambda: raw(img1, img2, w, w), "no fastmath"),
        ("NumPy loop over offsets float32", lambda: numpy_offset_loop(img1, img2, window)),
    ]
    swv_gib = k * (size - w + 1) ** 2 * w * w * 4 / 2**30
    avail_gib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    if swv_gib < avail_gib / 3:
        rows.append(("sliding_window_view + einsum float32", lambda: sliding_window_einsum(img1, img2, window)))
        swv_note = ""
    else:
        swv_note = (
            f"sliding_window_view + einsum: not run, its K x window x image intermediate needs "
            f"{swv_gib:.1f} GiB (available: {avail_gib:.1f} GiB)"
        )
    rows32 = alternate(rows, rounds=rounds)
    print(table("Full map, float32 inputs", rows32, ours32))
    if swv_note:
        print(f"\n{swv_note}")
    print()

    ours_disp = "find_displacement hessian (ours)"
    stmt_disp = "statement's recipe map + argmax + Hessian (Numba)"
    fused_disp = "statement's recipe fused with argmax + Hessian, no map (Numba)"
    rows_disp = alternate(
        [
            (ours_disp, lambda: find_displacement(img1, img2, window), "never builds the map"),
            ("find_displacement refine (ours)", lambda: find_displacement(img1, img2, window, subpixel="refine")),
            (stmt_disp, lambda: kernels["statement_displacement"](img1, img2, w, w), "float64 map, then the peaks"),
            (fused_disp, lambda: kernels["fused_displacement"](img1, img2, w, w), "strongest Numba we wrote"),
        ],
        rounds=rounds,
    )
    print(table("Displacement field, float32 inputs", rows_disp, ours_disp))
    inputs_mb = 2 * img1.nbytes / 2**20
    peak_mb = rows_disp[0].peak_mb
    print(
        f"\nPeak extra memory of find_displacement: {peak_mb:.0f} MiB = {peak_mb / inputs_mb:.2f}x the two inputs "
        f"({inputs_mb:.0f} MiB); target <= 3x."
    )

    print("\nTargets (ratios of best times, this run):")
    lines = [
        ("float64 map, pixels first: at least 1.5x the statement's recipe", ratio(rows64, stmt64, ours64), 1.5),
        (
            "float64 map, offsets first: at least 1.5x the statement's recipe",
            ratio(rows64, stmt64, ours64_planes),
            1.5,
        ),
        ("find_displacement: at least 6x the statement's recipe + argmax", ratio(rows_disp, stmt_disp, ours_disp), 6),
    ]
    for text, value, target in lines:
        print(f"- {text}: {value:.2f}x ({'met' if value >= target else 'MISSED'})")
    print("\nAgainst the strongest Numba loops (no target):")
    for text, value in [
        ("float64 map, offsets first, against the offsets-first loop", ratio(rows64, planes64, ours64_planes)),
        ("float64 map, pixels first, against the columns-innermost loop", ratio(rows64, columns64, ours64)),
        ("float32 map, offsets first, against the offsets-first loop", ratio(rows32, planes32, ours32_planes)),
        ("float32 map, pixels first, against the columns-innermost loop", ratio(rows32, columns32, ours32)),
        ("float32 map, pixels first, against the statement's recipe", ratio(rows32, stmt32, ours32)),
        ("find_displacement, against the fused loop", ratio(rows_disp, fused_disp, ours_disp)),
    ]:
        print(f"- {text}: {value:.2f}x")


if __name__ == "__main__":
    main()
