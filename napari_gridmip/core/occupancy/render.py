"""Full-resolution renders of a volume through its occupancy pyramid: maximum intensity and first hit.

Rays skip empty space with :func:`~napari_gridmip.traverse_occupied`'s hierarchical DDA and read the volume only
at the occupied voxels they cross: inside the traversal for a volume in memory, chunk by chunk (only the chunks
some ray's occupied voxels are in) for dask and Zarr.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from napari_gridmip.core import validate
from napari_gridmip.core.occupancy import _flat, traverse
from napari_gridmip.core.occupancy._shapes import mipmap_shapes
from napari_gridmip.core.occupancy.pyramid import (
    _compare,
    _constant_occupancy,
    _device_threshold,
    _key_dtype,
    _reject_dask,
    check_pyramid,
    float_key,
    from_float_key,
    threshold_block,
)
from napari_gridmip.core.runtime.precision import compute_dtype, precision_scope
from napari_gridmip.core.runtime.transfer import to_device

__all__ = ["orthographic_rays", "render_volume"]

MODES = ("mip", "first_hit")
RENDER_CAPACITY = 16  # voxels a ray records per pass on the dask path (more go on in further passes)


class Rays(NamedTuple):
    """Ray origins and unit directions, ``(h, w, 3)`` each, in voxel index coordinates ``(z, y, x)``."""

    origins: np.ndarray
    directions: np.ndarray


def _unit(name: str, value: Any) -> np.ndarray:
    vector = np.asarray(validate.as_array(name, value), dtype=np.float64)
    if vector.shape != (3,) or not np.all(np.isfinite(vector)):
        raise ValueError(f"{name} must be 3 finite numbers (z, y, x); got {value!r}")
    norm = np.linalg.norm(vector)
    if norm == 0:
        raise ValueError(f"{name} must not be the zero vector")
    return vector / norm


def orthographic_rays(center: Any, view: Any, up: Any, image_shape: Any, *, pixel_size: float = 1.0) -> Rays:
    """The rays of an orthographic camera, one through the centre of each pixel.

    Parameters
    ----------
    center
        The point the image is centred on, ``(z, y, x)`` in the volume's voxel
        index coordinates (voxel ``i`` covers ``[i, i + 1)``; the volume's
        centre is ``shape / 2``).
    view
        The viewing direction (where the rays go), ``(z, y, x)``; any length.
        napari's ``viewer.scene.camera.view_direction`` is one.
    up
        The image's up direction, ``(z, y, x)``: rows run against it. Only its
        part perpendicular to ``view`` counts; it must not be parallel to
        ``view``. napari's ``viewer.scene.camera.up_direction`` is one.
    image_shape
        ``(rows, columns)`` of the image in pixels.
    pixel_size
        A pixel's side in voxels.

    Returns
    -------
    Rays
        ``origins`` and ``directions``, float64 arrays of shape
        ``(rows, columns, 3)``. Pixel ``(i, j)``'s origin is ``center +
        (j - (columns - 1)/2) * pixel_size * right - (i - (rows - 1)/2) *
        pixel_size * up``, on the plane through ``center`` perpendicular to
        ``view``, with ``right = cross(up, view)`` in ``(z, y, x)`` component
        order (so napari's default view ``(1, 0, 0)``, up ``(0, -1, 0)`` gives
        columns along +x, rows along +y). Directions are the unit ``view``,
        so ``t`` is the signed distance from that plane: the rays are whole
        lines, and :func:`render_volume` traces them from ``t = -inf`` by default.

    Raises
    ------
    ValueError
        If a vector is not 3 finite numbers, is zero, or ``up`` is parallel
        to ``view``; if ``image_shape`` is not 2 sizes >= 1; if
        ``pixel_size`` is not a positive finite number.

    Examples
    --------
    >>> from napari_gridmip import orthographic_rays
    >>> rays = orthographic_rays((8, 8, 8), (1, 0, 0), (0, -1, 0), (2, 3))
    >>> rays.origins[0, 0].tolist(), rays.directions[0, 0].tolist()
    ([8.0, 7.5, 7.0], [1.0, 0.0, 0.0])
    """
    center = np.asarray(validate.as_array("center", center), dtype=np.float64)
    if center.shape != (3,) or not np.all(np.isfinite(center)):
        raise ValueError(f"center must be 3 finite numbers (z, y, x); got {center!r}")
    view = _unit("view", view)
    up = np.asarray(_unit("up", up))
    up = up - np.dot(up, view) * view
    if np.linalg.norm(up) < 1e-9:
        raise ValueError("up must not be parallel to view (it gives the image's vertical direction)")
    up /= np.linalg.norm(up)
    right = np.cross(up, view)
    rows, columns = validate.int_tuple("image_shape", image_shape, 2)
    pixel_size = validate.check_finite_scalar("pixel_size", pixel_size)
    if pixel_size <= 0:
        raise ValueError(f"pixel_size must be positive; got {pixel_size}")
    i = (np.arange(rows) - (rows - 1) / 2) * pixel_size
    j = (np.arange(columns) - (columns - 1) / 2) * pixel_size
    origins = center + j[None, :, None] * right - i[:, None, None] * up
    return Rays(origins, np.broadcast_to(view, origins.shape).copy())


# ---------------------------------------------------------------------------------------------------------------------
# in memory: the volume is read inside the traversal


def _initial_best(volume_dtype: np.dtype, batch: int) -> jax.Array:
    """The running maximum before any voxel: the lowest float key, the integer minimum, or False."""
    if validate.is_float(volume_dtype):
        key = _key_dtype(volume_dtype)
        return jnp.full(batch, jnp.iinfo(key).min, key)
    if volume_dtype == np.bool_:
        return jnp.zeros(batch, bool)
    return jnp.full(batch, jnp.iinfo(volume_dtype).min, volume_dtype)


@functools.partial(jax.jit, static_argnames=("mode", "use_threshold"))
def _render_run(flat, volume, o, d, t_stop, state, carry, threshold, limit, keep, mode, use_threshold):
    """Go on with a batch of rays, reading the volume at each occupied voxel: (state, (found, best, first)).

    ``best`` holds float keys for float volumes (exact maxima; see ``float_key``).
    """
    batch = o.shape[0]
    floats = validate.is_float(np.dtype(volume.dtype))

    def consume(carry, emitted, records, new):
        found, best, first = carry
        cell, t_in, _ = records
        if mode == "mip" or use_threshold:
            value = volume[cell[:, 0], cell[:, 1], cell[:, 2]]
        if mode == "mip":
            key = float_key(value) if floats else value
            best = jnp.where(emitted, jnp.maximum(best, key), best)
            return (found | emitted, best, first), jnp.zeros(batch, bool)
        hit = emitted & _compare(value, threshold) if use_threshold else emitted
        first = jnp.where(hit, t_in, first)
        return (found | hit, best, first), hit

    capacity = jnp.iinfo(state.count.dtype).max  # nothing is recorded: no capacity to run out of
    return traverse.march(flat, o, d, t_stop, state, limit, keep, capacity, consume, carry)


def _in_memory(volume, flat, shapes, o, d, near, far, mode, threshold, batch_size, progress, dtype):
    n = o.shape[0]
    vdtype = np.dtype(volume.dtype)
    limit = traverse._step_limit(shapes[0], len(shapes), 2 * sum(shapes[0]))
    device = to_device(volume)
    use_threshold = threshold is not None
    scalar = jnp.asarray(_device_threshold(vdtype, threshold) if use_threshold else 0)
    found = np.zeros(n, bool)
    best = np.array(_initial_best(vdtype, n))  # a writable copy
    first = np.full(n, np.nan, dtype)
    for start, stop, size in traverse._batches(n, batch_size):
        part = slice(start, stop)
        ray_o, ray_d = jnp.asarray(traverse._pad(o[part], size, -1)), jnp.asarray(traverse._pad(d[part], size, 0))
        near_b, far_b = jnp.asarray(traverse._pad(near[part], size, 0)), jnp.asarray(traverse._pad(far[part], size, 0))
        state, t_stop = traverse._start(flat, ray_o, ray_d, near_b, far_b)  # padding rays miss the volume
        carry = (jnp.zeros(size, bool), _initial_best(vdtype, size), jnp.full(size, jnp.nan, dtype))
        rays = np.arange(start, stop)
        while True:
            keep = jnp.asarray(traverse.keep_active(size), state.k.dtype)
            state, carry = _render_run(flat, device, ray_o, ray_d, t_stop, state, carry, scalar, limit, keep,
                                       mode=mode, use_threshold=use_threshold)  # fmt: skip
            active, (f, b, t) = jax.device_get((state.active, carry))
            left = active[: len(rays)]
            done, ended = ~left, rays[~left]
            found[ended], best[ended], first[ended] = (a[: len(rays)][done] for a in (f, b, t))
            if not left.any():
                break
            # the rays still going continue in a smaller batch (see traverse.march)
            index = np.nonzero(left)[0]
            rays, size = rays[index], traverse.padded_size(len(index))
            state = traverse.RayState(*traverse.compact(state, index, size, [0] * len(state)))
            carry = tuple(traverse.compact(carry, index, size, (False, 0, np.nan)))
            ray_o, ray_d, t_stop = traverse.compact((ray_o, ray_d, t_stop), index, size, (-1, 0, 0))
        if progress is not None:
            progress(stop, n)
    if mode == "mip" and validate.is_float(vdtype):
        best = np.array(from_float_key(jnp.asarray(best), vdtype))
    return found, best, first


# ---------------------------------------------------------------------------------------------------------------------
# dask / Zarr: only the chunks that hold an occupied voxel some ray crosses are read


class _ChunkCache:
    """Chunks of a dask volume, loaded on demand (several at once, in parallel), kept up to ``budget`` bytes."""

    def __init__(self, volume: Any, budget: int) -> None:
        self.volume = volume
        self.bounds = [np.concatenate([[0], np.cumsum(c)]).astype(np.int64) for c in volume.chunks]
        self.budget = budget
        self.blocks: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()
        self.size = 0
        self.reads = 0

    def chunk_of(self, voxels: np.ndarray) -> np.ndarray:
        """(n, 3) chunk indices of (n, 3) voxels."""
        return np.stack([np.searchsorted(b, voxels[:, a], side="right") - 1 for a, b in enumerate(self.bounds)], 1)

    def values(self, voxels: np.ndarray) -> np.ndarray:
        """The volume's values at (n, 3) voxels, loading the chunks not yet held (all at once, in parallel)."""
        import dask  # a chunked volume's render only: dask takes 0.1 s to import, dask.array 0.5 s

        if len(voxels) == 0:
            return np.empty(0, self.volume.dtype)
        grid = tuple(len(b) - 1 for b in self.bounds)
        ids = np.ravel_multi_index(tuple(self.chunk_of(voxels).T), grid)
        order = np.argsort(ids, kind="stable")
        ids_sorted = ids[order]
        starts = np.flatnonzero(np.r_[True, ids_sorted[1:] != ids_sorted[:-1]])
        chunks = [tuple(int(i) for i in np.unravel_index(ids_sorted[s], grid)) for s in starts]
        missing = [c for c in chunks if c not in self.blocks]
        if missing:
            loaded = dask.compute(*[self.volume.blocks[c] for c in missing])
            self.reads += len(missing)
            for c, block in zip(missing, loaded):
                self._keep(c, np.asarray(block))
        out = np.empty(len(voxels), self.volume.dtype)
        ends = np.r_[starts[1:], len(ids)]
        for c, s, e in zip(chunks, starts, ends):
            block = self.blocks[c]
            self.blocks.move_to_end(c)
            mine = order[s:e]
            local = voxels[mine] - np.array([b[i] for b, i in zip(self.bounds, c)])
            out[mine] = block[local[:, 0], local[:, 1], local[:, 2]]
        return out

    def _keep(self, key: tuple[int, ...], block: np.ndarray) -> None:
        self.blocks[key] = block
        self.size += block.nbytes
        while self.size > self.budget and len(self.blocks) > 1:
            _, old = self.blocks.popitem(last=False)
            self.size -= old.nbytes


