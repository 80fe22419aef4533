"""Input checks shared by every kernel.

Each check raises ``ValueError`` whose message names the argument, what was
given and what was expected, so that a GUI can show it to the user as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def dtype_of(array: Any) -> np.dtype:
    """The NumPy dtype of a NumPy, JAX or array-like object."""
    dtype = getattr(array, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(array).dtype


def shape_of(array: Any) -> tuple[int, ...]:
    shape = getattr(array, "shape", None)
    return tuple(shape) if shape is not None else np.shape(array)


def check_real(name: str, array: Any) -> np.dtype:
    """Accept bool, integer and real floating arrays; reject everything else."""
    dtype = dtype_of(array)
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating):
        return dtype
    raise ValueError(f"{name} must have a bool, integer or real floating dtype; got dtype {dtype}")


def check_ndim(name: str, array: Any, *, ndim: int | None = None, min_ndim: int | None = None) -> tuple[int, ...]:
    """Check the number of axes; return the shape."""
    shape = shape_of(array)
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}D; got shape {shape} ({len(shape)}D)")
    if min_ndim is not None and len(shape) < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} axes; got shape {shape}")
    return shape


def check_nonempty(name: str, shape: Sequence[int]) -> None:
    if any(n == 0 for n in shape):
        raise ValueError(f"{name} must not have a zero-length axis; got shape {tuple(shape)}")


def int_tuple(name: str, value: int | Sequence[int], length: int | None = None, *, minimum: int = 1) -> tuple[int, ...]:
    """Turn an int or a sequence of ints into a tuple of ints >= ``minimum``.

    A scalar is repeated ``length`` times (``length`` must then be given).
    """
    if np.ndim(value) == 0:
        if length is None:
            raise ValueError(f"{name} must be a sequence of integers; got {value!r}")
        items = [value] * length
    else:
        items = list(value)  # type: ignore[arg-type]
    out = []
    for item in items:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise ValueError(f"{name} must hold integers; got {value!r}")
        out.append(int(item))
    if length is not None and len(out) != length:
        raise ValueError(f"{name} must have {length} entries; got {value!r} ({len(out)} entries)")
    if any(v < minimum for v in out):
        raise ValueError(f"{name} entries must be >= {minimum}; got {value!r}")
    return tuple(out)


def check_finite_scalar(name: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number; got {value!r}") from None
    if not np.isfinite(out):
        raise ValueError(f"{name} must be finite; got {value!r}")
    return out


def check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def parse_ints(name: str, text: str) -> tuple[int, ...]:
    """Parse ``"128, 96"`` (commas or spaces) into ``(128, 96)``; empty text gives ``()``."""
    parts = [p for p in text.replace(",", " ").replace("x", " ").split() if p]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{name} must be integers separated by commas; got {text!r}") from None
