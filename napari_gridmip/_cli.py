"""``napari-gridmip``: the viewer, and batch subcommands for data larger than memory.

    napari-gridmip                                   napari with the widgets docked
    napari-gridmip mipmap IN OUT [--threshold T]     occupancy pyramid -> OME-Zarr
    napari-gridmip merge IN OUT --stride S [S ...]   patch stack -> image
    napari-gridmip correlate IMG1 IMG2 OUT --window WM WN   displacement field -> Zarr
        [--subset SH SW] [--step S] [--outputs transmission,dark-field,...]

Every subcommand reads lazily (dask), computes block by block with a progress
bar, writes under a temporary name that is renamed when complete, and on bad
input prints one line and exits with status 2 (1 for a failure while running).
``--scheduler ADDRESS`` runs the work on an existing dask.distributed cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

PLUGIN = "napari-gridmip"
WIDGET_NAMES = ["Occupancy mipmap", "Reassemble patches", "Correlation map"]  # display names in napari.yaml
SAMPLE_KEYS = ["occupancy", "tiles", "speckle"]  # in WIDGET_NAMES' order: each sample is for that widget

EXAMPLES = {
    "mipmap": "napari-gridmip mipmap volume.zarr occupancy.ome.zarr --threshold 120 --scale 2 0.5 0.5",
    "merge": "napari-gridmip merge tiles.npy merged.tif --stride 100 100 --image-shape 3 512 512 --blend gaussian",
    "correlate": "napari-gridmip correlate sample.tif reference.tif field.zarr --window 15 15 --subpixel refine\n"
    "  napari-gridmip correlate deformed.tif reference.tif dic.zarr --window 11 11 --subset 31 31 --step 5 "
    "--subpixel refine --outputs uncertainty",
}

# --outputs of `correlate`: name -> (arrays written, what computes them)
TRACKING_OUTPUTS = {
    "transmission": ("transmission",),
    "dark-field": ("dark_field",),
    "residual": ("residual",),
    "uncertainty": ("sigma_dy", "sigma_dx"),
}
# Derived from the displacement by functions of another part of the library; written when this version has them.
DERIVED_OUTPUTS = {"phase": "integrate_gradient", "strain": "strain_field"}


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the usage stays in --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="napari-gridmip",
        description="Open napari with the napari-gridmip widgets, or run one job in batch (see the subcommands).",
    )
    parser.add_argument(
        "--sample", choices=SAMPLE_KEYS, default="occupancy", help="sample to open (default: %(default)s)"
    )
    parser.add_argument("--no-sample", action="store_true", help="open no sample")
    commands = parser.add_subparsers(dest="command", metavar="{mipmap,merge,correlate}")

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
        "--subpixel", default="hessian", help="hessian, paraboloid, refine or none (default: hessian)"
    )
    correlate.add_argument(
        "--outputs", default="", metavar="NAMES",
        help="comma-separated extra arrays: transmission, dark-field, residual, uncertainty (sigma_dy, sigma_dx); "
        "phase and strain where this version has them. With any of them the field is track_speckles' (IMG1 the "
        "sample, IMG2 the reference)",
    )  # fmt: skip
    correlate.add_argument("--dtype", default="float32", choices=["float32", "float64"])

    for sub in (mipmap, merge, correlate):
        sub.add_argument("--scheduler", metavar="ADDRESS", help="a dask.distributed scheduler, e.g. tcp://host:8786")
        sub.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
        sub.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        open_viewer(args)
        return
    try:
        with runner(args.scheduler, quiet=args.quiet) as compute:
            RUNS[args.command](args, compute)
    except (UsageError, ValueError, TypeError) as error:
        print(f"napari-gridmip {args.command}: error: {_one_line(error)}", file=sys.stderr)
        sys.exit(2)
    except (OSError, MemoryError, RuntimeError) as error:
        print(f"napari-gridmip {args.command}: failed: {type(error).__name__}: {_one_line(error)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"napari-gridmip {args.command}: interrupted; nothing was written", file=sys.stderr)
        sys.exit(130)


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
    front = docks[SAMPLE_KEYS.index(args.sample)] if not args.no_sample else docks[0]
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


def run_mipmap(args: argparse.Namespace, compute: Any) -> None:
    from napari_gridmip.io import read_array, write_mipmap

    volume = read_array(args.input)
    write_mipmap(
        volume, args.output, threshold=args.threshold, scale=args.scale, overwrite=args.overwrite, compute=compute
    )


def run_merge(args: argparse.Namespace, compute: Any) -> None:
    from napari_gridmip import merge_patches
    from napari_gridmip.io import read_array, write_array

    patches = read_array(args.input)
    d = len(args.stride)
    if patches.ndim < 2 * d:
        raise UsageError(f"a patch stack with {d} tiled axes needs at least {2 * d} axes; got shape {patches.shape}")
    image_shape = args.image_shape
    if image_shape is None:
        from napari_gridmip._jobs.patches import infer_image_shape

        grid, patch = patches.shape[:d], patches.shape[patches.ndim - d :]
        image_shape = infer_image_shape(grid, patches.shape[d : patches.ndim - d], patch, tuple(args.stride))
    merged = merge_patches(patches, image_shape, args.stride, blend=args.blend)
    write_array(merged, args.output, overwrite=args.overwrite, compute=compute)


def parse_outputs(text: str) -> list[str]:
    """The ``--outputs`` names, checked (one-line errors for unknown or unavailable ones)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = [*TRACKING_OUTPUTS, *DERIVED_OUTPUTS]
    for name in names:
        if name not in known:
            raise UsageError(f"--outputs: unknown output {name!r}; choose from {', '.join(known)}")
        if name in DERIVED_OUTPUTS:
            import napari_gridmip

            function = DERIVED_OUTPUTS[name]
            if function not in napari_gridmip.__all__:
                raise UsageError(
                    f"--outputs {name} needs napari_gridmip.{function}, which this version of napari-gridmip lacks"
                )
    return names


