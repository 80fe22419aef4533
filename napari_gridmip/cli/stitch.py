"""``napari-gridmip stitch TILES OUT``: register the tiles of a mosaic whose stage positions are only roughly known
and fuse them, by the widget's stitching plan: the mosaic as OME-Zarr (:func:`napari_gridmip.io.write_ome_zarr`)
or TIFF, a CSV of every tile's position beside it, and optionally Fiji's registered TileConfiguration."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from napari_gridmip.cli._shared import UsageError, absolute, add_batch_options, check_new

NAME = "stitch"
HELP = "Register the tiles of a mosaic whose stage positions are only roughly known, and fuse them into one image."
EXAMPLE = (
    "napari-gridmip stitch scans/ mosaic.ome.zarr --pattern 'tile_{row}_{col}.tif' --grid 6 6 --overlap 0.1\n"
    "  napari-gridmip stitch scans/TileConfiguration.txt scans/mosaic.ome.zarr --tile-configuration\n"
    "  napari-gridmip stitch scan.ome.tif mosaic.ome.zarr"
)
BATCH = True

REGISTERED_NAME = "TileConfiguration.registered.txt"  # napari_gridmip._jobs.stitch's (not imported at start-up)
POSITIONS_SUFFIX = ".positions.csv"  # after OUT's whole name: mosaic.tif and mosaic.ome.zarr get files of their own


def _max_shift(text: str) -> int | str:
    """``--max-shift``: a positive integer (px) or ``auto``."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto'; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto'; got {value}")
    return value


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "tiles", metavar="TILES", help="a folder of TIFF tiles (with --pattern), an array file (n, [C,] *tile), or a "
        "microscope file whose stage positions place the tiles (no --grid): Fiji's TileConfiguration.txt (or its "
        "folder), an OME-TIFF of several series, an OME-Zarr collection",
    )  # fmt: skip
    sub.add_argument(
        "output", metavar="OUT", help="the mosaic to write: .ome.zarr or .tif/.tiff; each tile's position goes "
        f"beside it into OUT{POSITIONS_SUFFIX} (mosaic.ome.zarr{POSITIONS_SUFFIX} for mosaic.ome.zarr)",
    )  # fmt: skip
    sub.add_argument("--grid", type=int, nargs="+", metavar="N", help="tiles along each axis: R C (or Z R C)")
    sub.add_argument("--overlap", type=float, help="nominal overlap, a fraction of the tile (tiles on a grid)")
    sub.add_argument("--order", help="row-major, column-major or snake (default: row-major)")
    sub.add_argument("--max-shift", type=_max_shift, default="auto",
                     help="largest stage error searched, px, or 'auto' (from the overlap; the default)")  # fmt: skip
    sub.add_argument("--pattern", help="tile file names, e.g. 'tile_{row}_{col}.tif' or 'img_{index:03}.tif'")
    sub.add_argument("--blend", default="linear", help="linear, mean, max or overwrite (default: linear)")
    sub.add_argument("--channel", type=int, help="the channel to register (default: the channels' mean)")
    sub.add_argument(
        "--flat-field", action="store_true", help="divide out the illumination profile estimated from the tiles"
    )
    sub.add_argument(
        "--tile-configuration", action="store_true",
        help=f"also write the registered positions as Fiji's {REGISTERED_NAME} beside OUT, each tile named by its "
        "file (tiles with no file of their own, an OME-TIFF's series, are written beside it as tile_000.tif, ...)",
    )  # fmt: skip
    add_batch_options(sub)


def positions_csv_path(output: str | Path) -> Path:
    """The positions file of the mosaic ``output``: its whole name followed by ``.positions.csv``
    (``mosaic.ome.zarr`` -> ``mosaic.ome.zarr.positions.csv``), so that two mosaics of one folder never share one."""
    path = Path(output)
    return path.with_name(path.name + POSITIONS_SUFFIX)


