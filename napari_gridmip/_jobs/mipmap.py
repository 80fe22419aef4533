"""The occupancy-mipmap job: the pyramid of one volume (or one per time point), and its occupancy layer."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip._jobs import (
    DaskProgress,
    Job,
    JobResult,
    Output,
    ProgressCallback,
    as_dask,
    is_lazy,
    layer_tuples,
)
from napari_gridmip._jobs.device_layers import DeviceInput, is_device_array, resolve
from napari_gridmip._jobs.plan import Call, Plan, Source
from napari_gridmip._jobs.world import Frame, _shear_matrix, derived_placement

WIDGET = "mipmap"
MAX_BLOCKS = 4096  # the default level shown is the finest with at most this many occupied cells
OCCUPANCY_COLOR = "cyan"


@dataclass(frozen=True)
class MipmapRequest:
    """The inputs of an occupancy-mipmap run, captured on the GUI thread.

    ``data`` is the volume ``(..., Z, Y, X)``: one time point of a 4D+ layer
    (then ``frame`` is the layer's transform restricted to its last three
    axes), or all of them (one pyramid per leading index). ``device``: where the job takes ``data`` from the
    layer's device copy (:mod:`napari_gridmip._jobs.device_layers`).
    """

    name: str
    data: Any
    frame: Frame
    threshold: float
    per_level: bool = False
    index: str = ""  # how ``data`` comes from the layer's data, as code (e.g. "[3]" for time point 3)
    device: DeviceInput | None = None


def level_placement(frame: Frame, level: int) -> dict[str, Any]:
    """Placement of mipmap level ``level``: each voxel covers a ``2**level`` block of the input's last three
    axes; leading (time, channel) axes keep their steps."""
    factor = 2**level
    lead = frame.ndim - 3
    return derived_placement(frame, step=[1] * lead + [factor] * 3, offset=[0] * lead + [(factor - 1) / 2] * 3)


def default_level(counts: Sequence[int], max_blocks: int = MAX_BLOCKS) -> int:
    """The finest level above 0 with at most ``max_blocks`` occupied cells (level 0 is the data itself)."""
    for k in range(1, len(counts)):
        if counts[k] <= max_blocks:
            return k
    return len(counts) - 1


def as_labels(level: Any) -> Any:
    """A bool level as Labels data (uint8): a view in memory, a lazy cast for a dask level."""
    return level.view(np.uint8) if isinstance(level, np.ndarray) else level.astype(np.uint8)


def occupancy_output(name: str, level_data: Any, frame: Frame, level: int) -> Output:
    """The Labels layer that shows one level's occupied cells as translucent blocks."""
    colormap = {None: "transparent", 0: "transparent", 1: OCCUPANCY_COLOR}  # napari: a direct label colormap
    meta = {
        "name": f"{name} occupancy",
        "opacity": 0.45,
        "colormap": colormap,
        "metadata": {"gridmip_level": level},
        **level_placement(frame, level),
    }
    return Output(as_labels(level_data), meta, "labels", "occupancy")


def level_expression(level: int) -> str:
    """The occupancy layer's data as code over the script's ``levels``."""
    return f"levels[{level}]"


def mipmap_plan(name: str, index: str, threshold: float, *, volume: str = "volume", shown: int | None = None) -> Plan:
    """What the job computes, as public calls: the occupancy pyramid of the layer's volume at ``threshold``;
    outputs ``"level k"`` (``levels[k]``) and, once the level shown is known, ``"occupancy"``.

    (The widget's job builds the max pyramid once and thresholds it, which it keeps for the threshold slider;
    ``threshold_mipmap(max_mipmap(v), threshold=t)`` equals ``occupancy_mipmap(v, threshold=t)`` bit for bit,
    and the script says the shorter thing.)
    """
    sources = [Source(volume, layer=name, index=index)]
    calls = [Call("occupancy_mipmap", (volume,), kwargs={"threshold": float(threshold)}, result="levels")]
    outputs = {} if shown is None else {"occupancy": level_expression(shown)}
    return Plan(sources, calls, outputs)


# -- the pyramid a run leaves behind: any threshold's occupancy with NumPy alone ------------------------------------


