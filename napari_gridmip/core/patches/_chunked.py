"""Dask twins: tiled runs on a dask image, and the fusion of a tile mosaic, output chunk by output chunk (the
merge's twin is :mod:`~napari_gridmip.core.patches._chunked_merge`, named here too).

Each output chunk is made from the tiles that touch it, by the in-memory kernel that the public function hands
in (:class:`TiledEngine` for the tiled runs, :func:`~napari_gridmip.core.patches.fuse.fuse_window` for the
fusion), so that nothing here imports the public functions' modules back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from napari_gridmip.core.patches._chunked_merge import MERGE_CHUNK, merge_patches  # noqa: F401 - the merge's twin
from napari_gridmip.core.patches._merge import merge_dtypes

# -- apply_tiled on a dask image ----------------------------------------------------


def _group_ranges(count: int, per_group: int) -> list[tuple[int, int]]:
    return [(first, min(first + per_group, count)) for first in range(0, count, per_group)]


def _box(axes: Any, ranges: Any, kind: str) -> list[tuple[int, int]]:
    """A group's box along every axis: ``"read"`` (its windows), ``"valid"`` or ``"owned"``."""
    box = []
    for a, (first, stop) in zip(axes, ranges):
        if kind == "read":
            box.append((int(a.starts[first]), int(a.starts[stop - 1]) + a.window))
        else:
            intervals = a.valid if kind == "valid" else a.owned
            box.append((int(intervals[first][0]), int(intervals[stop - 1][1])))
    return box


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    box = [(max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b)]
    return box if all(hi > lo for lo, hi in box) else None


def _local(box: list[tuple[int, int]], origin: list[tuple[int, int]]) -> tuple[Any, ...]:
    return (Ellipsis, *(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(box, origin)))


def _tasks(prefix: str) -> Any:
    """``task(label, fn, *args)``: a delayed call keyed ``prefix-label``, so that dask tokenizes nothing.

    Tokenizing the closures and the plan would cloudpickle them for every task
    (seconds for a few hundred tasks); one random prefix per call keeps keys unique.
    """
    import uuid

    import dask

    base = f"{prefix}-{uuid.uuid4().hex}"

    def task(label: str, fn: Any, *args: Any) -> Any:
        return dask.delayed(fn, name=f"{base}-{label}-fn", pure=True)(*args, dask_key_name=f"{base}-{label}")

    return task


class TiledEngine(NamedTuple):
    """The in-memory engine of :func:`~napari_gridmip.apply_tiled` that its dask twin runs in each task, handed
    in by the public function (this module imports nothing back from it)."""

    check_output: Callable
    make_merger: Callable
    run_windows: Callable
    label_dtype: Callable
    weighted_compute: Callable
    components: Callable


