"""Digital image correlation: accuracy at known sub-pixel shifts, and speed against Numba loops and pyvale.

Peers: a Numba search loop (speed), a Numba IC-GN written as ncorr and DICe write theirs (``_numba_icgn.py``) and
pyvale's C++ engine (``--only peer``); accuracy against the known shifts.

    python -m benchmarks run dic [--quick] [--only accuracy|speed|real|peer|gradients]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import PeakMemory, Run, block, group, machine, measure, note, record, start_run  # noqa: E402

# -- the baseline -----------------------------------------------------------------------------------


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
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
3. Peers (``--only peer``): DIC at 1024 x 1024, subset 31, step 4: ours (refine, affine) against an IC-GN loop in
   Numba written as ncorr and DICe write theirs (``_numba_icgn.py``) and pyvale's C++ engine; warm, first call in
   a new process, RMS error against the known field, peak memory.
4. Gradients (``--only gradients``): the affine subsets' per-point gradient errors against the spread least
   squares predicts (``tests/core/correlation/subset_reference.affine_spread``), per noise level.
"""


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


NOISES = (0.005, 0.015, 0.03)  # Gaussian noise, fraction of the 8-bit range: 1.3, 3.8 and 7.7 grey levels


def _smooth_field_profile(size: int, noise: float, seed: int, prefilter) -> tuple[float, float]:
    """(RMS error of the y-averaged dx profile, its gain) for a 0.1 px sine field along x (one period across the
    image), subset 31, step 4; the truth is the field averaged over each subset (what a subset measures)."""
    from napari_gridmip import find_displacement
    from napari_gridmip._sample_data.dic import make_dic_pair

    x = np.arange(size)
    field = {"dy": 0.0, "dx": 0.1 * np.sin(2 * np.pi * x / size)[None, :] * np.ones((size, 1))}
    reference, deformed, _ = make_dic_pair((size, size), field=field, seed=seed, noise=noise)
    out = find_displacement(deformed[None], reference[None], (7, 7), subset=(31, 31), step=4, subpixel="refine",
                            prefilter=prefilter)  # fmt: skip
    dx = np.asarray(out.dx)
    cols = 3 + 15 + 4 * np.arange(dx.shape[1])
    truth = np.mean([0.1 * np.sin(2 * np.pi * (cols + k) / size) for k in range(-15, 16)], axis=0)
    profile = np.nanmean(dx, axis=0)
    return float(np.sqrt(np.mean((profile - truth) ** 2))), float(np.polyfit(truth, profile, 1)[0])