@dataclass
class Pyramid:
    """The max pyramid of one run, which the widget keeps: the occupancy at any threshold without recomputing.

    ``max_levels[0]`` is the volume itself (the NumPy array, or a dask view of a lazy one); the coarser levels are
    NumPy arrays in the volume's dtype. Thresholding them (:meth:`level`) is NumPy only, for the GUI thread.
    ``chunk_max`` is the maximum of each chunk of a lazy volume's chunk grid (``None`` in memory).
    """

    name: str
    volume: Any
    max_levels: list
    frame: Frame
    index: str
    lazy: bool
    value_range: tuple[float, float]
    chunk_max: np.ndarray | None = None
    level0_count: tuple[float, int] | None = None  # (threshold, count) of a lazy level 0, known at Run's threshold

    @property
    def stack(self) -> bool:
        """Several volumes (time points, channels): one pyramid per leading index."""
        return self.volume.ndim > 3

    def level(self, k: int, threshold: float) -> Any:
        """Level ``k`` of the occupancy pyramid at ``threshold`` (``max > threshold`` exactly; NaN empty): NumPy,
        or a lazy dask threshold for level 0 of a lazy volume (napari reads the slices it shows)."""
        from napari_gridmip.core.occupancy.pyramid import threshold_block  # JAX: loaded by the run that made it

        level = self.max_levels[k]
        if isinstance(level, np.ndarray):
            return threshold_block(level, threshold)
        return level.map_blocks(threshold_block, threshold, dtype=bool)

    def levels(self, threshold: float) -> list:
        return [self.level(k, threshold) for k in range(len(self.max_levels))]

    def count(self, k: int, threshold: float, level: Any = None) -> int | None:
        """Occupied cells of level ``k`` (``None`` for level 0 of a lazy volume away from Run's threshold)."""
        if k == 0 and self.lazy:
            known = self.level0_count
            return known[1] if known is not None and known[0] == threshold else None
        level = self.level(k, threshold) if level is None else level
        return int(np.count_nonzero(level))

    def chunks_held(self, threshold: float) -> tuple[int, int] | None:
        """(chunks holding an occupied voxel, chunks) of a lazy volume's chunk grid; ``None`` in memory."""
        if self.chunk_max is None:
            return None
        from napari_gridmip.core.occupancy.pyramid import threshold_block  # JAX: loaded by the run that made it

        return int(np.count_nonzero(threshold_block(self.chunk_max, threshold))), int(self.chunk_max.size)

    def summary(self, k: int, threshold: float, count: int | None) -> str:
        level = self.max_levels[k]
        size = int(np.prod(level.shape))
        if count is None:
            text = f"level {k} {tuple(level.shape)}: read lazily, not counted (threshold {threshold:g})"
        else:
            text = f"level {k} {tuple(level.shape)}: {count} of {size} cells occupied ({100 * count / size:.3g}%)"
        held = self.chunks_held(threshold)
        if held is not None:
            text += f"; {held[0]} of {held[1]} chunks hold data"
        return text


