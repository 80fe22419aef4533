"""``napari-gridmip mipmap IN OUT``: the occupancy pyramid of a volume as an OME-Zarr multiscale image
(:func:`napari_gridmip.io.write_mipmap`, block by block from a lazily read volume), optionally packed 8 cells a
byte, and the occupied voxels' bounding box."""

from __future__ import annotations

import argparse
from typing import Any

from napari_gridmip.cli._shared import absolute, add_batch_options, check_new

NAME = "mipmap"
HELP = "Write the occupancy pyramid of a volume as an OME-Zarr multiscale image."
EXAMPLE = "napari-gridmip mipmap volume.zarr occupancy.ome.zarr --threshold 120 --scale 2 0.5 0.5 --packed --bbox"
BATCH = True


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "input", metavar="IN", help=".npy, .tif/.tiff or Zarr (array, or OME-Zarr level 0): (..., Z, Y, X)"
    )
    sub.add_argument("output", metavar="OUT", help="the OME-Zarr folder to create")
    sub.add_argument("--threshold", type=float, default=0.0, help="occupied where value > T (default: 0)")
    sub.add_argument("--scale", type=float, nargs=3, metavar=("SZ", "SY", "SX"), help="level 0's voxel size")
    sub.add_argument(
        "--packed",
        action="store_true",
        help="also write every level packed 8 cells a byte, in OUT/packed/s0, s1, ... (order and shape in attributes)",
    )
    sub.add_argument(
        "--packed-order",
        choices=["morton", "c"],
        default="morton",
        help="byte layout of --packed: Morton order of 2x2x2 blocks (instant-ngp's bitfield) or C order "
        "(default: %(default)s)",
    )
    sub.add_argument(
        "--bbox", action="store_true", help="print the bounding box of the occupied voxels (z, y, x; half-open)"
    )
    add_batch_options(sub)


def run(args: argparse.Namespace, compute: Any) -> None:
    from napari_gridmip._jobs.plan import Call, Plan, Source
    from napari_gridmip.io import read_array

    check_new(args.output, overwrite=args.overwrite)
    volume = read_array(args.input)
    options = {"threshold": args.threshold, "scale": None if args.scale is None else tuple(args.scale)}
    if args.packed:
        options["packed"] = args.packed_order
    call = Call("write_mipmap", ("volume",), (absolute(args.output),), options, result="path")
    plan = Plan([Source("volume", path=absolute(args.input))], [call], {})
    attributes = plan.record()
    written = {"overwrite": args.overwrite, "compute": compute, "attributes": attributes}
    out = plan.execute({"volume": volume}, extras=lambda i, call: written)["path"]
    if args.bbox:
        print(bbox_line(out))


def bbox_line(path: Any) -> str:
    """The bounding box of the occupied voxels of a written pyramid (over every leading index), as one line.

    Reads only the slabs that the top-down search needs, from the stored levels.
    """
    import dask.array as da
    import zarr

    from napari_gridmip import occupied_bbox

    group = zarr.open_group(str(path), mode="r")
    count = len(group.attrs["multiscales"][0]["datasets"]) if "multiscales" in group.attrs else None
    if count is None:  # OME-Zarr 0.5 keeps the metadata under "ome"
        count = len(group.attrs["ome"]["multiscales"][0]["datasets"])
    levels = [da.from_zarr(group[f"s{k}"]) for k in range(count)]
    lead = tuple(range(levels[0].ndim - 3))
    box = occupied_bbox([level.any(axis=lead) if lead else level for level in levels])
    if box is None:
        return "occupied bounding box (z, y, x): none (no voxel above the threshold)"
    return f"occupied bounding box (z, y, x): lo={box.lo} hi={box.hi} (half-open), shape {box.shape}"
