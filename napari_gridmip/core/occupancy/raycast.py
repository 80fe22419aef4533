"""napari's volume rendering modes, at full resolution, reading only the chunks whose occupied cells rays enter.

Each ray is sampled at ``t = t0 + (k + 1/2) * step`` from where it enters the volume's box (``k = 0 .. n - 1``,
``n`` the samples inside the box), each sample reading the voxel it falls in (nearest, as napari's
``interpolation3d="nearest"``). Samples come in segments of ``S`` consecutive samples; a segment whose voxels all
lie in empty cells of the occupancy grid is skipped: its samples are taken to be ``background`` (exact when every
voxel of an empty cell holds ``background``, as the zeros around a sparse volume's data do). The other segments are
checked sample by sample, and their chunks (the volume's own chunks for dask and Zarr) are read into a bounded
cache, only where a sample falls in an occupied cell; a view that needs more chunks than the cache holds is
rendered in bands of rows. The sampling, skipping, gathering and reductions run in JAX, in compiled programs of
static shapes (batches of rays and of segments padded to powers of two).

The modes follow vispy's shaders (``vispy/visuals/volume.py``): ``mip`` and ``minip`` take the largest and the
smallest sample; ``attenuated_mip`` the largest ``v_k * exp(-attenuation * (S_k - 1))`` with ``S_k = step *
sum_{j <= k} clip((v_j - lo) / (hi - lo), 0, 1)``; ``iso`` the first sample above the threshold, with its depth.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from napari_gridmip.core import _validate

__all__ = ["colorize_view", "render_view"]

MODES = ("mip", "minip", "attenuated_mip", "iso")
RAY_BATCH = 1 << 14  # rays per compiled call: (rays, segments) arrays stay tens of MB
SEGMENT_BATCH = 1 << 15  # occupied segments per gather call
IN_MEMORY_CHUNK = 64  # NumPy/JAX volumes are read in chunks of this side


class ViewRender(NamedTuple):
    """What :func:`render_view` returns.

    ``values``: float32 ``(rows, columns)``, the mode's value in the volume's units (NaN: the ray misses the box,
    or for ``iso`` hits nothing). ``depth``: float32, ``t`` of the sample that gave the value (the iso hit, the
    maximum, the minimum; NaN where ``values`` is). ``chunks_read``: chunks loaded from the volume by this call
    (the rest came from the cache); ``chunks_used``: distinct chunks the view needed; ``chunks_total``: chunks in
    the volume's chunk grid; ``samples``: samples read (in occupied segments); ``samples_dense``: samples a dense
    march with the same step takes.
    """

    values: np.ndarray
    depth: np.ndarray
    chunks_read: int
    chunks_used: int
    chunks_total: int
    samples: int
    samples_dense: int


class RenderCancelled(Exception):
    """Raised by :func:`render_view` when its ``cancel`` callable returns True."""


# ---------------------------------------------------------------------------------------------------------------------
# the chunk cache


def _chunk_shape(volume: Any) -> tuple[int, int, int]:
    chunks = getattr(volume, "chunks", None)
    if chunks is None or isinstance(volume, (np.ndarray, jax.Array)):
        return (IN_MEMORY_CHUNK,) * 3
    if all(isinstance(c, tuple) for c in chunks):  # dask: regular chunks but for the last
        sizes = tuple(int(c[0]) for c in chunks)
        if any(len(set(c[:-1])) > 1 or c[-1] > c[0] for c in chunks):
            raise ValueError(f"volume must have regular chunks (all equal but the last); got {chunks}")
        return sizes
    return tuple(int(c) for c in chunks)


class ChunkCache:
    """Chunks of one volume, read on demand (in parallel threads), at most ``capacity`` bytes kept (LRU).

    One cache may serve many renders of the same volume (a live view keeps one), and is thread-safe.
    """

    def __init__(self, volume: Any, *, capacity: int = 512 << 20) -> None:
        self.volume = volume
        self.shape = tuple(int(n) for n in volume.shape)
        self.chunk = _chunk_shape(volume)
        self.grid = tuple(-(-n // c) for n, c in zip(self.shape, self.chunk))
        self.dtype = np.dtype(volume.dtype)
        self.chunk_bytes = int(np.prod(self.chunk)) * self.dtype.itemsize
        if capacity < self.chunk_bytes:
            raise ValueError(f"capacity must hold one chunk ({self.chunk_bytes} bytes); got {capacity}")
        self.capacity = int(capacity)
        self.blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self.reads = 0
        self.peak_bytes = 0
        self._lock = threading.Lock()

    @property
    def slots(self) -> int:
        """How many chunks fit at once."""
        return self.capacity // self.chunk_bytes

    def _read(self, flat: int) -> np.ndarray:
        index = np.unravel_index(flat, self.grid)
        region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, self.chunk, self.shape))
        block = self.volume[region]
        block = np.asarray(block.compute() if _validate.is_dask(block) else block)
        if block.shape != self.chunk:  # an edge chunk: padded to the full chunk (never sampled beyond the volume)
            full = np.zeros(self.chunk, self.dtype)
            full[tuple(slice(0, n) for n in block.shape)] = block
            block = full
        return block

    def get(self, ids: np.ndarray) -> list[np.ndarray]:
        """The chunks with flat ids ``ids`` (at most :attr:`slots` of them), reading the missing ones."""
        ids = [int(i) for i in ids]
        with self._lock:
            missing = [i for i in ids if i not in self.blocks]
        if missing:
            with ThreadPoolExecutor(max_workers=4) as pool:  # Zarr decompression releases the GIL
                loaded = list(pool.map(self._read, missing))
            with self._lock:
                self.reads += len(missing)
                for i, block in zip(missing, loaded):
                    self.blocks[i] = block
        with self._lock:
            out = []
            for i in ids:
                self.blocks.move_to_end(i)
                out.append(self.blocks[i])
            keep = set(ids)
            self.peak_bytes = max(self.peak_bytes, len(self.blocks) * self.chunk_bytes)
            while len(self.blocks) * self.chunk_bytes > self.capacity:
                oldest = next(iter(self.blocks))
                if oldest in keep:
                    break
                self.blocks.popitem(last=False)
        return out


# ---------------------------------------------------------------------------------------------------------------------
# the compiled pieces


def _voxels(o, d, t0, k, step, shape):
    """The voxel (int32 (..., 3), clipped into the volume) of sample ``k`` of rays ``(o, d, t0)``."""
    t = t0 + (k.astype(jnp.float32) + 0.5) * step
    p = o + t[..., None] * d
    return jnp.clip(jnp.floor(p).astype(jnp.int32), 0, shape - 1), t


@functools.partial(jax.jit, static_argnames=("segment", "count", "cell"))
def _scan(o, d, t0, n, cells, step, shape, segment, count, cell):
    """(rays, count) occupied flags of each ray's segments: any cell between the first and last sample occupied."""
    first = jnp.arange(count, dtype=jnp.int32) * segment
    last = jnp.minimum(first[None, :] + segment - 1, n[:, None] - 1)
    valid = first[None, :] < n[:, None]
    ob, db, tb = o[:, None, :], d[:, None, :], t0[:, None]
    vf, _ = _voxels(ob, db, tb, jnp.broadcast_to(first[None, :], last.shape), step, shape)
    vl, _ = _voxels(ob, db, tb, jnp.maximum(last, 0), step, shape)
    lo, hi = jnp.minimum(vf, vl) // cell, jnp.maximum(vf, vl) // cell  # a segment spans at most 2 cells per axis
    occupied = jnp.zeros(last.shape, bool)
    for corner in np.ndindex(2, 2, 2):
        c = jnp.minimum(lo + jnp.asarray(corner, jnp.int32), hi)
        occupied = occupied | cells[c[..., 0], c[..., 1], c[..., 2]]
    return occupied & valid