def apply_tiled(plan: Any, runner: Any, image: Any, batch: int, engine: TiledEngine) -> Any:
    """The lazy twin of the in-memory run (validated and planned by the caller, whose ``engine`` runs the windows).

    Windows are grouped, as many per axis as fit the image's first chunk along
    it (at least one), so output blocks follow the input's chunking; each
    output block is the pixels its group's windows own. ``"crop"``: one
    task per block runs its windows and copies. Weighted blends: one task per
    group adds its windows' weighted outputs over their valid box (a little
    larger than the block), and each block sums the parts of those boxes that
    fall on it, its own group's first, then the others in C order. Labels: one
    task per group labels its valid box (ids linked inside the group), small
    tasks pair the ids that two groups give to one pixel, one task links all
    pairs into a lookup table, and each block is its ids looked up; the label
    boxes are held until the table is made.
    """
    import dask.array as da

    tiled = engine
    task = _tasks("apply_tiled")
    d = len(plan.axes)
    out_shape, out_dtype = runner.probe(plan.lead + plan.window, image.dtype)
    tiled.check_output(plan, np.broadcast_to(np.zeros((), out_dtype), out_shape), None)
    lead_out = tuple(out_shape[: len(out_shape) - d])
    chunk_sides = [c[0] for c in image.chunks[len(image.chunks) - d :]]
    per_group = [max(1, round(side / a.stride)) for a, side in zip(plan.axes, chunk_sides)]
    axis_groups = [_group_ranges(a.count, g) for a, g in zip(plan.axes, per_group)]
    groups = list(np.ndindex(*(len(g) for g in axis_groups)))
    ranges = {g: [axis_groups[k][i] for k, i in enumerate(g)] for g in groups}
    owned = {g: _box(plan.axes, ranges[g], "owned") for g in groups}
    valid = {g: _box(plan.axes, ranges[g], "valid") for g in groups}

    def run(block: np.ndarray, group: tuple[int, ...], region: list[tuple[int, int]]) -> Any:
        read = _box(plan.axes, ranges[group], "read")
        merger = tiled.make_merger(plan, region, ranges[group])
        tiled.run_windows(plan, runner, block, [lo for lo, _ in read], merger, batch)
        return merger.result()

    def group_task(group: tuple[int, ...], region: list[tuple[int, int]]) -> Any:
        read = _box(plan.axes, ranges[group], "read")
        source = image[(Ellipsis, *(slice(lo, hi) for lo, hi in read))]
        return task(f"run-{group}-{region}", run, source, group, region)

    def shape_of(box: list[tuple[int, int]]) -> tuple[int, ...]:
        return lead_out + tuple(hi - lo for lo, hi in box)

    if plan.labels:
        dtype = tiled.label_dtype(out_dtype)
        blocks = _label_blocks(groups, owned, valid, group_task, shape_of, dtype, task, tiled.components)
    elif plan.blend == "crop":
        blocks = {
            g: da.from_delayed(group_task(g, owned[g]), shape=shape_of(owned[g]), dtype=out_dtype) for g in groups
        }
    else:
        compute = tiled.weighted_compute(np.dtype(out_dtype))
        result = merge_dtypes(np.dtype(out_dtype), "mean")[1]
        partials = {g: group_task(g, valid[g]) for g in groups}

        def combine(region: list[tuple[int, int]], parts: list[tuple[np.ndarray, list[tuple[int, int]]]]) -> np.ndarray:
            first, first_box = parts[0]
            out = np.array(first[_local(region, first_box)], dtype=compute)
            for part, box in parts[1:]:
                overlap = _intersect(region, box)
                out[_local(overlap, region)] += part[_local(overlap, box)]
            return out.astype(result, copy=False)

        blocks = {}
        for g in groups:
            others = [h for h in groups if h != g and _intersect(owned[g], valid[h]) is not None]
            parts = [(partials[h], valid[h]) for h in [g, *others]]
            summed = task(f"combine-{g}", combine, owned[g], parts)
            blocks[g] = da.from_delayed(summed, shape=shape_of(owned[g]), dtype=result)

    def nest(prefix: tuple[int, ...]) -> Any:
        if len(prefix) == d:
            return blocks[prefix]
        return [nest((*prefix, i)) for i in range(len(axis_groups[len(prefix)]))]

    return da.block(nest(()))


def _label_blocks(groups, owned, valid, group_task, shape_of, dtype, task, components: Callable) -> dict:
    """Labels: per-group ids linked across groups by one lookup-table task (see :func:`apply_tiled`)."""
    import dask.array as da

    labelled = {g: group_task(g, valid[g]) for g in groups}  # (ids over the valid box, count)
    ids = {g: labelled[g][0] for g in groups}
    counts = [labelled[g][1] for g in groups]
    index = {g: i for i, g in enumerate(groups)}

    def pair(a: np.ndarray, b: np.ndarray, box_a, box_b, shared) -> np.ndarray:
        x, y = a[_local(shared, box_a)], b[_local(shared, box_b)]
        both = (x > 0) & (y > 0)
        return np.unique(np.stack([x[both], y[both]], axis=1).astype(np.int64), axis=0)

    def present(a: np.ndarray, count: int, region, box) -> np.ndarray:
        seen = np.bincount(a[_local(region, box)].ravel(), minlength=count + 1) > 0
        seen[0] = False
        return seen

    links = []  # (group index of a, group index of b, delayed pairs)
    for g in groups:
        for h in groups:
            shared = _intersect(valid[g], owned[h]) if h != g else None
            if shared is not None:
                pairs = task(f"pair-{g}-{h}", pair, ids[g], ids[h], valid[g], valid[h], shared)
                links.append((index[g], index[h], pairs))
    seen = [task(f"present-{g}", present, ids[g], labelled[g][1], owned[g], valid[g]) for g in groups]

    def tables(counts: list[int], pairs: list[np.ndarray], seen: list[np.ndarray]) -> list[np.ndarray]:
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        n = int(offsets[-1]) + 1
        glued = [p + [offsets[i], offsets[j]] for (i, j, _), p in zip(links, pairs) if len(p)]
        if glued:
            both = np.concatenate(glued)
            root = components(n, both[:, 0], both[:, 1])
        else:
            root = np.arange(n)
        alive = np.zeros(n, bool)
        for i, s in enumerate(seen):
            alive[offsets[i] + np.flatnonzero(s)] = True
        rank = np.zeros(n, np.int64)
        roots = np.unique(root[alive])
        rank[roots] = np.arange(1, len(roots) + 1)
        if len(roots) > np.iinfo(dtype).max:
            raise ValueError(f"{len(roots)} labels do not fit fn's dtype {dtype}")
        lut = np.where(alive, rank[root], 0)
        return [np.concatenate([[0], lut[offsets[i] + 1 : offsets[i + 1] + 1]]) for i in range(len(counts))]

    luts = task("tables", tables, counts, [pairs for _, _, pairs in links], seen)

    def relabel(a: np.ndarray, luts: list[np.ndarray], i: int, region, box) -> np.ndarray:
        return luts[i][a[_local(region, box)]].astype(dtype)

    return {
        g: da.from_delayed(
            task(f"relabel-{g}", relabel, ids[g], luts, index[g], owned[g], valid[g]),
            shape=shape_of(owned[g]),
            dtype=dtype,
        )
        for g in groups
    }