def make_mipmap_job(request: MipmapRequest) -> Job:
    """The max pyramid (in memory or block by block), then the occupancy at the request's threshold: the Labels
    layer of the default level, and per-level images if asked. ``details["pyramid"]`` is the :class:`Pyramid`."""
    _validate_volume(request.name, request.data)
    plan = mipmap_plan(request.name, request.index, request.threshold)

    def run(progress: ProgressCallback) -> JobResult:
        kept: dict[str, Pyramid] = {}

        def through_max_pyramid(call: Call, namespace: dict, runtime: dict) -> list:
            """The planned ``occupancy_mipmap`` (its recorded threshold) as the max pyramid thresholded, which the
            widget keeps: any other threshold is then NumPy alone."""
            planned = dataclasses.replace(request, data=namespace["volume"], threshold=call.kwargs["threshold"])
            if is_lazy(planned.data):
                pyramid, on_device = _lazy_pyramid(planned, progress), None
            else:
                pyramid, on_device = _pyramid_in_memory(planned, progress)
            kept["pyramid"] = pyramid
            return _occupancy_levels(pyramid, call.kwargs["threshold"], on_device)

        namespace = plan.execute({"volume": request.data}, evaluators={"levels": through_max_pyramid})
        pyramid, levels, t = kept["pyramid"], namespace["levels"], request.threshold
        counts = [_count(pyramid, k, t, level) for k, level in enumerate(levels)]
        shown = default_level(counts)
        done = plan.extended(outputs={"occupancy": level_expression(shown)})
        if request.per_level:
            done = done.extended(outputs={**done.outputs, **{f"level {k}": f"levels[{k}]" for k in range(len(levels))}})
        values = {name: _on_host(value) for name, value in done.outputs_of(namespace).items()}
        outputs: list[Output] = []
        if request.per_level:
            outputs += [
                per_level_output(request.name, values[f"level {k}"], request.frame, k) for k in range(len(levels))
            ]
        outputs.append(occupancy_output(request.name, values["occupancy"], request.frame, shown))
        layers = layer_tuples(outputs, widget=WIDGET, plan=done)
        details = {"pyramid": pyramid, "counts": counts, "level": shown, "frame": request.frame, "threshold": t}
        return JobResult(layers, pyramid.summary(shown, t, counts[shown]), details)

    return Job(f"Occupancy mipmap of {request.name!r}", run)


def per_level_output(name: str, level: Any, frame: Frame, k: int) -> Output:
    common = {"contrast_limits": (0, 1), "colormap": "gray", "blending": "additive", "visible": False}
    meta = {"name": f"{name} mipmap level {k}", **common, **level_placement(frame, k)}
    return Output(level, meta, "image", f"level {k}")


def _value_range(low: Any, high: Any) -> tuple[float, float]:
    """The slider's range from the volume's minimum and maximum (NaN ones: all NaN, or nothing to range over)."""
    low, high = float(low), float(high)
    if not np.isfinite(low) or not np.isfinite(high):
        return 0.0, 1.0
    return (low, high) if high > low else (low, low + 1.0)


def _pyramid_in_memory(request: MipmapRequest, progress: ProgressCallback) -> tuple[Pyramid, Any]:
    """The max pyramid on the device, fetched level by level (one progress step each); level 0 is the input.

    Also the volume's device copy where the kernels take it from the layer's (:mod:`napari_gridmip._jobs.device_layers`;
    else None): the job thresholds and counts level 0 there. The pyramid keeps NumPy alone (the widget keeps it:
    a device array in it would hold the chip's memory after the cache let the copy go).
    """
    from napari_gridmip.core import max_mipmap, mipmap_shapes  # imports JAX: in the worker, not as the widgets load

    volume = np.asarray(request.data)
    source = resolve(request.device, request.data, "volume")
    on_device = source if is_device_array(source) else None
    total = len(mipmap_shapes(tuple(volume.shape[-3:]))) + 1
    progress(0, total)
    device_levels = max_mipmap(volume if on_device is None else on_device)
    for level in device_levels[1:]:  # every level's transfer started at once: on an accelerator they overlap
        if hasattr(level, "copy_to_host_async"):
            level.copy_to_host_async()
    levels = [volume]
    for k, level in enumerate(device_levels[1:], start=1):
        progress(k, total)
        levels.append(np.asarray(level))  # views of JAX's buffers on the CPU
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN volume: NaN, handled below
        # on the device where the copy is: the host's pass over a 512^3 volume is longer than the chip's pyramid
        low = _minimum(volume if on_device is None else on_device)
    progress(total, total)
    pyramid = Pyramid(
        request.name, volume, levels, request.frame, request.index, False, _value_range(low, levels[-1].max())
    )
    return pyramid, on_device


def _minimum(volume: Any) -> Any:
    """The volume's minimum, NaN ignored (NaN if all of it is): NumPy's, or JAX's for a device array (equal)."""
    if is_device_array(volume):
        import jax.numpy as jnp  # a device array: JAX is loaded

        return (jnp.nanmin if volume.dtype.kind == "f" else jnp.min)(volume)
    return np.nanmin(volume) if volume.dtype.kind == "f" else volume.min()


