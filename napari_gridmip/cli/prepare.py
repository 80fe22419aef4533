"""``napari-gridmip --prepare [--background] [--force] [--compute-on WHERE]``: compile the widgets' programs once
per machine (:mod:`napari_gridmip._sample_data.prepare`), here or in a detached process. Options of the top-level
command, not a subcommand: ``napari-gridmip --prepare`` is what the README and the first-run notice tell users."""

from __future__ import annotations

import argparse
import sys

from napari_gridmip.cli._shared import one_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The top-level options ``--prepare``, ``--force``, ``--background`` and ``--compute-on``."""
    from napari_gridmip.core.options import COMPUTE_ON  # JAX-free

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


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command line asked for a preparation (or gave one of its options without ``--prepare``)."""
    return bool(args.prepare or args.force or args.background or args.prepare_compute_on)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Prepare here, or in a detached process with ``--background``; the exit status (2 for a bad combination or a
    cache that cannot keep programs, 1 for a failed job)."""
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
        print(f"{_prepare.PROG}: error: {one_line(error)}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as error:  # a cache folder not writable, a device another process holds
        print(f"{_prepare.PROG}: failed: {type(error).__name__}: {one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_prepare.PROG}: interrupted; the machine is not recorded as prepared", file=sys.stderr)
        return 130