class StitchInputs(NamedTuple):
    """What ``stitch`` reads: the tiles (dask) and how they are placed."""

    tiles: Any
    grid_index: np.ndarray | None  # each tile's grid index (None: placed by the file's stage positions)
    grid: tuple[int, ...]  # the grid's shape; (n, 1[, 1]) for stage positions, which need none
    names: list[str] | None  # the tiles' file names (a folder), or their names in the file
    by_name: bool  # the grid index came from the file names (else from the acquisition order, --order)
    positions: np.ndarray | None = None  # the file's stage positions, (n, d) pixels
    pixel_size: tuple[float, ...] | None = None  # micrometres, where the file states it
    tile_files: list[Any] | None = None  # each tile's image file, where the tiles are files of their own
    mosaic_path: str | None = None  # the microscope file read with read_mosaic


def mosaic_file(args: argparse.Namespace) -> Any:
    """The microscope file whose stage positions place the tiles, or None: Fiji's ``TileConfiguration*.txt`` (or a
    folder holding one, without ``--pattern``), an OME-TIFF of several series (napari's mosaic reader's rule: one
    series is an image, read as an array), or an OME-Zarr collection."""
    from napari_gridmip.io._mosaic import TILE_CONFIGURATIONS, collection_images
    from napari_gridmip.io._read import open_tiff

    source = Path(args.tiles)
    name = source.name.lower()
    if source.is_dir():
        if args.pattern:
            return None
        if any((source / config).is_file() for config in TILE_CONFIGURATIONS) or collection_images(source):
            return source
        return None
    if not source.is_file():
        return None
    if name.endswith(".txt"):
        return source
    if name.endswith((".ome.tif", ".ome.tiff")):
        with open_tiff(source) as tif:
            return source if tif.is_ome and len(tif.series) > 1 else None
    return None


def _stitch_inputs(args: argparse.Namespace) -> StitchInputs:
    """The tiles and their placement: the file's stage positions, or a grid (from the file names, or from the
    acquisition order and ``--grid``)."""
    from napari_gridmip.core.patches.stitch import grid_indices
    from napari_gridmip.io import read_array, read_mosaic, read_tiles

    source = Path(args.tiles)
    if not source.exists():
        raise UsageError(f"{str(source.absolute())!r} does not exist")
    names = None
    stage_file = mosaic_file(args)
    if stage_file is not None:
        given = [flag for flag, value in (("--grid", args.grid), ("--order", args.order), ("--overlap", args.overlap))
                 if value is not None]  # fmt: skip
        if given:
            raise UsageError(f"{args.tiles!r} gives each tile's stage position: leave out {', '.join(given)} "
                             "(they place tiles on a grid)")  # fmt: skip
        from napari_gridmip._jobs.stitch import tile_files_of

        mosaic = read_mosaic(stage_file)
        d = mosaic.positions.shape[1]
        grid = (len(mosaic.positions),) + (1,) * (d - 1)
        files = tile_files_of(stage_file, mosaic.names)  # a TileConfiguration's tiles are files of their own
        return StitchInputs(mosaic.tiles, None, grid, list(mosaic.names), False, mosaic.positions, mosaic.pixel_size,
                            files, absolute(stage_file))  # fmt: skip
    if args.overlap is None:
        raise UsageError("--overlap is required for tiles on a grid (the nominal overlap of neighbours, e.g. "
                         "--overlap 0.1)")  # fmt: skip
    if source.is_dir():
        if not args.pattern:
            raise UsageError(f"{args.tiles!r} is a folder: give --pattern, e.g. 'tile_{{row}}_{{col}}.tif' (or "
                             "name a TileConfiguration.txt)")  # fmt: skip
        folder = read_tiles(source, args.pattern)
        tiles, names = folder.tiles, [p.name for p in folder.paths]
        files = [Path(p).absolute() for p in folder.paths]
        if folder.grid_index is not None:
            grid = tuple(int(g) for g in folder.grid_index.max(axis=0) + 1)
            if args.grid and tuple(args.grid) != grid:
                raise UsageError(f"--grid {' '.join(map(str, args.grid))} disagrees with the files' {grid} grid")
            return StitchInputs(tiles, folder.grid_index, grid, names, True, tile_files=files)
    else:
        if args.pattern:
            raise UsageError(f"--pattern is for a folder of tiles; {args.tiles!r} is not a folder")
        tiles, files = read_array(source), None
    if not args.grid:
        raise UsageError("--grid is required (tiles along each axis, e.g. --grid 6 6)")
    grid = tuple(args.grid)
    if not 2 <= len(grid) <= 3:
        raise UsageError(f"--grid takes 2 or 3 numbers (R C, or Z R C); got {len(grid)}")
    if int(np.prod(grid)) != tiles.shape[0]:
        count = int(np.prod(grid))
        raise UsageError(f"--grid {' x '.join(map(str, grid))} needs {count} tiles; found {tiles.shape[0]}")
    from napari_gridmip.core import validate

    order = validate.check_choice("order", args.order or "row-major", ("row-major", "column-major", "snake"))
    return StitchInputs(tiles, grid_indices(grid, order), grid, names, False, tile_files=files)