def _occupancy_levels(pyramid: Pyramid, threshold: float, on_device: Any) -> list:
    """The occupancy pyramid at ``threshold`` from the max pyramid; level 0 from the volume's device copy where
    there is one (a device array, fetched only where an output shows it): thresholding a 512^3 volume on the host
    takes longer than the chip's whole pyramid."""
    if on_device is None:
        return pyramid.levels(threshold)
    from napari_gridmip.core import threshold_mipmap  # imports JAX: in the worker, not as the widgets load

    coarse = [pyramid.level(k, threshold) for k in range(1, len(pyramid.max_levels))]
    return [threshold_mipmap([on_device], threshold=threshold)[0], *coarse]


def _count(pyramid: Pyramid, k: int, threshold: float, level: Any) -> int | None:
    """Occupied cells of level ``k`` (:meth:`Pyramid.count`), counted on the device for a device level."""
    if is_device_array(level):
        import jax.numpy as jnp  # a device array: JAX is loaded

        return int(jnp.count_nonzero(level))
    return pyramid.count(k, threshold, level)


def _on_host(value: Any) -> Any:
    """An output's value as the layers hold it: a device array fetched."""
    return np.asarray(value) if is_device_array(value) else value


def _block_max(block: np.ndarray) -> np.ndarray:
    """A chunk's maximum, NaN ignored (NaN if it holds only NaN), as a 1-cell block."""
    flat = block.reshape(-1)
    if block.dtype.kind == "f":
        value = np.fmax.reduce(flat) if flat.size else np.nan
    else:
        value = flat.max() if flat.size else 0
    return np.full((1,) * block.ndim, value, dtype=block.dtype)


def _lazy_pyramid(request: MipmapRequest, progress: ProgressCallback) -> Pyramid:
    """A dask/Zarr volume, block by block, every chunk read once: the max levels 1 and up in memory (an eighth of
    the voxels, and less), level 0 left lazy, each chunk's maximum, the minimum, and level 0's count at the
    request's threshold; one progress step per task. Cancel stops between tasks."""
    # in the worker: dask.array takes 0.5 s to import, the kernels import JAX
    import dask
    import dask.array as da

    from napari_gridmip.core import max_mipmap
    from napari_gridmip.core.occupancy.pyramid import threshold_block

    volume = as_dask(request.data)
    levels = max_mipmap(volume)
    chunk_max = volume.map_blocks(_block_max, chunks=(1,) * volume.ndim, dtype=volume.dtype)
    low = da.nanmin(volume) if volume.dtype.kind == "f" else volume.min()
    count0 = da.count_nonzero(volume.map_blocks(threshold_block, request.threshold, dtype=bool))
    with DaskProgress(progress), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN chunks
        *coarse, chunk_max, low, count0 = dask.compute(*levels[1:], chunk_max, low, count0, scheduler="threads")
    coarse = [np.asarray(level) for level in coarse]
    return Pyramid(
        request.name,
        volume,
        [volume, *coarse],
        request.frame,
        request.index,
        True,
        _value_range(low, coarse[-1].max() if coarse else np.fmax.reduce(np.asarray(chunk_max).reshape(-1))),
        chunk_max=np.asarray(chunk_max),
        level0_count=(request.threshold, int(count0)),
    )


def mipmap_summary(levels: Sequence[np.ndarray], counts: Sequence[int], shown: int) -> str:
    """E.g. ``'level 3 (20, 18, 17): 412 of 6120 cells occupied (6.7%)'``."""
    level = levels[shown]
    return (
        f"level {shown} {tuple(level.shape)}: {counts[shown]} of {level.size} cells occupied "
        f"({100 * counts[shown] / level.size:.3g}%)"
    )


def _validate_volume(name: str, data: Any) -> None:
    if len(data.shape) < 3:
        raise ValueError(f"layer {name!r} must be 3D, or a 4D+ stack of volumes; got shape {tuple(data.shape)}")


# -- crop to occupied --------------------------------------------------------------------------------------------


def _single_volume(pyramid: Pyramid, what: str) -> None:
    if pyramid.stack:
        raise ValueError(
            f"{what} works on one volume: turn off 'All time points' and Run again (the time point shown is used)"
        )


