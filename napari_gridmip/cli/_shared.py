"""What every subcommand of ``napari-gridmip`` shares: the one-line usage error, the batch options (``--scheduler``,
``--overwrite``, ``--quiet``, ``--compute-on``), the dask runner with its progress bar, the ``--compute-on`` block,
and the check that an output may be written. JAX-free: ``napari-gridmip --help`` imports it."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the usage stays in --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def add_batch_options(sub: argparse.ArgumentParser, *, scheduler: bool = True) -> None:
    """The options of every batch subcommand, after its own: ``--scheduler`` (where ``scheduler``), ``--overwrite``,
    ``--quiet`` and ``--compute-on``."""
    from napari_gridmip.core.options import COMPUTE_ON  # JAX-free

    if scheduler:
        sub.add_argument("--scheduler", metavar="ADDRESS", help="a dask.distributed scheduler, e.g. tcp://host:8786")
    else:
        sub.set_defaults(scheduler=None)  # one piece at a time, in this process
    sub.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    sub.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_argument(
        "--compute-on", choices=COMPUTE_ON,
        help="where the kernels run: the library's rules (auto), JAX's default device (accelerator), or the host "
        "CPU (host); recorded with the outputs (default: NAPARI_GRIDMIP_COMPUTE_ON, else auto)",
    )  # fmt: skip


def exists_message(path: str | os.PathLike) -> str:
    """The command line's words for an output that exists (the library's name a Python argument instead)."""
    return f"{str(Path(path).absolute())!r} already exists; pass --overwrite to replace it"


def check_new(*paths: str | os.PathLike, overwrite: bool) -> None:
    """Refuse, before any work, outputs that exist (unless ``--overwrite``) or whose folder does not."""
    for path in paths:
        path = Path(path).absolute()
        if path.exists() and not overwrite:
            raise UsageError(exists_message(path))
        if not path.parent.is_dir():
            raise UsageError(f"the folder {str(path.parent)!r} does not exist")


def absolute(path: str | os.PathLike) -> str:
    """``path`` made absolute (the provenance's sources, and a cluster's workers, which run elsewhere)."""
    return os.path.abspath(path)


def one_line(error: BaseException) -> str:
    """An error's message on one line (or its type's name, where it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def placed(where: str | None) -> Any:
    """The run's block: its kernels where ``--compute-on`` (else ``NAPARI_GRIDMIP_COMPUTE_ON``, else auto) says, and
    where each call ran logged for the outputs' provenance (``plan.record()``'s ``"ran_on"``)."""
    from napari_gridmip._jobs import placed as job_placed
    from napari_gridmip.core.runtime import choice

    return job_placed(choice.default() if where is None else where)


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
