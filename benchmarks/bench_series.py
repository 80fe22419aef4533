"""DIC of whole sequences (``correlate_series``): accuracy on sequences with known truth, and time per frame.

Peers: one affine pair of the same size (time per frame), pyvale and DICe's stored solution on a real sequence
(``--only real``), muDIC's global DIC (``--only mudic``), and pyvale (its default and incremental modes) and muDIC
side by side with ours on the same sequences, each method's error against the truth beside its time
(``--only peers``).

    python -m benchmarks run series [--quick] [--only accuracy|speed|real|mudic|peers] [--real-dir FOLDER]
        [--peers pyvale,mudic] [--mudic-element PX]
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from importlib import metadata
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import group, machine, measure, note, record, start_run  # noqa: E402

import napari_gridmip as gm  # noqa: E402
from napari_gridmip._sample_data.dic_series import KINDS, make_dic_series, true_displacement  # noqa: E402
from napari_gridmip.core.correlation.status import Status  # noqa: E402

SUBSET, STEP = 31, 8


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
1. Accuracy (``--only accuracy``): the four synthetic sequences of ``napari_gridmip._sample_data.dic_series``
   (8-bit camera noise; a drift out of view and back, a speckled disk turning a full turn in 20 degree steps
   inside its mask, a plate with a hole under growing tension, a stretch growing to 25%), subset 31, step 8,
   under each reference policy. Per frame: the points valid, those whose subset is in view (the truth says),
   the median and 95th percentile of the error of the valid points, the share of in-view points within
   0.05 px, and the points wrong but finite (error above 1 px), which must be 0.
2. Speed (``--only speed``): warm time per frame of a 256^2 (and 512^2) sequence against the warm time of one
   affine pair of the same size (``find_displacement(..., subset=(31, 31), step=8, subpixel="refine",
   shape="affine")``, window 11), in one process, best of several; and the first call (compiles) beside it.
3. A real sequence (``--only real --real-dir FOLDER``; skipped without a folder; nothing is downloaded): Ncorr's
   open-hole tension CFRP sample (DIC Challenge 2D sample 12), ``ohtcfrp_00`` ... ``ohtcfrp_11`` (.png/.tif) and
   ``roi.png``/``roi.tif`` in FOLDER. Ours (subset 31, step 8, the ROI, accumulated) against pyvale run here with
   the same subset, step, ROI and reference frame (its points fall on our grid: compared point by point), per
   frame: the RMS of the difference, at whole subsets and at subsets reaching into the hole, the share of our
   ROI points valid, the time per frame of each. Where FOLDER also holds DICe's stored solution
   (``DICe_solution_NN.txt``, DICe's regression case dic_challenge_12), ours is run at DICe's subset on DICe's
   points (the frames cropped so our grid falls on them) and compared there, and pyvale's field beside it.
4. muDIC (``--only mudic``; ``pip install mudic``): the growing-stretch sequence (256^2, 8 frames, to 25%), where
   muDIC's global (finite-element) DIC needs no large-motion start: its warm time per frame (a mesh of 8 x 8
   cubic B-spline elements over the centre, its defaults otherwise) and its RMS error against the truth at its
   21 x 21 evaluation points, beside ours (subset 31, step 8) on the same frames, RMS over our valid points.
5. Side by side (``--only peers``, ``--peers pyvale,mudic`` to choose; ``pip install -e .[bench]``): 8-frame
   sequences of the samples' analytic speckle seen through the exact inverse map, with the samples' camera (shot and
   read noise, 8 bits): a drift of (1.37, 2.71) px a frame, and a turn of 4 degrees a frame about the centre; 256^2
   and 512^2 (``--quick``: 128^2, 5 frames, one warm call). Subset 31, step 8 for every method: ``correlate_series``
   (its defaults: accumulated); pyvale's ``dic.calculate_2d`` on the same grid (its subset centres are our points)
   against frame 0 (its default; a call that raises is redone frame by frame, its time with the failed call's) and
   with ``incremental_update="IMAGE"`` every frame (one call; a raise loses the sequence), ``max_displacement``
   min(64, size / 4), its defaults otherwise (ZNCC threshold 0.9, nothing written below it); muDIC's global DIC on a
   Q4 mesh whose nodes are our points every ``--mudic-element`` px (default 16), its defaults otherwise (a frame
   that does not converge is kept). Each method's first call and best warm call of the whole sequence
   (``--repeats``), one group per sequence with ours as the reference; per frame, the median and 99th percentile
   error where it and ours both find a point (ours' on the same points beside), its share of the in-view points (the
   subset's corners, carried by the true motion, inside the frame) found, and its finite values off by more than 0.1
   px: a value a method cannot stand behind must be NaN. Ours' first call compiles only on the first sequence of
   each size (the same programs serve the second).
"""


def _frame_rows(result, truth, frames_shape, subset) -> list[dict]:
    tdy, tdx = true_displacement(truth["maps"], result.y, result.x)
    gy, gx = np.meshgrid(result.y, result.x, indexing="ij")
    half = subset // 2
    error = np.hypot(result.dy - tdy, result.dx - tdx)
    rows = []
    usable = result.status[0] == Status.ok
    roi_points = truth["roi"][gy.astype(int), gx.astype(int)]
    for t in range(len(error)):
        ok = result.status[t] == Status.ok
        # in view: the subset's four corners, carried by the true motion, inside the frame
        in_view = usable.copy()
        for cy, cx in ((-half, -half), (-half, half), (half, -half), (half, half)):
            qy, qx = truth["maps"][t](gy + cy, gx + cx)
            in_view &= (qy >= 0) & (qy <= frames_shape[1] - 1) & (qx >= 0) & (qx <= frames_shape[2] - 1)
        e = error[t][ok]
        rows.append(
            dict(
                frame=t,
                valid=int(ok.sum()),
                roi=int(roi_points.sum()),
                in_view=int(in_view.sum()),
                median=float(np.median(e)) if e.size else np.nan,
                p95=float(np.percentile(e, 95)) if e.size else np.nan,
                within=float(np.mean(ok[in_view] & (error[t][in_view] <= 0.05))) if in_view.any() else np.nan,
                wrong=int(np.sum(ok & (error[t] > 1))),
                out_wrong=int(np.sum(ok & ~in_view & (error[t] > 1))),
            )
        )
    return rows


