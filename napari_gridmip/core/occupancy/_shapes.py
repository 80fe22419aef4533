"""The pyramid's level shapes: a leaf that the in-memory kernels and their dask twin both read."""

from __future__ import annotations


def mipmap_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes of every level for a volume of ``shape``, level 0 first.

    >>> mipmap_shapes((5, 2, 1))
    [(5, 2, 1), (3, 1, 1), (2, 1, 1), (1, 1, 1)]
    """
    shapes = [tuple(int(n) for n in shape)]
    while any(n > 1 for n in shapes[-1]):
        shapes.append(tuple((n + 1) // 2 for n in shapes[-1]))
    return shapes