def fuse_tiles(
    tiles: Any,
    positions: np.ndarray,
    origin: np.ndarray,
    extent: tuple[int, ...],
    *,
    has_channels: bool,
    blend: str,
    interpolation: str,
    compute: np.dtype,
    result: np.dtype,
    fill: float,
    chunk: int,
    kernel: Callable[..., Any],
) -> Any:
    """The mosaic of a dask tile stack, one task per output chunk (validated by the caller).

    Each task fuses the tiles whose footprint (plus the interpolation's taps)
    touches its chunk, in tile order, with the in-memory ``kernel`` (the caller's
    :func:`~napari_gridmip.core.patches.fuse.fuse_window`, handed in so that this
    module imports nothing back) on a window
    of the full chunk size (edge chunks cropped after): every pixel sums the
    same tiles in the same order as the in-memory mosaic. The tile count of a
    task is padded to a power of two with repeats of its first tile marked
    invalid, so that few programs are compiled.
    """
    import dask
    import dask.array as da

    d = len(extent)
    shape = np.asarray(tiles.shape[tiles.ndim - d :])
    channels = tiles.shape[1] if has_channels else 1
    lead = (channels,) if has_channels else ()
    placed = np.round(positions) if interpolation == "nearest" else positions
    foot_lo = np.floor(placed).astype(np.int64) - 2
    foot_hi = foot_lo + shape + 4
    bounds = [[(start, min(start + chunk, n)) for start in range(0, n, chunk)] for n in extent]
    window = tuple(min(chunk, n) for n in extent)

    def fused(sub_tiles, sub_positions, valid, window_origin, crop):
        stack = sub_tiles if has_channels else sub_tiles[:, None]
        out = kernel(
            stack, sub_positions, window_origin, window, blend=blend, interpolation=interpolation,
            compute=compute, result=result, fill=fill, valid=valid,
        )  # fmt: skip
        out = np.asarray(out)[(slice(None), *crop)]
        return out if has_channels else out[0]

    def block_at(index):
        lo = origin + np.array([bounds[a][i][0] for a, i in enumerate(index)])
        hi = origin + np.array([bounds[a][i][1] for a, i in enumerate(index)])
        size = tuple(int(b - a) for a, b in zip(lo, hi))
        touching = np.flatnonzero(np.all((foot_hi > lo) & (foot_lo < hi), axis=1))
        if len(touching) == 0:
            return da.full(lead + size, fill, dtype=result, chunks=lead + size)
        padded = 1 << math.ceil(math.log2(len(touching)))
        chosen = np.concatenate([touching, np.full(padded - len(touching), touching[0])])
        valid = np.arange(padded) < len(touching)
        crop = tuple(slice(0, s) for s in size)
        task = dask.delayed(fused, pure=True)(tiles[chosen], positions[chosen], valid, lo, crop)
        return da.from_delayed(task, shape=lead + size, dtype=result)

    def nest(prefix):
        if len(prefix) == d:
            return block_at(prefix)
        return [nest((*prefix, i)) for i in range(len(bounds[len(prefix)]))]

    return da.block(nest(()))
