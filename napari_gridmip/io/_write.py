"""Writers that never leave partial output: everything goes under a temporary name first
(:func:`~napari_gridmip.core.runtime.files.atomic_path`), renamed into place when complete."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_gridmip.core.runtime.files import atomic_path

SPATIAL_AXES = ("z", "y", "x")
LEADING_AXES = ("t", "c")  # NGFF orders axes (t, c, z, y, x)


def mipmap_transforms(ndim: int, levels: int, scale: Sequence[float] | None = None) -> list[list[dict[str, Any]]]:
    """NGFF ``coordinateTransformations`` of each level: scale ``2**k`` and the half-block translation.

    A level-``k`` voxel covers a ``2**k`` block of level 0, so its centre sits
    ``(2**k - 1) / 2`` level-0 voxels in (the widget's placement uses the same
    rule). Leading (time, channel) axes keep scale 1 and translation 0.
    """
    spatial = np.ones(3) if scale is None else np.asarray(scale, dtype=float)
    lead = ndim - 3
    out = []
    for k in range(levels):
        factor = 2**k
        out.append(
            [
                {"type": "scale", "scale": [1.0] * lead + [float(s * factor) for s in spatial]},
                {"type": "translation", "translation": [0.0] * lead + [float(s * (factor - 1) / 2) for s in spatial]},
            ]
        )
    return out


def write_mipmap(
    volume: Any,
    path: str | os.PathLike,
    *,
    threshold: float = 0.0,
    scale: Sequence[float] | None = None,
    overwrite: bool = False,
    compute: Callable[[Any], Any] | None = None,
    attributes: Mapping[str, Any] | None = None,
    packed: str | None = None,
) -> Path:
    """Write the occupancy pyramid of ``volume`` as an OME-Zarr multiscale image.

    Parameters
    ----------
    volume
        ``(..., D, H, W)`` NumPy, JAX or dask array, up to two leading axes
        (time, channel). A dask array is read block by block (2**7-aligned),
        each block's finest levels written as it is done, so memory holds a
        few blocks and the small coarse levels, never the volume.
    path
        The OME-Zarr folder to create (written under a temporary name, renamed
        when complete: a failed run leaves nothing behind).
    threshold
        As for :func:`~napari_gridmip.occupancy_mipmap`.
    scale
        Level 0's voxel size along (z, y, x); default 1.
    overwrite
        Replace an existing ``path``.
    compute
        How to run a dask graph (given a list of dask collections, returns
        their results); default ``dask.compute``. The command line passes one
        that shows a progress bar or runs on a ``dask.distributed`` cluster.
    attributes
        Extra JSON-able attributes for the image group, beside the NGFF
        metadata (the command line stores its provenance there, under
        ``"napari_gridmip"``).
    packed
        ``"morton"`` or ``"c"``: also write each level packed 8 cells to a
        byte (:func:`~napari_gridmip.pack_occupancy`) in a ``packed`` group
        inside the image: array ``packed/s{k}`` of uint8, shape ``(..., n)``
        (one row of ``n`` bytes per leading index), with attributes ``order``
        and ``shape`` (the level's ``(D, H, W)``), so that
        ``unpack_occupancy(packed["s0"][...], shape, order=order)`` gives
        level 0 back. The group's attributes say the same, with ``levels``
        and a ``layout`` text. Default None: no packed levels. In C order
        each level is packed in slabs of at most 2**26 cells; in Morton
        order one 3D level is held in memory at a time.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        As for :func:`~napari_gridmip.occupancy_mipmap`; if ``volume`` has more
        than 5 axes; or if ``path`` exists and ``overwrite`` is false.
    """
    import zarr
    from ome_zarr.writer import write_multiscales_metadata

    from napari_gridmip.core import validate

    volume = validate.as_array("volume", volume)
    ndim = len(validate.shape_of(volume))
    if ndim > 5:
        raise ValueError(f"volume must have at most 5 axes (t, c, z, y, x) for OME-Zarr; got {ndim}")
    if scale is not None and len(scale) != 3:
        raise ValueError(f"scale must give the (z, y, x) voxel size; got {scale!r}")
    validate.check_real("volume", volume)
    validate.check_ndim("volume", volume, min_ndim=3)
    validate.check_nonempty("volume", validate.shape_of(volume))
    threshold = validate.check_finite_scalar("threshold", threshold)
    if packed is not None:
        validate.check_choice("packed", packed, PACKED_ORDERS)
    axes = [{"name": name, "type": "time" if name == "t" else "channel"} for name in LEADING_AXES[: ndim - 3]]
    axes += [{"name": name, "type": "space"} for name in SPATIAL_AXES]
    with atomic_path(path, overwrite=overwrite) as temporary:
        group = zarr.open_group(str(temporary), mode="w")
        if validate.is_dask(volume):
            count = _write_levels_by_block(volume, group, threshold, compute)
        else:
            count = _write_levels_in_memory(volume, group, threshold)
        datasets = [
            {"path": f"s{k}", "coordinateTransformations": transforms}
            for k, transforms in enumerate(mipmap_transforms(ndim, count, scale))
        ]
        # the NGFF metadata from ome-zarr-py (explicit transforms: 2**k scales and half-block translations)
        write_multiscales_metadata(group, datasets, axes=axes, name="occupancy")
        if attributes:
            group.attrs.update(dict(attributes))
        if packed is not None:
            write_packed_levels(group, count, packed)
    return Path(path)


PACKED_ORDERS = ("morton", "c")
PACKED_LAYOUT = {
    "morton": "one byte per 2x2x2 block, cell (z, y, x) of the level its bit 4*(z%2) + 2*(y%2) + (x%2) (bit 0 the "
    "least significant); bytes in Morton order of the blocks (z//2, y//2, x//2), bits interleaved ... z1 y1 x1 z0 y0 "
    "x0, blocks outside the grid skipped (instant-ngp's bitfield for a cubic power-of-two grid)",
    "c": "cell i of the level in C order is bit i % 8 (bit 0 the least significant) of byte i // 8 "
    "(numpy.packbits(level.ravel(), bitorder='little'))",
}
SLAB_CELLS = 1 << 26  # C-order packing reads a level in z-slabs of at most this many cells


def write_packed_levels(group: Any, count: int, order: str) -> None:
    """The ``packed`` group: levels ``s0 .. s{count-1}`` of ``group`` packed in ``order``, read back level by level."""
    import math

    from napari_gridmip.core.occupancy.packing import pack_occupancy, packed_size

    out = group.create_group("packed")
    out.attrs.update({"order": order, "levels": count, "layout": PACKED_LAYOUT[order]})
    for k in range(count):
        level = group[f"s{k}"]
        lead, (d, h, w) = tuple(level.shape[:-3]), tuple(level.shape[-3:])
        size = packed_size((d, h, w), order)
        array = out.create_array(
            f"s{k}", shape=lead + (size,), chunks=(1,) * len(lead) + (min(size, 1 << 22),), dtype=np.uint8, fill_value=0
        )
        array.attrs.update({"order": order, "shape": [d, h, w]})
        for index in np.ndindex(*lead):
            if order == "morton":
                array[index] = np.asarray(pack_occupancy(level[index], order="morton"))
                continue
            # C order: a slab of whole z-planes starting at a multiple of 8 cells packs on its own
            step = 8 // math.gcd(h * w, 8)
            rows = max(step, (SLAB_CELLS // (h * w)) // step * step)
            for z in range(0, d, rows):
                data = np.asarray(pack_occupancy(level[index + (slice(z, z + rows),)], order="c"))
                start = z * h * w // 8
                array[index + (slice(start, start + data.size),)] = data


LEVEL_CHUNK = 128  # stored chunk of the levels written whole (a block's level 0 is 128^3)
DIRECT_LEVELS = 2  # a block task writes its levels 0..2 itself; finer pieces are too small to store per block


def _create_level(group: Any, k: int, shape: tuple[int, ...], chunks: tuple[int, ...]) -> Any:
    return group.create_array(f"s{k}", shape=shape, chunks=chunks, dtype=bool, fill_value=False)


def _write_levels_in_memory(volume: Any, group: Any, threshold: float) -> int:
    """The in-memory path: the whole pyramid from one compiled program, then each level stored."""
    from napari_gridmip.core.occupancy.pyramid import occupancy_mipmap

    levels = occupancy_mipmap(volume, threshold=threshold)
    lead = len(levels[0].shape) - 3
    for k, level in enumerate(levels):
        chunks = (1,) * lead + tuple(min(LEVEL_CHUNK, n) for n in level.shape[lead:])
        _create_level(group, k, tuple(level.shape), chunks)[...] = np.asarray(level)
    return len(levels)


def _write_levels_by_block(volume: Any, group: Any, threshold: float, compute: Callable | None) -> int:
    """The dask path, in bounded memory: one task per ``2**b``-aligned block.

    Each task reads its block, makes the block's levels, writes levels 0 to 2
    straight into their stored chunks (the block covers whole chunks of each,
    so no two tasks touch a chunk), and returns only the small levels 3 to
    ``b``; those and the coarsest levels are assembled and stored at the end.
    A graph that handed every level to a separate write held each block's
    levels until all were written: 1.4 GiB for a 1 GiB volume
    (benchmarks/bench_large.py).
    """
    import dask

    from napari_gridmip.core.occupancy.pyramid import BLOCK_LEVELS, mipmap_shapes
    from napari_gridmip.core.occupancy.pyramid import occupancy_mipmap as in_memory

    lead = volume.ndim - 3
    shapes = mipmap_shapes(volume.shape[-3:])
    top = len(shapes) - 1
    b = min(top, BLOCK_LEVELS)
    step = 2**b
    spatial = tuple((step,) * (n // step) + ((n % step,) if n % step else ()) for n in volume.shape[-3:])
    volume = volume.rechunk(tuple((1,) * n for n in volume.shape[:lead]) + spatial)
    direct = min(DIRECT_LEVELS, b)
    lead_shape = tuple(volume.shape[:lead])
    stored = [
        _create_level(group, k, lead_shape + shapes[k], (1,) * lead + (max(step >> k, 1),) * 3)
        for k in range(direct + 1)
    ]

    def block_task(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        location = block_info[0]["array-location"]
        index = tuple(start for start, _ in location[:lead])
        starts = [start for start, _ in location[lead:]]
        levels = [np.asarray(level) for level in in_memory(block.reshape(block.shape[-3:]), threshold=threshold)]
        levels = [levels[min(k, len(levels) - 1)] for k in range(b + 1)]  # a small edge block reaches (1, 1, 1) early
        for k in range(direct + 1):
            region = tuple(slice(s >> k, (s >> k) + n) for s, n in zip(starts, levels[k].shape))
            stored[k][index + region] = levels[k]
        out = np.empty((1,) * block.ndim, dtype=object)
        out.flat[0] = (index, starts, levels[direct + 1 :])
        return out

    pieces = volume.map_blocks(block_task, dtype=object, chunks=tuple((1,) * len(c) for c in volume.chunks))
    (results,) = (compute or dask.compute)([pieces])
    small = [np.zeros(lead_shape + shapes[k], dtype=bool) for k in range(direct + 1, b + 1)]
    for index, starts, levels in np.asarray(results, dtype=object).flat:
        for k, level in enumerate(levels, start=direct + 1):
            region = tuple(slice(s >> k, (s >> k) + n) for s, n in zip(starts, level.shape))
            small[k - direct - 1][index + region] = level
    coarse = []
    if top > b:  # levels b + 1 and up, from level b (small), one pyramid per leading index
        coarse = [np.asarray(level) for level in in_memory(small[-1], threshold=0.5)[1:]] if small else []
    for k, level in enumerate([*small, *coarse], start=direct + 1):
        chunks = (1,) * lead + tuple(min(LEVEL_CHUNK, n) for n in level.shape[lead:])
        _create_level(group, k, tuple(level.shape), chunks)[...] = level
    return top + 1


def write_array(
    array: Any,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    compute: Callable | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Path:
    """Write an array to ``.npy``, ``.tif``/``.tiff`` or a Zarr folder (by the suffix), never partially.

    Zarr is written block by block from a dask array; ``.npy`` and TIFF need
    the whole array in memory. ``attributes`` (JSON-able) go into the Zarr
    array's attributes or, as JSON, the TIFF's ImageDescription; a ``.npy``
    file has no place for them.
    """
    import dask
    import dask.array as da

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".tif", ".tiff", ".zarr"):
        raise ValueError(f"{str(path)!r}: the output must end in .npy, .tif, .tiff or .zarr")
    with atomic_path(path, overwrite=overwrite) as temporary:
        if suffix == ".zarr":
            lazy = array if hasattr(array, "dask") else da.from_array(np.asarray(array))
            (compute or dask.compute)([lazy.to_zarr(str(temporary), compute=False)])
            if attributes:
                import zarr

                zarr.open_array(str(temporary), mode="r+").attrs.update(dict(attributes))
            return path
        data = np.asarray((compute or dask.compute)([array])[0] if hasattr(array, "dask") else array)
        if suffix == ".npy":
            with open(temporary, "wb") as f:
                np.save(f, data)
        else:
            import tifffile

            description = json.dumps(dict(attributes)) if attributes else None
            tifffile.imwrite(temporary, data, description=description, metadata=None if description else {})
    return path


def write_ome_zarr(
    image: Any,
    path: str | os.PathLike,
    *,
    pixel_size: float | Sequence[float] | None = None,
    origin: Sequence[float] | None = None,
    axes: str | None = None,
    name: str = "image",
    chunk: int = 512,
    overwrite: bool = False,
    compute: Callable[[Any], Any] | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Path:
    """Write an image (e.g. a fused mosaic) as an OME-Zarr image with its pixel size and place, one level.

    Parameters
    ----------
    image
        ``([T,] [C,] [Z,] Y, X)`` NumPy, JAX or dask array (a dask array is written chunk by chunk, never whole in
        memory), e.g. ``fuse_tiles(...).image``.
    path
        The OME-Zarr folder to create (written under a temporary name, renamed when complete).
    pixel_size
        Micrometres per pixel along the spatial axes, ``(y, x)``, ``(z, y, x)`` or one number for all: level 0's
        ``scale``, with the axes' unit ``"micrometer"``. Default None: scale 1, no unit.
    origin
        The scene coordinate of pixel 0 along the spatial axes, in pixels (``fuse_tiles(...).origin``): written as
        the ``translation`` (times ``pixel_size``), so that viewers place the mosaic where the stage put it.
    axes
        The axes' NGFF names, e.g. ``"cyx"`` or ``"czyx"``; default by the number of axes: ``yx``, ``zyx``,
        ``czyx``, ``tczyx``.
    name
        The multiscale's name.
    chunk
        The stored chunk's side along the spatial axes (one time point and channel per chunk).
    overwrite
        Replace an existing ``path``.
    compute
        How to run a dask graph (given a list of dask collections); default ``dask.compute``.
    attributes
        Extra JSON-able attributes for the image group, beside the NGFF metadata (e.g. a provenance record).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        If ``image`` has fewer than 2 or more than 5 axes, ``axes`` does not name them (NGFF order: ``t``, ``c``,
        then spatial axes ending in ``y, x``), ``pixel_size`` or ``origin`` does not fit the spatial axes, or
        ``path`` exists and ``overwrite`` is false.

    References
    ----------
    .. [1] OME-NGFF, ``multiscales``, https://ngff.openmicroscopy.org (the metadata is ome-zarr-py's).
    """
    import dask
    import zarr
    from ome_zarr.writer import write_multiscales_metadata

    from napari_gridmip.core import validate

    image = validate.as_array("image", image)
    shape = tuple(int(n) for n in validate.shape_of(image))
    default_axes = {2: "yx", 3: "zyx", 4: "czyx", 5: "tczyx"}
    axes = (axes or default_axes.get(len(shape), "")).lower()
    spatial = axes.lstrip("tc")
    if (
        len(axes) != len(shape)
        or not 2 <= len(shape) <= 5
        or spatial not in ("yx", "zyx")
        or axes[: len(axes) - len(spatial)] not in ("", "t", "c", "tc")
    ):
        raise ValueError(f"image of shape {shape} with axes {axes!r}: expected 2 to 5 axes named like 'yx', 'zyx', "
                         "'cyx', 'czyx' or 'tczyx'")  # fmt: skip
    d = len(spatial)
    size = np.ones(d) if pixel_size is None else np.broadcast_to(np.asarray(pixel_size, dtype=float), (d,))
    if not (np.isfinite(size) & (size > 0)).all():
        raise ValueError(f"pixel_size must be positive, one number or one per spatial axis; got {pixel_size!r}")
    start = np.zeros(d) if origin is None else np.asarray(origin, dtype=float)
    if start.shape != (d,) or not np.isfinite(start).all():
        raise ValueError(f"origin must give the {d} spatial axes' pixel 0; got {origin!r}")
    lead = len(axes) - d
    scale = [1.0] * lead + [float(s) for s in size]
    translation = [0.0] * lead + [float(t) for t in start * size]
    axis_meta = []
    for letter in axes:
        kind = {"t": "time", "c": "channel"}.get(letter, "space")
        entry = {"name": letter, "type": kind}
        if kind == "space" and pixel_size is not None:
            entry["unit"] = "micrometer"
        axis_meta.append(entry)
    chunks = (1,) * lead + tuple(min(int(chunk), n) for n in shape[lead:])
    with atomic_path(path, overwrite=overwrite) as temporary:
        group = zarr.open_group(str(temporary), mode="w")
        dtype = np.dtype(image.dtype)
        array = group.create_array("s0", shape=shape, chunks=chunks, dtype=dtype, fill_value=0)
        if validate.is_dask(image):
            # each task writes whole stored chunks: no two touch one
            (compute or dask.compute)([image.rechunk(chunks).store(array, lock=False, compute=False)])
        else:
            array[...] = np.asarray(image)
        transforms = [{"type": "scale", "scale": scale}, {"type": "translation", "translation": translation}]
        write_multiscales_metadata(
            group, [{"path": "s0", "coordinateTransformations": transforms}], axes=axis_meta, name=name
        )
        if attributes:
            group.attrs.update(dict(attributes))
    return Path(path)
