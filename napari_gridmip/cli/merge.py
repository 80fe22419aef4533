"""``napari-gridmip merge IN OUT --stride S [S ...]``: a patch stack (grid axes first) reassembled into one image,
by the widget's merge plan, written block by block."""

from __future__ import annotations

import argparse
from typing import Any

from napari_gridmip.cli._shared import UsageError, absolute, add_batch_options, check_new

NAME = "merge"
HELP = "Reassemble a patch stack (grid axes first) into one image."
EXAMPLE = "napari-gridmip merge tiles.npy merged.tif --stride 100 100 --image-shape 3 512 512 --blend gaussian"
BATCH = True


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("input", metavar="IN", help="patches (g1, ..., gd, *leading, p1, ..., pd)")
    sub.add_argument("output", metavar="OUT", help="the image to write: .npy, .tif/.tiff or .zarr")
    sub.add_argument("--stride", type=int, nargs="+", required=True, help="one stride per tiled axis")
    sub.add_argument("--image-shape", type=int, nargs="+", help="default: the smallest image the grid covers")
    sub.add_argument("--blend", default="mean", help="mean, gaussian, hann, max or overwrite (default: mean)")
    add_batch_options(sub)


def run(args: argparse.Namespace, compute: Any) -> None:
    from napari_gridmip._jobs.patches import MergeRequest, infer_image_shape, merge_plan
    from napari_gridmip._jobs.plan import Source
    from napari_gridmip.io import read_array, write_array

    check_new(args.output, overwrite=args.overwrite)
    patches = read_array(args.input)
    d = len(args.stride)
    if patches.ndim < 2 * d:
        raise UsageError(f"a patch stack with {d} tiled axes needs at least {2 * d} axes; got shape {patches.shape}")
    image_shape = args.image_shape
    if image_shape is None:
        grid, patch = patches.shape[:d], patches.shape[patches.ndim - d :]
        image_shape = infer_image_shape(grid, patches.shape[d : patches.ndim - d], patch, tuple(args.stride))
    request = MergeRequest(args.input, patches, tuple(image_shape), tuple(args.stride), args.blend, None, ())
    plan = merge_plan(request, source=Source("patches", path=absolute(args.input)), display=False)
    merged = plan.run({"patches": patches})["merged"]
    write_array(merged, args.output, overwrite=args.overwrite, compute=compute, attributes=plan.record())