def make_crop_job(pyramid: Pyramid, threshold: float, *, kind: str, display: dict[str, Any]) -> Job:
    """The input cropped to the occupied bounding box at ``threshold``, placed over the input in world coordinates.

    ``kind`` is the input's layer type ("image" or "labels"); ``display`` its colormap and contrast limits. A NumPy
    crop is a copy (editing it never edits the input); a dask/Zarr crop stays lazy. Raises ValueError when nothing
    is above the threshold.
    """
    _single_volume(pyramid, "Crop to occupied")

    def run(progress: ProgressCallback) -> JobResult:
        progress(0, 2)
        plan = mipmap_plan(pyramid.name, pyramid.index, threshold).extended(
            calls=[Call("occupied_bbox", ("levels",), result="box")], outputs={"crop": "volume[box.slices]"}
        )
        kept = {"levels": lambda call, namespace, runtime: pyramid.levels(call.kwargs["threshold"])}
        namespace = plan.execute({"volume": pyramid.volume}, evaluators=kept)  # the kept pyramid's levels
        box = namespace["box"]
        progress(1, 2)
        if box is None:
            raise ValueError(f"nothing in {pyramid.name!r} is above the threshold {threshold:g}: no crop to make")
        crop = plan.outputs_of(namespace)["crop"]
        data = crop if pyramid.lazy else np.array(crop)
        meta = {"name": f"{pyramid.name} crop", **display, **derived_placement(pyramid.frame, offset=box.lo)}
        layers = layer_tuples([Output(data, meta, kind, "crop")], widget=WIDGET, plan=plan)
        progress(2, 2)
        return JobResult(layers, f"crop {box.shape} from {box.lo} (z, y, x) to {box.hi}", {"box": box})

    return Job(f"Crop {pyramid.name!r} to its occupied box", run)


# -- render the full-resolution view -----------------------------------------------------------------------------

RENDER_MODES = {"MIP": "mip", "depth (first hit)": "first_hit"}
MAX_RENDER_SIDE = 1024  # pixels on the long side of a render
DEPTH_COLORMAP = "viridis"


@dataclass(frozen=True)
class Camera:
    """napari's 3D camera, copied on the GUI thread: world coordinates of the displayed axes ``(z, y, x)``.

    ``right_handed`` is ``camera.handedness == "right"``: the screen's right is then ``view x up``
    (``up x view`` for napari's left-handed orientations). ``canvas`` is ``(rows, columns)`` in pixels;
    ``zoom`` is screen pixels per world unit (napari's orthographic camera).
    """

    center: tuple[float, float, float]
    view: tuple[float, float, float]
    up: tuple[float, float, float]
    right_handed: bool
    zoom: float
    canvas: tuple[int, int]

    @classmethod
    def of(cls, viewer: Any) -> Camera:
        camera = viewer.scene.camera  # viewer.camera: deprecated since napari 0.9
        return cls(
            tuple(float(v) for v in camera.center[-3:]),
            tuple(float(v) for v in camera.view_direction),
            tuple(float(v) for v in camera.up_direction),
            str(getattr(camera.handedness, "value", camera.handedness)) == "right",
            float(camera.zoom),
            tuple(int(n) for n in viewer.canvas.size),
        )


def data_to_world(frame: Frame) -> tuple[np.ndarray, np.ndarray]:
    """``(M, b)`` with ``world = M @ data + b`` for a 3D frame (napari's scale, shear, rotate, translate, affine)."""
    linear = frame.rotate @ _shear_matrix(frame.shear, 3) @ np.diag(frame.scale)
    affine = frame.affine
    return affine[:3, :3] @ linear, affine[:3, :3] @ frame.translate + affine[:3, 3]


@dataclass(frozen=True)
class ViewRays:
    """The render's rays in the volume's voxel index coordinates, their picture's size and world placement, and
    the code that makes them (sources of the Copy as Python script)."""

    origins: np.ndarray
    directions: np.ndarray
    shape: tuple[int, int]
    pixel_size: float  # world units
    translate: tuple[float, float]  # world (y, x) of pixel (0, 0)
    sources: list[Source]


