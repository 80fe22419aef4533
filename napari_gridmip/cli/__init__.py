"""``napari-gridmip``: the viewer, and batch subcommands for data larger than memory.

    napari-gridmip                                   napari with the widgets docked
    napari-gridmip --prepare [--background] [--force]   compile the widgets' programs once per machine
    napari-gridmip mipmap IN OUT [--threshold T] [--packed] [--bbox]   occupancy pyramid -> OME-Zarr
    napari-gridmip merge IN OUT --stride S [S ...]   patch stack -> image
    napari-gridmip correlate IMG1 IMG2 OUT --window WM WN   displacement field -> Zarr
        [--subset SH SW] [--step S] [--outputs transmission,dark-field,...]
    napari-gridmip stitch TILES OUT --grid R C --overlap F   tiles -> registered mosaic + OUT.positions.csv
    napari-gridmip stitch scan.ome.tif OUT [--tile-configuration]   placed by the file's stage positions
    napari-gridmip corrimage MOVIE OUT [--neighbours 8|4]   local correlation image of a movie
    napari-gridmip correlate-series FRAMES --out FOLDER [--subset 31] [--step 8] [--roi MASK]
        [--reference accumulated|incremental|auto]   DIC of a sequence -> one DICe CSV per frame
    napari-gridmip correlate-volumes REF DEF OUT.ome.zarr [--subset 21] [--step 10] [--roi MASK] [--vtk OUT.vti]
    napari-gridmip rates [--again]                   this machine's rates for placing the kernels

A thin reader and writer around the widgets' own plans (:mod:`napari_gridmip._jobs`): each subcommand reads its
files as the plan's sources, executes the same plan as the widget's job with the same options, and writes the
outputs with ``plan.record()``, the calls, inputs, versions and a script that reproduces them. Every subcommand
reads lazily (dask), computes block by block (``correlate-series``: frame by frame) with a progress bar, writes
under a temporary name that is renamed when complete, and on bad input prints one line and exits with status 2 (1
for a failure while running). ``--scheduler ADDRESS`` runs the work on an existing dask.distributed cluster.

One module per subcommand (listed in :data:`COMMANDS`), each with ``NAME``, ``HELP``, ``EXAMPLE``, ``BATCH`` (it
takes the batch options and runs with a dask runner), ``add_arguments(parser)`` and ``run(args, compute)``; the
top-level ``--prepare`` options are :mod:`.prepare`'s; what they share is :mod:`._shared`'s. Every module imports
no JAX until it runs: ``napari-gridmip --help`` stays quick.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from napari_gridmip.cli import prepare
from napari_gridmip.cli._shared import Parser, UsageError, one_line, placed, runner

PLUGIN = "napari-gridmip"
# display names in napari.yaml; each sample is for one widget, whose tab comes to the front
WIDGET_NAMES = [
    "Occupancy mipmap",
    "Reassemble patches",
    "Stitch tiles",
    "Process in tiles",
    "Correlation map",
    "Digital volume correlation",
]
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
    "dvc": "Digital volume correlation",
}
SAMPLE_KEYS = list(SAMPLE_WIDGETS)

#: The subcommands' modules in this package, in --help's order: a new subcommand is a new module and its line here.
COMMANDS = (
    "mipmap",
    "merge",
    "correlate",
    "stitch",
    "corrimage",
    "correlate_series",
    "correlate_volumes",
    "rates",
)

__all__ = ["PLUGIN", "SAMPLE_KEYS", "SAMPLE_WIDGETS", "WIDGET_NAMES", "UsageError", "build_parser", "commands", "main"]


def commands() -> dict[str, ModuleType]:
    """The subcommands by their names on the command line (``correlate-series``), each its module."""
    modules = [importlib.import_module(f"{__name__}.{name}") for name in COMMANDS]
    return {module.NAME: module for module in modules}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the viewer's options, ``--prepare``'s, and every subcommand of :data:`COMMANDS`."""
    parser = Parser(
        prog="napari-gridmip",
        description="Open napari with the napari-gridmip widgets, run one job in batch (see the subcommands), or "
        "prepare this machine's compiled programs for the widgets' first Runs (--prepare).",
    )
    parser.add_argument(
        "--sample", choices=SAMPLE_KEYS, default="occupancy", help="sample to open (default: %(default)s)"
    )
    parser.add_argument("--no-sample", action="store_true", help="open no sample")
    prepare.add_arguments(parser)
    found = commands()
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(found) + "}")
    for name, module in found.items():
        sub = subparsers.add_parser(
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=f"example:\n  {module.EXAMPLE}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if prepare.wanted(args):
        sys.exit(prepare.run(parser, args))
    if args.command is None:
        open_viewer(args)
        return
    module = commands()[args.command]
    try:
        if module.BATCH:
            with runner(args.scheduler, quiet=args.quiet) as compute, placed(args.compute_on):
                status = module.run(args, compute)
        else:
            status = module.run(args, None)
    except (UsageError, ValueError, TypeError, ImportError) as error:  # ImportError: an optional reader missing
        print(f"napari-gridmip {args.command}: error: {_message(error)}", file=sys.stderr)
        sys.exit(2)
    except (OSError, MemoryError, RuntimeError) as error:
        print(f"napari-gridmip {args.command}: failed: {type(error).__name__}: {one_line(error)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"napari-gridmip {args.command}: interrupted; nothing was written", file=sys.stderr)
        sys.exit(130)
    if status:
        sys.exit(status)


def _message(error: BaseException) -> str:
    """One line for a bad input; an output that exists in the command line's words (the library's name
    ``overwrite=True``, a Python argument)."""
    from napari_gridmip.cli._shared import exists_message
    from napari_gridmip.core.runtime.files import OutputExistsError

    if isinstance(error, OutputExistsError):
        return exists_message(error.path)
    return one_line(error)


def open_viewer(args: argparse.Namespace) -> None:
    import napari  # Qt and napari: only for this command, never for the others' --help

    from napari_gridmip._widgets.first_window import fit_first_window

    viewer = napari.Viewer(title="napari-gridmip")
    # tabs, not a stack: three docks stacked need more height than a laptop screen has
    docks = [viewer.window.add_plugin_dock_widget(PLUGIN, name, tabify=True)[0] for name in WIDGET_NAMES]
    fit_first_window(viewer, docks)  # most of the screen, and every widget's tab readable
    if not args.no_sample:
        viewer.open_sample(PLUGIN, args.sample)
    # the tab of the widget that takes the sample comes to the front once the window is up
    front = docks[WIDGET_NAMES.index(SAMPLE_WIDGETS[args.sample])] if not args.no_sample else docks[0]
    from qtpy.QtCore import QTimer

    QTimer.singleShot(0, front.raise_)
    napari.run()
