"""Scoped float64: JAX's x64 switch flipped for one call, never for the user."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np


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
    """Enable x64 inside the block when ``dtype`` is 64-bit; restore the user's setting after."""
    if not is_wide(dtype):
        yield
        return
    enable = getattr(jax, "enable_x64", None)
    if enable is None:  # older JAX
        from jax.experimental import enable_x64 as enable  # type: ignore[no-redef]

        with enable():
            yield
        return
    with enable(True):
        yield