@functools.partial(jax.jit, static_argnames=("segment", "cell"))
def _mark(o, d, t0, n, rays, segs, cells, step, shape, chunk, grid, segment, cell):
    """Flat chunk id of each sample of the given segments that falls in an occupied cell, else -1."""
    k = segs[:, None] * segment + jnp.arange(segment, dtype=jnp.int32)[None, :]
    v, _ = _voxels(o[rays][:, None, :], d[rays][:, None, :], t0[rays][:, None], k, step, shape)
    c = v // cell
    hit = cells[c[..., 0], c[..., 1], c[..., 2]] & (k < n[rays][:, None])
    q = v // chunk
    flat = (q[..., 0] * grid[1] + q[..., 1]) * grid[2] + q[..., 2]
    return jnp.where(hit, flat, -1)


@functools.partial(jax.jit, static_argnames=("segment",))
def _gather(o, d, t0, n, rays, segs, atlas, slots, step, shape, chunk, background, segment):
    """Values (float32 (P, segment)), validity and t of the samples of the given segments."""
    k = segs[:, None] * segment + jnp.arange(segment, dtype=jnp.int32)[None, :]
    v, t = _voxels(o[rays][:, None, :], d[rays][:, None, :], t0[rays][:, None], k, step, shape)
    q = v // chunk
    local = v - q * chunk
    slot = slots[q[..., 0], q[..., 1], q[..., 2]]
    value = atlas[jnp.maximum(slot, 0), local[..., 0], local[..., 1], local[..., 2]].astype(jnp.float32)
    value = jnp.where(slot >= 0, value, background)
    return value, k < n[rays][:, None], t