def view_rays(
    camera: Camera, frame: Frame, volume_shape: Sequence[int], *, max_side: int = MAX_RENDER_SIDE
) -> ViewRays:
    """One ray per canvas pixel (at most ``max_side`` on the long side) of napari's orthographic camera, taken from
    world coordinates into the layer's data (voxel index ``data + 0.5``), kept to the rows and columns whose rays
    meet the volume's box. Directions are the unit view direction mapped to data, so a depth ``t`` is a world
    distance from the plane through the camera's centre."""
    from napari_gridmip.core import orthographic_rays  # imports JAX: in the worker, not as the widgets load

    rows, columns = (max(int(n), 1) for n in camera.canvas)
    factor = max(1.0, max(rows, columns) / max_side)
    shape = (max(round(rows / factor), 1), max(round(columns / factor), 1))
    pixel = factor / camera.zoom
    view = np.asarray(camera.view, float)
    sign = -1.0 if camera.right_handed else 1.0  # orthographic_rays' right is up x view: turn the view round
    call_view = tuple(float(v) for v in sign * view)
    world = orthographic_rays(camera.center, call_view, camera.up, shape, pixel_size=pixel)
    matrix, offset = data_to_world(frame)
    inverse = np.linalg.inv(matrix)
    origins = (world.origins - offset) @ inverse.T + 0.5
    directions = (sign * world.directions) @ inverse.T
    hits = _meets_box(origins, directions, volume_shape)
    if hits.any():
        used_rows, used_columns = np.nonzero(hits.any(axis=1))[0], np.nonzero(hits.any(axis=0))[0]
        r0, r1, c0, c1 = used_rows[0], used_rows[-1] + 1, used_columns[0], used_columns[-1] + 1
        r0, r1, c0, c1 = (int(v) for v in (r0, r1, c0, c1))
    else:
        r0, r1, c0, c1 = 0, 1, 0, 1
    window = f"[{r0}:{r1}, {c0}:{c1}]"
    arguments = f"{camera.center!r}, {call_view!r}, {camera.up!r}, {shape!r}, pixel_size={pixel!r}"
    offset_code, inverse_code = _array_code(offset), _array_code(inverse)
    sources = [
        Source("camera_rays", expression=f"gm.orthographic_rays({arguments})"),
        Source("origins", expression=f"((camera_rays.origins - {offset_code}) @ {inverse_code}.T + 0.5){window}"),
        Source("directions", expression=f"(({sign!r} * camera_rays.directions) @ {inverse_code}.T){window}"),
    ]
    centre = np.asarray(camera.center, float)
    top, left = centre[1] - (shape[0] - 1) / 2 * pixel, centre[2] - (shape[1] - 1) / 2 * pixel
    translate = (float(top + r0 * pixel), float(left + c0 * pixel))
    return ViewRays(
        origins[r0:r1, c0:c1], directions[r0:r1, c0:c1], (r1 - r0, c1 - c0), float(pixel), translate, sources
    )


