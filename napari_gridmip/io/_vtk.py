"""Fields on a regular 3D grid as a VTK ImageData file (XML ``.vti``), which ParaView and VisIt open, written by
pyevtk (the optional ``vtk`` extra: ``pip install 'napari-gridmip[vtk]'``).

The package's arrays are ``(Z, Y, X)`` in C order; VTK's images are ``(x, y, z)`` with x varying fastest. The
writer takes the package's order (arrays, origin and spacing all z first) and turns it into VTK's, so that a
field's voxel ``[k, j, i]`` is VTK's point ``(i, j, k)`` at ``origin + spacing * (k, j, i)`` read backwards.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_gridmip.core.runtime.files import atomic_path

VECTOR_DTYPES = (np.float32, np.float64)


def write_vtk_image(
    path: str | os.PathLike,
    fields: Mapping[str, Any],
    *,
    origin: Sequence[float] = (0.0, 0.0, 0.0),
    spacing: Sequence[float] | float = 1.0,
    vectors: Mapping[str, tuple[str, str, str]] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write 3D fields of one shape as point data of a VTK ImageData file (``.vti``, raw appended binary).

    Parameters
    ----------
    path
        The file to create; its name must end in ``.vti`` (written under a temporary name, renamed when complete).
    fields
        Name -> ``(Z, Y, X)`` array (NumPy, or anything ``np.asarray`` reads), all of one shape. Booleans are written
        as uint8, other dtypes as they are (NaN stays NaN: ParaView shows it as such).
    origin
        ``(z, y, x)``: where element ``[0, 0, 0]`` lies (e.g. a DVC grid's first point, in voxels or micrometres).
    spacing
        ``(z, y, x)`` or one number: the distance between neighbouring elements along each axis (e.g. the grid's
        step times the voxel size).
    vectors
        Name -> the names of three of ``fields`` giving its ``(z, y, x)`` components (e.g. ``{"displacement":
        ("dz", "dy", "dx")}``): also written as one 3-component array in VTK's ``(x, y, z)`` order, the file's
        active vectors (ParaView's Glyph filter draws them as arrows).
    overwrite
        Replace an existing ``path``.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ImportError
        If pyevtk is not installed.
    ValueError
        If ``path`` does not end in ``.vti`` or exists (without ``overwrite``), there is no field, a field is not
        3D or the fields' shapes differ, ``origin`` or ``spacing`` does not give 3 finite values (spacing positive),
        or a vector names a missing field.
    """
    try:
        from pyevtk.hl import imageToVTK
    except ImportError:
        raise ImportError("writing VTK files needs pyevtk: pip install 'napari-gridmip[vtk]'") from None
    path = Path(path)
    if path.suffix.lower() != ".vti":
        raise ValueError(f"a VTK ImageData file's name ends in .vti; got {str(path)!r}")
    if not fields:
        raise ValueError("no field to write")
    arrays = {str(name): np.asarray(value) for name, value in fields.items()}
    shapes = {name: array.shape for name, array in arrays.items()}
    first = next(iter(shapes.values()))
    if len(first) != 3 or any(shape != first for shape in shapes.values()):
        raise ValueError(f"the fields must be 3D (Z, Y, X) of one shape; got {shapes}")
    start = np.asarray(origin, dtype=float)
    step = np.broadcast_to(np.asarray(spacing, dtype=float), (3,))
    if start.shape != (3,) or not np.isfinite(start).all():
        raise ValueError(f"origin must give 3 finite values (z, y, x); got {origin!r}")
    if not (np.isfinite(step).all() and (step > 0).all()):
        raise ValueError(f"spacing must be positive, one number or 3 (z, y, x); got {spacing!r}")
    point_data: dict[str, Any] = {}
    for name, array in arrays.items():
        if array.dtype == bool:
            array = array.astype(np.uint8)
        # VTK's x fastest: the transpose of a C-ordered (Z, Y, X) array is a Fortran-ordered (X, Y, Z) one
        point_data[name] = np.ascontiguousarray(array).transpose(2, 1, 0)
    for name, (z, y, x) in (vectors or {}).items():
        missing = [part for part in (z, y, x) if part not in arrays]
        if missing:
            raise ValueError(f"the vector {name!r} names fields that are not given: {missing}")
        dtype = np.result_type(*(arrays[p].dtype for p in (z, y, x)), np.float32)
        point_data[name] = tuple(np.ascontiguousarray(arrays[p], dtype).transpose(2, 1, 0) for p in (x, y, z))
    # pyevtk adds ".vti" to the name it is given: it is given the temporary name without it
    with atomic_path(path, overwrite=overwrite, suffix=".vti") as temporary:
        # plain floats: pyevtk writes the values' repr into the XML (a NumPy scalar's is "np.float64(6.0)")
        origin_xyz, spacing_xyz = (tuple(float(v) for v in a[::-1]) for a in (start, step))
        imageToVTK(str(temporary.with_suffix("")), origin=origin_xyz, spacing=spacing_xyz, pointData=point_data)
    return path