def accuracy(args) -> str:
    """Bias and spread per sub-pixel shift and noise level, the default (prefiltered) refinement against the
    unfiltered one and the Hessian step; the smooth-field profile; and a figure of the bias curves."""
    from napari_gridmip import find_displacement, track_speckles
    from napari_gridmip._sample_data.dic import make_dic_pair

    size, step = (160, 8) if args.quick else (256, 4)
    seeds = (1,) if args.quick else (1, 2, 3)
    shifts = [0.0, 0.3, 0.5] if args.quick else [round(0.1 * k, 1) for k in range(11)]
    window, subset = (7, 7), (31, 31)
    points = ((size - 36 + step - 1) // step) ** 2
    lines = [
        f"DIC bias: {size}x{size} 8-bit speckle pairs (analytic dots, Gaussian noise of the stated fraction of the "
        f"range, quantised) moved by (0, s); subset 31, window 7, step {step}; {points} points x {len(seeds)} "
        f"seeds per row; errors of dx (px); {machine()}",
        "",
        "| noise | shift s (px) | default bias | default spread | predicted spread | unfiltered refine bias "
        "| unfiltered spread | hessian bias | hessian spread |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    curves = {}
    summary = []
    for noise in NOISES:
        worst = {"default": 0.0, "unfiltered": 0.0, "hessian": 0.0}
        ratios = []
        for s in shifts:
            errors = {"default": [], "unfiltered": [], "hessian": []}
            predicted = []
            for seed in seeds:
                reference, deformed, _ = make_dic_pair((size, size), field={"dy": 0.0, "dx": s},
                                                       seed=1000 * seed + int(100 * s), noise=noise)  # fmt: skip
                img1, img2 = deformed[None], reference[None]
                runs = {
                    "default": find_displacement(img1, img2, window, subset=subset, step=step, subpixel="refine"),
                    "unfiltered": find_displacement(
                        img1, img2, window, subset=subset, step=step, subpixel="refine", prefilter=None
                    ),  # fmt: skip
                    "hessian": find_displacement(img1, img2, window, subset=subset, step=step),
                }
                for name, out in runs.items():
                    errors[name].append(np.asarray(out.dx) - s)
                tracked = track_speckles(img1, img2, window, subset=subset, step=step, prefilter="auto")
                predicted.append(float(np.nanmedian(np.asarray(tracked.sigma_dx))))
            stats = {name: (float(np.nanmean(e)), float(np.nanmean([np.nanstd(x) for x in e])))
                     for name, e in errors.items()}  # fmt: skip
            for name in worst:
                worst[name] = max(worst[name], abs(stats[name][0]))
            curves.setdefault(noise, []).append((s, stats["default"][0], stats["unfiltered"][0]))
            ratios.append(stats["default"][1] / np.mean(predicted))
            lines.append(
                f"| {100 * noise:.1f}% | {s:.1f} | {stats['default'][0]:+.4f} | {stats['default'][1]:.4f} "
                f"| {np.mean(predicted):.4f} | {stats['unfiltered'][0]:+.4f} | {stats['unfiltered'][1]:.4f} "
                f"| {stats['hessian'][0]:+.4f} | {stats['hessian'][1]:.4f} |"
            )
        profile = [_smooth_field_profile(2 * size, noise, 7 + seed, "auto") for seed in seeds]
        profile_raw = [_smooth_field_profile(2 * size, noise, 7 + seed, None) for seed in seeds]
        summary.append(
            f"| {100 * noise:.1f}% | {worst['default']:.4f} | {worst['unfiltered']:.4f} | {worst['hessian']:.4f} "
            f"| {np.mean([p[0] for p in profile]):.4f} | {np.mean([p[1] for p in profile]):.3f} "
            f"| {np.mean([p[0] for p in profile_raw]):.4f} | {np.mean([p[1] for p in profile_raw]):.3f} "
            f"| {min(ratios):.2f}-{max(ratios):.2f} |"
        )
    lines += [
        "",
        f"Per noise level: worst |bias| over the shifts, and a 0.1 px sine field along x on {2 * size}x{2 * size} "
        f"pairs (y-averaged dx profile against the subset-averaged truth: RMS error and gain, mean of "
        f"{len(seeds)} seeds); measured spread over predicted (track_speckles' sigma_dx, prefilter='auto').",
        "",
        "| noise | default worst bias | unfiltered worst bias | hessian worst bias | default profile RMS "
        "| default gain | unfiltered profile RMS | unfiltered gain | spread / predicted |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *summary,
    ]
    if args.figure:
        _bias_figure(curves, args.figure)
        lines += ["", f"Figure: {args.figure}"]
    return "\n".join(lines)


def _bias_figure(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    colours = dict(zip(NOISES, ("tab:blue", "tab:orange", "tab:red")))
    for noise, rows in curves.items():
        s, default, unfiltered = (np.array(c) for c in zip(*rows))
        ax.plot(s, unfiltered, "--", color=colours[noise], label=f"unfiltered, noise {100 * noise:.1f}%")
        ax.plot(s, default, "-o", ms=3, color=colours[noise], label=f"default (0.8 px prefilter), {100 * noise:.1f}%")
    ax.axhspan(-0.003, 0.003, color="0.9", zorder=0, label="target at 1.5%: |bias| <= 0.003 px")
    ax.axhline(0, color="0.5", lw=0.5)
    ax.set_xlabel("sub-pixel shift (px)")
    ax.set_ylabel("bias of dx (px)")
    ax.set_title("DIC refine: bias against sub-pixel shift, 8-bit speckle, subset 31")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)


def real(args) -> str:
    """Bias and spread on public real images: DIC Challenge 1.0 sample 1 ("trxy_s2", 8-bit, 512 x 512) moved by
    0.1 px steps up to 1 px along x, in the two contrast sets ("00", "10"), as published by
    jaredvanblitterswyk/image_deformation (rigid_body_translation/reu_sample1_*_upsample_10_rigid_pixel_shift:
    each image is the reference upsampled 10x, shifted and binned back, so its noise moves with the pattern)."""
    import tifffile

    from napari_gridmip import find_displacement

    root = Path(args.real_dir)
    lines = [
        "DIC on public real images (DIC Challenge 1.0 sample 1, via jaredvanblitterswyk/image_deformation): "
        f"subset 31, window 7, step 8; mean and spread of the dx error (px); {machine()}",
        "",
        "| contrast set | shift (px) | default bias | default spread | unfiltered refine bias | hessian bias |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    worst = {}
    for contrast in ("00", "10"):
        folder = root / f"reu_sample1_{contrast}_upsample_10_rigid_pixel_shift"
        reference = tifffile.imread(folder / f"trxy_s2_{contrast}_0.tiff")[None]
        for k in range(1, 11):
            moved = tifffile.imread(folder / f"trxy_s2_{contrast}_{k}.tiff")[None]
            truth = -0.1 * k  # the published images move the pattern by +0.1 k px: img1[x + dx] = img2[x]
            runs = {
                "default": find_displacement(moved, reference, (7, 7), subset=(31, 31), step=8, subpixel="refine"),
                "unfiltered": find_displacement(
                    moved, reference, (7, 7), subset=(31, 31), step=8, subpixel="refine", prefilter=None
                ),  # fmt: skip
                "hessian": find_displacement(moved, reference, (7, 7), subset=(31, 31), step=8),
            }
            errors = {name: np.asarray(out.dx) - truth for name, out in runs.items()}
            for name, e in errors.items():
                worst[name] = max(worst.get(name, 0.0), abs(float(np.nanmean(e))))
            lines.append(
                f"| {contrast} | {0.1 * k:.1f} | {np.nanmean(errors['default']):+.4f} "
                f"| {np.nanstd(errors['default']):.4f} | {np.nanmean(errors['unfiltered']):+.4f} "
                f"| {np.nanmean(errors['hessian']):+.4f} |"
            )
    lines += [
        "",
        f"Worst |bias|: default {worst['default']:.4f} px, unfiltered refine {worst['unfiltered']:.4f} px, "
        f"Hessian step {worst['hessian']:.4f} px.",
    ]
    return "\n".join(lines)


# -- gradients of the affine subsets: noise, prediction, systematic part -------------------------------------


def gradients(args) -> str:
    """Per-point errors of the affine subsets' gradients on a 3% stretch plus a 2 degree rotation (the test's
    field), against the spread least squares predicts from each subset's Gauss-Newton Hessian and residual
    (``tests/core/correlation/subset_reference.affine_spread``), per noise level; "none" is the float pair
    without noise or quantisation, "0%" the 8-bit pair without added noise (quantisation only)."""
    from napari_gridmip import find_displacement
    from napari_gridmip._sample_data import dic as dic_module
    from napari_gridmip.core.correlation.prefilter import DEFAULT_SIGMA
    from tests.core.correlation.subset_reference import affine_spread

    size, step = (160, 8) if args.quick else (256, 6)
    seeds = (1,) if args.quick else (1, 2)
    angle = np.deg2rad(2.0)
    grad = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]) @ np.diag([1.0, 1.03])
    grad = grad - np.eye(2)
    y, x = np.meshgrid(np.arange(size, dtype=float), np.arange(size, dtype=float), indexing="ij")
    c = (size - 1) / 2
    field = {"dy": grad[0, 0] * (y - c) + grad[0, 1] * (x - c), "dx": grad[1, 0] * (y - c) + grad[1, 1] * (x - c)}
    names = ("dy", "dy_y", "dy_x", "dx", "dx_y", "dx_x")
    cases = [("none", 31, "auto"), ("none", 31, None), ("0%", 31, "auto"), ("0.5%", 31, "auto"), ("0.5%", 31, None),
             ("0.5%", 41, "auto"), ("1.5%", 31, "auto")]  # fmt: skip
    lines = [
        f"Affine subsets' gradients: {size}x{size} pairs under a 3% stretch and a 2 degree rotation, window 15, "
        f"step {step}, {len(seeds)} seeds; the four gradients pooled; {machine()}",
        "",
        "| noise | subset | prefilter | mean error | spread (std) | predicted spread | spread / predicted "
        "| median abs error | max abs error | dx spread / predicted |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    original = dic_module.camera
    for noise, subset, prefilter in cases:
        errors, spreads, predicted, disp = [], [], [], []
        for seed in seeds:
            if noise == "none":
                dic_module.camera = lambda intensity, rng, noise=None: 10 + 235 * intensity
            try:
                level = None if noise == "none" else float(noise.rstrip("%")) / 100
                reference, deformed, _ = dic_module.make_dic_pair((size, size), field=field, seed=seed, noise=level)
            finally:
                dic_module.camera = original
            window = (15, 15)
            out = find_displacement(deformed[None], reference[None], window, subset=(subset, subset), step=step,
                                    subpixel="refine", shape="affine", prefilter=prefilter)  # fmt: skip
            gy = np.arange(out.dy.shape[0]) * step + window[0] // 2 + subset // 2
            gx = np.arange(out.dy.shape[1]) * step + window[1] // 2 + subset // 2
            params = np.stack([np.asarray(getattr(out, n), np.float64) for n in names], -1)
            sigma = DEFAULT_SIGMA if prefilter == "auto" else 0.0
            spread = affine_spread(deformed, reference, params, gy, gx, (subset, subset), sigma)
            truth = [field["dy"][np.ix_(gy, gx)], *grad[0], field["dx"][np.ix_(gy, gx)], *grad[1]]
            for k in (1, 2, 4, 5):
                e = params[..., k] - truth[k]
                errors.append(e.ravel())
                spreads.append(np.nanstd(e))
                predicted.append(np.nanmedian(spread[..., k]))
            disp.append(np.nanstd(params[..., 3] - truth[3]) / np.nanmedian(spread[..., 3]))
        e = np.concatenate(errors)
        ratio = np.divide(spreads, predicted)
        lines.append(
            f"| {noise} | {subset} | {prefilter or 'none'} | {np.nanmean(e):+.1e} | {np.mean(spreads):.1e} "
            f"| {np.mean(predicted):.1e} | {ratio.min():.2f}-{ratio.max():.2f} "
            f"| {np.nanmedian(np.abs(e)):.1e} | {np.nanmax(np.abs(e)):.1e} | {min(disp):.2f}-{max(disp):.2f} |"
        )
    return "\n".join(lines)


# -- 3. against the peers: IC-GN in Numba, pyvale -------------------------------------------------------

PEERS = ("ours refine", "ours affine", "Numba IC-GN translation", "Numba IC-GN affine",
         "Numba IC-GN affine, ours' tolerance", "pyvale rigid", "pyvale affine")  # fmt: skip
PEER_WINDOW, PEER_SUBSET, PEER_STEP = (21, 21), 31, 4  # bench_first_run.py's DIC row: search +-10 px


def _peer_pair(quick: bool):
    from napari_gridmip._sample_data.dic import make_dic_pair

    size = 512 if quick else 1024
    return make_dic_pair((size, size))  # the sample's field (dic_field): up to 4.6 px, strains up to 0.6%


def _peer_grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Our points (find_displacement's convention), which the Numba peer is given too."""
    first = PEER_WINDOW[0] // 2 + PEER_SUBSET // 2
    count = (size - (PEER_WINDOW[0] - 1) - (PEER_SUBSET - 1) + PEER_STEP - 1) // PEER_STEP
    points = first + PEER_STEP * np.arange(count)
    return points, points


def _peer_call(name: str, reference: np.ndarray, deformed: np.ndarray):
    """A function running method ``name`` on the pair, returning ``(dy, dx, y, x)`` (1D: the points and their
    positions on the reference)."""
    size = reference.shape[0]
    gy, gx = _peer_grid(size)
    yy, xx = (a.ravel() for a in np.meshgrid(gy, gx, indexing="ij"))
    if name.startswith("ours"):
        from napari_gridmip import find_displacement

        shape = "affine" if name.endswith("affine") else "translation"

        def call():
            out = find_displacement(deformed[None], reference[None], PEER_WINDOW, subset=(PEER_SUBSET,) * 2,
                                    step=PEER_STEP, subpixel="refine", shape=shape)  # fmt: skip
            return np.asarray(out.dy).ravel(), np.asarray(out.dx).ravel(), yy, xx

        return call
    if name.startswith("Numba"):
        from _numba_icgn import icgn_dic

        shape = "affine" if "affine" in name else "translation"
        # the brief's 1e-3 px (ncorr-like), or ours: no corner moves by 1e-4 px (float32)
        tolerance = 1e-4 if name.endswith("tolerance") else 1e-3

        def call():
            out = icgn_dic(deformed, reference, gy, gx, subset=PEER_SUBSET, radius=PEER_WINDOW[0] // 2, shape=shape,
                           tolerance=tolerance)  # fmt: skip
            return out["dy"].ravel(), out["dx"].ravel(), yy, xx

        return call
    import tempfile

    import pyvale.dic

    shape = "AFFINE" if name.endswith("affine") else "RIGID"
    folder = tempfile.mkdtemp(prefix="pyvale_")

    def call():
        # its defaults otherwise (multi-window FFT start, reliability-guided scan, bicubic B-spline, ZNSSD,
        # 5 x 5 Gaussian prefilter); the results are files, as its API writes them
        pyvale.dic.calculate_2d(reference, deformed[None], np.ones(reference.shape, bool), seed=[size // 2] * 2,
                                subset_size=PEER_SUBSET, subset_step=PEER_STEP, shape_function=shape,
                                max_displacement=PEER_WINDOW[0] // 2, output_basepath=folder, output_prefix=shape,
                                print_level=0)  # fmt: skip
        table = np.loadtxt(Path(folder) / f"{shape}def_img_0000.csv", delimiter=",", skiprows=1, usecols=range(6))
        x, y = table[:, 0].astype(int), table[:, 1].astype(int)
        dx, dy = np.where(table[:, 5] > 0, table[:, 2], np.nan), np.where(table[:, 5] > 0, table[:, 3], np.nan)
        inside = (y >= gy[0]) & (y <= gy[-1]) & (x >= gx[0]) & (x <= gx[-1])  # our points' region
        return dy[inside], dx[inside], y[inside], x[inside]

    return call


def _available(name: str) -> str | None:
    """Why ``name`` cannot run here (None: it can)."""
    import importlib.util

    module = {"Numba": "numba", "pyvale": "pyvale"}.get(name.split()[0])
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    return None


def _first_call(name: str, quick: bool) -> dict:
    """``name``'s first call in a new process with empty caches (JAX's persistent cache; Numba compiles
    without a cache): the call alone, its imports timed apart."""
    import json
    import os
    import subprocess
    import tempfile

    command = [sys.executable, __file__, "--first-call", name] + (["--quick"] if quick else [])
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NAPARI_GRIDMIP_CACHE_DIR": cache, "NUMBA_CACHE_DIR": cache}
        for key in ("JAX_COMPILATION_CACHE_DIR", "NAPARI_GRIDMIP_COMPILE_CACHE"):
            env.pop(key, None)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{name}'s first call failed: {done.stderr.strip().splitlines()[-3:]}")
    return json.loads(line[len("RESULT ") :])


def _first_call_child(name: str, quick: bool) -> None:
    import json

    reference, deformed, _ = _peer_pair(quick)
    start = time.perf_counter()
    call = _peer_call(name, reference, deformed)  # the imports
    imported = time.perf_counter() - start
    start = time.perf_counter()
    call()
    print("RESULT " + json.dumps({"import": imported, "first": time.perf_counter() - start}), flush=True)


def peer(args) -> str:
    """DIC at 1024^2 (``--quick``: 512^2), subset 31, step 4: ours (refine, affine) against a Numba IC-GN loop
    (translation, affine; :mod:`_numba_icgn`) and pyvale's C++ engine (rigid, affine): warm (best of
    ``--repeats``, alternating), first call in a new process, RMS error against the known field, peak memory."""
    from _harness import alternate

    reference, deformed, truth = _peer_pair(args.quick)
    size = reference.shape[0]
    names = [n for n in PEERS if _available(n) is None]
    missing = [f"{n}: {_available(n)}" for n in PEERS if _available(n) is not None]
    calls = {n: _peer_call(n, reference, deformed) for n in names}
    errors = {}
    for n in names:
        dy, dx, y, x = calls[n]()
        e2 = (dy - truth["dy"][y, x]) ** 2 + (dx - truth["dx"][y, x]) ** 2
        errors[n] = (float(np.sqrt(np.nanmean(e2))), float(np.isnan(e2).mean()), len(e2))
    rows = {r.name: r for r in alternate([(n, calls[n]) for n in names], rounds=args.repeats)}
    first = {n: _first_call(n, args.quick) for n in names}
    group("peers", rows.values(), "ours refine")
    for n, row in rows.items():  # the first call that counts is a new process's, its imports apart
        row.first_s = first[n]["first"]
        row.extra.update(import_s=first[n]["import"], rms_px=errors[n][0], failed=errors[n][1], points=errors[n][2])
    gy, _ = _peer_grid(size)
    lines = [
        f"DIC against the peers: {size}x{size} 8-bit pair (make_dic_pair: the sample's field, up to 4.6 px and "
        f"0.6% strain; 0.5% noise), subset {PEER_SUBSET}, step {PEER_STEP} ({len(gy)}x{len(gy)} points), "
        f"search +-{PEER_WINDOW[0] // 2} px; {machine()}",
        "",
        "| method | warm s (best of " + str(args.repeats) + ") | x ours refine | first call s (new process) "
        "| first / warm | imports s | RMS error px | failed points | points | peak extra MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = rows["ours refine"].best_s
    for n in names:
        r, f = rows[n], first[n]
        rms, failed, points = errors[n]
        lines.append(
            f"| {n} | {r.best_s:.3f} | {r.best_s / base:.2f} | {f['first']:.2f} | {f['first'] / r.best_s:.1f} "
            f"| {f['import']:.2f} | {rms:.4f} | {100 * failed:.2f}% | {points} | {r.peak_mb:.0f} |"
        )
    if missing:
        lines += ["", "Not run: " + "; ".join(missing) + "."]
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

    def best_of(name, fn, repeats):
        return measure(name, fn, repeats=repeats, group="speed", memory=False).best_s

    run_numba = numba_search()
    a2 = np.ascontiguousarray(img1[0, : band + margin])
    b2 = np.ascontiguousarray(img2[0, : band + margin])
    # compile for these very types and layouts (a strided view would compile a second version, timed)
    run_numba(np.ascontiguousarray(a2[:, :200]), np.ascontiguousarray(b2[:, :200]), subset, window, 2)
    clock = time.perf_counter()
    peak_nb, index_nb = run_numba(a2, b2, subset, window, band)
    numba_band = time.perf_counter() - clock
    # the baseline computes our definition: check on the band before timing anything else
    check = find_displacement(img1[:, : band + margin], img2[:, : band + margin], window, subset=subset,
                              subpixel="none")  # fmt: skip
    peak_ours = np.asarray(check.peak)
    assert np.nanmax(np.abs(peak_ours - peak_nb)) < 1e-4, np.nanmax(np.abs(peak_ours - peak_nb))
    repeats = args.repeats
    band_ours = best_of("ours on the Numba band", lambda: ours(band), repeats)
    full_none = best_of("find_displacement, integer peaks (ours)", lambda: ours(), repeats)
    full_hessian = best_of("find_displacement hessian (ours)", lambda: ours(subpixel="hessian"), repeats)
    full_refine = best_of("find_displacement refine (ours)", lambda: ours(subpixel="refine"), 1)
    with PeakMemory() as memory:
        ours(subpixel="hessian")
    numba_full = numba_band * out_rows / band
    record("Numba prange loop + argmax, scaled to the image", best_s=numba_full, group="speed",
           note=f"{band} rows timed once, after a compile", band_s=numba_band)  # fmt: skip
    speed_rows = [r for r in Run.active.rows if r.group == "speed"] if Run.active else []
    group("speed", speed_rows, "find_displacement, integer peaks (ours)")
    note("hessian peak extra MiB", memory.extra_mb)
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
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds to minutes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["accuracy", "speed", "real", "peer", "gradients"])
    parser.add_argument("--first-call", help=argparse.SUPPRESS)  # the child process of the peer part
    parser.add_argument("--figure", help="write the bias curves to this PNG (docs/images/dic_bias.png)")
    parser.add_argument(
        "--real-dir",
        help="a folder with the public DIC Challenge sample 1 shift series "
        "(reu_sample1_00_upsample_10_rigid_pixel_shift/ and reu_sample1_10_...; from "
        "jaredvanblitterswyk/image_deformation, rigid_body_translation/): adds the real-data table",
    )
    args = parser.parse_args()
    if args.first_call:
        _first_call_child(args.first_call, args.quick)
        return
    start_run("dic", args)
    parts = {"peer": peer, "gradients": gradients} if args.only in ("peer", "gradients") else {}
    parts = parts or {"real": real, "accuracy": accuracy, "speed": speed}
    for name, part in parts.items():
        if args.only in (None, name) and (name != "real" or args.real_dir):
            text = part(args)
            note(name, text)  # the part's table, as printed, beside its timed cases
            print(text, end="\n\n", flush=True)


if __name__ == "__main__":
    main()