def _meets_box(origins: np.ndarray, directions: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Which rays (whole lines) cross the box ``[0, shape)`` of voxel index space (the slab test)."""
    size = np.asarray(shape[-3:], float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = (0 - origins) / directions, (size - origins) / directions
    parallel = directions == 0
    inside = (origins >= 0) & (origins <= size)
    low = np.where(parallel, np.where(inside, -np.inf, np.inf), np.minimum(t1, t2))
    high = np.where(parallel, np.where(inside, np.inf, -np.inf), np.maximum(t1, t2))
    return low.max(axis=-1) < high.min(axis=-1)


def _array_code(array: np.ndarray) -> str:
    return f"np.array({np.asarray(array, float).tolist()!r})"


def render_plan(pyramid: Pyramid, threshold: float, rays: ViewRays, *, mode: str) -> Plan:
    """What the render computes, as public calls: the occupancy pyramid at ``threshold``, then ``render_volume``
    along ``rays``; output ``"render <mode>"`` (``view``).

    A volume in memory renders with its whole pyramid. A dask/Zarr one passes the pyramid from level 1 on
    (``occupancy_mipmap(volume, threshold=t)[1:]``) with the threshold: ``render_volume`` then looks at every voxel
    of an occupied level-1 cell and keeps those above the threshold, which gives the same picture with no chunk
    read to make level 0. (A lazy volume of one voxel, which has no level 1, is read into memory.)
    """
    sources = [Source("volume", layer=pyramid.name, index=pyramid.index), *rays.sources]
    data, index, options = "volume", "", {"mode": mode}
    if pyramid.lazy and len(pyramid.max_levels) > 1:
        index, options = "[1:]", {**options, "threshold": float(threshold)}
    elif pyramid.lazy:
        data = "volume_in_memory"
        sources.append(Source(data, expression="np.asarray(volume)"))
    calls = [
        Call("occupancy_mipmap", (data,), kwargs={"threshold": float(threshold)}, result="levels", index=index),
        Call("render_volume", (data, "levels", "origins", "directions"), kwargs=options, result="view"),
    ]
    return Plan(sources, calls, {f"render {mode}": "view"})


def make_render_job(
    pyramid: Pyramid,
    threshold: float,
    camera: Camera,
    *,
    mode: str,
    display: dict[str, Any],
    max_side: int = MAX_RENDER_SIDE,
) -> Job:
    """Ray-march the input from the camera, skipping empty space with the pyramid at ``threshold``: the
    evaluation of :func:`render_plan` (the kept pyramid's levels stand in for its ``occupancy_mipmap``, which they
    equal), so the layer's provenance and Copy as Python are what ran.

    ``mode`` is a key or value of :data:`RENDER_MODES`. ``render_volume`` reads only the chunks of a dask/Zarr
    volume that hold voxels above the threshold that the rays cross.
    """
    _single_volume(pyramid, "Render full-resolution view")
    mode = RENDER_MODES.get(mode, mode)
    if mode not in RENDER_MODES.values():
        raise ValueError(f"mode must be one of {sorted(RENDER_MODES)}; got {mode!r}")
    rays = view_rays(camera, pyramid.frame, pyramid.volume.shape, max_side=max_side)
    plan = render_plan(pyramid, threshold, rays, mode=mode)

    def kept_levels(call: Call, namespace: dict, runtime: dict) -> list:
        """The planned ``occupancy_mipmap`` (its recorded threshold and index) from the pyramid Run kept."""
        levels = pyramid.levels(call.kwargs["threshold"])
        return levels[1:] if call.index == "[1:]" else levels

    def run(progress: ProgressCallback) -> JobResult:
        progress(0, 1)
        start = time.perf_counter()
        read_in = plan.calls[0].data != ("volume",)  # a one-voxel lazy volume, read into memory: nothing kept to use
        evaluators = {} if read_in else {"levels": kept_levels}
        image = plan.run(
            {"volume": pyramid.volume},
            evaluators=evaluators,
            extras=lambda i, call: {"progress": progress} if call.accepts("progress") else {},
        )[f"render {mode}"]
        seconds = time.perf_counter() - start
        name, meta = _render_meta(pyramid.name, mode, image, display)
        meta.update(scale=(rays.pixel_size, rays.pixel_size), translate=rays.translate)
        outputs = [Output(image, {"name": name, **meta}, "image", f"render {mode}")]
        layers = layer_tuples(outputs, widget=WIDGET, plan=plan)
        summary = f"{name}: {rays.shape[1]} x {rays.shape[0]} px in {seconds:.2f} s"
        return JobResult(layers, summary, {"seconds": seconds, "shape": rays.shape})

    return Job(f"Render {pyramid.name!r} from the camera", run)


def _render_meta(name: str, mode: str, image: np.ndarray, display: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if mode == "mip":
        meta = {key: display[key] for key in ("colormap", "contrast_limits", "gamma") if key in display}
        if "contrast_limits" not in meta:  # a Labels input: its values' range
            finite = image[np.isfinite(image)] if image.dtype.kind == "f" else image
            top = float(finite.max()) if finite.size else 1.0
            meta["contrast_limits"] = (0.0, top if top > 0 else 1.0)
        return f"{name} render (MIP)", meta
    finite = image[np.isfinite(image)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    return f"{name} render (depth)", {"colormap": DEPTH_COLORMAP, "contrast_limits": (low, max(high, low + 1e-6))}
