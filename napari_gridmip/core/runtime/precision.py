"""Scoped float64: JAX's x64 switch flipped for one call, never for the user; on a TPU that call runs on the host.

A TPU has no float64 arithmetic: XLA emulates it, 8x slower than the host CPU on ``find_displacement`` at 256^2,
and refuses some operations outright (a complex128 FFT). So a float64 call runs on the host's CPU device there,
under every setting of :func:`napari_gridmip.compute_on`: it is what the chip can do, not how fast. The scope is
also where a kernel takes the user's setting in the thread it runs in (:func:`.strategy.placed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax import lax

from napari_gridmip.core.runtime import choice, strategy

HIGHEST = lax.Precision.HIGHEST


def compute_dtype(dtype: Any) -> np.dtype:
    """Validate the ``dtype`` keyword: float32 (default) or float64."""
    dtype = np.dtype(np.float32 if dtype is None else dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64; got {dtype}")
    return dtype


def is_wide(dtype: Any) -> bool:
    """64-bit numbers (int64, uint64, float64, complex128), which JAX narrows unless x64 is on."""
    dtype = np.dtype(dtype)
    return (dtype.kind in "iuf" and dtype.itemsize == 8) or (dtype.kind == "c" and dtype.itemsize == 16)


@contextlib.contextmanager
def precision_scope(dtype: Any) -> Iterator[None]:
    """Enable x64 inside the block when ``dtype`` is 64-bit; restore the user's setting after. The block runs
    where the user's setting places it in this thread (``core.runtime.strategy.placed``)."""
    if not is_wide(dtype):
        with strategy.placed():
            yield
        return
    enable = getattr(jax, "enable_x64", None)
    if enable is None:  # older JAX
        from jax.experimental import enable_x64 as enable  # type: ignore[no-redef]

        with strategy.placed(), enable(), _wide_device():
            yield
        return
    with strategy.placed(), enable(True), _wide_device():
        yield


def _wide_device() -> contextlib.AbstractContextManager:
    """Where 64-bit work runs: JAX's default device, except on a TPU (no float64 there), the host CPU (noted in
    a job's log of where its calls ran)."""
    if not strategy._on_tpu():
        return contextlib.nullcontext()
    choice.moved_to_host("float64")
    return strategy.on_host()