def stitch_plan_of(args: argparse.Namespace, inputs: StitchInputs) -> Any:
    """The stitching plan of ``stitch`` (the widget's, with the files as sources): the stage from the file's
    positions, or from ``grid_positions``, taken in the files' order for a folder whose names give each tile's grid
    index."""
    from napari_gridmip._jobs.plan import Source
    from napari_gridmip._jobs.stitch import StitchRequest, stitch_plan

    grid, grid_index, code = inputs.grid, inputs.grid_index, None
    if inputs.mosaic_path is not None:
        source = Source("tiles", expression=f"gm.read_mosaic({inputs.mosaic_path!r}).tiles")
        code = f"gm.read_mosaic({inputs.mosaic_path!r}).positions"
    elif args.pattern:
        source = Source("tiles", expression=f"gm.read_tiles({absolute(args.tiles)!r}, {args.pattern!r}).tiles")
    else:
        source = Source("tiles", path=absolute(args.tiles))
    order, stage_index = args.order or "row-major", ""
    if inputs.by_name:  # tile t sits at grid_index[t]: the row-major grid's tile ravel(grid_index[t])
        order, stage_index = "row-major", f"[{np.ravel_multi_index(tuple(grid_index.T), grid).tolist()}]"
    request = StitchRequest(args.tiles, inputs.tiles, None, tuple(grid), args.overlap or 0.0, order=order,
                            positions=inputs.positions, max_shift=args.max_shift, blend=args.blend,
                            flat_field=args.flat_field, source=source, positions_code=code)  # fmt: skip
    return stitch_plan(request, stage_index=stage_index, channel=args.channel, display=False)


