"""Summary images of a movie: the local correlation image of calcium imaging (CaImAn's ``Cn``).

Each pixel's value is the mean, over its in-image neighbours (8 or 4), of the Pearson correlation over time between
the pixel and the neighbour: a pixel inside a cell flickers with its neighbours and scores near 1, noise near 0.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import validate
from napari_gridmip.core.runtime import rates as _rates
from napari_gridmip.core.runtime import sharding as _sharding
from napari_gridmip.core.runtime import strategy
from napari_gridmip.core.runtime.precision import compute_dtype, is_wide, precision_scope
from napari_gridmip.core.runtime.sharding import wait_for
from napari_gridmip.core.runtime.transfer import aligned_empty, owned_to_device

__all__ = ["local_correlation_image"]

NEIGHBOURS = (8, 4)
# (row, column) offsets whose correlations make each neighbourhood; each serves both pixels of a pair
OFFSETS = {4: ((0, 1), (1, 0)), 8: ((0, 1), (1, 0), (1, 1), (1, -1))}
ALIGNMENT = 64  # bytes: a host buffer so aligned is aliased by JAX's CPU backend, not copied
CHUNK_BYTES = 64 * 2**20  # default chunk: this many bytes of compute-dtype frames
UNROLL_FRAMES = 8  # frames per step of the loop over a chunk (see _chunk_moments)

ProgressCallback = Callable[[int, int], None]


# -- moments of one chunk -----------------------------------------------------------------------


def _pair(a: jax.Array | np.ndarray, offset: tuple[int, int]) -> tuple[Any, Any]:
    """The two views of ``a`` (``(..., Y, X)``) whose elementwise pairs are the pixels ``p`` and ``p + offset``."""
    dy, dx = offset
    rows, cols = a.shape[-2:]
    first = a[..., : rows - dy, max(0, -dx) : cols - max(0, dx)]
    second = a[..., dy:, max(0, dx) : cols - max(0, -dx)]
    return first, second


def _neighbour(d: jax.Array, offset: tuple[int, int]) -> jax.Array:
    """``d[..., y + dy, x + dx]`` at every pixel (0 where that lies outside): the same shape as ``d``."""
    dy, dx = offset
    rows, cols = d.shape[-2:]
    padded = jnp.pad(d, [(0, 0)] * (d.ndim - 2) + [(0, dy), (max(0, -dx), max(0, dx))])
    first_col = max(0, -dx) + dx
    return padded[..., dy : dy + rows, first_col : first_col + cols]


def _frame_terms(d: jax.Array, offsets: tuple) -> tuple[jax.Array, ...]:
    """One centred frame's contributions, all image-shaped: its square, its product with each offset's
    neighbour (0 where the neighbour is outside), and itself; packed two to a complex number.

    XLA's CPU backend runs each of these sums as a loop of its own, each reading the frames again:
    packing the real sums in pairs into complex ones makes 3 loops of 6 sums (8 neighbours), 1.3x
    faster; image-shaped products (not cropped to each offset's pairs) keep the loops vectorised
    (cropped ones ran 3x slower).
    """
    terms = [d * d, *(d * _neighbour(d, o) for o in offsets), d]
    packed = [lax.complex(terms[k], terms[k + 1]) for k in range(0, len(terms) - 1, 2)]
    return (*packed, terms[-1]) if len(terms) % 2 else tuple(packed)


def _unpack(packed: tuple[jax.Array, ...], count: int) -> list[jax.Array]:
    """The ``count`` real sums of :func:`_frame_terms`'s packing."""
    out = []
    for p in packed:
        out.extend([p.real, p.imag] if jnp.iscomplexobj(p) else [p])
    return out[:count]


@partial(jax.jit, static_argnames=("offsets",))
def _chunk_moments(x: jax.Array, reference: jax.Array, count: jax.Array, *, offsets: tuple) -> tuple[jax.Array, ...]:
    """The moments of ``x - reference`` for a chunk ``x`` ``(B, F, Y, X)`` whose first ``count`` frames are real.

    ``reference`` is ``(B, Y, X)`` (zeros when the host already subtracted it). Returns a
    per-pixel centre ``m`` (the mean of the first block of real frames), the sums over the
    real frames of ``a**2`` and of each offset's products ``a_p a_q`` (cropped to the pairs
    inside the image: ``(B, Y, X)`` and smaller), where ``a = x - reference - m``, and the sum
    of ``a`` itself, with which the merge is exact whatever ``m``. Centring on the chunk's own
    data keeps the float32 sums exact to a few ulp whatever the movie's offset. The sums over
    frames run as multiply-adds unrolled over ``UNROLL_FRAMES`` frames in a loop over blocks
    of them (``F`` is a multiple): XLA's CPU backend makes one vectorised loop per sum of
    those; reductions over the frame axis ran 5x slower (512 x 512 frames), blocks of 16
    frames 2x slower.
    """
    frames = x.shape[1]
    real = (jnp.arange(frames) < count).astype(x.dtype)
    # the centre: the mean of the first block (any centre near the data keeps the sums exact, and the
    # deviation sum makes the merge exact for any; the whole chunk's mean cost one more pass, 8% more time)
    leading = real[:UNROLL_FRAMES]
    n = jnp.maximum(jnp.sum(leading), 1)
    mean = jnp.einsum("f,bfyx->byx", leading, x[:, :UNROLL_FRAMES], precision=lax.Precision.HIGHEST) / n - reference

    def block(i, acc):
        start = i * UNROLL_FRAMES
        frames_of_block = lax.dynamic_slice_in_dim(x, start, UNROLL_FRAMES, axis=1)
        weights = lax.dynamic_slice_in_dim(real, start, UNROLL_FRAMES)
        for f in range(UNROLL_FRAMES):
            d = ((frames_of_block[:, f] - reference) - mean) * weights[f]
            acc = tuple(a + t for a, t in zip(acc, _frame_terms(d, offsets)))
        return acc

    acc = tuple(jnp.zeros_like(t) for t in _frame_terms(mean, offsets))
    squares, *cross, deviation = _unpack(lax.fori_loop(0, frames // UNROLL_FRAMES, block, acc), 2 + len(offsets))
    return (mean, deviation, squares, *(_pair(c, o)[0] for c, o in zip(cross, offsets)))


@_rates.probe("products")
def _products_probe() -> tuple[Callable, Callable[[float], np.ndarray]]:
    """The correlation image's work for the placement's rates (core.runtime.rates): the per-frame sums of products with
    the 4 neighbour offsets over 16 frames of 512^2 float32 (16 MiB)."""
    offsets = OFFSETS[8]

    def program(x: jax.Array) -> tuple:
        def frame(f: Any, sums: tuple) -> tuple:
            d = lax.dynamic_index_in_dim(x, f, keepdims=False) - x[0]
            return tuple(s + t for s, t in zip(sums, _frame_terms(d, offsets)))

        return lax.fori_loop(0, x.shape[0], frame, _frame_terms(x[0] * 0, offsets))

    def data(scale: float) -> np.ndarray:
        side = max(8, round(512 * scale))
        return np.ones((16, side, side), np.float32)

    return program, data


def padded_frames(frames: int) -> int:
    """A chunk's frames rounded up to a whole number of :data:`UNROLL_FRAMES` blocks."""
    return -(-frames // UNROLL_FRAMES) * UNROLL_FRAMES


@partial(jax.jit, static_argnames=("offsets",), donate_argnums=(0,))
def _merge(totals: tuple, count: jax.Array, moments: tuple, *, offsets: tuple) -> tuple:
    """Add a chunk of ``count`` frames to the float64 ``totals`` (donated: updated in place), from its centre
    ``m`` and its sums of ``a = x - m`` (Chan et al.'s update): ``sum x = n m + sum a``,
    ``sum x^2 = sum a^2 + m (2 sum a + n m)``, ``sum x_p x_q = sum a_p a_q + m_p (n m_q + sum a_q) + m_q sum a_p``.
    """
    s1, s2, *cross = totals
    mean, deviation, squares, *centred = (m.astype(jnp.float64) for m in moments)
    scaled = count * mean + deviation  # the chunk's sum of x
    out = [s1 + scaled, s2 + squares + mean * (scaled + deviation)]
    for total, products, offset in zip(cross, centred, offsets):
        m_p, m_q = _pair(mean, offset)
        a_p, a_q = _pair(deviation, offset)
        out.append(total + products + m_p * (count * m_q + a_q) + m_q * a_p)
    return tuple(out)


@partial(jax.jit, static_argnames=("offsets",), donate_argnums=0)
def _merge_each(totals: tuple, counts: jax.Array, stacked: tuple, *, offsets: tuple) -> tuple:
    """:func:`_merge` of each device's part of a chunk in turn, in one program (a part of no frames adds 0)."""
    for part in range(counts.shape[0]):
        totals = _merge(totals, counts[part], tuple(m[part] for m in stacked), offsets=offsets)
    return totals


def _at_pair(values: Any, offset: tuple[int, int], xp: Any = jnp) -> tuple[Any, Any]:
    """``values`` (one per pair of pixels ``p``, ``p + offset``) zero-padded to the image twice: at ``p``,
    and at ``p + offset``."""
    dy, dx = offset
    lead = [(0, 0)] * (values.ndim - 2)
    at_first = xp.pad(values, lead + [(0, dy), (max(0, -dx), max(0, dx))])
    at_second = xp.pad(values, lead + [(dy, 0), (max(0, dx), max(0, -dx))])
    return at_first, at_second


def _neighbour_counts(shape: tuple[int, int], offsets: tuple) -> np.ndarray:
    """How many of the neighbours each pixel has inside the image (NumPy, once per shape)."""
    counts = np.zeros(shape)
    for offset in offsets:
        ones = np.ones(_pair(counts, offset)[0].shape)
        for padded in _at_pair(ones, offset, np):
            counts += padded
    return counts


@partial(jax.jit, static_argnames=("offsets",))
def _image(totals: tuple, n: jax.Array, neighbours: jax.Array, *, offsets: tuple) -> jax.Array:
    """The local correlation image ``(B, Y, X)`` from the float64 totals of ``n`` frames."""
    s1, s2, *cross = totals
    std = jnp.sqrt(jnp.maximum(s2 - s1 * s1 / n, 0))
    total = jnp.zeros_like(s1)
    for products, offset in zip(cross, offsets):
        s1_p, s1_q = _pair(s1, offset)
        std_p, std_q = _pair(std, offset)
        scale = std_p * std_q
        # 0 for a pair with a constant pixel; NaN (from NaN frames) stays NaN; clipped for rounding
        r = jnp.clip(jnp.where(scale == 0, 0, (products - s1_p * s1_q / n) / jnp.where(scale == 0, 1, scale)), -1, 1)
        for padded in _at_pair(r, offset):
            total = total + padded
    return jnp.where(neighbours > 0, total / jnp.where(neighbours > 0, neighbours, 1), jnp.nan)


class _Moments:
    """The movie's moments so far, in float64 on the device, merged chunk by chunk."""

    def __init__(self, shape: tuple[int, int, int], offsets: tuple):
        self.offsets = offsets
        self.n = 0
        with precision_scope(np.float64):
            # sum of x - reference, of its square, and of the products with each offset's neighbour
            shapes = [shape, shape, *(_pair(np.empty(shape, bool), o)[0].shape for o in offsets)]
            # distinct buffers: they are donated. From the host: an eager jnp.zeros is one more program to
            # compile per shape on a first call (bench_first_run.py)
            self.totals = tuple(owned_to_device(np.zeros(s)) for s in shapes)

    def add(self, count: int, moments: tuple) -> None:
        """Merge a chunk of ``count`` frames (see :func:`_merge`)."""
        self.n += count
        with precision_scope(np.float64):
            self.totals = _merge(self.totals, np.float64(count), moments, offsets=self.offsets)

    def add_each(self, counts: np.ndarray, stacked: tuple) -> None:
        """Merge the parts of a chunk that devices computed side by side (:func:`sent_parts`):
        ``counts[d]`` frames whose moments are ``stacked``'s entry ``d``, in device order."""
        self.n += int(counts.sum())
        with precision_scope(np.float64):
            here = next(iter(self.totals[0].devices()))  # each part crosses to the totals' device
            self.totals = _merge_each(
                self.totals, counts.astype(np.float64), jax.device_put(stacked, here), offsets=self.offsets
            )

    def packed(self) -> np.ndarray:
        """``(2 + offsets, B, Y, X)`` NumPy float64: the sums, the cross sums zero-padded to the image (dask
        sums these over the chunks)."""
        with precision_scope(np.float64):
            s1, s2, *cross = (np.asarray(t) for t in self.totals)
        out = np.zeros((2 + len(self.offsets),) + s1.shape)
        out[0], out[1] = s1, s2
        for k, (total, offset) in enumerate(zip(cross, self.offsets)):
            _pair(out[2 + k], offset)[0][...] = total
        return out

    @classmethod
    def unpacked(cls, packed: np.ndarray, n: int, offsets: tuple) -> _Moments:
        moments = cls(packed.shape[1:], offsets)
        moments.n = n
        with precision_scope(np.float64):
            parts = [packed[0], packed[1], *(_pair(packed[2 + k], o)[0] for k, o in enumerate(offsets))]
            moments.totals = tuple(jnp.asarray(np.ascontiguousarray(p)) for p in parts)
        return moments

    def image(self) -> np.ndarray:
        """The local correlation image ``(B, Y, X)``, NumPy float64."""
        with precision_scope(np.float64):
            counts = jax.device_put(_neighbour_counts(self.totals[0].shape[-2:], self.offsets))
            return np.asarray(_image(self.totals, np.float64(max(self.n, 1)), counts, offsets=self.offsets))


# -- feeding chunks -------------------------------------------------------------------------------


def _work_dtype(source: np.dtype) -> np.dtype:
    """The precision of ``movie - reference``: the input's own for floats (a float32 difference is correctly
    rounded), int64 for integers and bools (exact)."""
    if source == np.bool_ or np.issubdtype(source, np.integer):
        return np.dtype(np.int64)
    if source.itemsize < 4 or source.name == "bfloat16":
        return np.dtype(np.float32)  # their differences are exact in float32
    return source


def host_chunk(chunk: np.ndarray, reference: np.ndarray, frames: int, dtype: np.dtype) -> np.ndarray:
    """``chunk - reference`` ``(B, n, Y, X)``, computed in the input's precision, rounded once into a ``dtype``
    buffer of ``frames`` frames (zeros after the ``n`` real ones) that JAX's CPU backend aliases."""
    batch, count, rows, cols = chunk.shape
    buffer = aligned_empty((batch, frames, rows, cols), dtype)
    if chunk.dtype == np.bool_:
        chunk, reference = chunk.view(np.uint8), reference.view(np.uint8)
    work = _work_dtype(np.dtype(chunk.dtype))
    np.subtract(chunk, reference[:, None], out=buffer[:, :count], dtype=work, casting="unsafe")
    buffer[:, count:] = 0
    return buffer


def chunk_moments_of_host(chunk: np.ndarray, reference: np.ndarray, frames: int, dtype: np.dtype, offsets: tuple):
    """The moments of a NumPy chunk ``(B, n, Y, X)`` minus ``reference`` ``(B, Y, X)``, ``n <= frames``, padded to
    whole blocks (dispatched to the device: the result is ready later).

    A whole chunk already of the compute dtype, C-contiguous and 64-byte aligned (a memory-mapped
    ``.npy`` file's, for one) goes to JAX as it is (its CPU backend aliases such buffers: no copy)
    and the reference is subtracted on the device, in the same precision; any other chunk is
    copied once, minus the reference, into an aligned buffer of the compute dtype.
    """
    program, arguments = sent_chunk(chunk, reference, frames, dtype, offsets)
    return program(*arguments)


def sent_chunk(chunk: np.ndarray, reference: np.ndarray, frames: int, dtype: np.dtype, offsets: tuple
               ) -> tuple[Callable, tuple]:  # fmt: skip
    """:func:`chunk_moments_of_host` in two halves: ``(program, arguments)``, the chunk prepared on the host and
    sent to JAX's default device here (the host's work and the transfer), and the program whose call
    ``program(*arguments)`` dispatches its moments (the device's work)."""
    count = chunk.shape[1]
    with precision_scope(dtype):
        if sent_as_held(chunk.dtype):
            x, ref = (jax.device_put(part) for part in held_chunk(chunk, reference, padded_frames(frames)))
            return partial(_held_chunk_moments, dtype=dtype.name, offsets=offsets), (x, ref, np.int32(count))
        if (
            count == padded_frames(frames)
            and chunk.dtype == dtype
            and chunk.flags.c_contiguous
            and chunk.ctypes.data % ALIGNMENT == 0
        ):
            x, ref = jax.device_put(chunk), jax.device_put(np.ascontiguousarray(reference))
        else:
            x = owned_to_device(host_chunk(chunk, reference, padded_frames(frames), dtype))
            ref = jax.device_put(np.zeros(reference.shape, dtype))
        return partial(_chunk_moments, offsets=offsets), (x, ref, np.int32(count))


def _prefetched(send: Callable[[int], Any], starts: list[int], dtype: np.dtype) -> Iterator[Any]:
    """``send(start)`` for each of ``starts``, in order, each next one run in a thread while the caller works on
    the one before: off the host CPU, where a chunk's read, host copy and transfer (the host's and the link's work)
    then overlap the merge of the chunk before it (the moments' trip back and the float64 merge on the host of a
    TPU), one chunk ahead. On the CPU, where JAX aliases the host's buffer and nothing crosses, in turn."""
    if strategy.on_cpu() or len(starts) == 1:
        yield from (send(start) for start in starts)
        return
    device = strategy._target_device()  # JAX's default device is the thread's: the caller's, named for the worker
    context = contextvars.copy_context()  # the placement setting and the job's log follow into the worker

    def in_turn(start: int) -> Any:
        with jax.default_device(device), precision_scope(dtype):
            return send(start)

    with ThreadPoolExecutor(1, thread_name_prefix="napari-gridmip chunk read") as pool:
        ahead = pool.submit(context.copy().run, in_turn, starts[0])
        try:
            for following in starts[1:]:
                sent = ahead.result()
                ahead = pool.submit(context.copy().run, in_turn, following)
                yield sent
            yield ahead.result()
        finally:  # closed early (a stop, an error): a read not started is dropped, one under way is waited for
            ahead.cancel()


def sent_parts(chunk: np.ndarray, reference: np.ndarray, frames: int, dtype: np.dtype, offsets: tuple,
               devices: tuple) -> tuple[Callable, tuple, np.ndarray]:  # fmt: skip
    """:func:`sent_chunk` split over ``devices`` along the frames: ``(program, arguments, counts)``, each device's
    count of real frames, and the program whose call ``program(*arguments)`` dispatches every part's moments,
    stacked along a leading axis (:meth:`_Moments.add_each`).

    The chunk minus the reference (or as held, :func:`sent_as_held`) is written once into a host buffer of
    ``len(devices)`` equal parts of whole :data:`UNROLL_FRAMES` blocks; ``jax.device_put`` with a
    :class:`~jax.sharding.NamedSharding` sends each part to its device (each over its own link where devices have
    their own), and one ``shard_map`` program computes every part's moments at once
    (:mod:`napari_gridmip.core.runtime.sharding`).
    """
    count, parts = chunk.shape[1], len(devices)
    per_device = padded_frames(-(-frames // parts))
    counts = np.clip(count - per_device * np.arange(parts), 0, per_device).astype(np.int32)
    with precision_scope(dtype):
        mesh = _sharding.mesh(devices)
        layout = (1, None, _sharding.ONE_EACH)
        if sent_as_held(chunk.dtype):
            x, ref = held_chunk(chunk, reference, per_device * parts)
            program = _sharding.per_device(
                _held_chunk_moments, mesh, layout, (("dtype", dtype.name), ("offsets", offsets))
            )
        else:
            x, ref = host_chunk(chunk, reference, per_device * parts, dtype), np.zeros(reference.shape, dtype)
            program = _sharding.per_device(_chunk_moments, mesh, layout, (("offsets", offsets),))
        x = jax.device_put(x, _sharding.split(mesh, axis=1))
        ref = jax.device_put(ref, _sharding.split(mesh, axis=None))
    return program, (x, ref, jax.device_put(counts, _sharding.split(mesh, axis=0))), counts


def sent_as_held(source: np.dtype) -> bool:
    """Whether a host chunk of ``source`` crosses to the device as the source holds it, and is widened there
    (:func:`held_chunk`, :func:`_held_chunk_moments`), rather than widened on the host (:func:`host_chunk`).

    Where the work runs off the host CPU (the call's device, inside the caller's precision scope) and the source
    takes at most 2 bytes an element: bool, 8- and 16-bit integers, float16 and bfloat16 cross at a quarter or
    half of float32's bytes, over a link that is the memory-bound kernels' cost (core.runtime.rates). On the CPU the
    host's one pass writes the difference where JAX aliases it: nothing crosses.
    """
    return not strategy.on_cpu() and np.dtype(source).itemsize <= 2


def held_chunk(chunk: np.ndarray, reference: np.ndarray, frames: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, reference)``: the chunk ``(B, n, Y, X)`` in its own dtype, in an aligned buffer of ``frames`` frames
    (zeros after the ``n`` real ones, which the moments weigh 0), and the reference ``(B, Y, X)`` as held."""
    batch, count, rows, cols = chunk.shape
    buffer = aligned_empty((batch, frames, rows, cols), chunk.dtype)
    buffer[:, :count] = chunk
    buffer[:, count:] = 0
    return buffer, np.ascontiguousarray(reference)


@partial(jax.jit, static_argnames=("dtype", "offsets"))
def _held_chunk_moments(x: jax.Array, reference: jax.Array, count: jax.Array, *, dtype: str, offsets: tuple):
    """:func:`_chunk_moments` of a chunk sent as held (:func:`held_chunk`): ``x - reference`` computed on the device
    as :func:`host_chunk` computes it on the host (integers exactly in int32, floats in float32), rounded once
    into ``dtype``."""
    work = jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int32
    wide = (x.astype(work) - reference[:, None].astype(work)).astype(dtype)
    return _chunk_moments(wide, jnp.zeros(reference.shape, dtype), count, offsets=offsets)


@partial(jax.jit, static_argnames=("frames", "dtype"))
def _device_chunk(movie: jax.Array, reference: jax.Array, start: jax.Array, *, frames: int, dtype: Any) -> jax.Array:
    """Frames ``[start, start + frames)`` of a JAX movie ``(B, T, Y, X)`` minus the reference, as ``dtype``.

    One shape for every chunk: the last one is sliced from earlier (a dynamic slice is clamped),
    rolled so that its new frames come first, and the rest zeroed, as the host chunks are padded.
    """
    total = movie.shape[1]
    first = jnp.minimum(start, total - frames)
    block = jnp.roll(lax.dynamic_slice_in_dim(movie, first, frames, axis=1), first - start, axis=1)
    work = _work_dtype(np.dtype(movie.dtype))
    block = (block.astype(work) - reference[:, None].astype(work)).astype(dtype)
    fresh = jnp.arange(frames) < total - start
    block = jnp.where(fresh[None, :, None, None], block, 0)
    return jnp.pad(block, ((0, 0), (0, padded_frames(frames) - frames), (0, 0), (0, 0)))


def default_chunk_frames(batch: int, rows: int, cols: int, dtype: np.dtype) -> int:
    """As many frames as make ``CHUNK_BYTES`` of ``dtype`` (at least one)."""
    return max(1, CHUNK_BYTES // (batch * rows * cols * np.dtype(dtype).itemsize))


# -- the dask twin's kernels (handed to it: it imports nothing from here) ------------------------------


def _block_moments(chunk: np.ndarray, reference: np.ndarray, frames: int, *, dtype: np.dtype, offsets: tuple):
    """The moments of a dask block's frames ``chunk`` ``(1, n, Y, X)`` minus ``reference`` ``(1, Y, X)``, as a
    :class:`_Moments` (dispatched to the device: its ``packed()`` waits for them)."""
    moments = _Moments((1, *chunk.shape[-2:]), offsets)
    moments.add(chunk.shape[1], chunk_moments_of_host(chunk, reference, frames, dtype, offsets))
    return moments


def _packed_image(packed: np.ndarray, frames: int, *, offsets: tuple) -> np.ndarray:
    """The local correlation image ``(1, Y, X)``, NumPy float64, of ``frames`` frames' summed packed moments
    ``(2 + offsets, 1, Y, X)`` (see :meth:`_Moments.packed`)."""
    return _Moments.unpacked(packed, frames, offsets).image()


# -- public API --------------------------------------------------------------------------------


def local_correlation_image(
    movie: Any,
    *,
    neighbours: int = 8,
    dtype: Any = None,
    chunk_frames: int | None = None,
    progress: ProgressCallback | None = None,
) -> Any:
    """The local correlation image of a movie (CaImAn's ``Cn``, as its ``local_correlations_fft`` gives it).

    Parameters
    ----------
    movie
        ``(..., T, Y, X)``: T frames of Y x X pixels, any leading batch axes
        (each movie on its own); bool, integer or real float; NumPy, JAX, Zarr
        or dask. NaN in a pixel makes its value, and its neighbours', NaN.
    neighbours
        8 (default: the 3x3 neighbourhood) or 4 (the pixels sharing a side).
    dtype
        ``float32`` (default) or ``float64``: the precision of each chunk's
        sums (the merge across chunks is always float64).
    chunk_frames
        Frames per chunk; default as many as make 64 MiB of ``dtype``. A dask
        movie keeps its own chunks along T when each is under 256 MiB.
    progress
        Optional ``progress(done, total)``, called after each chunk of frames
        (``total`` chunks); it may raise to stop the computation. For a dask
        movie it is called from the task that finished the chunk, in this
        process's threads (pass None on a distributed cluster).

    Returns
    -------
    jax.Array, or dask.array.Array for dask inputs
        ``(..., Y, X)``, ``dtype``: each pixel's Pearson correlation over the
        T frames with each of its in-image neighbours, averaged over the
        neighbours it has (a corner pixel has 3 of 8, an edge pixel 5; with 4
        neighbours, 2 and 3). A pair with a constant pixel (zero variance)
        correlates as 0 and still counts, as in CaImAn's FFT variant; a
        one-pixel image, with no neighbours, gives NaN. Values lie in
        [-1, 1]. A dask movie gives a lazy dask array: one task per chunk of
        frames (whole images), a tree sum of the chunks' float64 moments, and
        a last task for the image, so memory holds a few chunks, never the
        movie.

    Raises
    ------
    ValueError
        If ``movie`` has fewer than 3 axes or a zero-length axis, its dtype is
        not real, ``neighbours`` is not 8 or 4, or ``chunk_frames`` is not a
        positive integer.
    TypeError
        If ``movie`` is not an array.

    Notes
    -----
    The values are those of CaImAn's ``local_correlations_fft`` (and of its ``local_correlations`` with 4
    neighbours); with 8, CaImAn's ``local_correlations`` adds two of its four diagonal pairs to a pixel that is not in
    the pair (``benchmarks/probes/caiman_check.py``, docs/timeseries.md).

    The movie is read once, in chunks of frames. Each chunk's moments (per pixel, and per pixel and neighbour offset:
    sums of squares and products, centred on the chunk's own data) are computed on the device in the compute dtype,
    after subtracting a reference frame (the movie's first) in the input's own precision; the chunks' moments are
    merged on the host in float64 (Chan, Golub and LeVeque's pairwise update), so memory holds two chunks and a few
    images of sums, and long movies lose no precision to running sums. ``corr(p, q) = corr(q, p)``: the 8 neighbours
    cost 4 offsets.

    References
    ----------
    A. Giovannucci et al., "CaImAn an open source tool for scalable calcium
    imaging data analysis", eLife 8, e38173 (2019); ``caiman.summary_images``.
    T. F. Chan, G. H. Golub and R. J. LeVeque, "Algorithms for computing the
    sample variance: analysis and recommendations", Am. Stat. 37(3), 242-247
    (1983).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> movie = rng.normal(size=(200, 16, 16))
    >>> movie[:, 4:8, 4:8] += 3 * rng.normal(size=(200, 1, 1))  # a cell flickering as one
    >>> image = np.asarray(local_correlation_image(movie))
    >>> bool(image[5, 5] > 0.8 and abs(image[12, 12]) < 0.2)
    True
    """
    movie = validate.as_array("movie", movie)
    validate.check_real("movie", movie)
    shape = validate.check_ndim("movie", movie, min_ndim=3)
    validate.check_nonempty("movie", shape)
    if isinstance(neighbours, (bool, np.bool_)) or neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours must be 8 or 4; got {neighbours!r}")
    dtype = compute_dtype(dtype)
    if chunk_frames is not None:
        (chunk_frames,) = validate.int_tuple("chunk_frames", [chunk_frames])
    offsets = OFFSETS[int(neighbours)]
    # where this machine's rates say the call finishes first (core.runtime.rates): a link can be slower than the host's
    # pass
    with strategy.memory_bound_place(movie, kernel="local_correlation_image"):
        return _local_correlation_image(movie, shape, offsets, dtype, chunk_frames, progress)


def _local_correlation_image(movie, shape, offsets, dtype, chunk_frames, progress):
    lead, (frames_total, rows, cols) = shape[:-3], shape[-3:]
    if validate.is_dask(movie):
        from napari_gridmip.core.correlation import _chunked  # the dask twin: dask.array takes 0.5 s to import

        return _chunked.local_correlation_image(
            movie,
            offsets,
            dtype,
            chunk_frames,
            progress,
            default_frames=default_chunk_frames(1, rows, cols, dtype),
            largest=4 * CHUNK_BYTES,
            # the blocks run in dask's threads, later: where memory_bound_place put this call
            # (core.runtime.strategy.keep_place)
            # (and on every local device in turn: core.runtime.sharding.spread_blocks)
            moments_of=_sharding.spread_blocks(
                strategy.keep_place(partial(_block_moments, dtype=dtype, offsets=offsets))
            ),
            image_of=strategy.keep_place(partial(_packed_image, offsets=offsets)),
        )
    batch = math.prod(lead)
    # a NumPy (or Zarr) movie's chunks are split over every local device of the platform the work runs on (inside
    # the precision scope: a float64 call on a TPU runs on its host), and a JAX movie stays on its own
    with precision_scope(dtype):
        devices = (None,) if isinstance(movie, jax.Array) else _sharding.band_devices()
    default = default_chunk_frames(batch, rows, cols, dtype) * len(devices)  # each device's part as on one
    chunk_frames = min(chunk_frames or default, frames_total)
    starts = list(range(0, frames_total, chunk_frames))
    moments = _Moments((batch, rows, cols), offsets)
    if isinstance(movie, jax.Array):
        scope = precision_scope(movie.dtype if is_wide(movie.dtype) else dtype)
        flat = movie.reshape((batch, frames_total, rows, cols))

        def send(start):  # nothing crosses: the chunk is sliced on its device when its moments are dispatched
            return partial(dispatch, start)

        def dispatch(start):
            block = _device_chunk(flat, flat[:, 0], np.int32(start), frames=chunk_frames, dtype=dtype.name)
            count = np.int32(min(chunk_frames, frames_total - start))
            zero = jax.device_put(np.zeros(block.shape[:1] + block.shape[2:], block.dtype))
            return partial(moments.add, int(count), _chunk_moments(block, zero, count, offsets=offsets))

        sending = (send(start) for start in starts)

    else:
        scope = precision_scope(dtype)
        reference = np.asarray(movie[..., 0, :, :]).reshape(batch, rows, cols)

        def send(start):
            """The chunk read, prepared and sent (host and link); the call that dispatches its moments and returns
            their merge (the device's work)."""
            chunk = np.asarray(movie[..., start : start + chunk_frames, :, :])
            chunk = chunk.reshape(batch, chunk.shape[-3], rows, cols)
            if len(devices) > 1:
                program, arguments, counts = sent_parts(chunk, reference, chunk_frames, dtype, offsets, devices)
                return lambda: partial(moments.add_each, counts, program(*arguments))
            program, arguments = sent_chunk(chunk, reference, chunk_frames, dtype, offsets)
            return lambda: partial(moments.add, chunk.shape[1], program(*arguments))

        sending = _prefetched(send, starts, dtype)

    with scope:
        # one chunk in flight while the next is read and prepared: JAX dispatches asynchronously, so each merge
        # is waited for before the next chunk is read. Without the wait the loop ran ahead of the computation,
        # each queued chunk's buffer alive until its turn: 898 MiB over the movie for a 2000 x 512^2 NumPy movie
        # (14 chunks of 64 MiB), and a Zarr movie read faster than it is computed could queue all of itself
        # closed on a stop or an error: the read-ahead thread and the chunk it holds go at once
        with contextlib.closing(sending):
            merge = _merge_chunks(sending, moments, len(starts), progress)
        merge()
        _report(progress, len(starts), len(starts))
    image = moments.image().reshape(lead + (rows, cols))
    with precision_scope(dtype):
        return jax.device_put(image.astype(dtype))


def _merge_chunks(sending: Iterator[Callable], moments: _Moments, total: int, progress: ProgressCallback | None
                  ) -> Callable[[], None]:  # fmt: skip
    """Dispatch each sent chunk's moments and merge the one before it, waiting for that merge before the next chunk
    is taken; returns the last chunk's merge, still to do."""
    merge = None  # the chunk in flight's merge into the moments
    for done, sent in enumerate(sending):
        following = sent()
        if merge is not None:
            merge()
            wait_for(moments.totals)
            _report(progress, done, total)
        merge = following
    return merge


def _report(progress: ProgressCallback | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)
