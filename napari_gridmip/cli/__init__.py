"""``napari-gridmip``: the viewer, and batch subcommands for data larger than memory.

    napari-gridmip                                   napari with the widgets docked
    napari-gridmip --prepare [--background] [--force]   compile the widgets' programs once per machine
    napari-gridmip mipmap IN OUT [--threshold T] [--packed] [--bbox]   occupancy pyramid -> OME-Zarr
    napari-gridmip merge IN OUT --stride S [S ...]   patch stack -> image
    napari-gridmip correlate IMG1 IMG2 OUT --window WM WN   displacement field -> Zarr
        [--subset SH SW] [--step S] [--outputs transmission,dark-field,...]
    napari-gridmip stitch TILES OUT --grid R C --overlap F   tiles -> registered mosaic + positions CSV
    napari-gridmip stitch scan.ome.tif OUT [--tile-configuration]   placed by the file's stage positions
    napari-gridmip corrimage MOVIE OUT [--neighbours 8|4]   local correlation image of a movie
    napari-gridmip correlate-series FRAMES --out FOLDER [--subset 31] [--step 8] [--roi MASK]
        [--reference accumulated|incremental|auto]   DIC of a sequence -> one DICe CSV per frame

A thin reader and writer around the widgets' own plans (:mod:`napari_gridmip._jobs`): each subcommand reads its
files as the plan's sources, executes the same plan as the widget's job with the same options (``merge_plan``,
``correlation_plan``, ``stitch_plan``, ``timeseries_plan``, ``series_plan``), and writes the outputs with
``plan.record()``, the calls, inputs, versions and a script that reproduces them. Every subcommand reads lazily
(dask), computes block by block (``correlate-series``: frame by frame) with a progress bar, writes under a
temporary name that is renamed when complete, and on bad input prints one line and exits with status 2 (1 for a
failure while running). ``--scheduler ADDRESS`` runs the work on an existing dask.distributed cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

PLUGIN = "napari-gridmip"
# display names in napari.yaml; each sample is for one widget, whose tab comes to the front
WIDGET_NAMES = ["Occupancy mipmap", "Reassemble patches", "Stitch tiles", "Process in tiles", "Correlation map"]
SAMPLE_WIDGETS = {
    "occupancy": "Occupancy mipmap",
    "sparse-volume": "Occupancy mipmap",
    "tiles": "Reassemble patches",
    "mosaic": "Stitch tiles",
    "speckle": "Correlation map",
    "speckle-contrast": "Correlation map",
    "dic": "Correlation map",
    "dic-series": "Correlation map",
    "calcium": "Correlation map",
}
SAMPLE_KEYS = list(SAMPLE_WIDGETS)

EXAMPLES = {
    "mipmap": "napari-gridmip mipmap volume.zarr occupancy.ome.zarr --threshold 120 --scale 2 0.5 0.5 --packed --bbox",
    "merge": "napari-gridmip merge tiles.npy merged.tif --stride 100 100 --image-shape 3 512 512 --blend gaussian",
    "correlate": "napari-gridmip correlate sample.tif reference.tif field.zarr --window 15 15 --subpixel refine\n"
    "  napari-gridmip correlate deformed.tif reference.tif dic.zarr --window 11 11 --subset 31 31 --step 5 "
    "--subpixel refine --outputs uncertainty",
    "stitch": "napari-gridmip stitch scans/ mosaic.ome.zarr --pattern 'tile_{row}_{col}.tif' --grid 6 6 --overlap 0.1\n"
    "  napari-gridmip stitch scans/TileConfiguration.txt scans/mosaic.ome.zarr --tile-configuration\n"
    "  napari-gridmip stitch scan.ome.tif mosaic.ome.zarr",
    "corrimage": "napari-gridmip corrimage movie.tif correlation.tif --neighbours 8",
    "correlate-series": "napari-gridmip correlate-series frames.tif --subset 31 --step 8 --roi mask.tif --out dic/",
}

REGISTERED_NAME = "TileConfiguration.registered.txt"  # napari_gridmip._jobs.stitch's (not imported at start-up)

# --outputs of `correlate`: the correlation plan's outputs (napari_gridmip._jobs.correlation.PARTS), spelled with
# hyphens on the command line
OUTPUT_NAMES = ("transmission", "dark-field", "residual", "uncertainty", "phase", "strain")


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the usage stays in --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


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


def build_parser() -> argparse.ArgumentParser:
    from napari_gridmip.core.options import COMPUTE_ON  # JAX-free

    parser = _Parser(
        prog="napari-gridmip",
        description="Open napari with the napari-gridmip widgets, run one job in batch (see the subcommands), or "
        "prepare this machine's compiled programs for the widgets' first Runs (--prepare).",
    )
    parser.add_argument(
        "--sample", choices=SAMPLE_KEYS, default="occupancy", help="sample to open (default: %(default)s)"
    )
    parser.add_argument("--no-sample", action="store_true", help="open no sample")
    parser.add_argument(
        "--prepare", action="store_true",
        help="compile the widgets' programs for their samples and keep them for every later session on this "
        "machine (once per machine: a first Run then loads them), then exit without opening napari",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="with --prepare: prepare again, even if done")
    parser.add_argument(
        "--background", action="store_true",
        help="with --prepare: prepare in a detached process, its output in a log file whose path is printed",
    )  # fmt: skip
    parser.add_argument(
        "--compute-on", dest="prepare_compute_on", choices=COMPUTE_ON,
        help="with --prepare: where the prepared runs compute, as the widgets' setting (default: "
        "NAPARI_GRIDMIP_COMPUTE_ON, else auto)",
    )  # fmt: skip
    commands = parser.add_subparsers(
        dest="command", metavar="{mipmap,merge,correlate,stitch,corrimage,correlate-series}"
    )

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=f"example:\n  {EXAMPLES[name]}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return sub

    mipmap = add("mipmap", "Write the occupancy pyramid of a volume as an OME-Zarr multiscale image.")
    mipmap.add_argument(
        "input", metavar="IN", help=".npy, .tif/.tiff or Zarr (array, or OME-Zarr level 0): (..., Z, Y, X)"
    )
    mipmap.add_argument("output", metavar="OUT", help="the OME-Zarr folder to create")
    mipmap.add_argument("--threshold", type=float, default=0.0, help="occupied where value > T (default: 0)")
    mipmap.add_argument("--scale", type=float, nargs=3, metavar=("SZ", "SY", "SX"), help="level 0's voxel size")
    mipmap.add_argument(
        "--packed",
        action="store_true",
        help="also write every level packed 8 cells a byte, in OUT/packed/s0, s1, ... (order and shape in attributes)",
    )
    mipmap.add_argument(
        "--packed-order",
        choices=["morton", "c"],
        default="morton",
        help="byte layout of --packed: Morton order of 2x2x2 blocks (instant-ngp's bitfield) or C order "
        "(default: %(default)s)",
    )
    mipmap.add_argument(
        "--bbox", action="store_true", help="print the bounding box of the occupied voxels (z, y, x; half-open)"
    )

    merge = add("merge", "Reassemble a patch stack (grid axes first) into one image.")
    merge.add_argument("input", metavar="IN", help="patches (g1, ..., gd, *leading, p1, ..., pd)")
    merge.add_argument("output", metavar="OUT", help="the image to write: .npy, .tif/.tiff or .zarr")
    merge.add_argument("--stride", type=int, nargs="+", required=True, help="one stride per tiled axis")
    merge.add_argument("--image-shape", type=int, nargs="+", help="default: the smallest image the grid covers")
    merge.add_argument("--blend", default="mean", help="mean, gaussian, hann, max or overwrite (default: mean)")

    correlate = add("correlate", "Displacement field (dy, dx, peak) between two K-frame stacks, into a Zarr group.")
    correlate.add_argument("img1", metavar="IMG1", help="the sample (or deformed) stack (..., K, M, N), or one image")
    correlate.add_argument("img2", metavar="IMG2", help="the reference stack, same shape")
    correlate.add_argument("output", metavar="OUT", help="the Zarr folder to create, with arrays dy, dx and peak")
    correlate.add_argument("--window", type=int, nargs=2, required=True, metavar=("WM", "WN"), help="odd window size")
    correlate.add_argument(
        "--subset", type=int, nargs=2, default=(1, 1), metavar=("SH", "SW"),
        help="odd subset: each vector spans K x SH x SW values (DIC: 21 21 to 41 41; default: 1 1)",
    )  # fmt: skip
    correlate.add_argument("--step", type=int, default=1, help="results on every S-th pixel only (default: 1)")
    correlate.add_argument(
        "--subpixel", default="hessian",
        help="hessian, paraboloid, refine or none (default: hessian); refine with a subset smooths both images "
        "by a 0.8 px Gaussian first, against noise bias",
    )  # fmt: skip
    correlate.add_argument(
        "--shape", default="translation", choices=["translation", "affine"],
        help="the subsets' shape function: affine fits each subset's displacement gradients too (IC-GN; needs "
        "--subset and --subpixel refine; strain then comes from those gradients) (default: translation)",
    )  # fmt: skip
    correlate.add_argument(
        "--outputs", default="", metavar="NAMES",
        help="comma-separated extra arrays: transmission, dark-field, residual, uncertainty (sigma_dy, sigma_dx), "
        "phase (integrate_gradient of the field, px^2) and strain (strain_field: exx, eyy, exy); with --step S both "
        "take the samples as S pixels apart. With transmission, dark-field, residual or uncertainty the field is "
        "track_speckles' (IMG1 the sample, IMG2 the reference)",
    )  # fmt: skip
    correlate.add_argument(
        "--strain-window", type=int, default=11, help="odd window of the strain fit, in output pixels (default: 11)"
    )
    correlate.add_argument("--dtype", default="float32", choices=["float32", "float64"])

    stitch = add(
        "stitch",
        "Register the tiles of a mosaic whose stage positions are only roughly known, and fuse them into one image.",
    )
    stitch.add_argument(
        "tiles", metavar="TILES", help="a folder of TIFF tiles (with --pattern), an array file (n, [C,] *tile), or a "
        "microscope file whose stage positions place the tiles (no --grid): Fiji's TileConfiguration.txt (or its "
        "folder), an OME-TIFF of several series, an OME-Zarr collection",
    )  # fmt: skip
    stitch.add_argument(
        "output", metavar="OUT", help="the mosaic to write: .ome.zarr or .tif/.tiff (positions CSV beside it)"
    )
    stitch.add_argument("--grid", type=int, nargs="+", metavar="N", help="tiles along each axis: R C (or Z R C)")
    stitch.add_argument("--overlap", type=float, help="nominal overlap, a fraction of the tile (tiles on a grid)")
    stitch.add_argument("--order", help="row-major, column-major or snake (default: row-major)")
    stitch.add_argument("--max-shift", type=_max_shift, default="auto",
                        help="largest stage error searched, px, or 'auto' (from the overlap; the default)")  # fmt: skip
    stitch.add_argument("--pattern", help="tile file names, e.g. 'tile_{row}_{col}.tif' or 'img_{index:03}.tif'")
    stitch.add_argument("--blend", default="linear", help="linear, mean, max or overwrite (default: linear)")
    stitch.add_argument("--channel", type=int, help="the channel to register (default: the channels' mean)")
    stitch.add_argument(
        "--flat-field", action="store_true", help="divide out the illumination profile estimated from the tiles"
    )
    stitch.add_argument(
        "--tile-configuration", action="store_true",
        help=f"also write the registered positions as Fiji's {REGISTERED_NAME} beside OUT, each tile named by its "
        "file (tiles with no file of their own, an OME-TIFF's series, are written beside it as tile_000.tif, ...)",
    )  # fmt: skip

    corrimage = add("corrimage", "The local correlation image of a movie (CaImAn's correlation image, Cn).")
    corrimage.add_argument("movie", metavar="MOVIE", help="the movie (..., T, Y, X): .npy, .tif/.tiff or Zarr")
    corrimage.add_argument("output", metavar="OUT", help="the image to write (..., Y, X): .npy, .tif/.tiff or .zarr")
    corrimage.add_argument(
        "--neighbours", type=int, choices=[8, 4], default=8, help="8 (3x3) or 4 (sides) neighbours (default: 8)"
    )
    corrimage.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    corrimage.add_argument("--chunk-frames", type=int, help="frames per task (default: the movie's chunks)")

    series = add(
        "correlate-series",
        "DIC of a whole experiment: a grid of points on frame 0 followed through every frame (correlate_series), "
        "with the strain of each frame; one CSV file per frame, DICe's columns, into a folder.",
    )
    series.add_argument(
        "frames", metavar="FRAMES", help="the sequence (T, Y, X): .npy, .tif/.tiff or Zarr; frame 0 is the reference"
    )
    series.add_argument("--out", required=True, metavar="FOLDER", help="the folder to create, DICe_solution_<t>.txt")
    series.add_argument(
        "--subset", type=int, nargs="+", default=[31], metavar="S", help="odd subset size SH [SW] (default: 31)"
    )
    series.add_argument("--step", type=int, default=8, help="the grid's spacing in px (default: 8)")
    series.add_argument(
        "--roi", metavar="MASK", help="the region of interest on frame 0: a (Y, X) bool or integer mask, nonzero inside"
    )
    series.add_argument(
        "--reference", default="accumulated", choices=["accumulated", "incremental", "auto"],
        help="each point matched against frame 0 (accumulated), the last frame it was found in (incremental), or "
        "frame 0 until its match weakens (auto) (default: %(default)s)",
    )  # fmt: skip
    series.add_argument(
        "--strain", default="green-lagrange", choices=["green-lagrange", "small"],
        help="the strain from each point's own gradients (default: %(default)s, which a rotation leaves at 0)",
    )  # fmt: skip
    series.set_defaults(scheduler=None)  # one frame at a time, in this process

    for sub in (mipmap, merge, correlate, stitch, corrimage):
        sub.add_argument("--scheduler", metavar="ADDRESS", help="a dask.distributed scheduler, e.g. tcp://host:8786")
    for sub in (mipmap, merge, correlate, stitch, corrimage, series):
        sub.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
        sub.add_argument("--quiet", action="store_true", help="no progress bar")
        sub.add_argument(
            "--compute-on", choices=COMPUTE_ON,
            help="where the kernels run: the library's rules (auto), JAX's default device (accelerator), or the host "
            "CPU (host); recorded with the outputs (default: NAPARI_GRIDMIP_COMPUTE_ON, else auto)",
        )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.prepare or args.force or args.background or args.prepare_compute_on:
        sys.exit(run_prepare(parser, args))
    if args.command is None:
        open_viewer(args)
        return
    try:
        with runner(args.scheduler, quiet=args.quiet) as compute, placed(args.compute_on):
            RUNS[args.command](args, compute)
    except (UsageError, ValueError, TypeError, ImportError) as error:  # ImportError: an optional reader missing
        print(f"napari-gridmip {args.command}: error: {_one_line(error)}", file=sys.stderr)
        sys.exit(2)
    except (OSError, MemoryError, RuntimeError) as error:
        print(f"napari-gridmip {args.command}: failed: {type(error).__name__}: {_one_line(error)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"napari-gridmip {args.command}: interrupted; nothing was written", file=sys.stderr)
        sys.exit(130)


def run_prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--prepare`` (:mod:`napari_gridmip._sample_data.prepare`): here, or in a detached process with
    ``--background``; the
    exit status (2 for a bad combination or a cache that cannot keep programs, 1 for a failed job)."""
    if not args.prepare:
        if args.force or args.background:
            parser.error(f"{'--force' if args.force else '--background'} goes with --prepare")
        parser.error("--compute-on before a subcommand goes with --prepare; a subcommand takes it after its name")
    if args.command is not None:
        parser.error(f"--prepare takes no subcommand; got {args.command!r}")
    from napari_gridmip._sample_data import prepare as _prepare

    try:
        if args.background:
            pid, log = _prepare.start_in_background(args.prepare_compute_on, force=args.force)
            print(f"{_prepare.PROG}: preparing in the background (process {pid}); its log: {log}")
            return 0
        from napari_gridmip.core.runtime import choice

        where = args.prepare_compute_on or choice.default()
        return _prepare.prepare(where, force=args.force)
    except (_prepare.PrepareError, ValueError) as error:
        print(f"{_prepare.PROG}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as error:  # a cache folder not writable, a device another process holds
        print(f"{_prepare.PROG}: failed: {type(error).__name__}: {_one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_prepare.PROG}: interrupted; the machine is not recorded as prepared", file=sys.stderr)
        return 130


def placed(where: str | None) -> Any:
    """The run's block: its kernels where ``--compute-on`` (else ``NAPARI_GRIDMIP_COMPUTE_ON``, else auto) says, and
    where each call ran logged for the outputs' provenance (``plan.record()``'s ``"ran_on"``)."""
    from napari_gridmip._jobs import placed as job_placed
    from napari_gridmip.core.runtime import choice

    return job_placed(choice.default() if where is None else where)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def open_viewer(args: argparse.Namespace) -> None:
    import napari

    viewer = napari.Viewer(title="napari-gridmip")
    # tabs, not a stack: three docks stacked need more height than a laptop screen has
    docks = [viewer.window.add_plugin_dock_widget(PLUGIN, name, tabify=True)[0] for name in WIDGET_NAMES]
    if not args.no_sample:
        viewer.open_sample(PLUGIN, args.sample)
    # the tab of the widget that takes the sample comes to the front once the window is up
    front = docks[WIDGET_NAMES.index(SAMPLE_WIDGETS[args.sample])] if not args.no_sample else docks[0]
    from qtpy.QtCore import QTimer

    QTimer.singleShot(0, front.raise_)
    napari.run()


@contextlib.contextmanager
def runner(address: str | None, *, quiet: bool) -> Iterator[Any]:
    """A ``compute(delayed_list)`` that runs locally with a progress bar, or on the cluster at ``address``."""
    import dask

    if address is None:
        from dask.diagnostics import ProgressBar

        def compute(graphs: Any) -> Any:
            with ProgressBar(out=sys.stderr) if not quiet else contextlib.nullcontext():
                return dask.compute(graphs)[0]

        yield compute
        return
    try:
        from distributed import Client, progress
    except ImportError:
        raise UsageError("--scheduler needs dask.distributed: pip install 'napari-gridmip[distributed]'") from None
    try:
        client = Client(address, timeout="10s")
    except OSError as error:
        raise UsageError(f"cannot reach the scheduler at {address!r}: {error}") from None
    with client:

        def compute(graphs: Any) -> Any:
            futures = client.compute(graphs)
            if not quiet:
                progress(futures)
                print(file=sys.stderr)
            return client.gather(futures)

        yield compute


def _absolute(path: str) -> str:
    import os

    return os.path.abspath(path)


def run_mipmap(args: argparse.Namespace, compute: Any) -> None:
    from napari_gridmip._jobs.plan import Call, Plan, Source
    from napari_gridmip.io import read_array

    volume = read_array(args.input)
    options = {"threshold": args.threshold, "scale": None if args.scale is None else tuple(args.scale)}
    if args.packed:
        options["packed"] = args.packed_order
    call = Call("write_mipmap", ("volume",), (_absolute(args.output),), options, result="path")
    plan = Plan([Source("volume", path=_absolute(args.input))], [call], {})
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


def run_merge(args: argparse.Namespace, compute: Any) -> None:
    from napari_gridmip._jobs.patches import MergeRequest, infer_image_shape, merge_plan
    from napari_gridmip._jobs.plan import Source
    from napari_gridmip.io import read_array, write_array

    patches = read_array(args.input)
    d = len(args.stride)
    if patches.ndim < 2 * d:
        raise UsageError(f"a patch stack with {d} tiled axes needs at least {2 * d} axes; got shape {patches.shape}")
    image_shape = args.image_shape
    if image_shape is None:
        grid, patch = patches.shape[:d], patches.shape[patches.ndim - d :]
        image_shape = infer_image_shape(grid, patches.shape[d : patches.ndim - d], patch, tuple(args.stride))
    request = MergeRequest(args.input, patches, tuple(image_shape), tuple(args.stride), args.blend, None, ())
    plan = merge_plan(request, source=Source("patches", path=_absolute(args.input)), display=False)
    merged = plan.run({"patches": patches})["merged"]
    write_array(merged, args.output, overwrite=args.overwrite, compute=compute, attributes=plan.record())


def parse_outputs(text: str) -> list[str]:
    """The ``--outputs`` names, checked (one-line errors for unknown ones), as the correlation plan spells them."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in OUTPUT_NAMES:
            raise UsageError(f"--outputs: unknown output {name!r}; choose from {', '.join(OUTPUT_NAMES)}")
    return [name.replace("-", "_") for name in names]


def correlate_plan(args: argparse.Namespace, img1: Any, img2: Any) -> tuple[Any, dict[str, Any]]:
    """The correlation plan of ``correlate`` (the widget's, with the files as sources) and its inputs."""
    from napari_gridmip._jobs.correlation import CorrelationRequest, correlation_plan
    from napari_gridmip._jobs.plan import Source

    names = parse_outputs(args.outputs)
    index = "[None]" if img1.ndim == 2 and img2.ndim == 2 else ""  # one image each (DIC): K = 1
    request = CorrelationRequest(
        args.img1, args.img2, img1, img2, None, tuple(args.window), subpixel=args.subpixel, dtype=args.dtype,
        subset=tuple(args.subset), step=args.step, outputs=tuple(names), index=index,
        strain_window=args.strain_window, shape=args.shape,
    )  # fmt: skip
    sources = (Source("img1", path=_absolute(args.img1), index=index),
               Source("img2", path=_absolute(args.img2), index=index))  # fmt: skip
    plan = correlation_plan(request, sources=sources, display=False)
    return plan, {"img1": sources[0].take(img1), "img2": sources[1].take(img2)}


def run_correlate(args: argparse.Namespace, compute: Any) -> None:
    import dask.array as da
    import zarr

    from napari_gridmip.io import read_array
    from napari_gridmip.io._write import atomic_path

    plan, inputs = correlate_plan(args, read_array(args.img1), read_array(args.img2))
    arrays = plan.run(inputs)  # lazy: the stacks are read band by band while OUT is written
    with atomic_path(args.output, overwrite=args.overwrite) as temporary:
        zarr.open_group(str(temporary), mode="w").attrs.update(plan.record())
        writes = [da.to_zarr(da.asarray(array), str(temporary), component=name, compute=False)
                  for name, array in arrays.items()]  # fmt: skip
        compute(writes)


def positions_csv_path(output: str) -> Any:
    """``mosaic.ome.zarr`` or ``mosaic.tif`` -> ``mosaic.positions.csv`` beside it."""
    from pathlib import Path

    path = Path(output)
    name = path.name
    for suffix in (".ome.zarr", ".zarr", ".tiff", ".tif"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return path.with_name(f"{name}.positions.csv")


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
    from pathlib import Path

    from napari_gridmip.io._mosaic import TILE_CONFIGURATIONS, collection_images

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
        import tifffile

        with tifffile.TiffFile(source) as tif:
            return source if tif.is_ome and len(tif.series) > 1 else None
    return None


def _stitch_inputs(args: argparse.Namespace) -> StitchInputs:
    """The tiles and their placement: the file's stage positions, or a grid (from the file names, or from the
    acquisition order and ``--grid``)."""
    from pathlib import Path

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
                            files, _absolute(str(stage_file)))  # fmt: skip
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
        source = Source("tiles", expression=f"gm.read_tiles({_absolute(args.tiles)!r}, {args.pattern!r}).tiles")
    else:
        source = Source("tiles", path=_absolute(args.tiles))
    order, stage_index = args.order or "row-major", ""
    if inputs.by_name:  # tile t sits at grid_index[t]: the row-major grid's tile ravel(grid_index[t])
        order, stage_index = "row-major", f"[{np.ravel_multi_index(tuple(grid_index.T), grid).tolist()}]"
    request = StitchRequest(args.tiles, inputs.tiles, None, tuple(grid), args.overlap or 0.0, order=order,
                            positions=inputs.positions, max_shift=args.max_shift, blend=args.blend,
                            flat_field=args.flat_field, source=source, positions_code=code)  # fmt: skip
    return stitch_plan(request, stage_index=stage_index, channel=args.channel, display=False)


def run_stitch(args: argparse.Namespace, compute: Any) -> None:
    from pathlib import Path

    from napari_gridmip.io._write import atomic_path

    output = str(args.output)
    lower = output.lower()
    if not lower.endswith((".ome.zarr", ".tif", ".tiff")):
        raise UsageError(f"{output!r}: the mosaic must end in .ome.zarr, .tif or .tiff")
    csv_path = positions_csv_path(output)
    for path in (output, csv_path):  # before any work
        if Path(path).exists() and not args.overwrite:
            raise UsageError(f"{str(Path(path).absolute())!r} already exists (pass --overwrite to replace it)")
    inputs = _stitch_inputs(args)
    tiles, grid = inputs.tiles, inputs.grid
    d = len(grid)
    if tiles.ndim not in (d + 1, d + 2):
        raise UsageError(f"a {d}D grid needs tiles (n, [C,] *tile) with {d} spatial axes; got shape {tiles.shape}")
    folder = Path(output).absolute().parent
    if args.tile_configuration:
        from napari_gridmip._jobs.stitch import export_targets

        for path in export_targets(folder, tiles.shape[0], inputs.tile_files, mosaic=False):  # before any work
            if path.exists() and not args.overwrite:
                raise UsageError(f"{str(path)!r} already exists (pass --overwrite to replace it)")
    plan = stitch_plan_of(args, inputs)
    from napari_gridmip._jobs import prepare_jax

    prepare_jax()  # compiled programs kept in the per-user cache, as the widgets do: a second run skips the compile
    small = tiles.nbytes < 2 * 2**30  # read once into memory for the registration, which reads each overlap

    def report(done: int, total: int) -> None:
        if not args.quiet:
            print(f"\rregistering tile pairs: {done}/{total}", end="\n" if done == total else "", file=sys.stderr)

    def extras(i: int, call: Any) -> dict[str, Any]:
        return {"progress": report} if call.function == "register_tiles" else {}

    data = tiles.compute() if small else tiles
    bound = {"tiles": data} if inputs.positions is None else {"tiles": data, "stage": inputs.positions}
    values = plan.execute(bound, extras=extras)
    result = values["registration"]
    if not args.quiet:
        accepted, pairs = int(result.accepted.sum()), len(result.pairs)
        print(f"{accepted} of {pairs} pairs used, median residual {result.median_residual:.3f} px, "
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
            has_channels = tiles.ndim == d + 2
            _write_ome_zarr(image, origin, temporary, has_channels=has_channels, compute=compute,
                            attributes=attributes, pixel_size=inputs.pixel_size)  # fmt: skip
        else:
            import json

            import tifffile

            pixels = np.asarray(compute([image])[0]) if hasattr(image, "dask") else np.asarray(image)
            tifffile.imwrite(temporary, pixels, description=json.dumps(attributes))
        # a folder's tiles by their files; a microscope file's by their names in it (an OME-TIFF's images...)
        column = "name" if inputs.mosaic_path is not None else "file"
        _write_positions(csv_temporary, result, inputs.grid_index, origin, inputs.names, column)


def _write_ome_zarr(
    image: Any,
    origin: np.ndarray,
    path: Any,
    *,
    has_channels: bool,
    compute: Any,
    attributes: dict[str, Any],
    pixel_size: Any = None,
) -> None:
    """One OME-Zarr image (level 0 only) whose translation puts pixel 0 at ``origin``, with ``attributes``; with
    ``pixel_size`` (micrometres), the spatial axes in micrometres at that scale."""
    import dask.array as da
    import zarr
    from ome_zarr.writer import write_multiscales_metadata

    lead = 1 if has_channels else 0
    names = ("z", "y", "x")[3 - len(origin) :]
    size = np.ones(len(origin)) if pixel_size is None else np.asarray(pixel_size, dtype=float)[-len(origin) :]
    unit = {} if pixel_size is None else {"unit": "micrometer"}
    axes = [{"name": "c", "type": "channel"}] * lead + [{"name": n, "type": "space", **unit} for n in names]
    group = zarr.open_group(str(path), mode="w")
    group.attrs.update(attributes)
    compute([da.to_zarr(da.asarray(image), str(path), component="0", compute=False)])
    transforms = [
        {"type": "scale", "scale": [1.0] * lead + [float(s) for s in size]},
        {"type": "translation", "translation": [0.0] * lead + [float(o * s) for o, s in zip(origin, size)]},
    ]
    datasets = [{"path": "0", "coordinateTransformations": transforms}]
    write_multiscales_metadata(group, datasets, axes=axes, name="mosaic")


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


def run_corrimage(args: argparse.Namespace, compute: Any) -> None:
    from napari_gridmip._jobs.plan import Source
    from napari_gridmip._jobs.timeseries import TimeSeriesRequest, timeseries_plan
    from napari_gridmip.io import read_array, write_array

    movie = read_array(args.movie)
    request = TimeSeriesRequest(args.movie, movie, None, args.neighbours, args.dtype, args.chunk_frames)
    plan = timeseries_plan(request, source=Source("movie", path=_absolute(args.movie)))
    # lazy: the frames are read chunk by chunk while OUT is written
    image = plan.run({"movie": movie})["correlation image"]
    write_array(image, args.output, overwrite=args.overwrite, compute=compute, attributes=plan.record())


def run_correlate_series(args: argparse.Namespace, compute: Any) -> None:
    """``correlate-series``: the widget's DIC series plan on a file's frames, one CSV file per frame with the run's
    provenance in each header; nothing written unless every frame was followed."""
    import json
    from pathlib import Path

    from napari_gridmip._jobs.correlation import SeriesRequest, series_plan
    from napari_gridmip._jobs.plan import KEY, Source
    from napari_gridmip.io import read_array
    from napari_gridmip.io._dic_csv import write_series_csv
    from napari_gridmip.io._write import atomic_path

    out = Path(args.out).absolute()
    if out.exists() and not args.overwrite:  # before any work
        raise UsageError(f"{str(out)!r} already exists (pass --overwrite to replace it)")
    if not out.parent.exists():
        raise UsageError(f"the folder {str(out.parent)!r} does not exist")
    if len(args.subset) > 2:
        raise UsageError(f"--subset takes one or two sizes (SH [SW]); got {len(args.subset)}")
    frames = read_array(args.frames)
    if frames.ndim != 3:
        raise UsageError(f"FRAMES must be a sequence (T, Y, X); {args.frames!r} has shape {frames.shape}")
    subset = (args.subset[0], args.subset[-1])
    sources = [Source("frames", path=_absolute(args.frames))]
    inputs = {"frames": frames}  # read one frame at a time
    if args.roi is not None:
        sources.append(Source("roi", path=_absolute(args.roi)))
        inputs["roi"] = read_array(args.roi).compute()
    request = SeriesRequest(args.frames, frames, None, subset=subset, step=args.step, reference=args.reference,
                            strain_kind=args.strain)  # fmt: skip
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
    with atomic_path(out, overwrite=args.overwrite) as temporary:
        files = write_series_csv(values["series"], temporary, strain=strain, provenance=provenance)
    if not args.quiet:
        print(f"wrote {len(files)} files into {str(out)!r}", file=sys.stderr)


RUNS = {
    "mipmap": run_mipmap,
    "merge": run_merge,
    "correlate": run_correlate,
    "stitch": run_stitch,
    "corrimage": run_corrimage,
    "correlate-series": run_correlate_series,
}
