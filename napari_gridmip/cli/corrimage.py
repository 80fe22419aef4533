"""``napari-gridmip corrimage MOVIE OUT``: the local correlation image of a movie (CaImAn's Cn), by the widget's
time-series plan, the frames read chunk by chunk."""

from __future__ import annotations

import argparse
from typing import Any

from napari_gridmip.cli._shared import absolute, add_batch_options, check_new

NAME = "corrimage"
HELP = "The local correlation image of a movie (CaImAn's correlation image, Cn)."
EXAMPLE = "napari-gridmip corrimage movie.tif correlation.tif --neighbours 8"
BATCH = True


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("movie", metavar="MOVIE", help="the movie (..., T, Y, X): .npy, .tif/.tiff or Zarr")
    sub.add_argument("output", metavar="OUT", help="the image to write (..., Y, X): .npy, .tif/.tiff or .zarr")
    sub.add_argument(
        "--neighbours", type=int, choices=[8, 4], default=8, help="8 (3x3) or 4 (sides) neighbours (default: 8)"
    )
    sub.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    sub.add_argument("--chunk-frames", type=int, help="frames per task (default: the movie's chunks)")
    add_batch_options(sub)


def run(args: argparse.Namespace, compute: Any) -> None:
    from napari_gridmip._jobs.plan import Source
    from napari_gridmip._jobs.timeseries import TimeSeriesRequest, timeseries_plan
    from napari_gridmip.io import read_array, write_array

    check_new(args.output, overwrite=args.overwrite)
    movie = read_array(args.movie)
    request = TimeSeriesRequest(args.movie, movie, None, args.neighbours, args.dtype, args.chunk_frames)
    plan = timeseries_plan(request, source=Source("movie", path=absolute(args.movie)))
    # lazy: the frames are read chunk by chunk while OUT is written
    image = plan.run({"movie": movie})["correlation image"]
    write_array(image, args.output, overwrite=args.overwrite, compute=compute, attributes=plan.record())
