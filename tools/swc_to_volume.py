"""Neuron tracings (SWC) drawn into a sparse uint8 volume, written as a chunked Zarr array (only chunks holding a
voxel are stored): the real sparse volume of docs/occupancy.md.

    python tools/swc_to_volume.py SWC_FOLDER OUT.zarr [--voxel-um 10] [--source-um 25] [--extent 528 320 456]

Each SWC line is ``id type x y z radius parent``; the coordinates are in units of ``--source-um`` (the CAR
tracings are registered to the Allen CCFv3 at 25 um, whose 25 um volume is 528 x 320 x 456 voxels along
anterior-posterior, dorsal-ventral and left-right: the files' x, y and z). Voxel centres sit at whole
coordinates in both grids, so a point at ``c`` falls in voxel ``round(c * source_um / voxel_um)``. The array's
axes are the files' (x, y, z), napari's (z, y, x): ``extent * source_um / voxel_um`` voxels (1320 x 800 x 1140 at
10 um). Every parent-child segment is drawn one voxel wide: sampled at most one voxel apart along each axis, each
sample rounded to its voxel, so consecutive voxels touch (26-connected) and no segment has a gap. The radius
column is not used. Neuron ``i`` (files in sorted order) is drawn with the value ``i + 1`` (where neurons cross,
the larger value is kept); the array's attributes list the files, their values and the source.

Memory holds the occupied voxels' coordinates only (a few MB), never the volume: each stored chunk is made from
the voxels that fall in it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

CCF_EXTENT_25UM = (528, 320, 456)  # the Allen CCFv3 25 um volume: anterior-posterior, dorsal-ventral, left-right
CHUNK = 128  # the stored chunks (the CLI's mipmap reads 128^3 blocks)


def read_swc(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """The points ``(n, 3)`` float64 ``(x, y, z)`` of an SWC file and each point's parent row (-1 for a root).

    Comment lines (``#``) and blank lines are skipped; ids need not be sorted or consecutive. A parent id that is
    not in the file counts as a root.
    """
    rows = [line.split() for line in Path(path).read_text().splitlines() if line.strip() and line[0] != "#"]
    if not rows:
        return np.zeros((0, 3)), np.zeros(0, np.int64)
    table = np.array([row[:7] for row in rows], dtype=np.float64)
    ids = table[:, 0].astype(np.int64)
    parents = table[:, 6].astype(np.int64)
    order = np.argsort(ids)
    position = np.searchsorted(ids[order], parents)
    position = np.clip(position, 0, len(ids) - 1)
    found = ids[order][position] == parents
    parent_rows = np.where(found, order[position], -1)
    return table[:, 2:5], parent_rows


def segment_voxels(points: np.ndarray, parent_rows: np.ndarray) -> np.ndarray:
    """The voxels ``(m, 3)`` int64 (unique, sorted) of every point and every point-to-parent segment.

    ``points`` are in voxel units (voxel ``i`` centred at ``i``). A segment from ``a`` to ``b`` is sampled at
    ``ceil(max |b - a|) + 1`` evenly spaced points, so neighbouring samples are at most a voxel apart along each
    axis and their rounded voxels touch.
    """
    points = np.asarray(points, dtype=np.float64)
    child = np.flatnonzero(parent_rows >= 0)
    a, b = points[child], points[parent_rows[child]]
    steps = np.ceil(np.abs(b - a).max(axis=1)).astype(np.int64)
    counts = steps + 1
    edge = np.repeat(np.arange(len(child)), counts)
    k = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    t = (k / np.maximum(steps[edge], 1))[:, None]
    samples = np.concatenate([points, a[edge] + t * (b[edge] - a[edge])])
    voxels = np.floor(samples + 0.5).astype(np.int64)  # round half up: the voxel whose centre is nearest
    return np.unique(voxels, axis=0)


def neuron_voxels(
    files: Sequence[str | os.PathLike], *, voxel_um: float = 10.0, source_um: float = 25.0
) -> tuple[np.ndarray, np.ndarray]:
    """The voxels ``(m, 3)`` of all neurons at ``voxel_um`` and their uint8 values (neuron ``i`` is ``i + 1``).

    A voxel of several neurons keeps the largest value.
    """
    if len(files) > 255:
        raise ValueError(f"at most 255 neurons fit in uint8 values; got {len(files)}")
    coords, values = [np.zeros((0, 3), np.int64)], [np.zeros(0, np.uint8)]
    for i, path in enumerate(files):
        points, parents = read_swc(path)
        voxels = segment_voxels(points * (source_um / voxel_um), parents)
        coords.append(voxels)
        values.append(np.full(len(voxels), i + 1, np.uint8))
    coords, values = np.concatenate(coords), np.concatenate(values)
    if not len(coords):
        return coords, values
    order = np.lexsort((values, *coords.T[::-1]))  # by voxel (C order), then value
    coords, values = coords[order], values[order]
    last = np.r_[np.any(coords[1:] != coords[:-1], axis=1), True]  # the last (largest value) of each voxel
    return coords[last], values[last]


def write_volume(
    path: str | os.PathLike, coords: np.ndarray, values: np.ndarray, shape: Sequence[int], *, chunk: int = CHUNK,
    attributes: dict | None = None,
) -> int:  # fmt: skip
    """A uint8 Zarr array of ``shape`` (fill 0) holding ``values`` at ``coords``; only chunks with a voxel are
    written. Voxels outside ``shape`` are an error. Returns the number of chunks written."""
    import zarr

    coords = np.asarray(coords, np.int64).reshape(-1, 3)
    shape = tuple(int(n) for n in shape)
    if len(coords) and (coords.min() < 0 or np.any(coords.max(axis=0) >= shape)):
        raise ValueError(f"voxels from {coords.min(axis=0)} to {coords.max(axis=0)} fall outside the shape {shape}")
    array = zarr.open_array(str(path), mode="w", shape=shape, chunks=(chunk,) * 3, dtype=np.uint8, fill_value=0)
    if attributes:
        array.attrs.update(attributes)
    grid = tuple(-(-n // chunk) for n in shape)
    ids = np.ravel_multi_index(tuple((coords // chunk).T), grid) if len(coords) else np.zeros(0, np.int64)
    order = np.argsort(ids, kind="stable")
    ids, coords, values = ids[order], coords[order], np.asarray(values)[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, np.int64)
    for a, b in zip(starts, np.r_[starts[1:], len(ids)]):
        corner = np.array(np.unravel_index(ids[a], grid)) * chunk
        region = tuple(slice(c, min(c + chunk, n)) for c, n in zip(corner, shape))
        block = np.zeros([s.stop - s.start for s in region], np.uint8)
        block[tuple((coords[a:b] - corner).T)] = values[a:b]
        array[region] = block
    return len(starts)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("swc", type=Path, help="a folder of .swc files (or one file)")
    parser.add_argument("output", type=Path, help="the Zarr array to create")
    parser.add_argument("--voxel-um", type=float, default=10.0, help="the volume's voxel size (default: 10)")
    parser.add_argument("--source-um", type=float, default=25.0, help="the files' coordinate unit (default: 25)")
    parser.add_argument(
        "--extent", type=int, nargs=3, default=CCF_EXTENT_25UM, metavar=("X", "Y", "Z"),
        help="the volume's size in source units (default: the CCFv3 25 um volume, 528 320 456)",
    )  # fmt: skip
    parser.add_argument("--source", default="", help="where the files came from, kept in the attributes")
    args = parser.parse_args(argv)
    files = sorted(args.swc.glob("*.swc")) if args.swc.is_dir() else [args.swc]
    if not files:
        parser.error(f"no .swc files in {args.swc}")
    start = time.perf_counter()
    coords, values = neuron_voxels(files, voxel_um=args.voxel_um, source_um=args.source_um)
    shape = tuple(int(np.ceil(n * args.source_um / args.voxel_um)) for n in args.extent)
    attributes = {
        "voxel_um": args.voxel_um,
        "axes": "the SWC files' (x, y, z): CCFv3 anterior-posterior, dorsal-ventral, left-right",
        "neurons": {path.name: i + 1 for i, path in enumerate(files)},
        "source": args.source,
        "made_by": "tools/swc_to_volume.py",
    }
    written = write_volume(args.output, coords, values, shape, attributes=attributes)
    seconds = time.perf_counter() - start
    total = int(np.prod([-(-n // CHUNK) for n in shape]))
    print(
        f"{len(files)} neurons -> {args.output}: shape {shape} uint8 at {args.voxel_um:g} um, {len(coords)} voxels "
        f"occupied ({len(coords) / np.prod(shape, dtype=float):.4%}), {written} of {total} chunks of {CHUNK}^3 "
        f"written, {seconds:.1f} s"
    )


if __name__ == "__main__":
    main()
