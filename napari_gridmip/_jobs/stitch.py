"""The stitching job: tiles at roughly known stage positions registered, placed, fused, and shown with the
placement's confidence (tile outlines) and the pairs used or rejected (links between tile centres). One plan
(:func:`stitch_plan`) for the widget's job and ``napari-gridmip stitch``; one export (:func:`write_registered`,
:func:`make_export_job`) of the registered positions as Fiji's TileConfiguration for both."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_gridmip._jobs import Job, JobResult, Output, ProgressCallback, as_dask, is_lazy, layer_tuples, staged
from napari_gridmip._jobs.plan import Call, Plan, Source
from napari_gridmip._jobs.world import Frame, derived_placement
from napari_gridmip.core.runtime.files import atomic_path
from napari_gridmip.io import write_ome_zarr, write_tile_configuration

WIDGET = "stitch"
ACCEPTED_COLOR = (0.2, 0.9, 0.3, 1.0)  # a used pair's link
REJECTED_COLOR = (1.0, 0.25, 0.25, 1.0)  # a rejected pair's link
STAGE_COLOR = (1.0, 0.25, 0.25, 1.0)  # the outline of a tile placed from the stage


@dataclass(frozen=True)
class StitchRequest:
    """One stitching run, captured on the GUI thread.

    ``tiles`` is ``(n, [C,] *shape)`` with ``d = len(grid_shape)`` spatial axes. The stage positions are
    ``positions`` when the tiles came with them (``(n, d)`` pixels), else made by
    :func:`~napari_gridmip.grid_positions` from the grid, the overlap and the acquisition order.
    """

    name: str
    tiles: Any
    frame: Frame  # the tile stack layer's transform (a folder's tiles: unit pixels)
    grid_shape: tuple[int, ...]
    overlap: float
    order: str = "row-major"
    positions: Any = None
    max_shift: int | str = "auto"  # register_tiles' search: px, or "auto" from the overlap
    blend: str = "linear"
    flat_field: bool = False  # divide out the illumination profile estimated from the tiles before fusing
    source: Source | None = None  # how the tiles are read, for the script (a layer by default)
    positions_code: str | None = None  # how the stage positions are read, for the script


def _tile_geometry(request: StitchRequest) -> tuple[int, tuple[int, ...], int | None]:
    """(d, the tiles' spatial shape, the channel axis of one tile or None)."""
    d = len(request.grid_shape)
    shape = tuple(int(n) for n in request.tiles.shape)
    if len(shape) not in (d + 1, d + 2):
        raise ValueError(
            f"tiles {request.name!r} of shape {shape} do not fit a {d}D grid: expected (n, {'Z, ' if d == 3 else ''}"
            f"Y, X) or with a channel axis after n"
        )
    n = int(np.prod(request.grid_shape))
    if shape[0] != n and request.positions is None:
        raise ValueError(f"a grid of {request.grid_shape} holds {n} tiles; {request.name!r} has {shape[0]}")
    return d, shape[-d:], 0 if len(shape) == d + 2 else None


def stitch_plan(
    request: StitchRequest, *, stage_index: str = "", channel: int | None | str = "auto", display: bool = True
) -> Plan:
    """Stage positions (``grid_positions``, unless the tiles came with theirs), ``register_tiles`` and
    ``fuse_tiles``; outputs ``"mosaic"`` (and, with ``display``, the tile outlines and the pairs' links).

    ``stage_index`` picks the grid's positions in the tiles' order (a folder's tiles, by their file names);
    ``channel`` is the channel registered (``"auto"``: none for one-channel tiles, else the channels' mean).
    """
    d, tile_shape, auto_channel = _tile_geometry(request)
    channel = auto_channel if channel == "auto" else channel
    sources = [request.source or Source("tiles", layer=request.name)]
    calls = []
    if request.positions is None:
        args = (tuple(request.grid_shape), tile_shape, request.overlap)
        calls.append(Call("grid_positions", (), args, {"order": request.order}, "stage", index=stage_index))
    else:
        positions = np.asarray(request.positions, dtype=float)
        sources.append(Source("stage", expression=request.positions_code or repr(positions.tolist())))
    options = {"max_shift": request.max_shift, "channel": channel}
    calls.append(Call("register_tiles", ("tiles", "stage"), (), options, "registration"))
    fuse_options = {"blend": request.blend, **({"flat_field": True} if request.flat_field else {})}
    calls.append(Call("fuse_tiles", ("tiles", "registration.positions"), (), fuse_options, "mosaic"))
    outputs = {"mosaic": "np.asarray(mosaic.image)" if display else "mosaic.image"}  # the command line writes it lazily
    if display:
        if d == 2:
            outputs["outlines"] = f"[p + np.array({_corners(tile_shape).tolist()}) for p in registration.positions]"
        centre = f"np.array({(np.asarray(tile_shape, dtype=float) / 2).tolist()})"
        outputs["pairs"] = (
            f"np.array([[registration.positions[i] + {centre}, registration.positions[j] - registration.positions[i]]"
            " for i, j in registration.pairs])"
        )
    return Plan(sources, calls, outputs)


def _corners(tile_shape: tuple[int, ...]) -> np.ndarray:
    return np.array([[0, 0], [tile_shape[0], 0], [tile_shape[0], tile_shape[1]], [0, tile_shape[1]]], float)


def make_stitch_job(request: StitchRequest) -> Job:
    d, tile_shape, channel = _tile_geometry(request)
    plan = stitch_plan(request)

    def run(progress: ProgressCallback) -> JobResult:
        tiles = as_dask(request.tiles) if is_lazy(request.tiles) else np.asarray(request.tiles)
        # registration 0..70, fusion 70..100; the tiles' progress is passed even when they are lazy
        steps = staged(plan, progress, {"registration": 70, "mosaic": 30})
        inputs = {"tiles": tiles}
        if request.positions is not None:
            inputs["stage"] = np.asarray(request.positions, dtype=float)
        values = plan.execute(inputs, **steps)
        registration, mosaic = values["registration"], values["mosaic"]
        layers = layer_tuples(
            _outputs(request, plan.outputs_of(values), registration, mosaic, d, tile_shape, channel),
            widget=WIDGET,
            plan=plan,
        )
        details = {"registration": registration, "origin": np.asarray(mosaic.origin, dtype=float)}
        return JobResult(layers, stitch_summary(registration), details)

    return Job(f"Stitching {request.name!r}", run)


def stitch_summary(registration: Any) -> str:
    """E.g. ``'17 of 17 pairs used; median residual 0.03 px; 1 tile placed from the stage'``."""
    used, pairs = int(registration.accepted.sum()), len(registration.accepted)
    stage = int(registration.placed_from_stage.sum())
    residual = registration.median_residual
    residual_text = f"{residual:.2g} px" if np.isfinite(residual) else "none"
    plural = "s" if stage != 1 else ""
    return f"{used} of {pairs} pairs used; median residual {residual_text}; {stage} tile{plural} placed from the stage"


def _outputs(request, values, registration, mosaic, d, tile_shape, channel) -> list[Output]:
    image = np.asarray(values["mosaic"])
    frame = request.frame
    spatial = frame.last_axes(d)
    origin = np.asarray(mosaic.origin, dtype=float)
    if channel is None:
        placement = derived_placement(spatial, offset=origin)
    else:  # ([C,] *shape): the channel axis keeps a unit step
        placement = derived_placement(frame.last_axes(d + 1), offset=np.concatenate([[0.0], origin]))
    outputs = [Output(image, {"name": f"{request.name} mosaic", **placement}, "image", "mosaic")]
    scene = derived_placement(spatial)  # shapes are drawn in the positions' frame (tile pixels)
    positions = registration.positions
    if d == 2:
        confidence, from_stage = registration.tile_confidence, registration.placed_from_stage
        colors = [STAGE_COLOR if stage else _confidence_color(c) for stage, c in zip(from_stage, confidence)]
        text = [f"{t}: {'stage' if stage else f'{c:.2f}'}" for t, (stage, c) in enumerate(zip(from_stage, confidence))]
        meta = {
            "name": f"{request.name} tile placement",
            "shape_type": "rectangle",
            "edge_color": colors,
            "face_color": "transparent",
            "edge_width": max(1.0, 0.006 * float(max(image.shape[-2:]))),
            "features": {"tile": np.arange(len(positions)), "confidence": confidence, "label": text},
            "text": {"string": "{label}", "size": 9, "color": "white"},
            **scene,
        }
        outputs.append(Output(values["outlines"], meta, "shapes", "outlines"))
    if len(registration.pairs):
        # a Vectors layer of (start, step) segments between the tile centres: napari shows it in a fifth of the
        # time a second Shapes layer took (benchmarks/bench_layer_insert.py: ~160 ms against ~720 ms)
        colors = np.array([ACCEPTED_COLOR if ok else REJECTED_COLOR for ok in registration.accepted], float)
        meta = {
            "name": f"{request.name} pairs",
            "vector_style": "line",
            "edge_color": colors,
            "edge_width": max(1.0, 0.004 * float(max(image.shape[-2:]))),
            "features": {
                "reason": registration.reasons,
                "refinement": registration.refinements,
                "ncc": registration.ncc,
                "residual": registration.residual,
            },
            **scene,
        }
        outputs.append(Output(values["pairs"], meta, "vectors", "pairs"))
    return outputs


def _confidence_color(confidence: float) -> tuple[float, float, float, float]:
    """Viridis-like: dark blue (unsure) to yellow (sure), for a confidence (NCC) in [0, 1]."""
    stops = np.array([[0.27, 0.0, 0.33], [0.13, 0.57, 0.55], [0.99, 0.91, 0.14]])
    x = float(np.clip(confidence, 0, 1)) * 2
    i = min(int(x), 1)
    rgb = stops[i] + (stops[i + 1] - stops[i]) * (x - i)
    return (*rgb.tolist(), 1.0)


# -- export: the registered positions as Fiji's TileConfiguration, the mosaic as OME-Zarr -------------------------

REGISTERED_NAME = "TileConfiguration.registered.txt"  # Fiji's name for positions after registration
MOSAIC_NAME = "mosaic.ome.zarr"


def tile_files_of(source: str | os.PathLike | None, names: Sequence[str] | None) -> list[Path] | None:
    """Each tile's image file, where the tiles came from a Fiji TileConfiguration (or a folder holding one) that
    names them (``names``, relative to its folder); None where they are no files of their own (an OME-TIFF's
    series, an OME-Zarr collection's images, a layer)."""
    from napari_gridmip.io._mosaic import TILE_CONFIGURATIONS, _is_zarr

    if source is None or names is None:
        return None
    path = Path(source).absolute()
    if path.is_file() and path.name.lower().endswith(".txt"):
        folder = path.parent
    elif path.is_dir() and not _is_zarr(path) and any((path / name).is_file() for name in TILE_CONFIGURATIONS):
        folder = path
    else:
        return None
    return [folder / name for name in names]


def registered_names(folder: str | os.PathLike, tile_files: Sequence[Path] | None, n: int) -> tuple[list[str], bool]:
    """The tiles' names in a TileConfiguration written into ``folder``, and whether the tiles must be written too.

    Fiji reads each name relative to the configuration's folder, so tiles that are files are named by their path
    relative to ``folder`` (their bare file names when the configuration goes beside them); others are written
    there as ``tile_000.tif``, ``tile_001.tif``, ...
    """
    if tile_files is not None:
        try:
            base = Path(folder).absolute()
            return [Path(os.path.relpath(Path(f).absolute(), base)).as_posix() for f in tile_files], False
        except ValueError:  # on another drive (Windows): no relative path, so the tiles are written beside it
            pass
    width = max(3, len(str(n - 1)))
    return [f"tile_{t:0{width}d}.tif" for t in range(n)], True


def export_targets(folder: str | os.PathLike, n: int, tile_files: Sequence[Path] | None, *, mosaic: bool) -> list[Path]:
    """What an export into ``folder`` writes: the TileConfiguration, the tile files it needs, and the mosaic."""
    folder = Path(folder).absolute()
    names, write_tiles = registered_names(folder, tile_files, n)
    targets = [folder / REGISTERED_NAME] + ([folder / name for name in names] if write_tiles else [])
    return targets + ([folder / MOSAIC_NAME] if mosaic else [])


def write_registered(
    stack: contextlib.ExitStack,
    folder: str | os.PathLike,
    positions: Any,
    *,
    tiles: Any = None,
    tile_files: Sequence[Path] | None = None,
    overwrite: bool = False,
    progress: ProgressCallback | None = None,
) -> Path:
    """Write ``positions`` (``(n, d)`` pixels) as ``folder/TileConfiguration.registered.txt``, and the tiles as
    ``tile_000.tif``... beside it where they are no files of their own (:func:`registered_names`).

    Each file is written under a temporary name entered into ``stack``: renamed into place when the stack closes
    without error, removed otherwise (nothing of a failed or cancelled export is left). Every target is checked
    before any is written (ValueError if one exists and ``overwrite`` is false). ``progress(done, total)`` is
    called once per tile written.
    """
    import tifffile  # an optional dependency (the io extra): needed only here

    folder = Path(folder).absolute()
    positions = np.asarray(positions, dtype=np.float64)
    n, d = positions.shape
    names, write_tiles = registered_names(folder, tile_files, n)
    config = stack.enter_context(atomic_path(folder / REGISTERED_NAME, overwrite=overwrite))
    if write_tiles:
        if tiles is None:
            raise ValueError("the tiles are no files of their own and none were given to write beside the "
                             "TileConfiguration")  # fmt: skip
        temporaries = [stack.enter_context(atomic_path(folder / name, overwrite=overwrite)) for name in names]
        for t, temporary in enumerate(temporaries):
            tile = np.asarray(tiles[t])
            axes = ("C" if tile.ndim == d + 1 else "") + "ZYX"[3 - d :]  # read back as such by read_mosaic
            tifffile.imwrite(temporary, tile, photometric="minisblack", metadata={"axes": axes})
            if progress is not None:
                progress(t + 1, n)
    write_tile_configuration(names, positions, config)
    return folder / REGISTERED_NAME


@dataclass(frozen=True)
class ExportRequest:
    """One export of a stitching result, captured on the GUI thread: into ``folder``, Fiji's
    ``TileConfiguration.registered.txt`` of ``positions`` (with the tiles where they are no files) and the fused
    ``mosaic`` (``([C,] *shape)``, pixel 0 at ``origin``) as ``mosaic.ome.zarr`` with its pixel size."""

    folder: Path
    positions: np.ndarray  # the registered positions, (n, d) pixels
    mosaic: Any
    origin: np.ndarray
    pixel_size: tuple[float, ...] | None = None  # micrometres, (y, x) or (z, y, x)
    tiles: Any = None  # (n, [C,] *shape), written where tile_files is None
    tile_files: list[Path] | None = None
    name: str = "mosaic"
    attributes: dict[str, Any] | None = None  # e.g. the mosaic layer's provenance, kept in the OME-Zarr
    overwrite: bool = False


def make_export_job(request: ExportRequest) -> Job:
    """Write :class:`ExportRequest`'s files, every one under a temporary name renamed when all are complete."""

    def run(progress: ProgressCallback) -> JobResult:
        folder = Path(request.folder).absolute()
        n, d = np.shape(request.positions)
        tiles_written = export_targets(folder, n, request.tile_files, mosaic=False)[1:]
        total = len(tiles_written) + 2  # the tiles, the configuration, the mosaic
        progress(0, total)
        with contextlib.ExitStack() as stack:
            mosaic = stack.enter_context(atomic_path(folder / MOSAIC_NAME, overwrite=request.overwrite))
            write_registered(
                stack, folder, request.positions, tiles=request.tiles, tile_files=request.tile_files,
                overwrite=request.overwrite, progress=lambda done, _: progress(done, total),
            )  # fmt: skip
            progress(total - 1, total)
            image = request.mosaic
            axes = ("c" if np.ndim(image) == d + 1 else "") + "zyx"[3 - d :]
            write_ome_zarr(image, mosaic, pixel_size=request.pixel_size, origin=request.origin, axes=axes,
                           name=request.name, attributes=request.attributes)  # fmt: skip
            progress(total, total)  # a Cancel pressed meanwhile still stops here: nothing is renamed
        extra = f" and {len(tiles_written)} tile files" if tiles_written else ""
        return JobResult([], f"wrote {REGISTERED_NAME}{extra} and {MOSAIC_NAME} to {folder}")

    return Job(f"Exporting to {Path(request.folder).name or request.folder!s}", run)