def _pick(values, t, better, rays, size):
    """Per ray, the best value (by ``better``: max or min) and the t of its first occurrence."""
    segment_reduce = jax.ops.segment_max if better is jnp.maximum else jax.ops.segment_min
    arg = jnp.argmax(values, axis=1) if better is jnp.maximum else jnp.argmin(values, axis=1)
    best = jnp.take_along_axis(values, arg[:, None], 1)[:, 0]
    best_t = jnp.take_along_axis(t, arg[:, None], 1)[:, 0]
    ray_best = segment_reduce(best, rays, num_segments=size)
    # the earliest t among the segments holding the ray's best value
    t_of = jax.ops.segment_min(jnp.where(best == ray_best[rays], best_t, jnp.inf), rays, num_segments=size)
    return ray_best, t_of


@functools.partial(jax.jit, static_argnames=("segment", "mode", "size"))
def _reduce(o, d, t0, n, rays, segs, atlas, slots, step, shape, chunk, background, params, segment, mode, size):
    """One batch of occupied segments reduced per ray: (value, t) of each of ``size`` rays (-inf/+inf: none)."""
    value, valid, t = _gather(o, d, t0, n, rays, segs, atlas, slots, step, shape, chunk, background, segment)
    if mode == "mip":
        return _pick(jnp.where(valid, value, -jnp.inf), t, jnp.maximum, rays, size)
    if mode == "minip":
        return _pick(jnp.where(valid, value, jnp.inf), t, jnp.minimum, rays, size)
    # iso: the first sample above params[0]
    hit = valid & (value > params[0])
    first = jnp.min(jnp.where(hit, t, jnp.inf), axis=1)
    at = jnp.argmax(hit, axis=1)
    hit_value = jnp.where(jnp.isfinite(first), jnp.take_along_axis(value, at[:, None], 1)[:, 0], -jnp.inf)
    ray_t = jax.ops.segment_min(first, rays, num_segments=size)
    ray_value = jax.ops.segment_max(jnp.where(first == ray_t[rays], hit_value, -jnp.inf), rays, num_segments=size)
    return ray_value, ray_t


@functools.partial(jax.jit, static_argnames=("segment",))
def _totals(o, d, t0, n, rays, segs, atlas, slots, step, shape, chunk, background, lo, hi, segment):
    """attenuated_mip: each segment's sum of ``step * clip((v - lo) / (hi - lo), 0, 1)``."""
    value, valid, _ = _gather(o, d, t0, n, rays, segs, atlas, slots, step, shape, chunk, background, segment)
    return jnp.sum(jnp.where(valid, step * jnp.clip((value - lo) / (hi - lo), 0, 1), 0), axis=1)


def _padded(n: int, minimum: int = 1024) -> int:
    return max(minimum, 1 << max(0, int(n - 1).bit_length()))


