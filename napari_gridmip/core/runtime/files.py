"""Files and folders written whole or not at all: the package's one atomic-write helper.

Everything the package writes goes through here: the settings, the rates, the preparation's marker, the samples'
cache and the kept executables as whole bytes (:func:`write_atomically`), and the readers' and the command line's
outputs (:mod:`napari_gridmip.io`'s writers, a DIC series' folder, a stitched mosaic and its positions) as a
temporary path that a writer fills (:func:`atomic_path`). Either way the output appears complete under its name,
or not at all. JAX-free, and a leaf.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path


class OutputExistsError(FileExistsError, ValueError):
    """An output that exists and may not be replaced: a ValueError for callers that check their arguments, an
    OSError (FileExistsError) for those that handle files. ``path``: the output (the command line names it in its
    own words)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{str(path)!r} already exists; pass overwrite=True to replace it")
        self.path = path

    def __reduce__(self) -> tuple:  # pickled by its path (a cluster's worker sends it back), not its message
        return type(self), (self.path,)


def _partial(path: Path, kind: str, suffix: str = "") -> Path:
    """A hidden sibling of ``path`` that no other process or thread picks: its process, thread and a random tag."""
    tag = f"{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
    return path.with_name(f".{path.name}.{kind}-{tag}{suffix}")


def remove(path: Path) -> None:
    """Remove a file or a folder with everything in it; nothing if it does not exist."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, overwrite: bool = False, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside ``path`` to write a file or a folder into: renamed to ``path`` when the block ends
    without error, removed (with whatever was written there) when it raises or is interrupted.

    Parameters
    ----------
    path
        The output, made absolute (the workers of a cluster may run in another folder). Its folder must exist.
    overwrite
        Replace an existing ``path``. A file is replaced in one rename (a reader sees the old file or the new);
        a folder is first renamed aside, then removed once the new one is in place.
    suffix
        The end of the temporary path's name, for a writer that needs its own (pyevtk appends ``.vti`` to the name
        it is given; a writer that checks the suffix of its file).

    Yields
    ------
    pathlib.Path
        The temporary path, which does not exist yet: the writer creates it (a file, or a folder).

    Raises
    ------
    OutputExistsError
        If ``path`` exists and ``overwrite`` is false: before the block runs, or, when another writer made it
        meanwhile, at its end (the temporary output is then removed).
    ValueError
        If the folder of ``path`` does not exist.
    """
    path = Path(path).absolute()
    if path.exists() and not overwrite:
        raise OutputExistsError(path)
    if not path.parent.is_dir():
        raise ValueError(f"the folder {str(path.parent)!r} does not exist")
    temporary = _partial(path, "partial", suffix)
    try:
        yield temporary
        _put_in_place(temporary, path, overwrite)
    except BaseException:
        remove(temporary)
        raise


def _put_in_place(temporary: Path, path: Path, overwrite: bool) -> None:
    """Rename the complete ``temporary`` to ``path``."""
    if not temporary.exists() and not temporary.is_symlink():
        raise FileNotFoundError(f"nothing was written to {str(path)!r}")
    if not overwrite:
        if path.exists():  # another writer finished first
            raise OutputExistsError(path)
        try:
            os.replace(temporary, path)
        except OSError:
            if path.exists():  # a folder made in the instant between (a file then would be replaced)
                raise OutputExistsError(path) from None
            raise
        return
    if path.is_dir() and not path.is_symlink():  # a folder cannot be renamed over a folder that holds files
        old = _partial(path, "old")
        os.replace(path, old)
        os.replace(temporary, path)
        remove(old)
    else:
        if temporary.is_dir() and path.exists():  # a folder over a file
            path.unlink()
        os.replace(temporary, path)


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, replacing it, and creating its folder: into a file of this
    process's and thread's own beside it, then renamed over ``path``, so that a reader, or another process writing
    the same file, never sees half of it. Raises OSError where the folder cannot be written (the partial file is
    removed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, overwrite=True) as partial:
        if isinstance(data, str):
            partial.write_text(data, encoding="utf-8")
        else:
            partial.write_bytes(data)