def _chunked(volume, flat, shapes, o, d, near, far, mode, threshold, batch_size, progress, dtype, cache_bytes):
    import dask.array as da  # as in values above

    if not validate.is_dask(volume):
        chunks = getattr(volume, "chunks", None)
        volume = da.from_array(volume, chunks=chunks if chunks is not None else "auto")
    cache = _ChunkCache(volume, cache_bytes)
    n = o.shape[0]
    found = np.zeros(n, bool)
    floats = validate.is_float(np.dtype(volume.dtype))
    if floats:  # the maximum in float64, which holds every float dtype exactly; NaN ignored by fmax
        best = np.full(n, np.nan)
    else:
        best = np.full(n, False if volume.dtype == np.bool_ else np.iinfo(volume.dtype).min, volume.dtype)
    first = np.full(n, np.nan, dtype)
    capacity = RENDER_CAPACITY
    for start, stop, size in traverse._batches(n, batch_size):
        part = slice(start, stop)
        pieces, _ = traverse.record_batch(flat, shapes, o[part], d[part], near[part], far[part], size, capacity)
        packed = traverse._pack([(r + start, *rest) for r, *rest in pieces], np.zeros(0), dtype, np.int64)
        rays, voxels, t_in = packed.ray_indices, packed.voxels.astype(np.int64), packed.t_starts
        if mode == "first_hit" and threshold is None:
            hit = np.ones(len(rays), bool)  # the first occupied voxel: nothing to read
        else:
            sample = cache.values(voxels)
            if mode == "mip":
                if floats:
                    np.fmax.at(best, rays, sample.astype(np.float64))
                else:
                    np.maximum.at(best, rays, sample)
                found[rays] = True
                hit = None
            else:
                hit = threshold_block(sample.reshape(-1, 1, 1), threshold).reshape(-1)
        if hit is not None:
            picked, index = np.unique(rays[hit], return_index=True)  # entries are sorted by ray, then t
            first[picked] = t_in[hit][index]
            found[picked] = True
        if progress is not None:
            progress(stop, n)
    return found, best.astype(volume.dtype), first