def _pad(a: np.ndarray, size: int, value: Any = 0) -> np.ndarray:
    out = np.full((size, *a.shape[1:]), value, a.dtype)
    out[: len(a)] = a
    return out


# ---------------------------------------------------------------------------------------------------------------------


def _box_entry(o: np.ndarray, d: np.ndarray, shape: np.ndarray, t_near: float) -> tuple[np.ndarray, np.ndarray]:
    """Where each ray enters the box [0, shape) (clamped to ``t_near``), and its samples' count is found from."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = (0 - o) / d
        b = (shape - o) / d
        lo = np.where(d != 0, np.minimum(a, b), np.where((o >= 0) & (o < shape), -np.inf, np.inf))
        hi = np.where(d != 0, np.maximum(a, b), np.where((o >= 0) & (o < shape), np.inf, -np.inf))
    enter = np.maximum(lo.max(axis=-1), t_near)
    leave = hi.min(axis=-1)
    return enter, leave


def sample_plan(origins: np.ndarray, directions: np.ndarray, shape: tuple[int, ...], step: float, t_near: float):
    """``(t0, n)``: the first sample's base and the number of samples of each ray (float64, int64)."""
    enter, leave = _box_entry(origins, directions, np.asarray(shape, np.float64), t_near)
    n = np.where(leave > enter, np.ceil((leave - enter) / step - 0.5), 0)
    n = np.maximum(n, 0).astype(np.int64)
    return np.where(n > 0, enter, 0.0), n


