"""napari's volume rendering modes, at full resolution, reading only the chunks whose occupied cells rays enter: the
live view's renderer (:func:`render_view`, whose notes give the sampling), its brick cache and its colours.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from napari_gridmip.core import validate
from napari_gridmip.core.occupancy import _flat
from napari_gridmip.core.occupancy.chunk_files import chunk_reader
from napari_gridmip.core.runtime import strategy
from napari_gridmip.core.runtime.transfer import aligned_empty

__all__ = ["colorize_view", "render_view"]

MODES = ("mip", "minip", "attenuated_mip", "iso")
SEGMENT_BATCH = 1 << 13  # segments per compiled call: short calls, since a call holds the GIL (the GUI thread waits)
# coarse segments (or blocks) per call of the segment search: its tests are cheap (one lookup), so at 8192 a call the
# Python around each call (packing rays, reading the result) cost as much as the call; still about 1 to 2 ms a call
REFINE_BATCH = 1 << 15
IN_MEMORY_CHUNK = 64  # NumPy/JAX volumes are read in chunks of this side
# a trilinear sample in float32 exceeds the largest voxel it reads by a few units in the last place at most (8
# products of weights summing to 1 within rounding): a segment is skipped only when its bound, raised by this
# fraction of its size, stays below the ray's best (generous: 2^-12 against about 2^-21)
BOUND_MARGIN = 2.0**-12
MIP_ROUNDS = 2  # mip: rounds of one segment per ray (its largest bound left) before the rest that may reach
SCALES = (16, 4, 1)  # segments are found against cells this many times the occupancy cells, coarsest first
SCAN_BLOCK = 8  # the coarsest segments are tested in blocks of this many, as many blocks as a ray's samples need


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
    """Chunks of one volume, read on demand (in parallel threads), of which only the occupied cells are kept.

    The volume is read a chunk at a time (its own chunks for dask and Zarr), but where the chunks are whole cells of
    the render's occupancy grid (every chunk side a multiple of the cell side: Zarr's 64^3 chunks of 8^3 cells), a
    chunk read keeps only its occupied cells, as bricks of ``cell``^3 voxels in a pool, with a table per chunk of
    where each of its cells lies in the pool (-1: empty, every voxel ``background``). For a sparse volume this holds
    a small part of the chunks' bytes (the 2048^3 sample's 3058 chunks with an occupied cell: 1.5 GiB whole, 43 MiB
    of occupied cells). Otherwise whole chunks are kept (one brick per chunk). Chunks are evicted least recently
    used first, with their bricks. A local Zarr v3 array of the plain layout (``bytes`` and one of ``zstd``,
    ``gzip``, ``blosc``) is read from its chunk files directly (:mod:`.chunk_files`: 4x less time a chunk than
    through Zarr); other volumes through their own slicing. One cache may serve many renders of the same volume (a
    live view keeps one); it is used by one render at a time, and is emptied when a render brings another occupancy
    grid.

    ``capacity`` bounds the bytes of the pool and of the chunks' tables; the pool never holds more bricks than the
    grid has occupied cells. Its arrays are host arrays that JAX's CPU backend reads without a copy
    (``jax.device_put`` aliases them; other backends keep a device copy that each band of a render brings up
    to date with the bricks written since, :meth:`device_arrays`).
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
        self.reads = 0
        # a local Zarr v3 array's chunks straight from their files (4x less time than through Zarr), else None
        self._reader = chunk_reader(volume)
        self._cells: np.ndarray | None = None  # the occupancy grid the pool was filled for
        self.cell = 0
        self._clear()

    def _clear(self) -> None:
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # chunk id -> chunk slot, least recently used first
        self.bricks_of: dict[int, np.ndarray] = {}  # chunk id -> its bricks in the pool
        self.derived: dict[Any, Any] = {}  # what renders derive from the cells (coarser grids), kept with them

    def prepare(self, cells: np.ndarray, cell: int) -> None:
        """Lay the pool out for the occupancy grid ``cells`` of ``cell``^3 voxels (emptied if it was another)."""
        # by value, against a copy: a caller's grid changed in place is another grid (the identity or a kept
        # reference would see the change on both sides and keep the old bricks)
        if self._cells is not None and self.cell == cell and np.array_equal(cells, self._cells):
            return
        self._clear()
        self._cells, self.cell = np.array(cells, dtype=bool, copy=True), int(cell)
        self.bricked = all(c % cell == 0 for c in self.chunk)
        self.brick = (cell,) * 3 if self.bricked else self.chunk  # the pool's unit: a cell, or a whole chunk
        self.per_chunk = tuple(c // b for c, b in zip(self.chunk, self.brick))  # bricks per chunk and axis
        # the bricks each chunk holds: its occupied cells (bricked), or 1 for a chunk with an occupied cell
        if self.bricked:
            padded = np.zeros(tuple(g * p for g, p in zip(self.grid, self.per_chunk)), bool)
            padded[tuple(slice(0, n) for n in cells.shape)] = cells
            g, p = self.grid, self.per_chunk
            self.counts = padded.reshape(g[0], p[0], g[1], p[1], g[2], p[2]).sum(axis=(1, 3, 5)).ravel()
        else:
            self.counts = np.ones(int(np.prod(self.grid)), np.int64)
        brick_bytes = int(np.prod(self.brick)) * self.dtype.itemsize
        table_bytes = int(np.prod(self.per_chunk)) * 4
        occupied_chunks = int(np.count_nonzero(self.counts)) if self.bricked else int(np.prod(self.grid))
        if self.bricked:  # a quarter of the capacity at most for the tables, the rest for the bricks
            slots = max(1, min(occupied_chunks, self.capacity // (4 * (table_bytes + brick_bytes))))
            bricks = max(int(np.prod(self.per_chunk)), (self.capacity - slots * table_bytes) // brick_bytes)
            bricks = max(1, min(bricks, int(self.counts.sum())))
        else:
            slots = bricks = max(1, min(self.capacity // self.chunk_bytes, occupied_chunks))
        # the render indexes the pool flat with int32
        bricks = min(bricks, (2**31 - 1) // int(np.prod(self.brick)))
        slots = min(slots, bricks) if not self.bricked else slots
        self.slots, self.bricks = slots, bricks
        self.atlas = aligned_empty((bricks, *self.brick), self.dtype)  # pages are committed as bricks arrive
        self.tables = np.full((slots, *self.per_chunk), -1, np.int32)
        self.maxima = np.zeros(bricks, np.float32)  # each brick's largest voxel (as the render reads it: float32)
        self.maxima_known = np.zeros(bricks, bool)  # made when a render asks (skip_by_maxima), not on every read
        self._free_slots = list(range(slots - 1, -1, -1))
        self._free_bricks = np.arange(bricks - 1, -1, -1, dtype=np.int32)  # a stack: the top is the end
        self._free_top = bricks
        self._on_device: tuple[jax.Array, jax.Array] | None = None  # device_arrays' copies (not on the CPU)
        self._written: list[np.ndarray] = []  # bricks written since those copies were brought up to date
        self._written_slots: list[int] = []

    @property
    def blocks(self) -> list[int]:
        """The chunk ids held."""
        return list(self.slot_of)

    @property
    def nbytes(self) -> int:
        """Bytes of bricks held (the pool's committed part)."""
        per = int(np.prod(self.brick)) * self.dtype.itemsize if self._cells is not None else 0
        return sum(len(b) for b in self.bricks_of.values()) * per

    def occupied(self) -> np.ndarray:
        """The ids of the chunks with an occupied cell (every chunk where whole chunks are kept)."""
        if self._cells is None:
            raise ValueError("the cache has no occupancy grid yet: call prepare(cells, cell) first")
        return np.flatnonzero(self.counts)

    def fits(self, ids: np.ndarray) -> bool:
        """Whether the chunks ``ids`` fit in the cache together."""
        return len(ids) <= self.slots and int(self.counts[np.asarray(ids, np.int64)].sum()) <= self.bricks

    def _read(self, flat: int) -> np.ndarray:
        index = np.unravel_index(flat, self.grid)
        region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, self.chunk, self.shape))
        if self._reader is not None:  # the whole stored chunk: the part inside the volume
            return self._reader(index)[tuple(slice(0, r.stop - r.start) for r in region)]
        block = self.volume[region]
        return np.asarray(block.compute() if validate.is_dask(block) else block)

    def _read_bricks(self, flat: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ``flat``'s bricks ``(k, *brick)`` and which of its cells they are (bool ``per_chunk``)."""
        block = self._read(flat)
        if not self.bricked:
            return np.ones((1, 1, 1), bool), block[None]
        index = np.unravel_index(flat, self.grid)
        first = [i * p for i, p in zip(index, self.per_chunk)]
        mask = np.zeros(self.per_chunk, bool)
        inside = self._cells[tuple(slice(f, f + p) for f, p in zip(first, self.per_chunk))]
        mask[tuple(slice(0, n) for n in inside.shape)] = inside
        if block.shape != self.chunk:  # an edge chunk: padded (the padding is never sampled)
            whole = np.zeros(self.chunk, block.dtype)
            whole[tuple(slice(0, n) for n in block.shape)] = block
            block = whole
        c, p = self.cell, self.per_chunk
        cells = block.reshape(p[0], c, p[1], c, p[2], c).transpose(0, 2, 4, 1, 3, 5)
        return mask, cells[mask]

    def load(self, ids: np.ndarray) -> np.ndarray:
        """Hold the chunks ``ids`` (they must :meth:`fit`), reading the missing ones; returns their slots."""
        if self._cells is None:
            raise ValueError("the cache has no occupancy grid yet: call prepare(cells, cell) first")
        ids = [int(i) for i in ids]
        if not self.fits(np.asarray(ids, np.int64)):
            raise ValueError(
                f"{len(ids)} chunks asked for at once; the cache holds {self.slots} chunks ({self.bricks} bricks)"
            )
        wanted = set(ids)
        missing = [i for i in ids if i not in self.slot_of]
        need = int(self.counts[np.asarray(missing, np.int64)].sum()) if missing else 0
        for chunk_id in list(self.slot_of):  # evict the least recently used chunks not wanted now
            if len(self._free_slots) >= len(missing) and self._free_top >= need:
                break
            if chunk_id not in wanted:
                self._free_slots.append(self.slot_of.pop(chunk_id))
                freed = self.bricks_of.pop(chunk_id)
                self._free_bricks[self._free_top : self._free_top + len(freed)] = freed
                self._free_top += len(freed)
        if missing:
            with ThreadPoolExecutor(max_workers=4) as pool:  # Zarr decompression releases the GIL
                for chunk_id, (mask, bricks) in zip(missing, pool.map(self._read_bricks, missing)):
                    slot = self._free_slots.pop()
                    taken = self._free_bricks[self._free_top - len(bricks) : self._free_top].copy()
                    self._free_top -= len(bricks)
                    self.maxima_known[taken] = False
                    if self.bricked:
                        self.atlas[taken] = bricks
                    else:  # a whole chunk (an edge chunk fills part of its brick; never sampled beyond the volume)
                        self.atlas[taken[0]][tuple(slice(0, n) for n in bricks.shape[1:])] = bricks[0]
                    table = self.tables[slot]
                    table[...] = -1
                    table[mask] = taken
                    self.slot_of[chunk_id] = slot
                    self.bricks_of[chunk_id] = taken
                    self._written.append(taken)
                    self._written_slots.append(slot)
            self.reads += len(missing)
        slots = np.empty(len(ids), np.int32)
        for j, chunk_id in enumerate(ids):
            self.slot_of.move_to_end(chunk_id)
            slots[j] = self.slot_of[chunk_id]
        return slots

    def brick_maxima(self) -> np.ndarray:
        """Each brick's largest voxel (float32 ``(bricks,)``), made for the bricks read since the last call."""
        held = np.concatenate(list(self.bricks_of.values())) if self.bricks_of else np.zeros(0, np.int32)
        todo = held[~self.maxima_known[held]]
        if len(todo):
            if self.bricked:
                self.maxima[todo] = self.atlas[todo].reshape(len(todo), -1).max(axis=1)
            else:  # whole chunks: an edge chunk fills part of its brick (the rest is never sampled)
                for chunk_id, taken in self.bricks_of.items():
                    if not self.maxima_known[taken[0]]:
                        index = np.unravel_index(chunk_id, self.grid)
                        part = tuple(slice(0, min(c, n - i * c)) for i, c, n in zip(index, self.chunk, self.shape))
                        self.maxima[taken[0]] = self.atlas[taken[0]][part].max()
            self.maxima_known[todo] = True
        return self.maxima

    def device_arrays(self) -> tuple[jax.Array, jax.Array]:
        """The pool and the chunks' tables on the device.

        On the CPU, the host arrays themselves (``jax.device_put`` aliases them: no copy). Elsewhere
        (:func:`napari_gridmip.core.runtime.strategy.host_pool_aliased`), copies kept on the device, into which only the
        bricks and
        tables written since the last call are copied: a render asks once per band, and copying the whole pool
        each time (its capacity, 512 MiB by default, over a host link of a few GB/s) was a copy per band of
        bricks mostly there already. The first call starts from a pool of zeros (only written bricks are read).
        """
        if strategy.host_pool_aliased():
            self._written, self._written_slots = [], []  # nothing to bring up to date
            return jax.device_put(self.atlas), jax.device_put(self.tables)
        if self._on_device is None:
            self._on_device = (
                jnp.zeros(self.atlas.shape, self.atlas.dtype),
                jnp.full(self.tables.shape, -1, jnp.int32),
            )
        if self._written:
            bricks = np.unique(np.concatenate(self._written)).astype(np.int32)
            slots = np.unique(np.asarray(self._written_slots, np.int32))
            atlas, tables = self._on_device
            self._on_device = (_set_rows(atlas, *_padded_rows(self.atlas, bricks)),
                               _set_rows(tables, *_padded_rows(self.tables, slots)))  # fmt: skip
            self._written, self._written_slots = [], []
        return self._on_device


def _padded_rows(array: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` and those rows of ``array``, padded to a power of two (at least 64) with an index past the end
    (dropped by :func:`_set_rows`): one compiled program serves many counts."""
    size = _flat.bucket(len(rows), 64)
    return _pad(rows.astype(np.int32), size, len(array)), _pad(array[rows], size)


@jax.jit
def _set_rows(array: jax.Array, index: jax.Array, rows: jax.Array) -> jax.Array:
    """``array`` with its rows ``index`` set to ``rows`` (indices past the end dropped)."""
    return array.at[index].set(rows, mode="drop")


# ---------------------------------------------------------------------------------------------------------------------
# the compiled pieces: every batch is padded to SEGMENT_BATCH segments (REFINE_BATCH in the search), and a segment
# carries its ray's (o, d, t0, n), so one program per level and mode serves every view (none is compiled when the
# camera moves)

CORNERS = np.array(list(np.ndindex(2, 2, 2)), np.int32)  # the 8 voxels a trilinear sample reads


def _points(o, d, t0, k, step):
    """Position (float32 (..., 3), index coordinates) and t of sample ``k`` of rays ``(o, d, t0)``."""
    t = t0 + (k.astype(jnp.float32) + 0.5) * step
    return o + t[..., None] * d, t


def _base(p, shape):
    """The lower of the two voxels per axis a trilinear sample at ``p`` reads (voxel centres at ``i + 1/2``), and
    its weight for the upper one; indices clamped to the volume (clamp to edge, as OpenGL's textures)."""
    q = p - 0.5
    low = jnp.floor(q)
    return jnp.clip(low.astype(jnp.int32), -1, shape - 1), q - low


def _corner(base, corner, shape):
    return jnp.clip(base + corner, 0, shape - 1)


def _pack(o, d, t0, n) -> np.ndarray:
    """Rays as one float32 ``(P, 8)`` array (one transfer a call): origin, direction, ``t0`` and the sample count's
    int32 bits."""
    return np.concatenate([o, d, t0[:, None], n.astype(np.int32).view(np.float32)[:, None]], axis=1)


def _unpack(rays):
    return rays[:, 0:3], rays[:, 3:6], rays[:, 6], jax.lax.bitcast_convert_type(rays[:, 7], jnp.int32)


def _div(x, k: int):
    """``x // k`` for non-negative int ``x`` and a static ``k`` (a shift when ``k`` is a power of two)."""
    return x >> (k.bit_length() - 1) if k & (k - 1) == 0 else x // k


def _segments_occupied(o, d, t0, n, first, length, boxes, step, shape, cell):
    """Whether a segment's samples may read a voxel of an occupied cell: the voxels its trilinear samples read lie
    in the box from the first sample's lower voxels to the last's upper ones, which spans at most 2 cells per axis
    (a segment's samples span at most ``cell - 1`` voxels), so its cells are the box of cells from ``lo`` to ``lo +
    e`` (``e`` 0 or 1 per axis). ``boxes`` (:func:`_box_bits`) holds per cell whether each of the 8 such boxes from
    it has an occupied cell: one lookup a segment, not 8."""
    # axis by axis on (P, k) arrays (the same arithmetic as _points and _base): XLA vectorises these, not (P, k, 3)
    last = jnp.minimum(first + length - 1, n - 1)
    t_first = t0 + (first.astype(jnp.float32) + 0.5) * step
    t_last = t0 + (jnp.maximum(last, 0).astype(jnp.float32) + 0.5) * step
    grid = boxes.shape
    index, bit = 0, 0  # the box's first cell (flat), and which of the 8 boxes from it: bit 4 e0 + 2 e1 + e2
    for axis in range(3):
        bf = jnp.clip(jnp.floor(o[..., axis] + t_first * d[..., axis] - 0.5).astype(jnp.int32), -1, shape[axis] - 1)
        bl = jnp.clip(jnp.floor(o[..., axis] + t_last * d[..., axis] - 0.5).astype(jnp.int32), -1, shape[axis] - 1)
        lo = _div(jnp.clip(jnp.minimum(bf, bl), 0, shape[axis] - 1), cell)
        hi = _div(jnp.clip(jnp.maximum(bf, bl) + 1, 0, shape[axis] - 1), cell)
        index = index * grid[axis] + lo
        bit = bit * 2 + (hi > lo).astype(jnp.int32)
    word = boxes.reshape(-1)[index]
    return ((word >> bit.astype(jnp.uint8)) & 1).astype(bool) & (first < n)


def _box_bits(cells: np.ndarray) -> np.ndarray:
    """uint8, one per cell: bit ``4 e0 + 2 e1 + e2`` (``e`` 0 or 1 per axis) is set when a cell of the box from
    the cell to ``e`` cells past it along each axis is occupied (cells past the grid's end are empty)."""
    bits = np.zeros(tuple(g + 1 for g in cells.shape), np.uint8)  # padded: the cells past the end
    bits[:-1, :-1, :-1] = cells
    width = 1  # bits per cell so far: the extents along the axes done (the last axis first: its bit is the lowest)
    for axis in (2, 1, 0):
        here = tuple(slice(0, -1) if a == axis else slice(None) for a in range(3))
        past = tuple(slice(1, None) if a == axis else slice(None) for a in range(3))
        # extent 0 along this axis: the bits so far; extent 1: those ORed with the next cell's, in the next bits
        bits = bits[here] | ((bits[here] | bits[past]) << np.uint8(width))
        width *= 2
    return bits


@functools.partial(jax.jit, static_argnames=("length", "split", "cell"))
def _refine(rays, coarse, boxes, step, shape, length, split, cell):
    """(P, split): which of the ``split`` segments of ``length`` samples inside each coarse segment meet one
    (``rays``: each coarse segment's ray; :func:`render_view`'s first level takes blocks of ``split`` segments)."""
    o, d, t0, n = _unpack(rays)
    first = (coarse[:, None] * split + jnp.arange(split, dtype=jnp.int32)[None, :]) * length
    return _segments_occupied(o[:, None], d[:, None], t0[:, None], n[:, None], first, length, boxes, step, shape, cell)


def _samples(o, d, t0, n, segs, step, shape, segment):
    """Each segment's samples: their lower voxels and weights per axis (3 arrays (P, segment) each: XLA vectorises
    these, not (P, segment, 3); the arithmetic of :func:`_points` and :func:`_base`), t and validity."""
    k = segs[:, None] * segment + jnp.arange(segment, dtype=jnp.int32)[None, :]
    t = t0[:, None] + (k.astype(jnp.float32) + 0.5) * step
    bases, weights = [], []
    for axis in range(3):
        q = o[:, None, axis] + t * d[:, None, axis] - 0.5
        low = jnp.floor(q)
        bases.append(jnp.clip(low.astype(jnp.int32), -1, shape[axis] - 1))
        weights.append(q - low)
    return bases, weights, t, k < n[:, None]


@functools.partial(jax.jit, static_argnames=("segment", "cell", "chunks"))
def _mark(rays, segs, cells, step, shape, chunk, grid, segment, cell, chunks):
    """The chunks (flat ids; ``chunks``: none) that hold a voxel a sample of the given segments reads in an occupied
    cell, per segment and sample: (P, 8 segment) int32, made a set in NumPy (XLA's scatter on the CPU is slow)."""
    o, d, t0, n = _unpack(rays)
    bases, _, _, valid = _samples(o, d, t0, n, segs, step, shape, segment)
    base = jnp.stack(bases, axis=-1)
    marked = []
    for corner in CORNERS:
        v = _corner(base, corner, shape)
        c = v // cell
        hit = cells[c[..., 0], c[..., 1], c[..., 2]] & valid
        q = v // chunk
        flat = (q[..., 0] * grid[1] + q[..., 1]) * grid[2] + q[..., 2]
        marked.append(jnp.where(hit, flat, chunks))
    return jnp.concatenate(marked, axis=1)


def _segment_box(rays, segs, step, shape, segment):
    """The box of voxels ``[lo, hi]`` (int32 ``(P, 3)`` each, inclusive) that the trilinear samples of each segment
    read (from its first sample's base voxel to one past its last's, clipped to the volume), and the rays' sample
    counts ``n`` (``(P,)``)."""
    o, d, t0, n = _unpack(rays)
    last = jnp.minimum((segs + 1) * segment - 1, n - 1)
    bf, _ = _base(_points(o, d, t0, segs * segment, step)[0], shape)
    bl, _ = _base(_points(o, d, t0, jnp.maximum(last, 0), step)[0], shape)
    lo = jnp.clip(jnp.minimum(bf, bl), 0, shape - 1)
    hi = jnp.clip(jnp.maximum(bf, bl) + 1, 0, shape - 1)
    return lo, hi, n


@functools.partial(jax.jit, static_argnames=("segment", "cell", "chunks", "aligned"))
def _mark_boxes(rays, segs, cells, step, shape, chunk, grid, segment, cell, chunks, aligned):
    """As :func:`_mark`, per segment rather than per sample (8 lookups a segment, not 8 a sample): the chunks of
    the part of each occupied cell inside the box of voxels the segment's samples read. A superset of ``_mark``'s
    (a box holds more voxels than its samples read), as tight at the cells' scale; chunks of at least a cell."""
    lo, hi, n = _segment_box(rays, segs, step, shape, segment)
    valid = (segs * segment < n)[:, None]
    marked = []
    for corner in np.ndindex(2, 2, 2):
        c = jnp.minimum(lo // cell + jnp.asarray(corner, jnp.int32), hi // cell)
        hit = cells[c[:, 0], c[:, 1], c[:, 2]][:, None] & valid
        part_lo, part_hi = jnp.maximum(lo, c * cell), jnp.minimum(hi, c * cell + cell - 1)  # the box inside the cell
        # its chunks: at most 2 per axis (it is at most a cell wide); one where chunks are whole cells
        for end in np.ndindex(2, 2, 2) if not aligned else [(0, 0, 0)]:
            q = jnp.where(jnp.asarray(end, bool), part_hi, part_lo) // chunk
            flat = (q[:, 0] * grid[1] + q[:, 1]) * grid[2] + q[:, 2]
            marked.append(jnp.where(hit[:, 0], flat, chunks))
    return jnp.stack(marked, axis=1)


def _brick_of(slots, tables, q, i, per_chunk):
    """The pool index of the brick ``i`` (per axis, within its chunk) of chunk ``q`` (per axis), through the chunk's
    slot in ``slots`` (the chunk grid) and its table in ``tables``, and whether it is held: False where the chunk
    is not held or the cell is empty (every voxel the background; the index is then meaningless)."""
    grid = slots.shape
    (q0, q1, q2), (i0, i1, i2) = q, i
    slot = slots.reshape(-1)[(q0 * grid[1] + q1) * grid[2] + q2]
    index = tables.reshape(-1)[((jnp.maximum(slot, 0) * per_chunk[0] + i0) * per_chunk[1] + i1) * per_chunk[2] + i2]
    return index, (slot >= 0) & (index >= 0)


def _gather_local(base, weight, valid, atlas, tables, slots, shape, background, brick, per_chunk):
    """:func:`_gather`'s values (``base``, ``weight``: per axis) where bricks are at least a cell: a segment's samples
    then read voxels of 2 bricks per axis at most (see :func:`_bounds`), so each segment's 8 bricks are looked up
    once (chunk slot, then the chunk's table), and each of its samples' corners picks one of them: 1 lookup in the
    pool and 1 in the segment's 8, not 3 scattered ones. The voxels read, the weights and the sum's order are
    :func:`_gather`'s."""
    grid = slots.shape
    per_axis, firsts = [], []  # per axis: the segment's first brick; per side: which of its 2, voxel in it, weight
    for axis in range(3):
        lower = jnp.clip(base[axis], 0, shape[axis] - 1)
        # the smallest voxel a valid sample reads (the first sample is always valid)
        first = _div(jnp.min(jnp.where(valid, lower, lower[:, :1]), axis=1), brick[axis])
        sides = []
        for side in (0, 1):
            v = jnp.clip(base[axis] + side, 0, shape[axis] - 1)
            b = _div(v, brick[axis])
            w = weight[axis] if side else 1 - weight[axis]
            sides.append((jnp.clip(b - first[:, None], 0, 1), v - b * brick[axis], w))
        per_axis.append(sides)
        firsts.append(first)
    atlas = atlas.reshape(-1)
    volume = int(np.prod(brick))
    offsets = []  # (P, 8): each of the segment's bricks' start in the pool (-1: background)
    for corner in np.ndindex(2, 2, 2):
        q, i = [], []
        for axis, c in enumerate(corner):
            b = jnp.minimum(firsts[axis] + c, grid[axis] * per_chunk[axis] - 1)
            q.append(_div(b, per_chunk[axis]))
            i.append(b - q[-1] * per_chunk[axis])
        index, held = _brick_of(slots, tables, q, i, per_chunk)
        offsets.append(jnp.where(held, index * volume, -1))
    offsets = jnp.stack(offsets, axis=1)
    value = jnp.zeros(base[0].shape, jnp.float32)
    for c0, c1, c2 in np.ndindex(2, 2, 2):
        (k0, l0, w0), (k1, l1, w1), (k2, l2, w2) = per_axis[0][c0], per_axis[1][c1], per_axis[2][c2]
        start = jnp.take_along_axis(offsets, (k0 * 2 + k1) * 2 + k2, axis=1)
        read = atlas[jnp.maximum(start, 0) + (l0 * brick[1] + l1) * brick[2] + l2].astype(jnp.float32)
        value = value + (w0 * w1 * w2) * jnp.where(start >= 0, read, background)
    return value


def _gather(o, d, t0, n, segs, atlas, tables, slots, step, shape, background, segment, brick, per_chunk, local):
    """Trilinear values (float32 (P, segment)), validity and t of the samples of the given segments. A voxel is read
    from its brick (its cell, or its whole chunk) in the pool: the chunk's slot from ``slots`` (chunk grid), then the
    brick from the chunk's table; a voxel whose chunk is not held, or whose cell is empty, holds ``background``.

    ``brick`` and ``per_chunk`` are static (a cache's layout): the index arithmetic is shifts for powers of two, made
    once per axis and side (2 x 3), not per corner (8 x 3), and the lookups index flat arrays (2.4x faster than
    per-corner 3D indexing, measured)."""
    base, weight, t, valid = _samples(o, d, t0, n, segs, step, shape, segment)
    if local:
        return _gather_local(base, weight, valid, atlas, tables, slots, shape, background, brick, per_chunk), valid, t
    per_axis = []  # per axis, per side (lower, upper voxel): its chunk's index, its brick's in the chunk, its own
    for axis in range(3):  # in the brick, and its weight
        sides = []
        for side in (0, 1):
            v = jnp.clip(base[axis] + side, 0, shape[axis] - 1)
            b = _div(v, brick[axis])
            q = _div(b, per_chunk[axis])
            w = weight[axis] if side else 1 - weight[axis]
            sides.append((q, b - q * per_chunk[axis], v - b * brick[axis], w))
        per_axis.append(sides)
    atlas = atlas.reshape(-1)
    value = jnp.zeros(base[0].shape, jnp.float32)
    for c0, c1, c2 in np.ndindex(2, 2, 2):
        (q0, i0, l0, w0), (q1, i1, l1, w1), (q2, i2, l2, w2) = per_axis[0][c0], per_axis[1][c1], per_axis[2][c2]
        index, held = _brick_of(slots, tables, (q0, q1, q2), (i0, i1, i2), per_chunk)
        read = atlas[((jnp.maximum(index, 0) * brick[0] + l0) * brick[1] + l1) * brick[2] + l2].astype(jnp.float32)
        value = value + (w0 * w1 * w2) * jnp.where(held, read, background)
    return value, valid, t


@functools.partial(jax.jit, static_argnames=("segment", "brick", "per_chunk"))
def _bounds(rays, segs, maxima, tables, slots, step, shape, background, segment, brick, per_chunk):
    """Per segment, a value none of its samples exceeds (float32 (P,)): the largest voxel of the bricks holding the
    box of voxels its trilinear samples read (a sample is a convex combination of the voxels it reads), an empty
    cell or a chunk not held counting as ``background``. The box is at most ``cell + 1`` voxels wide per axis (see
    :func:`_segments_occupied`), so with bricks of at least a cell it lies in 2 bricks per axis: 8 lookups a
    segment, against the 64 of its samples' gathers."""
    lo, hi, n = _segment_box(rays, segs, step, shape, segment)
    per_axis = []  # per axis, its (one or) two bricks: the chunk's index, the brick's in the chunk
    for axis in range(3):
        first = _div(lo[:, axis], brick[axis])
        sides = []
        for b in (first, jnp.minimum(first + 1, _div(hi[:, axis], brick[axis]))):
            q = _div(b, per_chunk[axis])
            sides.append((q, b - q * per_chunk[axis]))
        per_axis.append(sides)
    bound = jnp.full(segs.shape, -jnp.inf, jnp.float32)
    for c0, c1, c2 in np.ndindex(2, 2, 2):
        (q0, i0), (q1, i1), (q2, i2) = per_axis[0][c0], per_axis[1][c1], per_axis[2][c2]
        index, held = _brick_of(slots, tables, (q0, q1, q2), (i0, i1, i2), per_chunk)
        bound = jnp.maximum(bound, jnp.where(held, maxima[jnp.maximum(index, 0)], background))
    return bound


def _first_best(values, t, better):
    """Per segment, the best value (max or min) and the t of its first occurrence."""
    arg = jnp.argmax(values, axis=1) if better is jnp.maximum else jnp.argmin(values, axis=1)
    return jnp.take_along_axis(values, arg[:, None], 1)[:, 0], jnp.take_along_axis(t, arg[:, None], 1)[:, 0]


@functools.partial(jax.jit, static_argnames=("segment", "mode", "brick", "per_chunk", "local"))
def _reduce(rays, segs, atlas, tables, slots, step, shape, background, params, prefix, segment, mode, brick, per_chunk,
            local):  # fmt: skip
    """Each segment reduced: (value, t) per segment (-inf/+inf and inf: none); the rays' reduction is in NumPy.

    ``params``: the iso threshold, or (lo, hi, attenuation); ``prefix``: attenuated_mip's sum before each segment.
    """
    o, d, t0, n = _unpack(rays)
    value, valid, t = _gather(o, d, t0, n, segs, atlas, tables, slots, step, shape, background, segment, brick,
                              per_chunk, local)  # fmt: skip
    if mode == "mip":
        return _first_best(jnp.where(valid, value, -jnp.inf), t, jnp.maximum)
    if mode == "minip":
        return _first_best(jnp.where(valid, value, jnp.inf), t, jnp.minimum)
    if mode == "attenuated_mip":
        lo, hi, attenuation = params[0], params[1], params[2]
        contribution = jnp.where(valid, step * jnp.clip((value - lo) / (hi - lo), 0, 1), 0)
        total = prefix[:, None] + jnp.cumsum(contribution, axis=1)
        scaled = jnp.where(valid, value * jnp.exp(-attenuation * (total - 1)), -jnp.inf)
        return _first_best(scaled, t, jnp.maximum)
    hit = valid & (value > params[0])  # iso: the first sample above the threshold
    at = jnp.argmax(hit, axis=1)
    found = jnp.any(hit, axis=1)
    first = jnp.where(found, jnp.take_along_axis(t, at[:, None], 1)[:, 0], jnp.inf)
    return jnp.where(found, jnp.take_along_axis(value, at[:, None], 1)[:, 0], -jnp.inf), first


@functools.partial(jax.jit, static_argnames=("segment", "brick", "per_chunk", "local"))
def _totals(rays, segs, atlas, tables, slots, step, shape, background, lo, hi, segment, brick, per_chunk, local):
    """attenuated_mip: each segment's sum of ``step * clip((v - lo) / (hi - lo), 0, 1)``."""
    o, d, t0, n = _unpack(rays)
    value, valid, _ = _gather(o, d, t0, n, segs, atlas, tables, slots, step, shape, background, segment, brick,
                              per_chunk, local)  # fmt: skip
    return jnp.sum(jnp.where(valid, step * jnp.clip((value - lo) / (hi - lo), 0, 1), 0), axis=1)


def _ahead(items, call, check, ahead: bool = True):
    """``(item, result as NumPy)`` for each item, the next call dispatched before a result is read: the compiled
    call runs (on XLA's threads) while the caller handles the previous result (JAX dispatches asynchronously).
    ``ahead=False``: one call at a time (where making the next item overwrites what a call reads: the cache's pool,
    which the device aliases on the CPU, when a band of chunks is loaded after another)."""
    if not ahead:  # each result read before the next item is made
        for item in items:
            check()
            yield item, jax.tree_util.tree_map(np.asarray, call(item))
        return
    pending = None
    for item in items:
        check()
        out = call(item)
        if pending is not None:
            yield pending[0], jax.tree_util.tree_map(np.asarray, pending[1])
        pending = (item, out)
    if pending is not None:
        yield pending[0], jax.tree_util.tree_map(np.asarray, pending[1])


def _pad(a: np.ndarray, size: int, value: Any = 0) -> np.ndarray:
    out = np.full((size, *a.shape[1:]), value, a.dtype)
    out[: len(a)] = a
    return out


def coarser_cells(cells: np.ndarray, factor: int) -> np.ndarray:
    """The occupancy of cells ``factor`` times larger (any of the cells inside)."""
    padded = np.zeros(tuple(-(-n // factor) * factor for n in cells.shape), bool)
    padded[tuple(slice(0, n) for n in cells.shape)] = cells
    g = padded.shape
    return padded.reshape(g[0] // factor, factor, g[1] // factor, factor, g[2] // factor, factor).any(axis=(1, 3, 5))


# ---------------------------------------------------------------------------------------------------------------------


def _box_entry(o: np.ndarray, d: np.ndarray, shape: np.ndarray, t_near: float) -> tuple[np.ndarray, np.ndarray]:
    """Where each ray enters the box [0, shape) (clamped to ``t_near``), and its samples' count is found from.

    Axis by axis, in place: few temporaries (each large fresh array costs its first touch of memory, slow here)."""
    enter = np.full(len(o), t_near, np.float64)
    leave = np.full(len(o), np.inf)
    for axis in range(3):
        oa, da = o[:, axis], d[:, axis]
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.divide(-oa, da)
            b = np.divide(shape[axis] - oa, da)
        lo, hi = np.minimum(a, b), np.maximum(a, b, out=b)
        flat = da == 0
        if flat.any():  # parallel to the faces: the whole line where it lies between them, else nowhere
            inside = (oa[flat] >= 0) & (oa[flat] < shape[axis])
            lo[flat] = np.where(inside, -np.inf, np.inf)
            hi[flat] = np.where(inside, np.inf, -np.inf)
        np.maximum(enter, lo, out=enter)
        np.minimum(leave, hi, out=leave)
    return enter, leave


def sample_plan(origins: np.ndarray, directions: np.ndarray, shape: tuple[int, ...], step: float, t_near: float):
    """``(t0, n)``: the first sample's base and the number of samples of each ray (float64, int64)."""
    enter, leave = _box_entry(origins, directions, np.asarray(shape, np.float64), t_near)
    n = np.where(leave > enter, np.ceil((leave - enter) / step - 0.5), 0)
    n = np.maximum(n, 0).astype(np.int64)
    return np.where(n > 0, enter, 0.0), n


def cell_side(shape: tuple[int, ...], cells_shape: tuple[int, ...]) -> int | None:
    """The side ``2**k`` (``k >= 2``, the smallest) of the cells of a grid of ``cells_shape`` over a volume of
    ``shape`` (:func:`render_view`'s reading of its ``cells``), or None."""
    return next((2**k for k in range(2, 31) if tuple(-(-n // 2**k) for n in shape) == tuple(cells_shape)), None)


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
    skip_by_maxima: bool = False,
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
        The size of the new cache (512 MiB): at most this many bytes of occupied cells (and the chunks' tables of
        them) are held; a view needing more is rendered in bands of rows.
    cancel
        Called between batches; when it returns True the render stops with :class:`RenderCancelled`.
    skip_by_maxima
        ``"mip"``: also skip the segments whose bricks' largest voxels cannot beat the ray's best so far (exact:
        the same values and depths; see the module notes). It pays where rays meet their bricks' maxima (bright
        objects of varied intensity); where most rays through an occupied brick pass beside its bright voxels (thin
        filaments, as the sparse sample's) it reads almost every segment anyway and the bounds cost more than they
        save (the sample's 2048^3 close-up: 2.7% fewer samples, 20% slower), so it is off by default.

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

    Notes
    -----
    Each ray is sampled at ``t = t0 + (k + 1/2) * step`` from where it enters the volume's box (``k = 0 .. n - 1``,
    ``n`` the samples inside the box), each sample interpolated trilinearly from the 8 voxels around it (voxel ``i``'s
    value at its centre ``i + 1/2``, indices clamped at the volume's faces: napari's default
    ``interpolation3d="linear"``, OpenGL's linear 3D texture filter with clamp to edge). Samples come in segments of
    ``S`` consecutive samples; a segment whose samples read no voxel of an occupied cell is skipped, its samples taken
    to be ``background`` (exact when every voxel of an empty cell holds ``background``). The other segments' chunks
    are read only where a sample reads a voxel of an occupied cell, into a bounded cache of the occupied ``cell``^3
    bricks; a view that needs more than the cache holds is rendered in bands of rows. The programs have fixed shapes
    (batches padded to one size each), so that no camera state compiles a new program once a level has been rendered.

    The modes follow vispy's shaders (``vispy/visuals/volume.py``): ``mip`` and ``minip`` take the largest and the
    smallest sample; ``attenuated_mip`` the largest ``v_k * exp(-attenuation * (S_k - 1))`` with ``S_k = step *
    sum_{j <= k} clip((v_j - lo) / (hi - lo), 0, 1)``; ``iso`` the first sample above the threshold, with its depth.

    With ``skip_by_maxima``, ``mip`` reads fewer segments still: each brick's largest voxel bounds every sample that
    reads it (a trilinear sample is a convex combination of the 8 voxels it reads). Each ray's segments are read
    largest bound first (two rounds of one segment per ray), then only those whose bound may still reach the ray's
    best (raised by a margin for float32's rounding), so the value and its depth are those of reading every segment.

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import occupancy_mipmap, render_view
    >>> volume = np.zeros((32, 32, 32), np.uint16); volume[4, 8, 8] = 7; volume[20, 8, 8] = 9
    >>> cells = np.asarray(occupancy_mipmap(volume)[3])
    >>> o, d = np.array([[0.0, 8.5, 8.5]]), np.array([[1.0, 0, 0]])  # through the voxel centres
    >>> float(render_view(volume, cells, o, d, step=1.0).values[0])  # samples at z = 0.5, 1.5, ...: the centres
    9.0
    >>> float(render_view(volume, cells, o, d).values[0])  # z = 20.25 and 20.75: 3/4 of 9 (trilinear)
    6.75
    >>> float(render_view(volume, cells, o, d, mode="minip").values[0])
    0.0
    """
    volume = validate.as_array("volume", volume)
    validate.check_real("volume", volume)
    shape = validate.check_ndim("volume", volume, ndim=3)
    cells = np.asarray(cells)
    if cells.dtype != np.bool_ or cells.ndim != 3:
        raise ValueError(f"cells must be a 3D bool occupancy grid; got {cells.dtype} of shape {cells.shape}")
    cell = cell_side(shape, cells.shape)
    if cell is None:
        raise ValueError(f"cells must have shape ceil({shape} / 2**k) for some k >= 2; got {cells.shape}")
    mode = validate.check_choice("mode", mode, MODES)
    step = validate.check_finite_scalar("step", step)
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
        params[0] = validate.check_finite_scalar("iso_threshold", iso_threshold)
    if mode == "attenuated_mip":
        if contrast_limits is None:
            raise ValueError("mode='attenuated_mip' needs contrast_limits (lo, hi)")
        lo, hi = (float(v) for v in contrast_limits)
        if not hi > lo:
            raise ValueError(f"contrast_limits must have hi > lo; got {contrast_limits}")
        params[:] = lo, hi, validate.check_finite_scalar("attenuation", attenuation)
    background = validate.check_finite_scalar("background", background)
    arguments = dict(volume=volume, cells=cells, o=o, d=d, shape=shape, cell=cell, out_shape=out_shape, mode=mode,
                     step=step, t_near=t_near, params=params, background=background, cache=cache,
                     cache_bytes=cache_bytes, cancel=cancel, skip_by_maxima=skip_by_maxima)  # fmt: skip
    if strategy.render_on_host():  # a TPU gathers slowly (core.runtime.strategy.render_on_host)
        with strategy.on_host():
            return _render(**arguments)
    return _render(**arguments)


def _render(*, volume, cells, o, d, shape, cell, out_shape, mode, step, t_near, params, background, cache, cache_bytes,
            cancel, skip_by_maxima):  # fmt: skip
    """:func:`render_view` after its checks, on JAX's default device."""
    if cache is None:
        cache = ChunkCache(volume, capacity=cache_bytes)
    elif cache.shape != tuple(shape):
        raise ValueError(f"cache is for a volume of shape {cache.shape}, not {shape}")
    cache.prepare(cells, cell)
    reads_before = cache.reads

    # the largest segment whose samples span less than a cell along every axis (at most 2 cells per axis), and
    # segments of more samples against cells 4 and 16 times as large, scanned first (coarsest first: a ray's
    # segments are looked at in finer ones only where the coarser one meets an occupied cell)
    scales = SCALES
    lengths = [1 << int(np.floor(np.log2((f * cell - 1) / step + 1))) for f in scales]
    lengths[-1] = segment = min(lengths[-1], 64)
    t0, n = sample_plan(o, d, shape, step, t_near)
    hit = np.flatnonzero(n > 0)
    rays_o, rays_d = o[hit].astype(np.float32), d[hit].astype(np.float32)
    rays_t0, rays_n = t0[hit].astype(np.float32), n[hit].astype(np.int32)
    # device_put, not jnp.asarray, for the arrays made here: jnp.asarray compiles a small copy program per new shape
    # (5 to 15 ms each, a dozen in a level's first render)
    step32, shape_device = np.float32(step), jax.device_put(np.asarray(shape, np.int32))
    if "boxes" not in cache.derived:  # per level (16x and 4x coarser cells, the cells): the bits of its cells'
        # boxes (one lookup a segment), and the cells themselves (marking chunks); kept with the cache
        grids = [coarser_cells(cells, f) for f in scales[:-1]] + [cells]
        cache.derived["boxes"] = [jax.device_put(_box_bits(g)) for g in grids]
        cache.derived["cells"] = jax.device_put(np.asarray(cells))
    boxes, cells_device = cache.derived["boxes"], cache.derived["cells"]

    def check() -> None:
        if cancel is not None and cancel():
            raise RenderCancelled

    packed = _pack(rays_o, rays_d, rays_t0, rays_n)
    padding = _pack(np.full((1, 3), -1, np.float32), np.zeros((1, 3), np.float32), np.zeros(1, np.float32),
                    np.zeros(1, np.int32))[0]  # fmt: skip

    def of_rays(index: np.ndarray, size: int) -> list:
        """The rays ``index`` (into the rays that meet the box), packed and padded to ``size``."""
        out = np.empty((size, 8), np.float32)
        # into place (indexing would copy twice); "clip": the default "raise" writes through a temporary
        np.take(packed, index, axis=0, out=out[: len(index)], mode="clip")
        out[len(index) :] = padding
        return [out]  # NumPy: the compiled call's own transfer is cheaper than jax.device_put's

    # 1. which segments meet an occupied cell: the coarsest segments of every ray, in blocks of SCAN_BLOCK up to the
    # ray's last sample (not the volume's diagonal: a close-up's rays are shorter), then finer ones inside the occupied
    # ones, level by level over all rays at once (full batches: each call's work is real, not padding)
    # (int32 throughout: these lists run to millions, and this machine is slow to hand out fresh pages)
    blocks = -(-rays_n // np.int32(SCAN_BLOCK * lengths[0]))
    r = np.repeat(np.arange(len(hit), dtype=np.int32), blocks)
    c = np.arange(len(r), dtype=np.int32) - np.repeat(np.cumsum(blocks, dtype=np.int32) - blocks, blocks)
    for level in range(len(scales)):  # c: each block's (then segment's) index along its ray
        split = SCAN_BLOCK if level == 0 else lengths[level - 1] // lengths[level]  # a power of two
        finer_r, finer_c = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]
        parts = [(r[a : a + REFINE_BATCH], c[a : a + REFINE_BATCH]) for a in range(0, len(r), REFINE_BATCH)]

        def refine(part, level=level, split=split):
            rr, cc = part
            return _refine(*of_rays(rr, REFINE_BATCH), _pad(cc, REFINE_BATCH),
                           boxes[level], step32, shape_device, lengths[level], split, scales[level] * cell)  # fmt: skip

        for (rr, cc), fine in _ahead(parts, refine, check):
            flat = np.flatnonzero(fine[: len(rr)])  # row-major: by coarse segment, then along it
            i = flat >> (split.bit_length() - 1)
            finer_r.append(rr[i])
            j = flat.astype(np.int32)
            j &= split - 1
            finer_c.append(cc[i] * split + j)
        r, c = np.concatenate(finer_r), np.concatenate(finer_c)
    # sorted by ray, then along it, as made: batches in ray order, np.flatnonzero in row-major order
    rays, segs = r, c

    # 2. the chunks their samples read in occupied cells, per batch of segments; bands of batches that fit
    batches = []
    pending = [(rays[a : a + SEGMENT_BATCH], segs[a : a + SEGMENT_BATCH]) for a in range(0, len(rays), SEGMENT_BATCH)]
    chunk_device, grid_device = (jax.device_put(np.asarray(v, np.int32)) for v in (cache.chunk, cache.grid))
    if min(cache.chunk) >= cell:
        mark = functools.partial(_mark_boxes, aligned=all(c % cell == 0 for c in cache.chunk))
    else:
        mark = _mark

    def marked(part):
        r, s = part
        return mark(*of_rays(r, SEGMENT_BATCH), _pad(s, SEGMENT_BATCH), cells_device, step32,
                    shape_device, chunk_device, grid_device, segment, cell, int(np.prod(cache.grid)))  # fmt: skip

    def settle(r, s, marked_ids) -> list:
        flags = np.zeros(int(np.prod(cache.grid)) + 1, bool)
        flags[marked_ids[: len(r)].ravel()] = True
        ids = np.flatnonzero(flags[:-1])
        if cache.fits(ids):
            return [(r, s, ids)]
        # more chunks than the cache holds: two halves (bands of rows), in order
        if len(r) == 1:
            raise ValueError(f"the cache holds {cache.slots} chunks ({cache.bricks} bricks); one segment needs "
                             f"{len(ids)} ({int(cache.counts[ids].sum())} bricks)")  # fmt: skip
        check()
        half = len(r) // 2
        return [*settle(r[:half], s[:half], np.asarray(marked((r[:half], s[:half])))),
                *settle(r[half:], s[half:], np.asarray(marked((r[half:], s[half:]))))]  # fmt: skip

    for (r, s), flat in _ahead(pending, marked, check):
        batches += settle(r, s, flat)
    bands, band, band_ids = [], [], np.zeros(0, np.int64)
    for r, s, ids in batches:
        union = np.union1d(band_ids, ids)
        if band and not cache.fits(union):
            bands.append((band, band_ids))
            band, union = [], ids
        band.append((r, s))
        band_ids = union
    if band:
        bands.append((band, band_ids))
    used = np.unique(np.concatenate([ids for _, ids in bands])) if bands else np.zeros(0)

    # 3. the skipped segments: each ray's samples outside the occupied segments are all background
    ray_n = n[hit]
    valid_counts = np.clip(ray_n[rays] - segs.astype(np.int64) * segment, 0, segment)
    first_of_ray = np.r_[True, rays[1:] != rays[:-1]] if len(rays) else np.zeros(0, bool)
    rank = np.arange(len(rays)) - np.maximum.accumulate(np.where(first_of_ray, np.arange(len(rays)), 0))
    gap = np.full(len(hit), np.iinfo(np.int64).max)  # the first segment of each ray not occupied
    if len(rays):
        starts = np.flatnonzero(first_of_ray)
        gap[rays[starts]] = np.minimum.reduceat(np.where(segs != rank, rank, np.iinfo(np.int64).max), starts)
    covered = np.bincount(rays, valid_counts, minlength=len(hit)).astype(np.int64)
    occupied_count = np.bincount(rays, minlength=len(hit))
    gap = np.where(gap == np.iinfo(np.int64).max, occupied_count, gap)  # occupied from 0 on: the first gap after
    any_skipped = covered < ray_n
    first_skipped = np.where(any_skipped, gap * segment, 0)
    t_skipped = (t0[hit] + (first_skipped + 0.5) * step).astype(np.float32)

    # 4. the values, band by band (attenuated_mip: the sums before each segment first)
    lo, hi, attenuation = (float(p) for p in params)
    prefix = np.zeros(len(rays), np.float32)
    per_sample, totals_before_gap = 0.0, None
    constants = (step32, shape_device, np.float32(background))
    # static: one program per layout; bricks of at least a cell: a segment's samples read 2 bricks per axis at most
    local = all(b >= cell for b in cache.brick)
    layout = {"brick": tuple(cache.brick), "per_chunk": tuple(cache.per_chunk)}
    gather_layout = {**layout, "local": local}
    # one band (the usual case: the pool holds the view's occupied cells): its arrays made once for both passes
    # mip with bricks of at least a cell: segments that cannot beat their ray's best are skipped (below)
    skipping = skip_by_maxima and mode == "mip" and local
    prepared = list(_band_batches(bands, cache, check)) if len(bands) == 1 and not skipping else None
    if mode == "attenuated_mip":
        per_sample = step * float(np.clip((background - lo) / (hi - lo), 0, 1))
        totals = np.zeros(len(rays), np.float64)

        def total(item):
            return _totals(*of_rays(item[1], SEGMENT_BATCH), *item[2], *constants, np.float32(lo), np.float32(hi),
                           segment, **gather_layout)  # fmt: skip

        for (index, _, _), out in _ahead(prepared or _band_batches(bands, cache, check), total, check, bool(prepared)):
            totals[index] = out[: len(index)]
        # the occupied segments before each one, and the background samples between them
        before = np.cumsum(totals) - totals
        before -= np.repeat((np.cumsum(totals) - totals)[first_of_ray], np.diff(np.r_[np.flatnonzero(first_of_ray),
                                                                                        len(rays)]))  # fmt: skip
        counted = np.cumsum(valid_counts) - valid_counts
        counted -= np.repeat(counted[first_of_ray], np.diff(np.r_[np.flatnonzero(first_of_ray), len(rays)]))
        skipped_before = np.minimum(segs.astype(np.int64) * segment, ray_n[rays]) - counted
        prefix = (before + skipped_before * per_sample).astype(np.float32)
        totals_before_gap = np.bincount(rays, np.where(segs < gap[rays], totals, 0), minlength=len(hit))
    values = np.full(len(hit), np.nan, np.float32)
    depth = np.full(len(hit), np.nan, np.float32)
    samples = len(rays) * segment
    params_device = jax.device_put(params)

    def reduce(item):
        index, r, part = item
        seg_prefix = _pad(prefix[index], SEGMENT_BATCH) if index is not None else np.zeros(SEGMENT_BATCH, np.float32)
        return _reduce(*of_rays(r, SEGMENT_BATCH), *part, *constants, params_device, seg_prefix, segment, mode,
                       **gather_layout)  # fmt: skip

    if skipping:
        # best first: per ray its segment of the largest bound, then only the segments whose bound may reach the
        # best value found (exact: a segment skipped holds no sample as large as a sample already found)
        floor = np.where(any_skipped, np.float32(background), -np.inf).astype(np.float32)
        samples = 0
        for band, ids in bands:
            check()
            table, atlas, tables = _loaded_band(cache, ids)
            arrays = (table,)
            maxima = jax.device_put(cache.brick_maxima())
            r = np.concatenate([part[0] for part in band])
            s = np.concatenate([part[1] for part in band])

            def bounded(a, r=r, s=s, tables=tables, table=arrays[0], maxima=maxima):
                return _bounds(*of_rays(r[a : a + SEGMENT_BATCH], SEGMENT_BATCH), _pad(s[a : a + SEGMENT_BATCH],
                               SEGMENT_BATCH), maxima, tables, table, step32, shape_device, constants[2], segment,
                               **layout)  # fmt: skip

            bound = np.empty(len(r), np.float32)
            for a, out in _ahead(range(0, len(r), SEGMENT_BATCH), bounded, check):
                bound[a : a + SEGMENT_BATCH] = out[: min(SEGMENT_BATCH, len(r) - a)]
            order = np.lexsort((-bound, r))  # by ray, then by decreasing bound
            ray_of = r[order]
            reach = (bound + np.abs(bound) * BOUND_MARGIN)[order]  # with float32's rounding of a sample
            left = np.ones(len(r), bool)  # not read yet, in `order`
            for round_ in range(MIP_ROUNDS + 1):
                # the segments whose bound may still reach their ray's best so far (NaN: none yet)
                left &= ~(reach < np.fmax(values[ray_of], floor[ray_of]))
                chosen = np.flatnonzero(left)
                if round_ < MIP_ROUNDS and len(chosen):  # each ray's largest bound left; the last round: all left
                    chosen = chosen[np.r_[True, ray_of[chosen][1:] != ray_of[chosen][:-1]]]
                left[chosen] = False
                chosen = order[chosen]
                samples += len(chosen) * segment
                parts = [
                    (None, r[chosen[a : a + SEGMENT_BATCH]], (_pad(s[chosen[a : a + SEGMENT_BATCH]], SEGMENT_BATCH),
                                                              atlas, tables, arrays[0]))
                    for a in range(0, len(chosen), SEGMENT_BATCH)
                ]  # fmt: skip
                for (_, rr, _), (v, t) in _ahead(parts, reduce, check):
                    ids, best_v, best_t = _per_ray(mode, rr, v[: len(rr)], t[: len(rr)])
                    values[ids], depth[ids] = _combine(mode, values[ids], depth[ids], best_v, best_t)
    else:
        batches = prepared or _band_batches(bands, cache, check)
        for (_, r, _), (v, t) in _ahead(batches, reduce, check, bool(prepared)):
            ids, best, best_t = _per_ray_sorted(mode, r, v[: len(r)], t[: len(r)])
            values[ids], depth[ids] = _combine(mode, values[ids], depth[ids], best, best_t)
    if mode in ("mip", "minip") or (mode == "iso" and background > params[0]):
        bg = np.where(any_skipped, background, np.nan).astype(np.float32)
        values, depth = _combine(mode, values, depth, bg, np.where(any_skipped, t_skipped, np.inf))
    elif mode == "attenuated_mip":  # the first background sample skipped is the least attenuated of them
        total = totals_before_gap + per_sample  # every sample before the first skipped one is in an occupied segment
        scaled = np.where(any_skipped, background * np.exp(-attenuation * (total - 1)), np.nan).astype(np.float32)
        values, depth = _combine("mip", values, depth, scaled, np.where(any_skipped, t_skipped, np.inf))
    out_values = np.full(len(o), np.nan, np.float32)
    out_depth = np.full(len(o), np.nan, np.float32)
    out_values[hit], out_depth[hit] = values, depth
    return ViewRender(
        out_values.reshape(out_shape),
        out_depth.reshape(out_shape),
        cache.reads - reads_before,
        len(used),
        int(np.prod(cache.grid)),
        samples,
        int(n.sum()),
    )


def _loaded_band(cache, ids):
    """Load a band's chunks ``ids`` into the cache: the chunk grid's slot table on the device (-1: not held), then
    the pool's arrays."""
    slots_of = cache.load(ids)
    table = np.full(cache.grid, -1, np.int32)
    table.flat[ids] = slots_of
    table = jax.device_put(table)
    atlas, tables = cache.device_arrays()
    return table, atlas, tables


def _band_batches(bands, cache, check):
    """(indices into the segment list, their rays, (segments, pool, tables, slot grid)) per batch, loading each
    band's chunks first."""
    start = 0
    for band, ids in bands:
        check()
        table, atlas, tables = _loaded_band(cache, ids)
        for r, s in band:
            index = np.arange(start, start + len(r))
            start += len(r)
            yield index, r, (_pad(s, SEGMENT_BATCH), atlas, tables, table)


def _per_ray(mode, rays, v, t):
    """Per-segment (value, t) of a batch reduced per ray (``rays`` sorted, a ray's segments in order along it):
    (the rays, their best value, its t); the best is the largest (smallest for minip) value at its first t, or
    for iso the first hit."""
    if mode == "iso":
        order = np.lexsort((t, rays))
    else:
        order = np.lexsort((t, v if mode == "minip" else -v, rays))
    r = rays[order]
    first = order[np.r_[True, r[1:] != r[:-1]]] if len(r) else order
    return rays[first], v[first], t[first]


def _per_ray_sorted(mode, rays, v, t):
    """:func:`_per_ray` for segments in the order the search makes them (by ray, then along it: ``t`` increases
    within a ray), without sorting: each ray's best by ``reduceat``, then the first segment holding it (the earliest
    ``t`` among equals, as :func:`_per_ray`'s sort takes). NaN values (a float volume's) go to :func:`_per_ray`."""
    if not len(rays) or np.isnan(v).any():
        return _per_ray(mode, rays, v, t)
    starts = np.flatnonzero(np.r_[True, rays[1:] != rays[:-1]])
    sizes = np.diff(np.r_[starts, len(rays)])
    if mode == "iso":  # the earliest hit (inf: none)
        is_best = t == np.repeat(np.minimum.reduceat(t, starts), sizes)
    else:
        best = (np.minimum if mode == "minip" else np.maximum).reduceat(v, starts)
        is_best = v == np.repeat(best, sizes)
    first = np.minimum.reduceat(np.where(is_best, np.arange(len(rays)), len(rays)), starts)
    return rays[first], v[first], t[first]


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
    gamma = validate.check_finite_scalar("gamma", gamma)
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
