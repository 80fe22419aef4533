"""A pyramid as one flat bit array, for lookups at a level chosen at run time (queries, ray traversal).

Each level's cells are packed in C order, 32 to a ``uint32`` word (cell ``i`` of
a level is bit ``i % 32`` of word ``i // 32`` of that level's run), and the runs
are concatenated, each starting on a word boundary. One gather then reads a
cell of any level: no per-level branches, 1/8 of the bool pyramid's memory.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from napari_gridmip.core.occupancy._bbox import bbox_of
from napari_gridmip.core.runtime import strategy

WORD = 32
MAX_LEVELS = 40  # tables are padded to this many levels, so that one program serves every pyramid


class FlatPyramid(NamedTuple):
    words: jax.Array  # uint32 (n_words,)
    offsets: jax.Array  # (L,) first bit of each level
    shapes: jax.Array  # (L, 3) each level's shape
    lo: jax.Array  # (3,) the occupied bounding box [lo, hi) (lo == hi == 0 when nothing is occupied)
    hi: jax.Array
    full: jax.Array  # the finest level whose every cell is occupied (the top, at least, when anything is)


def index_dtype(shapes: list[tuple[int, ...]]) -> np.dtype:
    """int32 while every bit index fits, else int64 (which needs x64: see ``precision_scope``)."""
    total = sum(-(-int(np.prod(s)) // WORD) * WORD for s in shapes)
    return np.dtype(np.int32) if total < 2**31 - 1 else np.dtype(np.int64)


def layout(shapes: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Bit offset of each level (word-aligned) and the shapes, as NumPy tables of ``MAX_LEVELS`` rows
    (the rows past the top repeat nothing: offset 0, shape 1 x 1 x 1)."""
    dtype = index_dtype(shapes)
    sizes = [-(-int(np.prod(s)) // WORD) * WORD for s in shapes]
    offsets = np.zeros(MAX_LEVELS, dtype)
    offsets[: len(shapes)] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    table = np.ones((MAX_LEVELS, 3), dtype)
    table[: len(shapes)] = shapes
    return offsets, table


def bucket(n: int, minimum: int = 1024) -> int:
    """The next power of two at or above ``n`` (and ``minimum``): array sizes that compiled programs share."""
    return max(minimum, 1 << max(int(n) - 1, 0).bit_length())


def _pack(level: jax.Array) -> jax.Array:
    bits = level.ravel()
    pad = -bits.size % WORD
    if pad:
        bits = jnp.pad(bits, (0, pad))
    weights = jnp.left_shift(jnp.uint32(1), jnp.arange(WORD, dtype=jnp.uint32))
    return (bits.reshape(-1, WORD).astype(jnp.uint32) * weights).sum(axis=1, dtype=jnp.uint32)


@jax.jit
def _pack_all(levels: list[jax.Array]) -> jax.Array:
    return jnp.concatenate([_pack(level) for level in levels])


def _pack_host(levels: list[Any]) -> np.ndarray:
    runs = []
    for level in levels:
        packed = np.packbits(np.asarray(level).ravel(), bitorder="little")
        runs.append(np.pad(packed, (0, -packed.size % 4)))
    return np.concatenate(runs).view("<u4")


def flatten(levels: list[Any]) -> FlatPyramid:
    """The flat form of a validated pyramid (NumPy or JAX levels). Call inside ``precision_scope(index dtype)``.

    The words are padded to a power of two and the tables to ``MAX_LEVELS`` rows,
    so that the programs that read them compile once for many pyramid shapes.
    Packed by NumPy on the CPU backend (reading a JAX CPU array costs nothing),
    by a jitted program where the levels live on an accelerator.
    """
    shapes = [tuple(int(n) for n in level.shape) for level in levels]
    offsets, table = layout(shapes)
    on_host = all(isinstance(level, np.ndarray) for level in levels) or strategy.on_cpu()
    if on_host:
        levels = [np.asarray(level) for level in levels]  # free for JAX arrays on the CPU backend
    words = _pack_host(levels) if on_host else _pack_all([jnp.asarray(level) for level in levels])
    padding = (0, bucket(words.shape[0]) - words.shape[0])
    # on the host where the words are: eager device ops each compiled a program on a first call
    words = jax.device_put(np.pad(words, padding)) if isinstance(words, np.ndarray) else jnp.pad(words, padding)
    box = bbox_of(levels)
    lo, hi = (np.zeros(3), np.zeros(3)) if box is None else (box.lo, box.hi)
    full = len(levels) - 1
    while full > 0 and bool(np.asarray(levels[full - 1]).all()):  # the coarse levels are small
        full -= 1
    kind = offsets.dtype
    return FlatPyramid(
        words, *jax.device_put((offsets, table, np.asarray(lo, kind), np.asarray(hi, kind), np.asarray(full, kind)))
    )


def top_level(flat: FlatPyramid) -> jax.Array:
    """Index of the (1, 1, 1) level: the first table row whose shape is 1 x 1 x 1."""
    return jnp.argmax(jnp.all(flat.shapes == 1, axis=1)).astype(flat.offsets.dtype)


def lookup(flat: FlatPyramid, k: jax.Array, cell: jax.Array) -> jax.Array:
    """Whether cell ``cell`` (level-``k`` coordinates, inside that level) is occupied. Traceable, vmappable."""
    shape = flat.shapes[k]
    kind = flat.offsets.dtype
    cell = cell.astype(kind)
    index = flat.offsets[k] + (cell[0] * shape[1] + cell[1]) * shape[2] + cell[2]
    word = flat.words[index // WORD]
    return ((word >> (index % WORD).astype(jnp.uint32)) & jnp.uint32(1)).astype(bool)
