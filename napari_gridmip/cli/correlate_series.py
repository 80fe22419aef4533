"""``napari-gridmip correlate-series FRAMES --out FOLDER``: DIC of a sequence, a grid of points on frame 0 followed
through every frame by the widget's series plan, one DICe CSV file per frame into a new folder."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from napari_gridmip._jobs.correlation import SERIES_MAX_SIGMA, SERIES_REFRESH_ZNCC, SERIES_SHAPES
from napari_gridmip.cli._shared import UsageError, absolute, add_batch_options, check_new

NAME = "correlate-series"
HELP = (
    "DIC of a whole experiment: a grid of points on frame 0 followed through every frame (correlate_series), "
    "with the strain of each frame; one CSV file per frame, DICe's columns, into a folder."
)
EXAMPLE = "napari-gridmip correlate-series frames.tif --subset 31 --step 8 --roi mask.tif --out dic/"
BATCH = True


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "frames", metavar="FRAMES", help="the sequence (T, Y, X): .npy, .tif/.tiff or Zarr; frame 0 is the reference"
    )
    sub.add_argument("--out", required=True, metavar="FOLDER", help="the folder to create, DICe_solution_<t>.txt")
    sub.add_argument(
        "--subset", type=int, nargs="+", default=[31], metavar="S", help="odd subset size SH [SW] (default: 31)"
    )
    sub.add_argument("--step", type=int, default=8, help="the grid's spacing in px (default: 8)")
    sub.add_argument(
        "--roi", metavar="MASK", help="the region of interest on frame 0: a (Y, X) bool or integer mask, nonzero inside"
    )
    sub.add_argument(
        "--reference", default="accumulated", choices=["accumulated", "incremental", "auto"],
        help="each point matched against frame 0 (accumulated), the last frame it was found in (incremental), or "
        "frame 0 until its match weakens (auto) (default: %(default)s)",
    )  # fmt: skip
    sub.add_argument(
        "--strain", default="green-lagrange", choices=["green-lagrange", "small"],
        help="the strain from each point's own gradients (default: %(default)s, which a rotation leaves at 0)",
    )  # fmt: skip
    sub.add_argument(
        "--shape", default="affine", choices=list(SERIES_SHAPES),
        help="the subset's warp: affine (translation, stretch, shear and rotation; 6 parameters) or rigid "
        "(translation and rotation; 3 parameters, less noise on parts that move rigidly) (default: %(default)s)",
    )  # fmt: skip
    sub.add_argument(
        "--max-sigma", type=float, default=SERIES_MAX_SIGMA, metavar="PX",
        help="px: a point is kept only where its subset's texture predicts a displacement standard deviation "
        "within this; larger keeps more points along the ROI's edges, less precisely (default: %(default)s)",
    )  # fmt: skip
    sub.add_argument(
        "--refresh-zncc", type=float, default=SERIES_REFRESH_ZNCC, metavar="ZNCC",
        help="incremental and auto: the ZNCC with frame 0 at which a point goes back to frame 0; auto also moves a "
        "point's reference to the current frame when its ZNCC falls under it; 1: never back to frame 0 "
        "(default: %(default)s)",
    )  # fmt: skip
    add_batch_options(sub, scheduler=False)  # one frame at a time, in this process


def run(args: argparse.Namespace, compute: Any) -> None:
    """The widget's DIC series plan on a file's frames, one CSV file per frame with the run's provenance in each
    header; nothing written unless every frame was followed."""
    import json

    from napari_gridmip._jobs.correlation import SeriesRequest, series_plan
    from napari_gridmip._jobs.plan import KEY, Source
    from napari_gridmip.core.runtime.files import atomic_path
    from napari_gridmip.io import read_array, write_series_csv

    check_new(args.out, overwrite=args.overwrite)  # before any work
    if len(args.subset) > 2:
        raise UsageError(f"--subset takes one or two sizes (SH [SW]); got {len(args.subset)}")
    # the options' ranges before the frames are read (correlate_series checks them again, in its own words)
    if not 0 < args.max_sigma < float("inf"):  # NaN too
        raise UsageError(f"--max-sigma must be a positive number of px; got {args.max_sigma}")
    if not 0 <= args.refresh_zncc <= 1:
        raise UsageError(f"--refresh-zncc must be a ZNCC in [0, 1]; got {args.refresh_zncc}")
    frames = read_array(args.frames)
    if frames.ndim != 3:
        raise UsageError(f"FRAMES must be a sequence (T, Y, X); {args.frames!r} has shape {frames.shape}")
    subset = (args.subset[0], args.subset[-1])
    sources = [Source("frames", path=absolute(args.frames))]
    inputs = {"frames": frames}  # read one frame at a time
    if args.roi is not None:
        sources.append(Source("roi", path=absolute(args.roi)))
        inputs["roi"] = read_array(args.roi).compute()
    request = SeriesRequest(args.frames, frames, None, subset=subset, step=args.step, reference=args.reference,
                            strain_kind=args.strain, shape=args.shape, max_sigma=args.max_sigma,
                            refresh_zncc=args.refresh_zncc)  # fmt: skip
    plan = series_plan(request, sources=sources, display=False)
    from napari_gridmip._jobs import prepare_jax

    prepare_jax()  # compiled programs kept in the per-user cache, as the widgets do

    def report(done: int, total: int) -> None:
        if not args.quiet:
            print(f"\rfollowing the grid: frame {done}/{total}", end="\n" if done == total else "", file=sys.stderr)

    def extras(i: int, call: Any) -> dict[str, Any]:
        return {"progress": report} if call.function == "correlate_series" else {}

    values = plan.execute(inputs, extras=extras)
    arrays = plan.outputs_of(values)
    strain = [np.asarray(arrays[name]) for name in ("exx", "eyy", "exy")]
    provenance = {KEY: json.dumps(plan.record()[KEY])}  # one header line: the calls, inputs, versions and script
    with atomic_path(args.out, overwrite=args.overwrite) as temporary:
        files = write_series_csv(values["series"], temporary, strain=strain, provenance=provenance)
    if not args.quiet:
        print(f"wrote {len(files)} files into {absolute(args.out)!r}", file=sys.stderr)