def accuracy(args) -> str:
    shape = (128, 128) if args.quick else (256, 256)
    lines = [
        f"DIC series accuracy: {shape[0]}x{shape[1]} 8-bit sequences with known motion (napari_gridmip._sample_data."
        f"dic_series), subset {SUBSET}, step {STEP}; {machine()}",
        "",
    ]
    for kind in KINDS:
        frames_n = {"translation": 7, "rotation": 19}.get(kind, 8)
        if args.quick:
            frames_n = min(frames_n, 5)
        frames, truth = make_dic_series(kind, frames=frames_n, shape=shape)
        roi = truth["roi"] if kind in ("rotation", "hole") else None
        for reference in ("accumulated", "incremental", "auto"):
            start = time.perf_counter()
            result = gm.correlate_series(frames, subset=SUBSET, step=STEP, roi=roi, reference=reference)
            seconds = time.perf_counter() - start
            rows = _frame_rows(result, truth, frames.shape, SUBSET)
            record(f"{kind}, reference={reference}", first_s=seconds, group="accuracy", note="one call, compiled",
                   worst_p95_px=max((r["p95"] for r in rows[1:]), default=None), frames=len(frames))  # fmt: skip
            lines += [
                f"#### {kind}, reference={reference} ({len(frames)} frames, {seconds:.1f} s with compiles)",
                "",
                "| frame | valid | points in ROI | in view | median err px | p95 err px | in view within 0.05 px "
                "| wrong > 1 px | of them out of view |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for r in rows:
                lines.append(
                    f"| {r['frame']} | {r['valid']} | {r['roi']} | {r['in_view']} | {r['median']:.4f} | "
                    f"{r['p95']:.4f} | {100 * r['within']:.1f}% | {r['wrong']} | {r['out_wrong']} |"
                )
            worst = max((r["p95"] for r in rows[1:]), default=np.nan)
            lines += [
                "",
                f"Worst p95 {worst:.4f} px; wrong and finite: {sum(r['wrong'] for r in rows)}; lowest valid share "
                f"of ROI points {min(r['valid'] / max(r['roi'], 1) for r in rows):.2f}.",
                "",
            ]
    return "\n".join(lines)


def speed(args) -> str:
    lines = [f"DIC series speed: warm time per frame against one affine pair of the same size; {machine()}", ""]
    lines += [
        "| sequence | series warm s | per frame s | pair warm s | per frame / pair | series first call s | peak MiB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    sizes = (128,) if args.quick else tuple(int(n) for n in args.sizes.split(","))
    count = 6
    for size in sizes:
        # the ROI disk turning 20 degrees a frame (jumps: the whole-image estimate), and speckle to the frame's
        # edges turning 4 degrees or drifting (1.37, 2.71) px a frame (the carried guesses)
        sequences = [("rotation 20 deg/frame, ROI", *make_dic_series("rotation", frames=count, shape=(size, size)))]
        for kind, name in (("rotation", "rotation 4 deg/frame"), ("translation", "translation")):
            frames, _ = peer_sequence(kind, count, (size, size))
            sequences.append((name, frames, {"roi": None}))
        for name, frames, truth in sequences:

            def whole(frames=frames, roi=truth["roi"]):
                return gm.correlate_series(frames, subset=SUBSET, step=STEP, roi=roi)

            series = measure(f"correlate_series, {count} frames of {size}^2, {name} (ours)", whole,
                             repeats=args.repeats)  # fmt: skip
            first, best = series.first_s, series.best_s
            img1, img2 = frames[1][None].astype(np.float32), frames[0][None].astype(np.float32)

            def pair(img1=img1, img2=img2):
                return gm.find_displacement(
                    img1, img2, (11, 11), subset=(SUBSET, SUBSET), step=STEP, subpixel="refine", shape="affine"
                )

            one_pair = measure(f"find_displacement, one affine pair of {size}^2, {name}", pair,
                               repeats=args.repeats, memory=False)  # fmt: skip
            pair_best = one_pair.best_s
            per_frame = best / (count - 1)
            series.extra["per_frame_s"] = per_frame
            group(f"{count} x {size}^2 {name}", [series, one_pair], one_pair.name)
            lines.append(
                f"| {count} x {size}^2, {name} | {best:.3f} | {per_frame:.3f} | {pair_best:.3f} | "
                f"{per_frame / pair_best:.2f} | {first:.2f} | {series.peak_mb:.0f} |"
            )
    lines += ["", "Target: a frame after the first at most 1.5x the warm time of one pair (ratio <= 1.5)."]
    return "\n".join(lines)


# -- 3. a real sequence against another DIC code ------------------------------------------------------------


def _read_image(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image)


def _read_real(folder: Path) -> tuple[np.ndarray, np.ndarray, list[str], dict[int, np.ndarray], dict]:
    """The frames ``ohtcfrp_NN`` (or DICe's ``oht_cfrp_NN``; .png, .tif, .tiff) in their order, the ROI
    (``roi.png``/``roi.tif``: nonzero in its first channel), the file names, and DICe's solutions
    ``DICe_solution_NN.txt`` where the folder has them (frame -> rows of x, y, u, v) with their header's settings."""
    import re

    files = {}
    for path in folder.iterdir():
        match = re.fullmatch(r"oht_?cfrp_(\d+)\.(png|tiff?)", path.name, flags=re.IGNORECASE)
        if match:
            files.setdefault(int(match.group(1)), path)
    if len(files) < 2 or sorted(files) != list(range(len(files))):
        raise SystemExit(f"--real-dir {folder}: ohtcfrp_00 ... ohtcfrp_NN (.png/.tif) not found there")
    frames = np.stack([_read_image(files[t]) for t in sorted(files)])
    if frames.ndim == 4:  # a colour file: its first channel
        frames = frames[..., 0]
    roi_path = next((folder / n for n in ("roi.png", "roi.tif", "roi.tiff") if (folder / n).exists()), None)
    if roi_path is None:
        raise SystemExit(f"--real-dir {folder}: no roi.png / roi.tif")
    roi = _read_image(roi_path)
    roi = (roi[..., 0] if roi.ndim == 3 else roi) > 0
    dice, header = {}, {}
    for path in sorted(folder.glob("DICe_solution_*.txt")):
        lines = path.read_text().splitlines()
        for line in lines:
            if line.startswith("***") and ":" in line:
                key, _, value = line[3:].partition(":")
                header[key.strip()] = value.strip()
        columns = next(line.split(",") for line in lines if line.startswith("COORDINATE_X"))
        rows = np.array([[float(v) for v in line.split(",")] for line in lines if line[:1] not in ("*", "C", "")])
        pick = [columns.index(c) for c in ("COORDINATE_X", "COORDINATE_Y", "DISPLACEMENT_X", "DISPLACEMENT_Y")]
        dice[int(path.stem.rsplit("_", 1)[1])] = rows[:, pick]
    return frames, roi, [files[t].name for t in sorted(files)], dice, header


def _pyvale_frame(reference, frame, roi, seed, folder, subset, step, partial):
    """pyvale's 2D DIC of one frame against the reference: ``(x, y, dx, dy)`` of its converged points, and the
    seconds of the call (its results are files, as its API writes them)."""
    import pyvale.dic

    start = time.perf_counter()
    # its defaults otherwise: multi-window FFT start and reliability-guided scan, bicubic B-spline, ZNSSD,
    # 5 x 5 Gaussian prefilter (sigma 1), correlation threshold 0.9; reference frame 0 (no incremental update)
    pyvale.dic.calculate_2d(reference, frame[None], roi, seed=list(seed), subset_size=subset, subset_step=step,
                            shape_function="AFFINE", max_displacement=32, partial_subset=partial,
                            output_basepath=folder, output_prefix="real_", print_level=0)  # fmt: skip
    seconds = time.perf_counter() - start
    table = np.loadtxt(Path(folder) / "real_def_img_0000.csv", delimiter=",", skiprows=1, usecols=range(7), ndmin=2)
    table = table[table[:, 5] > 0]
    return table[:, :4], seconds


def _at(result, x, y, t, offset=(0, 0)):
    """Our ``(dx, dy)`` in frame ``t`` at reference points ``(x, y)`` that lie on the grid (NaN where not)."""
    gy, gx = result.y + offset[0], result.x + offset[1]
    i = np.clip(np.searchsorted(gy, y), 0, len(gy) - 1)
    j = np.clip(np.searchsorted(gx, x), 0, len(gx) - 1)
    on = (gy[i] == y) & (gx[j] == x)
    dx = np.where(on, result.dx[t][i, j], np.nan)
    dy = np.where(on, result.dy[t][i, j], np.nan)
    return dx, dy, on


def real(args) -> str:
    """Ncorr's open-hole tension CFRP sequence (DIC Challenge sample 12), read from ``--real-dir``: ours
    (subset 31, step 8, its ROI, accumulated) against pyvale run here with the same settings, point by point,
    and against DICe's stored solution at DICe's own points and subset."""
    import importlib.util
    import tempfile

    from scipy import interpolate, ndimage

    if not args.real_dir:
        return "Real sequence: not run (give --real-dir FOLDER with ohtcfrp_00 ... and roi.png/roi.tif)."
    folder = Path(args.real_dir)
    frames, roi, names, dice, header = _read_real(folder)
    count = len(frames)
    repeats = max(1, args.repeats)
    # the hole: the part outside the ROI that does not touch the frame's border
    labels, _ = ndimage.label(~roi)
    border = np.unique(np.r_[labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    hole = (labels > 0) & ~np.isin(labels, border)
    to_hole = ndimage.distance_transform_edt(~hole) if hole.any() else np.full(roi.shape, np.inf)
    to_edge = ndimage.distance_transform_edt(roi)  # from a ROI pixel to the nearest pixel outside it

    # ours: a first call (compiles), then warm calls; per frame the least time between two progress calls
    start = time.perf_counter()
    ours = gm.correlate_series(frames, subset=SUBSET, step=STEP, roi=roi)
    first = time.perf_counter() - start
    per_frame = np.full(count, np.inf)
    for _ in range(repeats):
        stamps = [time.perf_counter()]

        def stamp(done, total, stamps=stamps):
            stamps.append(time.perf_counter())

        ours = gm.correlate_series(frames, subset=SUBSET, step=STEP, roi=roi, progress=stamp)
        per_frame = np.minimum(per_frame, np.diff(stamps))
    gy, gx = np.meshgrid(ours.y.astype(int), ours.x.astype(int), indexing="ij")
    in_roi = roi[gy, gx]
    record("correlate_series (ours), a frame", best_s=float(np.median(per_frame[1:])), first_s=first,
           group="real sequence", reference="correlate_series (ours), a frame", note="median over frames of the "
           "best of --repeats", times_s_per_frame=per_frame.tolist())  # fmt: skip

    # pyvale, one call per frame against frame 0 (its time per frame), the same subset, step and ROI; subsets
    # down to half inside the ROI (partial_subset 0.5, as our min_inside) so that it reports the hole's edge too
    have_pyvale = importlib.util.find_spec("pyvale") is not None
    peer, peer_s = {}, np.full(count, np.nan)
    if have_pyvale:
        seed = np.unravel_index(np.argmax(to_edge * (to_hole > SUBSET)), roi.shape)[::-1]  # (x, y) deep inside
        with tempfile.TemporaryDirectory(prefix="pyvale_") as tmp:
            for t in range(1, count):
                best = np.inf
                for _ in range(repeats):
                    peer[t], seconds = _pyvale_frame(frames[0], frames[t], roi, seed, tmp, SUBSET, STEP, 0.5)
                    best = min(best, seconds)
                peer_s[t] = best
        record("pyvale, a frame against frame 0", best_s=float(np.nanmedian(peer_s[1:])), group="real sequence",
               reference="correlate_series (ours), a frame", note="median over frames of the best of --repeats",
               times_s_per_frame=peer_s.tolist())  # fmt: skip

    # ours at DICe's settings: its subset, its points (a regular grid: the frames cropped so ours falls on it)
    dice_ours, dice_s, dsub, dstep, oy, ox = None, np.nan, 0, 0, 0, 0
    if dice:
        dsub = int(header.get("Subset size", 27))
        px, py = dice[min(dice)][:, 0], dice[min(dice)][:, 1]
        dstep = int(np.diff(np.unique(px)).min())
        half = dsub // 2
        oy, ox = int(py.min() - half) % dstep, int(px.min() - half) % dstep
        start = time.perf_counter()
        dice_ours = gm.correlate_series(frames[:, oy:, ox:], subset=dsub, step=dstep, roi=roi[oy:, ox:])
        dice_s = time.perf_counter() - start

    # the same with subsets down to 30% inside the (eroded) ROI: does a lower min_inside bring the ROI's edge in?
    edge = gm.correlate_series(frames, subset=SUBSET, step=STEP, roi=roi, min_inside=0.3)
    edge_valid = [int(((edge.status[t] == Status.ok) & in_roi).sum()) for t in range(count)]
    edge_rms, edge_n = [], []
    for t in peer:
        x, y, u, v = peer[t].T
        dx, dy, _ = _at(edge, x, y, t)
        e = np.hypot(dx - u, dy - v)
        edge_rms.append(float(np.sqrt(np.nanmean(e**2))))
        edge_n.append(int(np.isfinite(e).sum()))

    rows = []
    for t in range(count):
        ok = ours.status[t] == Status.ok
        r = dict(frame=t, disp=float(np.nanmax(np.hypot(ours.dy[t], ours.dx[t]))), valid=int((ok & in_roi).sum()),
                 roi=int(in_roi.sum()), ours_s=per_frame[t], peer_s=peer_s[t])  # fmt: skip
        if t in peer:
            x, y, u, v = peer[t].T
            dx, dy, on = _at(ours, x, y, t)
            assert on.all(), "pyvale's points are off our grid"
            e = np.hypot(dx - u, dy - v)
            both = np.isfinite(e)
            xi, yi = x.astype(int), y.astype(int)
            full = both & (to_edge[yi, xi] > SUBSET // 2)  # subsets wholly inside the ROI
            near = both & (to_hole[yi, xi] <= SUBSET // 2)  # subsets that reach into the hole
            r.update(peer_points=len(x), both=int(both.sum()), rms=float(np.sqrt(np.mean(e[both] ** 2))),
                     rms_full=float(np.sqrt(np.mean(e[full] ** 2))), rms_hole=float(np.sqrt(np.mean(e[near] ** 2))),
                     n_hole=int(near.sum()), max=float(e[both].max()),
                     worst_hole=float(to_hole[yi[both], xi[both]][np.argmax(e[both])]))  # fmt: skip
        if t in dice:
            x, y, u, v = dice[t].T
            dx, dy, on = _at(dice_ours, x, y, t, offset=(oy, ox))
            e = np.hypot(dx - u, dy - v)
            both = np.isfinite(e)
            r.update(dice_points=len(x), dice_both=int(both.sum()), dice_rms=float(np.sqrt(np.mean(e[both] ** 2))),
                     dice_mean=(float(np.mean((dx - u)[both])), float(np.mean((dy - v)[both]))))  # fmt: skip
            if t in peer:  # pyvale's field at DICe's points: Clough-Tocher cubic over its points' triangles
                pts = peer[t][:, [1, 0]]
                pu = interpolate.griddata(pts, peer[t][:, 2], np.c_[y, x], method="cubic")
                pv = interpolate.griddata(pts, peer[t][:, 3], np.c_[y, x], method="cubic")
                pe = np.hypot(pu - u, pv - v)
                r.update(pv_dice_rms=float(np.sqrt(np.nanmean(pe**2))), pv_dice_n=int(np.isfinite(pe).sum()))
        rows.append(r)

    shape = f"{frames.shape[1]}x{frames.shape[2]}"
    lines = [
        f"Real sequence: {count} frames {shape} {frames.dtype} ({names[0]} ... {names[-1]}, {folder}), ROI with a "
        f"hole; ours: correlate_series(frames, subset={SUBSET}, step={STEP}, roi=roi) (accumulated), "
        f"{ours.dy.shape[1]}x{ours.dy.shape[2]} points, {int(in_roi.sum())} with their centre in the ROI; {machine()}",
        "",
    ]
    if not have_pyvale:
        lines += ["pyvale is not installed (pip install pyvale): no peer run.", ""]
    lines += [
        "| frame | max disp px | ours valid / ROI points | pyvale points (both) | RMS diff px | RMS, whole subsets "
        "| RMS, subsets into the hole (n) | max diff px (px from the hole) | ours s/frame | pyvale s/frame "
        "| DICe points (both) | RMS ours - DICe px | RMS pyvale - DICe px |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(r, key, fmt=".4f"):
        return format(r[key], fmt) if key in r else "-"

    for r in rows:
        lines.append(
            f"| {r['frame']} | {r['disp']:.2f} | {r['valid']} / {r['roi']} ({100 * r['valid'] / r['roi']:.1f}%) "
            f"| {r.get('peer_points', '-')} ({r.get('both', '-')}) | {f(r, 'rms')} | {f(r, 'rms_full')} "
            f"| {f(r, 'rms_hole')} ({r.get('n_hole', '-')}) | {f(r, 'max', '.3f')} ({f(r, 'worst_hole', '.0f')}) "
            f"| {r['ours_s']:.2f} "
            f"| {'-' if np.isnan(r['peer_s']) else format(r['peer_s'], '.2f')} "
            f"| {r.get('dice_points', '-')} ({r.get('dice_both', '-')}) | {f(r, 'dice_rms')} | {f(r, 'pv_dice_rms')} |"
        )
    later = rows[1:]
    lost = np.unique(ours.status[:, in_roi][:, ~(ours.status[0][in_roi] == Status.ok)])
    never = in_roi & (ours.status[0] != Status.ok)
    lines += [
        "",
        f"Ours: first call {first:.1f} s (compiles); warm {np.sum(per_frame):.1f} s for the {count} frames "
        f"(frame 0 is the reference's set-up), best of {repeats}. pyvale: one call per frame, best of {repeats}.",
        f"Worst RMS against pyvale {max((r.get('rms', np.nan) for r in later), default=np.nan):.4f} px "
        f"(target <= 0.02 in every frame); lowest valid share "
        f"{min(r['valid'] / r['roi'] for r in rows):.3f} (target >= 0.95).",
        f"ROI points never started (status {', '.join(Status(s).name for s in lost)}): {int(never.sum())}, their "
        f"centres at most {to_edge[gy, gx][never].max() if never.any() else 0:.1f} px inside the ROI's edge; "
        f"a point found in frame 0 and lost later: "
        f"{int(np.sum((ours.status[0] == Status.ok) & (ours.status != Status.ok).any(0)))}.",
    ]
    if edge_rms:
        lines.append(
            f"With min_inside=0.3 (a subset may have 30% of its pixels in the ROI less its edge band): lowest "
            f"valid share {min(edge_valid) / int(in_roi.sum()):.3f}; RMS against pyvale worst {max(edge_rms):.4f} "
            f"px over {min(edge_n)} to {max(edge_n)} common points."
        )
    if dice:
        lines.append(
            f"DICe's stored solution: subset {dsub}, step {dstep}, shape functions "
            f"{header.get('Shape functions', '?')}, interpolation {header.get('Interpolation method', '?')}, "
            f"{header.get('Correlation method', '?')}; ours run at its subset on its points ({dice_s:.1f} s with "
            f"compiles); pyvale's step-{STEP} field interpolated onto its points (cubic, Clough-Tocher)."
        )
    return "\n".join(lines)


def mudic(args) -> str:
    import logging

    logging.disable(logging.WARNING)  # muDIC logs every iteration
    import muDIC

    frames, truth = make_dic_series("strain", frames=8, shape=(256, 256))
    count = len(frames) - 1

    def peer():
        stack = muDIC.image_stack_from_list([f.astype(np.float64) for f in frames])
        mesh = muDIC.Mesher(deg_e=3, deg_n=3, type="spline").mesh(
            stack, Xc1=40, Xc2=216, Yc1=40, Yc2=216, n_elx=8, n_ely=8, GUI=False
        )
        return muDIC.DICAnalysis(muDIC.DICInput(mesh, stack)).run()

    def ours():
        return gm.correlate_series(frames, subset=SUBSET, step=STEP)

    rows = []
    for name, run in (("muDIC 0.2 (global DIC, Q4-spline mesh 8 x 8)", peer), ("ours, correlate_series", ours)):
        timed = measure(name, run, repeats=args.repeats, memory=False)
        first, best = timed.first_s, timed.best_s
        result = run()
        if run is peer:
            fields = muDIC.Fields(result)
            disp, coords = fields.disp(), fields.coords()
            x, y = coords[0, 0, :, :, 0], coords[0, 1, :, :, 0]
            errors = []
            for t in range(1, len(frames)):
                ty, tx = truth["maps"][t](y, x)
                errors.append(np.hypot(disp[0, 0, :, :, t] - (tx - x), disp[0, 1, :, :, t] - (ty - y)).ravel())
            points = x.size
        else:
            tdy, tdx = true_displacement(truth["maps"], result.y, result.x)
            ok = result.status == Status.ok
            errors = [np.hypot(result.dy[t] - tdy[t], result.dx[t] - tdx[t])[ok[t]] for t in range(1, len(frames))]
            points = ok[-1].sum()
        rms = max(float(np.sqrt(np.mean(e**2))) for e in errors)
        timed.extra.update(per_frame_s=best / count, worst_rms_px=rms, points=int(points))
        group("against muDIC", [timed], "ours, correlate_series")
        rows.append((name, first, best / count, rms, points))
    ratio = rows[0][2] / rows[1][2]
    lines = [
        f"DIC series against muDIC: the growing stretch (256^2, 8 frames, to 25%); {machine()}",
        "",
        "| code | first call s | warm s per frame | worst frame's RMS error px | points (last frame) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {n} | {f:.2f} | {b:.3f} | {r:.4f} | {p} |" for n, f, b, r, p in rows]
    lines += ["", f"Ours {ratio:.1f}x faster a frame, warm (best of {args.repeats})."]
    return "\n".join(lines)


# -- 5. side by side with pyvale and muDIC on sequences with known motion ---------------------------------

PEERS = ("pyvale", "mudic")
WRONG_PX = 0.1  # a finite value off by more than this is one the method should not have stood behind


def _peer_maps(kind: str, frames: int, shape: tuple[int, int]) -> list[tuple]:
    """``(phi_t, phi_t^-1)`` per frame, both ``(y, x) -> (y', x')``: a rigid drift of (1.37, 2.71) px a frame, or
    a rotation by 4 degrees a frame about the frame's centre."""
    cy, cx = (shape[0] - 1) / 2, (shape[1] - 1) / 2
    maps = []
    for t in range(frames):
        if kind == "translation":
            sy, sx = 1.37 * t, 2.71 * t
            maps.append((lambda y, x, sy=sy, sx=sx: (y + sy, x + sx), lambda y, x, sy=sy, sx=sx: (y - sy, x - sx)))
        else:
            c, s = np.cos(np.deg2rad(4.0 * t)), np.sin(np.deg2rad(4.0 * t))

            def turn(y, x, c=c, s=s):
                return cy + c * (y - cy) + s * (x - cx), cx - s * (y - cy) + c * (x - cx)

            def back(y, x, c=c, s=s):
                return cy + c * (y - cy) - s * (x - cx), cx + s * (y - cy) + c * (x - cx)

            maps.append((turn, back))
    return maps


def peer_sequence(kind: str, frames: int, shape: tuple[int, int], seed: int = 0) -> tuple[np.ndarray, list]:
    """A speckle sequence ``(T, M, N)`` uint8 with its maps ``phi_t`` (reference -> frame): the analytic speckle of
    the DIC samples seen through the exact inverse map (no interpolation in the truth), then the samples' camera
    (shot and read noise, 8-bit quantisation). The speckle reaches past the frame, so a drift or a turn brings
    more of it into view, as a real specimen would."""
    from napari_gridmip._sample_data.dic import _dots, camera, render_speckle

    rng = np.random.default_rng(seed)
    maps = _peer_maps(kind, frames, shape)
    centres, amplitudes = _dots(
        shape, rng, margin=0.25 * max(shape) + 32
    )  # a turn of any angle keeps the corners on it
    qy, qx = np.meshgrid(np.arange(shape[0], dtype=np.float64), np.arange(shape[1], dtype=np.float64), indexing="ij")
    out = []
    for phi, inverse in maps:
        py, px = inverse(qy, qx)
        landing = np.stack(phi(centres[:, 0], centres[:, 1]), axis=1)
        out.append(camera(render_speckle(py, px, centres, amplitudes, landing), rng))
    return np.stack(out), [phi for phi, _ in maps]


class _Last:
    """A case's callable that keeps its last result: the errors are those of a timed call, not of another run."""

    def __init__(self, fn):
        self.fn, self.result = fn, None

    def __call__(self):
        self.result = self.fn()
        return self.result


def _on_grid(y, x, values, grid_y, grid_x) -> np.ndarray:
    """Scatter a peer's per-point ``values`` at reference points ``(y, x)`` onto our grid (NaN elsewhere)."""
    step_y = grid_y[1] - grid_y[0] if len(grid_y) > 1 else 1
    step_x = grid_x[1] - grid_x[0] if len(grid_x) > 1 else 1
    i, j = np.rint((y - grid_y[0]) / step_y).astype(int), np.rint((x - grid_x[0]) / step_x).astype(int)
    if not (np.allclose(grid_y[0] + i * step_y, y) and np.allclose(grid_x[0] + j * step_x, x)):
        raise AssertionError("the peer's points are off our grid")
    out = np.full((len(grid_y), len(grid_x)), np.nan)
    out[i, j] = values
    return out


_PYVALE_ROW = np.dtype([("x", "<i4"), ("y", "<i4"), ("u", "<f8"), ("v", "<f8"), ("mag", "<f8"), ("converged", "u1"),
                        ("cost", "<f8"), ("ftol", "<f8"), ("xtol", "<f8"), ("niter", "<i4")])  # fmt: skip


def _pyvale_series(frames, grid_y, grid_x, incremental: bool, max_displacement: int):
    """pyvale's 2D DIC of the sequence on our grid (its subset centres fall on our points with the same subset and
    step): ``(dy, dx)`` ``(T, R, C)``, NaN where it reports no point, and what failed.

    One call for all frames, as its API takes a sequence. Against frame 0 (its default) a call that raises (its
    seed fails the correlation threshold) is redone frame by frame, so one bad frame costs that frame only; the
    incremental mode cannot be split, and a raise loses the whole sequence."""
    import tempfile

    import pyvale.dic

    count = len(frames)
    dy = np.full((count, len(grid_y), len(grid_x)), np.nan)
    dx = np.full_like(dy, np.nan)
    dy[0], dx[0] = 0.0, 0.0
    seed = [int(grid_x[len(grid_x) // 2]), int(grid_y[len(grid_y) // 2])]  # (x, y): the grid's middle point
    failed = []

    def call(deformed, folder):
        # its defaults otherwise: multi-window FFT start, reliability-guided scan from the seed, affine shape,
        # bicubic B-spline, ZNSSD, 5 x 5 Gaussian prefilter, ZNCC threshold 0.9, points below it not written
        pyvale.dic.calculate_2d(frames[0], deformed, np.ones(frames.shape[1:], bool), seed=seed, subset_size=SUBSET,
                                subset_step=STEP, max_displacement=max_displacement,
                                incremental_update="IMAGE" if incremental else "OFF", incremental_update_value=1,
                                output_basepath=folder, output_prefix="series_", output_binary=True,
                                print_level=0)  # fmt: skip
        return [
            np.fromfile(Path(folder) / f"series_def_img_{i:04d}.dic2d", dtype=_PYVALE_ROW) for i in range(len(deformed))
        ]

    def keep(t, table):
        y, x = table["y"].astype(np.float64), table["x"].astype(np.float64)
        dy[t], dx[t] = _on_grid(y, x, table["v"], grid_y, grid_x), _on_grid(y, x, table["u"], grid_y, grid_x)

    with tempfile.TemporaryDirectory(prefix="pyvale_") as folder:
        try:
            for t, table in enumerate(call(frames[1:], folder), start=1):
                keep(t, table)
        except (RuntimeError, ValueError) as error:
            if incremental:
                failed.append(f"the sequence: {str(error).splitlines()[0]}")
            else:
                for t in range(1, count):
                    try:
                        keep(t, call(frames[t : t + 1], folder)[0])
                    except (RuntimeError, ValueError) as error:
                        failed.append(f"frame {t}: {str(error).splitlines()[0]}")
    return dy, dx, failed


def _mudic_series(frames, grid_y, grid_x, element: int):
    """muDIC's global DIC of the sequence on a Q4 mesh whose nodes are our grid's points every ``element`` px:
    ``(dy, dx)`` ``(T, R, C)`` at the nodes (NaN at our other points), and what failed. Its defaults otherwise:
    each frame against frame 0, started from the previous frame's nodes, a frame that does not converge kept
    (``noconvergence="ignore"``): it reports no point as lost."""
    import logging

    import muDIC

    count = len(frames)
    n_y, n_x = int((grid_y[-1] - grid_y[0]) // element), int((grid_x[-1] - grid_x[0]) // element)
    y0, x0 = float(grid_y[0]), float(grid_x[0])
    logging.disable(logging.INFO)  # it logs every iteration of every frame
    try:
        # its reference module sets NumPy's invalid operations to raise when imported: so within its own calls only
        with np.errstate(invalid="raise"):
            stack = muDIC.image_stack_from_list([f.astype(np.float64) for f in frames])
            mesh = muDIC.Mesher(type="q4").mesh(stack, Xc1=x0, Xc2=x0 + n_x * element, Yc1=y0,
                                                Yc2=y0 + n_y * element, n_elx=n_x, n_ely=n_y, GUI=False)  # fmt: skip
            result = muDIC.DICAnalysis(muDIC.DICInput(mesh, stack)).run()
    finally:
        logging.disable(logging.NOTSET)
    xs, ys = np.asarray(result.xnodesT), np.asarray(result.ynodesT)  # (nodes, frames it reached)
    dy = np.full((count, len(grid_y), len(grid_x)), np.nan)
    dx = np.full_like(dy, np.nan)
    for t in range(xs.shape[1]):
        dy[t] = _on_grid(ys[:, 0], xs[:, 0], ys[:, t] - ys[:, 0], grid_y, grid_x)
        dx[t] = _on_grid(ys[:, 0], xs[:, 0], xs[:, t] - xs[:, 0], grid_y, grid_x)
    failed = [] if xs.shape[1] == count else [f"stopped after frame {xs.shape[1] - 1}"]
    return dy, dx, failed, np.isfinite(_on_grid(ys[:, 0], xs[:, 0], 0.0, grid_y, grid_x))


def _errors(dy, dx, truth_dy, truth_dx, points, in_view, ours_error) -> list[dict]:
    """Per frame after the reference: a method's error where it and ours both find a point (median, p99), ours'
    error on the same points, the share of its in-view points it finds, and its finite values off by more than
    ``WRONG_PX`` (in view or not: a value it could not stand behind must be NaN)."""
    rows = []
    for t in range(1, len(dy)):
        error = np.hypot(dy[t] - truth_dy[t], dx[t] - truth_dx[t])
        found = np.isfinite(error) & points
        both = found & np.isfinite(ours_error[t])
        view = in_view[t] & points
        e, o = error[both], ours_error[t][both]
        rows.append(dict(
            frame=t, found=int((found & view).sum()), in_view=int(view.sum()),
            share=float((found & view).sum() / max(view.sum(), 1)), both=int(both.sum()),
            median=float(np.median(e)) if e.size else np.nan, p99=float(np.percentile(e, 99)) if e.size else np.nan,
            ours_median=float(np.median(o)) if o.size else np.nan,
            ours_p99=float(np.percentile(o, 99)) if o.size else np.nan,
            wrong=int(np.sum(found & (error > WRONG_PX))), wrong_out=int(np.sum(found & ~view & (error > WRONG_PX))),
        ))  # fmt: skip
    return rows


def peers(args) -> str:
    """Ours against pyvale (its default and its incremental mode) and muDIC on the same sequences, frame by frame."""
    import importlib.util

    chosen = [p.strip().lower() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PEERS))
    if unknown:
        raise SystemExit(f"--peers: unknown {unknown}; choose from {','.join(PEERS)}")
    missing = [p for p in chosen if importlib.util.find_spec({"mudic": "muDIC"}.get(p, p)) is None]
    chosen = [p for p in chosen if p not in missing]
    note("peers_versions", {p: metadata.version(p) for p in chosen})  # muDIC's module name hides it from the machine's
    sizes = (128,) if args.quick else (256, 512)
    count = 5 if args.quick else 8
    repeats = 1 if args.quick else args.repeats
    element = args.mudic_element
    if element % STEP:
        raise SystemExit(f"--mudic-element must be a multiple of the step ({STEP}) so that its nodes are our points")
    lines = [
        f"DIC series side by side: {count} frames, speckle with camera noise, 8-bit; a drift of (1.37, 2.71) px a "
        f"frame and a turn of 4 degrees a frame about the centre; subset {SUBSET}, step {STEP}; per method its "
        f"warm time per frame (whole sequence / {count - 1}, best of {repeats}) and, per frame, its error against "
        f"the truth where it and ours both find a point; {machine()}",
        "",
    ]
    if missing:
        lines += [f"Not installed, not run: {', '.join(missing)} (pip install -e .[bench]).", ""]
    summary = [
        "| sequence | method | first call s | warm s / frame | x ours | worst p99 px (common points) "
        "| lowest share found | finite and off > 0.1 px (all frames) | failed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    details = []
    for size in sizes:
        shape = (size, size)
        max_displacement = min(64, size // 4)  # pyvale: its search diameter must be under the frame's size
        for kind in ("translation", "rotation"):
            frames, maps = peer_sequence(kind, count, shape)
            title = f"{kind}, {size}^2, {count} frames"
            half = SUBSET // 2
            grid_y = np.arange(half, size - half, STEP, dtype=np.float64)
            grid_x = grid_y.copy()
            gy, gx = np.meshgrid(grid_y, grid_x, indexing="ij")
            truth_dy = np.stack([phi(gy, gx)[0] - gy for phi in maps])
            truth_dx = np.stack([phi(gy, gx)[1] - gx for phi in maps])
            # in view: the subset's four corners, carried by the true motion, inside the frame
            in_view = np.ones((count, *gy.shape), bool)
            for t, phi in enumerate(maps):
                for oy, ox in ((-half, -half), (-half, half), (half, -half), (half, half)):
                    qy, qx = phi(gy + oy, gx + ox)
                    in_view[t] &= (qy >= 0) & (qy <= size - 1) & (qx >= 0) & (qx <= size - 1)
            all_points = np.ones(gy.shape, bool)

            ours_fn = _Last(lambda frames=frames: gm.correlate_series(frames, subset=SUBSET, step=STEP))
            ours_row = measure("ours, correlate_series", ours_fn, repeats=repeats, note="reference='accumulated'")
            result = ours_fn.result
            assert np.array_equal(result.y, grid_y) and np.array_equal(result.x, grid_x)
            ours_dy, ours_dx = np.asarray(result.dy, np.float64), np.asarray(result.dx, np.float64)
            ours_error = np.hypot(ours_dy - truth_dy, ours_dx - truth_dx)
            cases = [(ours_row, _errors(ours_dy, ours_dx, truth_dy, truth_dx, all_points, in_view, ours_error), [])]

            peer_cases = []
            if "pyvale" in chosen:
                for incremental, mode in ((False, "against frame 0 (its default)"),
                                          (True, "incremental (reference moved every frame)")):  # fmt: skip
                    run = partial(_pyvale_series, frames, grid_y, grid_x, incremental, max_displacement)
                    peer_cases.append((f"pyvale, {mode}", run, f"max_displacement {max_displacement}"))
            if "mudic" in chosen:
                run = partial(_mudic_series, frames, grid_y, grid_x, element)
                peer_cases.append((f"muDIC, Q4 mesh, {element} px elements", run, "its nodes on our points"))
            for name, fn, text in peer_cases:
                wrapped = _Last(fn)
                row = measure(name, wrapped, repeats=repeats, note=text)  # its first call apart too (set-up)
                dy, dx, failed, *rest = wrapped.result
                points = rest[0] if rest else all_points
                cases.append((row, _errors(dy, dx, truth_dy, truth_dx, points, in_view, ours_error), failed))

            group(title, [row for row, _, _ in cases], ours_row.name)
            details += [
                f"#### {title}",
                "",
                "| frame | method | found / in view | median err px | p99 err px | ours on the same points: "
                "median, p99 px | finite and off > 0.1 px (of them out of view) |",
                "|---:|---|---:|---:|---:|---:|---:|",
            ]
            for row, frames_rows, failed in cases:
                row.extra.update(per_frame_s=row.best_s / (count - 1), frames=frames_rows, failed=failed,
                                 total_wrong=sum(r["wrong"] for r in frames_rows))  # fmt: skip
                is_ours = row is ours_row
                for r in frames_rows:
                    same = "" if is_ours else f"{r['ours_median']:.4f}, {r['ours_p99']:.4f}"
                    details.append(
                        f"| {r['frame']} | {row.name} | {r['found']} / {r['in_view']} ({100 * r['share']:.1f}%) "
                        f"| {r['median']:.4f} | {r['p99']:.4f} | {same} | {r['wrong']} ({r['wrong_out']}) |"
                    )
                worst = max((r["p99"] for r in frames_rows), default=np.nan)
                summary.append(
                    f"| {title} | {row.name} | {row.first_s:.2f} | {row.best_s / (count - 1):.3f} "
                    f"| {row.best_s / ours_row.best_s:.1f} | {worst:.4f} "
                    f"| {min(r['share'] for r in frames_rows):.3f} | {row.extra['total_wrong']} "
                    f"| {'; '.join(failed) or '-'} |"
                )
            details.append("")
    lines += (
        summary
        + [
            "",
            "x ours: the method's warm time over ours (best against best). Errors: median and 99th percentile over "
            "the points both it and ours find (ours on its own points in its rows); found: its finite values at "
            "in-view points (the subset's corners, carried by the true motion, inside the frame). pyvale writes no "
            "value below its ZNCC threshold (0.9); muDIC reports every node in every frame.",
            "",
        ]
        + details
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["accuracy", "speed", "real", "mudic", "peers"])
    parser.add_argument("--sizes", default="256,512,1024", help="section speed: frame sides (default %(default)s)")
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"section peers: the peers to run, of {','.join(PEERS)} (default: both)",
    )
    parser.add_argument(
        "--mudic-element",
        type=int,
        default=2 * STEP,
        help="section peers: muDIC's element "
        "size in px, a multiple of the step (its nodes are our points); default %(default)s",
    )
    parser.add_argument("--real-dir", help="a folder with ohtcfrp_00 ... ohtcfrp_NN and roi.png/.tif (section real)")
    args = parser.parse_args()
    start_run("series", args)
    for name, part in {"accuracy": accuracy, "speed": speed, "real": real, "mudic": mudic, "peers": peers}.items():
        if args.only == name or (args.only is None and name != "mudic"):
            text = part(args)
            note(name, text)  # the part's table, as printed, beside its timed cases
            print(text, end="\n\n", flush=True)


if __name__ == "__main__":
    main()