def run(args: argparse.Namespace, compute: Any) -> None:
    import contextlib

    from napari_gridmip.core.runtime.files import atomic_path

    output = str(args.output)
    lower = output.lower()
    if not lower.endswith((".ome.zarr", ".tif", ".tiff")):
        raise UsageError(f"{output!r}: the mosaic must end in .ome.zarr, .tif or .tiff")
    csv_path = positions_csv_path(output)
    check_new(output, csv_path, overwrite=args.overwrite)  # before any work
    inputs = _stitch_inputs(args)
    tiles, grid = inputs.tiles, inputs.grid
    d = len(grid)
    if tiles.ndim not in (d + 1, d + 2):
        raise UsageError(f"a {d}D grid needs tiles (n, [C,] *tile) with {d} spatial axes; got shape {tiles.shape}")
    folder = Path(output).absolute().parent
    if args.tile_configuration:
        from napari_gridmip._jobs.stitch import export_targets

        # before any work
        check_new(*export_targets(folder, tiles.shape[0], inputs.tile_files, mosaic=False), overwrite=args.overwrite)
    plan = stitch_plan_of(args, inputs)
    from napari_gridmip._jobs import prepare_jax

    prepare_jax()  # compiled programs kept in the per-user cache, as the widgets do: a second run skips the compile
    small = tiles.nbytes < 2 * 2**30  # read once into memory for the registration, which reads each overlap

    def report(done: int, total: int) -> None:
        # a share of the work, not a count: register_tiles counts batches of pairs over its passes, which the
        # summary's count of pairs would contradict
        if not args.quiet:
            end = "\n" if done == total else ""
            print(f"\rregistering tile pairs: {round(100 * done / max(total, 1)):3d}%", end=end, file=sys.stderr)

    def extras(i: int, call: Any) -> dict[str, Any]:
        return {"progress": report} if call.function == "register_tiles" else {}

    data = tiles.compute() if small else tiles
    bound = {"tiles": data} if inputs.positions is None else {"tiles": data, "stage": inputs.positions}
    values = plan.execute(bound, extras=extras)
    result = values["registration"]
    if not args.quiet:
        accepted, pairs = int(result.accepted.sum()), len(result.pairs)
        print(f"{accepted} of {pairs} overlapping tile pairs used, median residual {result.median_residual:.3f} px, "
              f"{int(result.placed_from_stage.sum())} tile(s) placed from the stage", file=sys.stderr)  # fmt: skip
    image, origin = plan.outputs_of(values)["mosaic"], values["mosaic"].origin
    attributes = plan.record()
    # every file under a temporary name, all renamed once all are complete: a failure leaves none of them
    with contextlib.ExitStack() as stack:
        temporary = stack.enter_context(atomic_path(output, overwrite=args.overwrite))
        csv_temporary = stack.enter_context(atomic_path(csv_path, overwrite=args.overwrite))
        if args.tile_configuration:
            from napari_gridmip._jobs.stitch import write_registered

            write_registered(stack, folder, result.positions, tiles=data, tile_files=inputs.tile_files,
                             overwrite=args.overwrite)  # fmt: skip
        if lower.endswith(".ome.zarr"):
            from napari_gridmip.io import write_ome_zarr

            axes = ("c" if tiles.ndim == d + 2 else "") + "zyx"[3 - d :]
            pixel_size = None if inputs.pixel_size is None else tuple(inputs.pixel_size)[-d:]
            write_ome_zarr(image, temporary, pixel_size=pixel_size, origin=origin, axes=axes, name="mosaic",
                           compute=compute, attributes=attributes)  # fmt: skip
        else:
            import json

            import tifffile

            pixels = np.asarray(compute([image])[0]) if hasattr(image, "dask") else np.asarray(image)
            tifffile.imwrite(temporary, pixels, description=json.dumps(attributes))
        # a folder's tiles by their files; a microscope file's by their names in it (an OME-TIFF's images...)
        column = "name" if inputs.mosaic_path is not None else "file"
        _write_positions(csv_temporary, result, inputs.grid_index, origin, inputs.names, column)


def _write_positions(
    path: Any, result: Any, grid_index: np.ndarray | None, origin: np.ndarray, names: Any, column: str = "file"
) -> None:
    """One row per tile; origins in the mosaic's pixels (where the tile's pixel 0 lies in OUT); the grid index
    where the tiles are on a grid; ``names`` in the last column, headed ``column``."""
    import csv

    d = result.positions.shape[1]
    axes = ("z", "y", "x")[3 - d :]
    grid_names = ("plane", "row", "col")[3 - d :] if grid_index is not None else ()
    header = ["tile", *[f"grid_{g}" for g in grid_names], *[f"stage_{a}" for a in axes]]
    header += [*[f"refined_{a}" for a in axes], "placed_from_stage", "confidence"] + ([column] if names else [])
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for t in range(len(result.positions)):
            row = [t, *(map(int, grid_index[t]) if grid_index is not None else ())]
            row += [f"{v:.4f}" for v in result.stage_positions[t] - origin]
            row += [f"{v:.4f}" for v in result.positions[t] - origin]
            row += [int(result.placed_from_stage[t]), f"{result.tile_confidence[t]:.4f}"]
            writer.writerow(row + ([names[t]] if names else []))
