"""Digital image correlation: accuracy at known sub-pixel shifts, and speed against a Numba loop.

    python benchmarks/bench_dic.py            # full size (the docs' tables)
    python benchmarks/bench_dic.py --quick    # small, seconds to minutes

1. Accuracy: 8-bit speckle pairs (napari_gridmip._sample_data.dic: analytic Gaussian dots, shot and read
   noise, quantised) moved rigidly by 0 to 1 px in 0.1 px steps (the same shift along both axes), subset 31,
   on a grid of points (step 4): bias (mean error) and spread (standard deviation of the error) per shift,
   for ``subpixel="refine"`` (cubic B-spline interpolation of img1), the same refinement with Keys' cubic
   convolution instead (what the dense refinement uses), refine on both images smoothed first by a Gaussian of
   0.8 px (the usual remedy for the bias that noise causes when only one image is interpolated), and
   ``"hessian"``; and the spread that ``track_speckles``' ``sigma_dx`` predicts. Targets: refine's bias
   within 0.01 px, spread within 0.02 px.
2. Speed: K = 1, 2048 x 2048 float32, subset 31, window 21, step 1. The baseline is the same definition as a
   Numba loop written well: ``@njit(fastmath=True, parallel=True)``, a ``prange`` over output rows, img1's
   subset means and norms precomputed (running sums), img2's centred subset and its norm once per pixel,
   then one contiguous multiply-add loop per offset (no temporaries), first maximum kept. It is timed on a
   band of rows (its cost is the same for every row) and scaled to the image; ours on the same band and on
   the whole image. Target: at least 10x faster; memory at most 4x the two images.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import PeakMemory, block, machine  # noqa: E402

PREFILTER = 0.8  # px: the Gaussian both images are smoothed by in the "prefiltered" columns

# -- the baseline -----------------------------------------------------------------------------------


def numba_search():
    from numba import njit, prange

    @njit(fastmath=True, parallel=True, cache=True)
    def subset_stats(img, sh, sw):
        """Each subset's (top-left indexed) inverse norm of its centred values, by running sums in float64."""
        rows, cols = img.shape
        out_r, out_c = rows - sh + 1, cols - sw + 1
        inv = np.empty((out_r, out_c), np.float32)
        count = sh * sw
        for y in prange(out_r):
            col_s = np.zeros(cols)
            col_q = np.zeros(cols)
            for u in range(sh):
                for x in range(cols):
                    v = img[y + u, x]
                    col_s[x] += v
                    col_q[x] += v * v
            s = 0.0
            q = 0.0
            for x in range(sw):
                s += col_s[x]
                q += col_q[x]
            for x in range(out_c):
                if x > 0:
                    s += col_s[x + sw - 1] - col_s[x - 1]
                    q += col_q[x + sw - 1] - col_q[x - 1]
                var = q - s * s / count
                inv[y, x] = 1.0 / np.sqrt(var) if var > 1e-12 * q else 0.0
        return inv

    @njit(fastmath=True, parallel=True, cache=True)
    def search(img1, img2, inv1, sh, sw, wm, wn, rows):
        """Peak and flat offset index (a * wn + b, first maximum) of the ZNCC over the window, per pixel."""
        cols = img1.shape[1]
        m, n = wm // 2, wn // 2
        out_c = cols - (wn - 1) - (sw - 1)
        count = sh * sw
        peak = np.empty((rows, out_c), np.float32)
        index = np.empty((rows, out_c), np.int32)
        for i in prange(rows):
            z = np.empty((sh, sw), np.float32)
            for j in range(out_c):
                s = 0.0
                for u in range(sh):
                    for v in range(sw):
                        s += img2[i + m + u, j + n + v]
                mean = s / count
                q = 0.0
                for u in range(sh):
                    for v in range(sw):
                        t = img2[i + m + u, j + n + v] - mean
                        z[u, v] = t
                        q += t * t
                inv2 = 1.0 / np.sqrt(q) if q > 0 else 0.0
                best = np.float32(-np.inf)
                at = 0
                for a in range(wm):
                    for b in range(wn):
                        acc = np.float32(0.0)
                        for u in range(sh):
                            for v in range(sw):
                                acc += img1[i + a + u, j + b + v] * z[u, v]
                        r = acc * inv1[i + a, j + b] * inv2
                        if r > best:
                            best = r
                            at = a * wn + b
                peak[i, j] = best
                index[i, j] = at
        return peak, index

    def run(img1, img2, subset, window, rows):
        inv1 = subset_stats(img1, *subset)
        return search(img1, img2, inv1, subset[0], subset[1], window[0], window[1], rows)

    return run


