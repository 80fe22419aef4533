"""Input checks shared by every kernel.

Each check raises ``ValueError`` whose message names the argument, what was
given and what was expected, so that a GUI can show it to the user as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def is_dask(array: Any) -> bool:
    """Whether ``array`` is a dask array (checked without importing dask)."""
    return type(array).__module__.split(".")[0] == "dask" and hasattr(array, "chunks")


def as_array(name: str, value: Any) -> Any:
    """The one rule every public function applies to its data arguments.

    NumPy, JAX, dask and Zarr arrays (anything with ``shape``, ``dtype`` and
    ``__array__``, or a dask array) pass through untouched; other array-likes
    (nested lists and tuples of numbers, NumPy scalars, objects with
    ``__array__``) become a NumPy array, never a view the caller could see
    modified. Text, mappings, sets, None and other objects are a TypeError;
    a ragged nested list is a ValueError.
    """
    if is_dask(value) or (hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "__array__")):
        return value
    if (
        value is None
        or isinstance(value, (str, bytes, dict, set, frozenset))
        or not (isinstance(value, (list, tuple, int, float, bool, np.generic)) or hasattr(value, "__array__"))
    ):
        raise TypeError(
            f"{name} must be an array (NumPy, JAX, dask or Zarr) or a nested list of numbers; "
            f"got {type(value).__name__}"
        )
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged nesting
        raise ValueError(f"{name} must be a rectangular nested list of numbers: {error}") from None
    if array.dtype == object:
        raise ValueError(f"{name} must be a rectangular nested list of numbers; got {type(value).__name__} of objects")
    return array


def dtype_of(array: Any) -> np.dtype:
    """The NumPy dtype of a NumPy, JAX or array-like object."""
    dtype = getattr(array, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(array).dtype


def shape_of(array: Any) -> tuple[int, ...]:
    shape = getattr(array, "shape", None)
    return tuple(shape) if shape is not None else np.shape(array)


def is_float(dtype: np.dtype) -> bool:
    """NumPy's real floats and bfloat16 (an ml_dtypes type that NumPy does not class as floating)."""
    return bool(np.issubdtype(dtype, np.floating)) or dtype.name == "bfloat16"


def check_real(name: str, array: Any) -> np.dtype:
    """Accept bool, integer and real floating arrays (bfloat16 included); reject everything else."""
    dtype = dtype_of(array)
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer) or is_float(dtype):
        return dtype
    raise ValueError(
        f"{name} must have a bool, integer or real floating dtype (float16, bfloat16, float32, float64); "
        f"got dtype {dtype}"
    )


def check_numeric(name: str, array: Any) -> np.dtype:
    """Accept what :func:`check_real` accepts plus complex (data that is only moved, never combined)."""
    dtype = dtype_of(array)
    if np.issubdtype(dtype, np.complexfloating):
        return dtype
    try:
        return check_real(name, array)
    except ValueError:
        raise ValueError(f"{name} must have a bool, integer, floating or complex dtype; got dtype {dtype}") from None


def check_exact_integers(name: str, array: Any, compute: np.dtype) -> None:
    """Refuse integers that the float ``compute`` dtype cannot hold exactly (above 2**24 for float32).

    Only dtypes whose range exceeds that limit are scanned (int32, uint32, int64, uint64).
    """
    dtype = dtype_of(array)
    if not np.issubdtype(dtype, np.integer):
        return
    bits = np.finfo(compute).nmant + 1  # 24 for float32, 53 for float64
    limit = 2**bits
    info = np.iinfo(dtype)
    if max(-int(info.min), int(info.max)) <= limit:
        return
    low, high = int(array.min()), int(array.max())
    largest = max(-low, high)
    if largest > limit:
        advice = (
            "pass dtype=np.float64 (exact up to 2**53)"
            if compute == np.float32
            else "rescale the data, or convert it to float yourself"
        )
        raise ValueError(
            f"{name} holds integers up to {largest} in magnitude ({dtype}), beyond {compute.name}'s exact range "
            f"(2**{bits}): {advice}"
        )


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
    """A finite real number; TypeError for text, booleans and non-numbers (``"0.5"`` is not a number)."""
    if isinstance(value, (str, bytes, bool, np.bool_)) or not (
        isinstance(value, (int, float, np.integer, np.floating)) or (np.ndim(value) == 0 and hasattr(value, "dtype"))
    ):
        raise TypeError(f"{name} must be a real number; got {value!r} ({type(value).__name__})")
    if hasattr(value, "dtype") and not (np.issubdtype(value.dtype, np.integer) or is_float(np.dtype(value.dtype))):
        raise TypeError(f"{name} must be a real number; got {value!r} (dtype {value.dtype})")
    out = float(value)
    if not np.isfinite(out):
        raise ValueError(f"{name} must be finite; got {value!r}")
    return out


def check_bool(name: str, value: Any) -> bool:
    """A flag: True or False (NumPy's bool too); TypeError for anything else, such as ``"no"`` or 1."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r} ({type(value).__name__})")
    return bool(value)


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
