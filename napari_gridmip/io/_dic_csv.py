"""A DIC series written as DIC users read it: one comma-separated file per frame, DICe's columns.

DICe writes ``DICe_solution_<frame>.txt`` files, each a row per subset with its id, reference coordinates,
displacement, shape parameters, match quality, uncertainty and status flag, preceded by a commented header;
Python, MATLAB, ParaView's CSV reader and DICe's own tools read them. We write the same columns (the names are
DICe's, upper case), the strain of each point beside them, a status both as DICe's flag (0 ok, nonzero a
failure) and as our :class:`~napari_gridmip.core.correlation.status.Status` name, and the run's provenance in
the header, each line starting with ``#`` (``numpy.loadtxt(..., delimiter=",")`` and ``pandas.read_csv(...,
comment="#")`` skip it).

References
----------
D. Z. Turner, "Digital Image Correlation Engine (DICe)", Sandia National Laboratories (2015): its output files
(``DICe_solution_*.txt``) and field names (``COORDINATE_X``, ``DISPLACEMENT_X``, ``SIGMA``, ``GAMMA``,
``STATUS_FLAG``, ``VSG_STRAIN_XX`` ...).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_gridmip.core.correlation.status import Status
from napari_gridmip.core.runtime.files import atomic_path

COLUMNS = ("SUBSET_ID", "COORDINATE_X", "COORDINATE_Y", "DISPLACEMENT_X", "DISPLACEMENT_Y", "DISPLACEMENT_X_X",
           "DISPLACEMENT_X_Y", "DISPLACEMENT_Y_X", "DISPLACEMENT_Y_Y", "SIGMA_X", "SIGMA_Y", "GAMMA", "ZNCC",
           "STRAIN_XX", "STRAIN_YY", "STRAIN_XY", "REFERENCE_FRAME", "STATUS_FLAG", "STATUS")  # fmt: skip


def write_series_csv(
    series: Any,
    folder: str | os.PathLike,
    *,
    strain: Sequence[Any] | None = None,
    prefix: str = "DICe_solution",
    provenance: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write each frame of a :func:`~napari_gridmip.correlate_series` result as a CSV file, DICe's columns.

    Parameters
    ----------
    series
        The :class:`~napari_gridmip.core.correlation.series.Series`.
    folder
        The folder (created if missing). Files ``<prefix>_<frame>.txt`` (frame numbers zero-padded) are
        written under temporary names and renamed only once all are complete: a failure leaves none of them.
    strain
        ``(exx, eyy, exy)``, each ``(T, R, C)`` (e.g. ``strain_field(series.dy, series.dx, gradients=...)``);
        default: from the series' own gradients, small strain.
    prefix
        The files' name before the frame number; default DICe's.
    provenance
        ``{key: value}`` written into each file's header (``# key: value``).

    Returns
    -------
    list of Path
        The files, one per frame.

    Notes
    -----
    Columns: ``COORDINATE_X/Y`` the point's reference pixel (x = column, y = row, DICe's order),
    ``DISPLACEMENT_X/Y`` = ``dx``/``dy`` (px), ``DISPLACEMENT_X_X`` = ``d dx / dx`` and so on, ``SIGMA_X/Y`` the
    predicted standard deviations, ``GAMMA`` = ``(1 - ZNCC) / 2`` ... DICe's matching residual in ZNSSD units
    (0 is a perfect match), ``STRAIN_*`` the strains, ``REFERENCE_FRAME`` the frame each point was matched
    against, ``STATUS_FLAG`` 0 where the point is valid and the status code otherwise, ``STATUS`` its name. A
    lost point's values are empty fields ... NaN where they are read back.

    Raises
    ------
    TypeError
        If ``series`` lacks a series' fields.
    ValueError
        If ``strain`` does not hold three arrays of the series' shape.
    """
    missing = [f for f in ("dy", "dx", "y", "x", "status", "zncc") if not hasattr(series, f)]
    if missing:
        raise TypeError(f"series must be a correlate_series result; it has no {', '.join(missing)}")
    dy, dx = np.asarray(series.dy), np.asarray(series.dx)
    shape = dy.shape
    if strain is None:
        dux, duy = np.asarray(series.dx_x), np.asarray(series.dx_y)
        dvx, dvy = np.asarray(series.dy_x), np.asarray(series.dy_y)
        strain = (dux, dvy, 0.5 * (duy + dvx))
    strain = [np.asarray(s) for s in strain]
    if len(strain) != 3 or any(s.shape != shape for s in strain):
        raise ValueError(f"strain must be (exx, eyy, exy), each of the series' shape {shape}")
    gy, gx = np.meshgrid(np.asarray(series.y), np.asarray(series.x), indexing="ij")
    names = {int(s): s.name for s in Status}
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    digits = max(4, len(str(shape[0] - 1)))
    header = ["napari-gridmip DIC series (DICe's columns; lost points have empty values)"]
    header += [f"{k}: {v}" for k, v in (provenance or {}).items()]
    written = []
    # every file under a temporary name, all renamed once all are complete: a failure leaves none of them (a new
    # folder is itself the temporary name; into an existing one each file goes beside its final name)
    with contextlib.ExitStack() as stack:
        existing = folder.exists()
        target = folder if existing else stack.enter_context(atomic_path(folder))
        target.mkdir(exist_ok=True)
        for t in range(shape[0]):
            status = np.asarray(series.status[t]).ravel()
            columns = [
                np.arange(status.size), gx.ravel(), gy.ravel(), dx[t].ravel(), dy[t].ravel(),
                np.asarray(series.dx_x[t]).ravel(), np.asarray(series.dx_y[t]).ravel(),
                np.asarray(series.dy_x[t]).ravel(), np.asarray(series.dy_y[t]).ravel(),
                np.asarray(series.sigma_dx[t]).ravel(), np.asarray(series.sigma_dy[t]).ravel(),
                (1 - np.asarray(series.zncc[t]).ravel()) / 2, np.asarray(series.zncc[t]).ravel(),
                strain[0][t].ravel(), strain[1][t].ravel(), strain[2][t].ravel(),
                np.asarray(series.key_frame[t]).ravel(), status,
            ]  # fmt: skip
            lines = ["# " + line for line in header] + [",".join(COLUMNS)]
            for i in range(status.size):
                fields = [_field(c[i]) for c in columns]
                lines.append(",".join([*fields, names.get(int(status[i]), str(int(status[i])))]))
            name = f"{prefix}_{t:0{digits}d}.txt"
            file = target / name
            if existing:  # an existing folder: each file beside its final name
                file = stack.enter_context(atomic_path(file, overwrite=True))
            file.write_text("\n".join(lines) + "\n")
            written.append(name)
    return [folder / name for name in written]


def _field(value: Any) -> str:
    """A CSV field: integers as such, floats with 6 decimals (1e-6 px), NaN as an empty field."""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    if not np.isfinite(value):
        return ""
    return f"{value:.6f}"