# -- 1. accuracy ------------------------------------------------------------------------------------


def accuracy(args) -> str:
    from scipy import ndimage

    from napari_gridmip import find_displacement, track_speckles
    from napari_gridmip._sample_data.dic import make_dic_pair
    from napari_gridmip.core.correlation import subsets

    size, step = (128, 8) if args.quick else (256, 4)
    shifts = [0.0, 0.3, 0.5] if args.quick else [round(0.1 * k, 1) for k in range(11)]
    window, subset = (7, 7), (31, 31)
    lines = [
        f"DIC accuracy: {size}x{size} 8-bit speckle pairs moved by (s, s), subset 31, window 7, step {step}; "
        f"errors of dx (px) over {((size - 36 + step - 1) // step) ** 2} points; {machine()}",
        "",
        "| shift s (px) | refine bias | refine spread | predicted spread | prefiltered bias | prefiltered spread "
        "| Keys refine bias | hessian bias | hessian spread |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    worst_bias = worst_spread = worst_filtered = 0.0
    for s in shifts:
        reference, deformed, _ = make_dic_pair((size, size), field={"dy": s, "dx": s}, seed=int(100 * s) + 1)
        refine = find_displacement(deformed[None], reference[None], window, subset=subset, step=step,
                                   subpixel="refine")  # fmt: skip
        hessian = find_displacement(deformed[None], reference[None], window, subset=subset, step=step)
        keys = subsets.run(deformed[None], reference[None], window, subset, step, method="refine", track=False,
                           dtype=np.dtype(np.float32), interpolation="keys")  # fmt: skip
        tracked = track_speckles(deformed[None], reference[None], window, subset=subset, step=step)
        smooth = [ndimage.gaussian_filter(x.astype(np.float32), PREFILTER)[None] for x in (deformed, reference)]
        filtered = find_displacement(*smooth, window, subset=subset, step=step, subpixel="refine")
        e_filtered = np.asarray(filtered.dx) - s
        e_refine = np.asarray(refine.dx) - s
        e_hessian = np.asarray(hessian.dx) - s
        predicted = float(np.nanmedian(np.asarray(tracked.sigma_dx)))
        bias, spread = float(np.nanmean(e_refine)), float(np.nanstd(e_refine))
        worst_bias, worst_spread = max(worst_bias, abs(bias)), max(worst_spread, spread)
        lines.append(
            f"| {s:.1f} | {bias:+.4f} | {spread:.4f} | {predicted:.4f} | {np.nanmean(e_filtered):+.4f} "
            f"| {np.nanstd(e_filtered):.4f} | {np.nanmean(np.asarray(keys[1]) - s):+.4f} "
            f"| {np.nanmean(e_hessian):+.4f} | {np.nanstd(e_hessian):.4f} |"
        )
        worst_filtered = max(worst_filtered, abs(float(np.nanmean(e_filtered))))
    lines += [
        "",
        f"refine: worst |bias| {worst_bias:.4f} px (target 0.01), worst spread {worst_spread:.4f} px (target 0.02); "
        f"on images pre-filtered by a Gaussian of sigma {PREFILTER} px, worst |bias| {worst_filtered:.4f} px",
    ]
    return "\n".join(lines)


# -- 2. speed ---------------------------------------------------------------------------------------


def speed(args) -> str:
    from napari_gridmip import find_displacement

    size = 512 if args.quick else 2048
    band = 4 if args.quick else 16
    window, subset = (21, 21), (31, 31)
    rng = np.random.default_rng(0)
    from napari_gridmip._sample_data.dic import make_dic_pair

    reference, deformed, _ = make_dic_pair((size, size), field={"dy": 0.4, "dx": -0.7})
    img1 = deformed.astype(np.float32)[None]
    img2 = reference.astype(np.float32)[None]
    del rng
    margin = (window[0] - 1) + (subset[0] - 1)
    out_rows = size - margin

    def ours(rows=None, subpixel="none"):
        a, b = (img1, img2) if rows is None else (img1[:, : rows + margin], img2[:, : rows + margin])
        return block(tuple(find_displacement(a, b, window, subset=subset, subpixel=subpixel)))

    def best_of(fn, repeats):
        fn()  # warm-up: compiles
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    run_numba = numba_search()
    a2 = np.ascontiguousarray(img1[0, : band + margin])
    b2 = np.ascontiguousarray(img2[0, : band + margin])
    # compile for these very types and layouts (a strided view would compile a second version, timed)
    run_numba(np.ascontiguousarray(a2[:, :200]), np.ascontiguousarray(b2[:, :200]), subset, window, 2)
    start = time.perf_counter()
    peak_nb, index_nb = run_numba(a2, b2, subset, window, band)
    numba_band = time.perf_counter() - start
    # the baseline computes our definition: check on the band before timing anything else
    check = find_displacement(img1[:, : band + margin], img2[:, : band + margin], window, subset=subset,
                              subpixel="none")  # fmt: skip
    peak_ours = np.asarray(check.peak)
    assert np.nanmax(np.abs(peak_ours - peak_nb)) < 1e-4, np.nanmax(np.abs(peak_ours - peak_nb))
    repeats = args.repeats
    band_ours = best_of(lambda: ours(band), repeats)
    full_none = best_of(lambda: ours(), repeats)
    full_hessian = best_of(lambda: ours(subpixel="hessian"), repeats)
    full_refine = best_of(lambda: ours(subpixel="refine"), 1)
    with PeakMemory() as memory:
        ours(subpixel="hessian")
    numba_full = numba_band * out_rows / band
    images_mib = 2 * img1.nbytes / 2**20
    uint8_mib = 2 * reference.nbytes / 2**20
    lines = [
        f"DIC speed: K=1, {size}x{size} float32, subset 31, window 21, step 1 ({out_rows}x{out_rows} points); "
        f"{machine()}",
        "",
        "| method | rows timed | time s | full image s | x ours |",
        "|---|---:|---:|---:|---:|",
        f"| find_displacement, integer peaks (ours) | {out_rows} | {full_none:.2f} | {full_none:.2f} | 1.00 |",
        f"| find_displacement hessian (ours) | {out_rows} | {full_hessian:.2f} | {full_hessian:.2f} "
        f"| {full_hessian / full_none:.2f} |",
        f"| find_displacement refine (ours) | {out_rows} | {full_refine:.2f} | {full_refine:.2f} "
        f"| {full_refine / full_none:.2f} |",
        f"| ours on the Numba band | {band} | {band_ours:.2f} | {band_ours * out_rows / band:.2f} (scaled) "
        f"| {band_ours * out_rows / band / full_none:.2f} |",
        f"| Numba prange loop + argmax | {band} | {numba_band:.2f} | {numba_full:.1f} (scaled) "
        f"| {numba_full / full_none:.1f} |",
        "",
        f"Speed-up over the Numba loop: {numba_full / full_none:.1f}x (integer peaks, the same computation), "
        f"{numba_full / full_hessian:.1f}x with our Hessian step; on the same band {numba_band / band_ours:.1f}x. "
        "Target: at least 10x.",
        f"Peak extra memory of find_displacement hessian: {memory.extra_mb:.0f} MiB = "
        f"{memory.extra_mb / images_mib:.2f}x the two float32 images ({images_mib:.0f} MiB; "
        f"{memory.extra_mb / uint8_mib:.1f}x the two 8-bit files, {uint8_mib:.0f} MiB), outputs included. "
        "Target: at most 4x.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds to minutes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["accuracy", "speed"])
    args = parser.parse_args()
    if args.only != "speed":
        print(accuracy(args), end="\n\n", flush=True)
    if args.only != "accuracy":
        print(speed(args), flush=True)


if __name__ == "__main__":
    main()