# ---------------------------------------------------------------------------------------------------------------------


def render_volume(
    volume: Any,
    levels: Any,
    origins: Any,
    directions: Any,
    *,
    mode: str = "mip",
    threshold: float | None = None,
    t_near: Any = -np.inf,
    t_far: Any = np.inf,
    fill: Any = None,
    dtype: Any = None,
    batch_size: int = traverse.MAX_BATCH,
    progress: Callable[[int, int], Any] | None = None,
    cache_bytes: int = 1 << 30,
) -> np.ndarray:
    """Render a volume along rays, reading it only at the occupied voxels they cross.

    Parameters
    ----------
    volume
        ``(D, H, W)`` array: NumPy or JAX (read inside the traversal), or dask
        or Zarr (read chunk by chunk: only the chunks that hold an occupied
        voxel some ray crosses). Any real dtype.
    levels
        The occupancy pyramid of ``volume`` (every level, level 0 of the
        volume's shape), NumPy or JAX, as from
        :func:`~napari_gridmip.occupancy_mipmap` or
        :func:`~napari_gridmip.threshold_mipmap`: where the rays look.
        Or the pyramid from level 1 on (``levels[1:]``; NumPy, JAX or dask,
        computed here: they are an eighth of the volume and less), for a
        dask or Zarr volume whose level 0 would read every chunk: every
        voxel of an occupied level-1 cell is then looked at, and
        ``threshold`` (required then, in either mode) decides from the
        values read which of them count. The picture is the same as with
        the whole pyramid at that threshold.
    origins, directions
        Rays, ``(..., 3)`` each, in voxel index coordinates ``(z, y, x)``, as
        from :func:`orthographic_rays` or :func:`~napari_gridmip.traverse_occupied`.
    mode
        ``"mip"``: maximum intensity projection, the largest value of the
        occupied voxels each ray crosses (each voxel's own value: nearest,
        not interpolated). Where the levels are ``volume > t``, this equals
        the maximum over every voxel on the ray wherever the ray crosses an
        occupied voxel, since every other voxel is ``<= t``.
        ``"first_hit"``: the ``t`` at which each ray enters its first voxel
        above ``threshold`` (a depth image).
    threshold
        ``"first_hit"``: a voxel is hit when its value is ``> threshold``
        (compared exactly, as :func:`~napari_gridmip.occupancy_mipmap` does);
        it must be at least the threshold the levels were made with, since
        only occupied voxels are looked at. ``None`` (default): the first
        occupied voxel, with no read of the volume at all. ``"mip"``: only
        with levels from level 1, where a ray's maximum counts when it is
        ``> threshold`` (else ``fill``).
    t_near, t_far
        Where rays start and stop (numbers or one per ray); default the whole
        line, as orthographic rays need.
    fill
        The value of rays that cross no occupied voxel in ``"mip"`` mode.
        Default: NaN for float volumes, the dtype's minimum for integers,
        False for bool.
    dtype
        float32 (default) or float64: the precision of the traversal and of
        the depths.
    batch_size
        Rays per batch (one compiled program run each, padded to a power of two, at least 1024).
    progress
        Called as ``progress(done, total)`` (rays) after each batch; it may
        raise to stop the render (the exception propagates; nothing is returned).
    cache_bytes
        dask/Zarr volumes: at most this many bytes of chunks are kept between
        batches (1 GiB).

    Returns
    -------
    numpy.ndarray
        Shape ``origins.shape[:-1]``. ``"mip"``: the volume's dtype, ``fill``
        where a ray crosses no occupied voxel. ``"first_hit"``: ``dtype``,
        NaN where a ray hits nothing.

    Raises
    ------
    ValueError
        If ``volume`` is not a 3D real array, ``levels`` not its bool
        pyramid (level 0 of neither the volume's shape nor level 1's),
        ``mode`` unknown, ``threshold`` given for ``"mip"`` with the whole
        pyramid, missing with levels from level 1, or not finite; for bad
        rays as :func:`~napari_gridmip.traverse_occupied` does.
    TypeError
        If ``progress`` is not callable, or a level of the whole pyramid is
        a dask array (compute them first).

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import occupancy_mipmap, orthographic_rays, render_volume
    >>> volume = np.zeros((16, 16, 16), np.float32); volume[4, 8, 8] = 2.0; volume[12, 8, 8] = 5.0
    >>> rays = orthographic_rays((8, 8, 8), (1, 0, 0), (0, -1, 0), (16, 16))
    >>> levels = occupancy_mipmap(volume)
    >>> float(render_volume(volume, levels, *rays)[8, 8])
    5.0
    >>> float(render_volume(volume, levels, *rays, mode="first_hit")[8, 8])  # z = 4: 4 voxels before the plane
    -4.0
    >>> import dask.array as da  # level 0 of a lazy volume left out: no chunk read to make it
    >>> lazy = da.from_array(volume, chunks=8)
    >>> float(render_volume(lazy, occupancy_mipmap(lazy)[1:], *rays, threshold=0.0)[8, 8])
    5.0
    """
    volume = validate.as_array("volume", volume)
    vdtype = validate.check_real("volume", volume)
    shape = validate.check_ndim("volume", volume, ndim=3)
    levels = check_pyramid("levels", levels)
    full_shapes = mipmap_shapes(tuple(shape))
    from_level_1 = len(full_shapes) > 1 and tuple(levels[0].shape) == full_shapes[1]
    if not from_level_1:
        if tuple(levels[0].shape) != tuple(shape):
            raise ValueError(
                f"levels must be the pyramid of volume (or its levels from level 1): level 0 has shape "
                f"{levels[0].shape}, volume {shape}"
            )
        _reject_dask("levels", levels)  # check_pyramid's allow_dask=False, without validating the levels again
    mode = validate.check_choice("mode", mode, MODES)
    mip_threshold = None  # a MIP from level 1: a ray's maximum counts above it
    if threshold is None and from_level_1:
        raise ValueError(
            "threshold is required with levels from level 1 (levels[1:]): the values read decide which voxels count"
        )
    if threshold is not None:
        if mode == "mip" and not from_level_1:
            raise ValueError("threshold is for mode='first_hit'; a MIP takes every occupied voxel (set it in levels)")
        threshold = validate.check_finite_scalar("threshold", threshold)
        constant = _constant_occupancy(vdtype, threshold)
        if constant is False:  # no value passes: no ray meets anything
            if mode == "first_hit":
                return np.full(np.shape(origins)[:-1], np.nan, compute_dtype(dtype))
            return np.full(np.shape(origins)[:-1], _fill(vdtype) if fill is None else fill, vdtype)
        if mode == "mip":
            mip_threshold, threshold = (None if constant else threshold), None
        elif constant is True:  # every value passes (a threshold below the dtype's range): the first occupied voxel
            threshold = None
    if from_level_1:
        levels = _with_level_0(levels, tuple(shape))
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable as progress(done, total); got {type(progress).__name__}")
    dtype = compute_dtype(dtype)
    (batch_size,) = validate.int_tuple("batch_size", (batch_size,))
    o, d, near, far, batch = traverse.ray_arguments(origins, directions, t_near, t_far, dtype)
    shapes = [tuple(int(n) for n in level.shape) for level in levels]
    kind = _flat.index_dtype(shapes)
    wide = np.float64 if dtype == np.float64 or kind == np.int64 or vdtype.itemsize == 8 else np.float32
    with precision_scope(wide):
        flat = _flat.flatten(levels)
        common = (flat, shapes, o, d, near, far, mode, threshold, batch_size, progress, dtype)
        if isinstance(volume, (np.ndarray, jax.Array)):
            found, values, first = _in_memory(volume, *common)
        else:
            found, values, first = _chunked(volume, *common, cache_bytes)
    if mode == "first_hit":
        return first.reshape(batch)
    if mip_threshold is not None:  # maxima at or below it came from voxels the coarse level 0 let in
        found &= threshold_block(values, mip_threshold)
    values[~found] = _fill(vdtype) if fill is None else fill
    return values.reshape(batch)


def _fill(dtype: np.dtype) -> Any:
    """A MIP's default value of a ray that meets nothing: NaN, the integer minimum, or False."""
    return np.nan if validate.is_float(dtype) else (False if dtype == np.bool_ else np.iinfo(dtype).min)


def _with_level_0(levels: list[Any], shape: tuple[int, ...]) -> list[np.ndarray]:
    """The pyramid from level 1 (computed, if dask) with a level 0 of every voxel of an occupied level-1 cell: a
    superset of the occupied voxels with the same level 1, made without reading the volume."""
    if any(validate.is_dask(level) for level in levels):
        import dask  # only dask input needs it (0.1 s to import)

        levels = dask.compute(*levels, scheduler="threads")
    levels = [np.asarray(level) for level in levels]
    up = levels[0].repeat(2, axis=0).repeat(2, axis=1).repeat(2, axis=2)
    return [np.ascontiguousarray(up[: shape[0], : shape[1], : shape[2]]), *levels]
