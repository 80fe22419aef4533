"""DIC of whole sequences (``correlate_series``): accuracy on sequences with known truth, and time per frame.

    python benchmarks/bench_series.py                 # every sequence and policy (256 x 256), a few minutes
    python benchmarks/bench_series.py --quick         # 128 x 128, fewer frames
    python benchmarks/bench_series.py --only speed    # the time per frame against one pair of the same size

1. Accuracy (``--only accuracy``): the four synthetic sequences of ``napari_gridmip._sample_data.dic_series``
   (8-bit camera noise; a drift out of view and back, a speckled disk turning a full turn in 20 degree steps
   inside its mask, a plate with a hole under growing tension, a stretch growing to 25%), subset 31, step 8,
   under each reference policy. Per frame: the points valid, those whose subset is in view (the truth says),
   the median and 95th percentile of the error of the valid points, the share of in-view points within
   0.05 px, and the points wrong but finite (error above 1 px), which must be 0.
2. Speed (``--only speed``): warm time per frame of a 256^2 (and 512^2) sequence against the warm time of one
   affine pair of the same size (``find_displacement(..., subset=(31, 31), step=8, subpixel="refine",
   shape="affine")``, window 11), in one process, best of several; and the first call (compiles) beside it.
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

import napari_gridmip as gm  # noqa: E402
from napari_gridmip._sample_data.dic_series import KINDS, make_dic_series, true_displacement  # noqa: E402
from napari_gridmip.core.correlation._status import Status  # noqa: E402

SUBSET, STEP = 31, 8


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
        py, px = gy + tdy[t], gx + tdx[t]
        in_view = (py >= half) & (py <= frames_shape[1] - 1 - half) & (px >= half) & (px <= frames_shape[2] - 1 - half)
        in_view &= usable
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
        "| frames | series warm s | per frame s | pair warm s | per frame / pair | series first call s | peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for size in (128,) if args.quick else (256, 512):
        count = 6
        frames, truth = make_dic_series("rotation", frames=count, shape=(size, size))
        start = time.perf_counter()
        gm.correlate_series(frames, subset=SUBSET, step=STEP, roi=truth["roi"])
        first = time.perf_counter() - start
        best = np.inf
        for _ in range(args.repeats):
            start = time.perf_counter()
            gm.correlate_series(frames, subset=SUBSET, step=STEP, roi=truth["roi"])
            best = min(best, time.perf_counter() - start)
        with PeakMemory() as memory:
            gm.correlate_series(frames, subset=SUBSET, step=STEP, roi=truth["roi"])
        img1, img2 = frames[1][None].astype(np.float32), frames[0][None].astype(np.float32)

        def pair(img1=img1, img2=img2):
            return gm.find_displacement(
                img1, img2, (11, 11), subset=(SUBSET, SUBSET), step=STEP, subpixel="refine", shape="affine"
            )

        block(pair())
        pair_best = np.inf
        for _ in range(args.repeats):
            start = time.perf_counter()
            block(pair())
            pair_best = min(pair_best, time.perf_counter() - start)
        per_frame = best / (count - 1)
        lines.append(
            f"| {count} x {size}^2 (rotation, ROI) | {best:.3f} | {per_frame:.3f} | {pair_best:.3f} | "
            f"{per_frame / pair_best:.2f} | {first:.2f} | {memory.extra_mb:.0f} |"
        )
    lines += ["", "Target: a frame after the first at most the warm time of one pair (ratio <= 1)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["accuracy", "speed"])
    args = parser.parse_args()
    if args.only in (None, "accuracy"):
        print(accuracy(args), end="\n\n", flush=True)
    if args.only in (None, "speed"):
        print(speed(args), flush=True)


if __name__ == "__main__":
    main()