def render_view(
    volume: Any,
    cells: Any,
    origins: Any,
    directions: Any,
    *,
    mode: str = "mip",
    step: float = 0.5,
    t_near: float = -np.inf,
    iso_threshold: float | None = None,
    contrast_limits: Any = None,
    attenuation: float = 0.05,
    background: float = 0.0,
    cache: ChunkCache | None = None,
    cache_bytes: int = 512 << 20,
    cancel: Callable[[], bool] | None = None,
) -> ViewRender:
    """Render a volume along rays in one of napari's modes, reading only chunks whose occupied cells rays enter.

    Parameters
    ----------
    volume
        ``(D, H, W)`` real array: NumPy, JAX, dask or Zarr (anything with ``shape``, ``dtype`` and slicing; its
        ``chunks`` are the unit of reading, 64^3 for NumPy and JAX). Never read whole, never copied densely.
    cells
        Bool occupancy grid of ``volume`` with cells of ``2**k`` voxels a side: level ``k`` of
        :func:`~napari_gridmip.occupancy_mipmap` (shape ``ceil(shape / 2**k)``); where a cell is False, every
        voxel in it must hold ``background`` for the render to be exact. ``k >= 2``.
    origins, directions
        Rays ``(..., 3)`` in voxel index coordinates ``(z, y, x)`` (voxel ``i`` covers ``[i, i + 1)``), as
        from :func:`~napari_gridmip.camera_rays`; directions are normalised here, so ``t`` counts voxels.
    mode
        ``"mip"``, ``"minip"``, ``"attenuated_mip"`` or ``"iso"``: napari's names (see the module notes).
    step
        Sample spacing along each ray, in voxels (napari's ``relative_step_size``); at most ``(2**k - 1) / 3``.
    t_near
        Where rays start: ``-inf`` (default; orthographic rays are whole lines) or 0 (from a perspective eye).
    iso_threshold
        ``"iso"``: a sample is hit when its value is above this. Required for ``"iso"`` only.
    contrast_limits
        ``"attenuated_mip"``: ``(lo, hi)`` that scale the accumulation, as napari's shader does. Required for it.
    attenuation
        ``"attenuated_mip"``: napari's ``attenuation``.
    background
        The value of every voxel in an empty cell (0 for the usual sparse volume).
    cache
        A :class:`ChunkCache` of this volume kept between renders (a live view passes its own); default a new
        one of ``cache_bytes``.
    cache_bytes
        The size of the new cache (512 MiB): at most this many bytes of chunks are held; a view needing more is
        rendered in bands of rows.
    cancel
        Called between batches; when it returns True the render stops with :class:`RenderCancelled`.

    Returns
    -------
    ViewRender
        ``values`` and ``depth`` (float32, ``origins.shape[:-1]``) and what was read (see :class:`ViewRender`).

    Raises
    ------
    ValueError
        If ``volume`` is not 3D real, ``cells`` not a bool grid of a power-of-two cell of it, ``mode`` unknown,
        ``step`` not positive or too long for the cells, rays of bad shapes, ``iso_threshold`` missing for
        ``"iso"``, ``contrast_limits`` missing or empty for ``"attenuated_mip"``.
    TypeError
        If ``cancel`` is not callable.

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import occupancy_mipmap, render_view
    >>> volume = np.zeros((32, 32, 32), np.uint16); volume[4, 8, 8] = 7; volume[20, 8, 8] = 9
    >>> cells = np.asarray(occupancy_mipmap(volume)[3])
    >>> o, d = np.array([[0.0, 8.5, 8.5]]), np.array([[1.0, 0, 0]])
    >>> float(render_view(volume, cells, o, d).values[0]), float(render_view(volume, cells, o, d, mode="minip").values[0])
    (9.0, 0.0)
    """
    volume = _validate.as_array("volume", volume)
    _validate.check_real("volume", volume)
    shape = _validate.check_ndim("volume", volume, ndim=3)
    cells = np.asarray(cells)
    if cells.dtype != np.bool_ or cells.ndim != 3:
        raise ValueError(f"cells must be a 3D bool occupancy grid; got {cells.dtype} of shape {cells.shape}")
    cell = next((2**k for k in range(2, 31) if tuple(-(-n // 2**k) for n in shape) == cells.shape), None)
    if cell is None:
        raise ValueError(f"cells must have shape ceil({shape} / 2**k) for some k >= 2; got {cells.shape}")
    mode = _validate.check_choice("mode", mode, MODES)
    step = _validate.check_finite_scalar("step", step)
    if not 0 < step <= (cell - 1) / 3:
        raise ValueError(f"step must be in (0, {(cell - 1) / 3:g}] voxels for cells of {cell}; got {step}")
    if cancel is not None and not callable(cancel):
        raise TypeError(f"cancel must be callable; got {type(cancel).__name__}")
    o = np.asarray(origins, np.float64)
    d = np.asarray(directions, np.float64)
    if o.shape != d.shape or o.shape[-1:] != (3,):
        raise ValueError(f"origins and directions must both be (..., 3); got {o.shape} and {d.shape}")
    out_shape = o.shape[:-1]
    o, d = o.reshape(-1, 3), d.reshape(-1, 3)
    d = d / np.linalg.norm(d, axis=-1, keepdims=True)
    params = np.zeros(3, np.float32)
    if mode == "iso":
        if iso_threshold is None:
            raise ValueError("mode='iso' needs iso_threshold")
        params[0] = _validate.check_finite_scalar("iso_threshold", iso_threshold)
    if mode == "attenuated_mip":
        if contrast_limits is None:
            raise ValueError("mode='attenuated_mip' needs contrast_limits (lo, hi)")
        lo, hi = (float(v) for v in contrast_limits)
        if not hi > lo:
            raise ValueError(f"contrast_limits must have hi > lo; got {contrast_limits}")
        params[:] = lo, hi, _validate.check_finite_scalar("attenuation", attenuation)
    background = _validate.check_finite_scalar("background", background)
    if cache is None:
        cache = ChunkCache(volume, capacity=cache_bytes)
    elif cache.shape != tuple(shape):
        raise ValueError(f"cache is for a volume of shape {cache.shape}, not {shape}")
    reads_before = cache.reads

    # the largest segment whose samples span less than a cell along every axis (at most 2 cells per axis)
    segment = 1 << int(np.floor(np.log2((cell - 1) / step + 1)))
    segment = min(segment, 64)
    t0, n = sample_plan(o, d, shape, step, t_near)
    count = int(n.max(initial=0))
    values = np.full(len(o), np.nan, np.float32)
    depth = np.full(len(o), np.nan, np.float32)
    used: set[int] = set()
    samples = 0
    context = _Context(cells, shape, cache, step, background, segment, cell, mode, params)
    hit = np.flatnonzero(n > 0)
    for start in range(0, len(hit), RAY_BATCH):
        if cancel is not None and cancel():
            raise RenderCancelled
        rays = hit[start : start + RAY_BATCH]
        v, t, u, s = context.batch(o[rays], d[rays], t0[rays], n[rays], cancel)
        values[rays], depth[rays] = v, t
        used |= u
        samples += s
    return ViewRender(
        values.reshape(out_shape),
        depth.reshape(out_shape),
        cache.reads - reads_before,
        len(used),
        int(np.prod(cache.grid)),
        samples,
        int(n.sum()),
    )


class _Context:
    """The device arrays and constants of one render, and one batch of rays at a time."""

    def __init__(self, cells, shape, cache, step, background, segment, cell, mode, params):
        self.cells = jnp.asarray(cells)
        self.shape = jnp.asarray(shape, jnp.int32)
        self.chunk = jnp.asarray(cache.chunk, jnp.int32)
        self.grid = jnp.asarray(cache.grid, jnp.int32)
        self.cache, self.step, self.background = cache, np.float32(step), np.float32(background)
        self.segment, self.cell, self.mode, self.params = segment, cell, mode, params

    def batch(self, o, d, t0, n, cancel):
        m = len(o)
        size = _padded(m)
        count = int(-(-int(n.max()) // self.segment))
        count = _padded(count, 8)
        args = (
            jnp.asarray(_pad(o.astype(np.float32), size, -1)),
            jnp.asarray(_pad(d.astype(np.float32), size, 0)),
            jnp.asarray(_pad(t0.astype(np.float32), size, 0)),
            jnp.asarray(_pad(n.astype(np.int32), size, 0)),
        )
        occupied = np.asarray(_scan(*args, self.cells, self.step, self.shape, self.segment, count, self.cell))
        valid = np.arange(count)[None, :] * self.segment < n[:, None]
        valid = _pad(valid, size, False)
        skipped = valid & ~occupied  # segments whose samples are all background
        rays, segs = np.nonzero(occupied)
        best = np.full(size, np.nan, np.float32)
        best_t = np.full(size, np.nan, np.float32)
        # the background's own contribution where segments were skipped (exact under the module's assumption)
        any_skipped = skipped.any(axis=1)
        first_skipped = np.where(any_skipped, np.argmax(skipped, axis=1), 0)
        t0_pad = _pad(t0, size, 0.0)
        t_first_skipped = t0_pad + (first_skipped * self.segment + 0.5) * float(self.step)
        prefix = None
        if self.mode == "attenuated_mip":
            lo, hi, attenuation = (float(p) for p in self.params)
            per_sample = float(self.step) * float(np.clip((self.background - lo) / (hi - lo), 0, 1))
            counts = np.clip(_pad(n, size, 0)[:, None] - np.arange(count)[None, :] * self.segment, 0, self.segment)
            totals = np.where(skipped, counts * per_sample, 0.0)
        used: set[int] = set()
        groups = self._groups(args, rays, segs, used, cancel)
        if self.mode == "attenuated_mip":
            for r, s, atlas, slots in groups:
                part = _totals(*args, *self._segments(r, s), atlas, slots, self.step, self.shape, self.chunk,
                               self.background, self.params[0], self.params[1], self.segment)  # fmt: skip
                totals[r, s] = np.asarray(part)[: len(r)]
            prefix = np.cumsum(totals, axis=1) - totals  # the sum before each segment
        for r, s, atlas, slots in groups:
            if prefix is not None:
                seg_prefix = _pad(prefix[r, s].astype(np.float32), _padded(len(r)), 0)[:, None]
                lo, hi, attenuation = (np.float32(p) for p in self.params)
                v, t = _reduce_attenuated(*args, *self._segments(r, s), atlas, slots, self.step, self.shape,
                                          self.chunk, self.background, lo, hi, attenuation, jnp.asarray(seg_prefix),
                                          self.segment, size)  # fmt: skip
            else:
                v, t = _reduce(*args, *self._segments(r, s), atlas, slots, self.step, self.shape, self.chunk,
                               self.background, jnp.asarray(self.params), self.segment, self.mode, size)  # fmt: skip
            v, t = np.asarray(v), np.asarray(t)
            best, best_t = _combine(self.mode, best, best_t, v, t)
        # the skipped segments' samples, all background
        if self.mode in ("mip", "minip"):
            bg = np.where(any_skipped, self.background, np.nan).astype(np.float32)
            best, best_t = _combine(self.mode, best, best_t, bg, np.where(any_skipped, t_first_skipped, np.inf))
        elif self.mode == "iso":
            if self.background > self.params[0]:
                bg = np.where(any_skipped, self.background, -np.inf).astype(np.float32)
                best, best_t = _combine("iso", best, best_t, bg, np.where(any_skipped, t_first_skipped, np.inf))
        else:
            lo, hi, attenuation = (float(p) for p in self.params)
            # the first sample of each skipped segment has the least attenuation of the segment
            k_first = np.arange(count) * self.segment
            seg_total_before = prefix + float(self.step) * float(np.clip((self.background - lo) / (hi - lo), 0, 1))
            scaled = np.where(skipped, self.background * np.exp(-attenuation * (seg_total_before - 1)), -np.inf)
            at = np.argmax(scaled, axis=1)
            v = scaled[np.arange(size), at].astype(np.float32)
            t = t0_pad + (k_first[at] + 0.5) * float(self.step)
            best, best_t = _combine("mip", best, best_t, np.where(any_skipped, v, np.nan), t)
        samples = len(rays) * self.segment
        return best[:m], best_t[:m], used, samples

    def _segments(self, r, s):
        size = _padded(len(r))
        return jnp.asarray(_pad(r.astype(np.int32), size, 0)), jnp.asarray(_pad(s.astype(np.int32), size, 0))

    def _groups(self, args, rays, segs, used, cancel):
        """(rays, segments, atlas, slot table) per group of occupied segments whose chunks fit in the cache."""
        groups = []
        pending = [(rays, segs)]
        while pending:
            r, s = pending.pop()
            if len(r) == 0:
                continue
            if cancel is not None and cancel():
                raise RenderCancelled
            chunks = []
            for a in range(0, len(r), SEGMENT_BATCH):
                part = self._segments(r[a : a + SEGMENT_BATCH], s[a : a + SEGMENT_BATCH])
                flat = _mark(*args, *part, self.cells, self.step, self.shape, self.chunk, self.grid, self.segment,
                             self.cell)  # fmt: skip
                chunks.append(np.unique(np.asarray(flat)))
            ids = np.unique(np.concatenate(chunks))
            ids = ids[ids >= 0]
            if len(ids) > self.cache.slots and len(r) > 1:
                half = len(r) // 2  # the segments are in ray order, rays in row order: two bands of rows
                pending += [(r[half:], s[half:]), (r[:half], s[:half])]
                continue
            used.update(int(i) for i in ids)
            blocks = self.cache.get(ids) if len(ids) else [np.zeros(self.cache.chunk, self.cache.dtype)]
            atlas = jnp.asarray(np.stack(blocks))
            slots = np.full(self.cache.grid, -1, np.int32)
            slots.flat[ids] = np.arange(len(ids), dtype=np.int32)
            slots = jnp.asarray(slots)
            for a in range(0, len(r), SEGMENT_BATCH):
                groups.append((r[a : a + SEGMENT_BATCH], s[a : a + SEGMENT_BATCH], atlas, slots))
        return groups


@functools.partial(jax.jit, static_argnames=("segment", "size"))
def _reduce_attenuated(o, d, t0, n, rays, segs, atlas, slots, step, shape, chunk, background, lo, hi, attenuation,
                       prefix, segment, size):  # fmt: skip
    value, valid, t = _gather(o, d, t0, n, rays, segs, atlas, slots, step, shape, chunk, background, segment)
    contribution = jnp.where(valid, step * jnp.clip((value - lo) / (hi - lo), 0, 1), 0)
    total = prefix + jnp.cumsum(contribution, axis=1)
    scaled = jnp.where(valid, value * jnp.exp(-attenuation * (total - 1)), -jnp.inf)
    return _pick(scaled, t, jnp.maximum, rays, size)


def _combine(mode, best, best_t, v, t):
    """Fold a batch's per-ray (value, t) into the running ones (NaN/inf: nothing yet)."""
    v = np.where(np.isfinite(v), v, np.nan).astype(np.float32)
    if mode == "iso":  # the earliest hit wins
        take = np.isfinite(t) & ~(t >= np.where(np.isnan(best_t), np.inf, best_t))
    elif mode == "minip":
        take = ~np.isnan(v) & (np.isnan(best) | (v < best) | ((v == best) & (t < best_t)))
    else:
        take = ~np.isnan(v) & (np.isnan(best) | (v > best) | ((v == best) & (t < best_t)))
    return np.where(take, v, best), np.where(take, t, best_t).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------------


def colorize_view(
    values: Any,
    *,
    colormap: Any,
    contrast_limits: Any,
    gamma: float = 1.0,
    depth: Any = None,
    background: Any = (0.0, 0.0, 0.0, 0.0),
) -> np.ndarray:
    """RGBA of a rendered view as napari shows a layer: contrast limits, then gamma, then the colormap.

    Parameters
    ----------
    values
        ``(rows, columns)`` float values from :func:`render_view` (NaN: nothing, shown as ``background``).
    colormap
        A napari ``Colormap`` or anything with ``map(values in [0, 1]) -> (n, 4)`` (``layer.colormap``).
    contrast_limits
        ``(lo, hi)``: ``lo`` maps to the colormap's start, ``hi`` to its end (clipped).
    gamma
        napari's gamma: the normalised value is raised to it.
    depth
        Iso surfaces: the depth image (float ``(rows, columns)``); the surface is lit from the viewer by the
        normals of the depth image (Lambert, as vispy's iso shader lights its surface from the camera).
    background
        RGBA of pixels with NaN values.

    Returns
    -------
    numpy.ndarray
        float32 ``(rows, columns, 4)`` in [0, 1].

    Raises
    ------
    ValueError
        If ``values`` is not 2D, ``contrast_limits`` not two increasing numbers, ``gamma`` not positive, or
        ``depth`` of another shape.
    TypeError
        If ``colormap`` has no ``map`` method.
    """
    values = np.asarray(values, np.float64)
    if values.ndim != 2:
        raise ValueError(f"values must be a 2D image; got shape {values.shape}")
    lo, hi = (float(v) for v in contrast_limits)
    if not hi > lo:
        raise ValueError(f"contrast_limits must have hi > lo; got {contrast_limits}")
    gamma = _validate.check_finite_scalar("gamma", gamma)
    if gamma <= 0:
        raise ValueError(f"gamma must be positive; got {gamma}")
    if not callable(getattr(colormap, "map", None)):
        raise TypeError(f"colormap must have a map method (a napari Colormap); got {type(colormap).__name__}")
    empty = np.isnan(values)
    norm = np.clip((np.where(empty, lo, values) - lo) / (hi - lo), 0, 1) ** gamma
    rgba = np.asarray(colormap.map(norm.ravel()), np.float32).reshape(*values.shape, 4)
    if depth is not None:
        depth = np.asarray(depth, np.float64)
        if depth.shape != values.shape:
            raise ValueError(f"depth must have the shape of values {values.shape}; got {depth.shape}")
        rgba[..., :3] *= _lambert(depth)[..., None]
    rgba[empty] = np.asarray(background, np.float32)
    return rgba


def _lambert(depth: np.ndarray) -> np.ndarray:
    """Diffuse light from the viewer on the surface of a depth image (pixels as unit steps), ambient 0.3."""
    filled = np.where(np.isnan(depth), np.nanmax(depth) if np.isfinite(depth).any() else 0, depth)
    gy, gx = np.gradient(filled) if min(depth.shape) > 1 else (np.zeros_like(filled),) * 2
    normal_z = 1 / np.sqrt(1 + gx**2 + gy**2)
    return (0.3 + 0.7 * normal_z).astype(np.float32)
