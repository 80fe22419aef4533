"""JAX's persistent compilation cache, in a per-user folder, switched on at the library's first use.

A compiled program then outlives the process: napari restarted or a script run again loads it in milliseconds
instead of compiling it for 0.1 to 3 s (``benchmarks/bench_first_run.py``). The user's own choice of cache always
wins; ``NAPARI_GRIDMIP_COMPILE_CACHE=0`` leaves JAX's configuration alone.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import platformdirs

from napari_gridmip.core.options import switched_off

#: Programs that took at least this long to compile are written to the cache (seconds).
MIN_COMPILE_SECONDS = 0.05

_state = {"done": False}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """The per-user folder for compiled programs (``NAPARI_GRIDMIP_CACHE_DIR`` overrides it)."""
    override = os.environ.get("NAPARI_GRIDMIP_CACHE_DIR")
    if override:
        return Path(override) / "jax"
    return Path(platformdirs.user_cache_dir("napari-gridmip")) / "jax"


def enable() -> Path | None:
    """Switch JAX's persistent cache on in :func:`cache_dir` once per process, unless the user chose.

    Returns
    -------
    pathlib.Path or None
        The cache folder in use (the user's own, if they set one), or None when it is off.
    """
    import jax  # the kernels' first use: this module is imported before JAX, by the lazy API

    user_dir = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
    if user_dir:
        return Path(user_dir)
    with _LOCK:  # two background jobs may start at once: the second waits until the cache is set
        if _state["done"] or switched_off("NAPARI_GRIDMIP_COMPILE_CACHE"):
            return None
        folder = cache_dir()
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
        _state["done"] = True
        return folder


def is_ours() -> bool:
    """Whether :func:`enable` switched JAX's persistent cache on in :func:`cache_dir` in this process (not the
    user's own folder, and not off)."""
    return _state["done"]