def derived_outputs(names: list[str], dy: Any, dx: Any) -> dict[str, Any]:
    """Phase and strain from the displacement, by the library's own functions (see ``DERIVED_OUTPUTS``).

    Here is where they plug in: ``integrate_gradient(dy, dx)`` (the integrated displacement, in px x px; the
    phase once scaled by the pixel size, distance and wavelength) and ``strain_field(dy, dx)``'s named parts.
    """
    import napari_gridmip

    out: dict[str, Any] = {}
    if "phase" in names:
        out["phase"] = napari_gridmip.integrate_gradient(dy, dx)
    if "strain" in names:
        strain = napari_gridmip.strain_field(dy, dx)
        out.update({name: getattr(strain, name) for name in strain._fields})
    return out


def run_correlate(args: argparse.Namespace, compute: Any) -> None:
    import dask.array as da
    import zarr

    from napari_gridmip import find_displacement, track_speckles
    from napari_gridmip.io import read_array
    from napari_gridmip.io._write import atomic_path

    names = parse_outputs(args.outputs)
    img1, img2 = read_array(args.img1), read_array(args.img2)
    if img1.ndim == 2 and img2.ndim == 2:  # one image each (DIC): K = 1
        img1, img2 = img1[None], img2[None]
    options = {"subset": tuple(args.subset), "step": args.step, "subpixel": args.subpixel, "dtype": args.dtype}
    if any(name in TRACKING_OUTPUTS for name in names):
        tracked = track_speckles(img1, img2, tuple(args.window), **options)
        arrays = {"dy": tracked.dy, "dx": tracked.dx, "peak": tracked.peak}
        for name in names:
            for part in TRACKING_OUTPUTS.get(name, ()):
                arrays[part] = getattr(tracked, part)
    else:
        dy, dx, peak = find_displacement(img1, img2, tuple(args.window), **options)
        arrays = {"dy": dy, "dx": dx, "peak": peak}
    arrays.update(derived_outputs(names, arrays["dy"], arrays["dx"]))
    with atomic_path(args.output, overwrite=args.overwrite) as temporary:
        zarr.open_group(str(temporary), mode="w")
        writes = [da.to_zarr(da.asarray(array), str(temporary), component=name, compute=False)
                  for name, array in arrays.items()]  # fmt: skip
        compute(writes)


RUNS = {"mipmap": run_mipmap, "merge": run_merge, "correlate": run_correlate}
