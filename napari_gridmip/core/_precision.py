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


@contextlib.contextmanager
def precision_scope(dtype: np.dtype) -> Iterator[None]:
    """Enable x64 inside the block when ``dtype`` is float64; restore the user's setting after."""
    if np.dtype(dtype) != np.float64:
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
