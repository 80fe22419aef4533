"""Samples kept on disk after their first making: File > Open Sample runs the sample function on napari's GUI
thread, where making the DIC pair, the tiles or the calcium movie took 0.5 to 1 s; read back from the cache, the
same layers take a few milliseconds.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from napari_gridmip._sample_data.sparse import cache_folder
from napari_gridmip.core.runtime.files import write_atomically


def _folder() -> Path:
    return cache_folder()


def _key(function: Callable[..., Any]) -> str:
    sources = {function.__module__, __package__}
    text = "".join(inspect.getsource(sys.modules[name]) for name in sorted(sources))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def on_disk(function: Callable[[], list[tuple]]) -> Callable[[], list[tuple]]:
    """``function`` (a sample: no arguments, napari layer-data tuples), made once and read back after.

    The cache key is the source of the sample's module and of this package's shared sample code, so a changed
    recipe makes its sample afresh. The folder is the samples folder beside the compiled programs
    (``NAPARI_GRIDMIP_CACHE_DIR`` overrides it, as for :func:`napari_gridmip._sample_data.sparse.cache_folder`).
    A cache that cannot be read or written is passed by: the sample is made as before.
    """

    @functools.wraps(function)
    def sample() -> list[tuple]:
        try:
            path = _folder() / f"{function.__name__}-{_key(function)}.pickle"
        except OSError:  # no source to key the cache by (a frozen install): no cache
            return function()
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
            pass
        layers = function()
        try:  # whole or not at all: a reader never sees half a file
            write_atomically(path, pickle.dumps(layers, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            pass
        return layers

    sample.uncached = function  # the recipe itself, for tests
    return sample
