"""Dask twins: the merge of a patch stack and the fusion of a tile mosaic, output chunk by output chunk.

Each output chunk is made from the patches (tiles) that touch it, by the in-memory kernel.

Max and overwrite merges equal the in-memory result bit for bit; weighted
merges (mean, gaussian, hann) agree within 2 ulp, since a chunk's sub-grid sums
its patches in another order (tests/core/test_chunked.py states it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MERGE_CHUNK = 1024  # output chunk of a merge along each tiled axis, unless the caller gives one


def merge_patches(
    patches: Any,
    image_shape: tuple[int, ...],
    stride: tuple[int, ...],
    *,
    blend: str,
    sigma_scale: float,
    result_dtype: np.dtype,
    chunk: int = MERGE_CHUNK,
) -> Any:
    """The merged image of a dask patch stack, one task per output chunk (validated by the caller).

    Each output chunk merges only the patches that touch it, as a sub-grid
    with the same origin rule (its first patch at 0, its last one flush with
    its end when the whole grid's is), so each pixel sums the same patches
    with the same weights as the whole merge.
    """
    import dask
    import dask.array as da

    from napari_gridmip.core.patches.grid import patch_origins

    d = len(stride)
    patch_size = patches.shape[patches.ndim - d :]
    lead = image_shape[: len(image_shape) - d]
    tiled = image_shape[len(image_shape) - d :]
    origins = [patch_origins(n, p, s) for n, p, s in zip(tiled, patch_size, stride)]
    bounds = [[(start, min(start + chunk, n)) for start in range(0, n, chunk)] for n in tiled]

    def merged_block(sub_patches: np.ndarray, sub_shape: tuple[int, ...], crop: tuple[slice, ...]) -> np.ndarray:
        from napari_gridmip.core.patches.grid import merge_patches as in_memory

        out = np.asarray(in_memory(sub_patches, sub_shape, stride, blend=blend, sigma_scale=sigma_scale))
        return out[(Ellipsis, *crop)]

    def block_at(index: tuple[int, ...]) -> Any:
        grid_slices, sub_tiled, crop = [], [], []
        for axis, i in enumerate(index):
            start, stop = bounds[axis][i]
            o = origins[axis]
            first = int(np.searchsorted(o + patch_size[axis], start, side="right"))  # first patch ending past start
            last = int(np.searchsorted(o, stop, side="left")) - 1  # last patch starting before stop
            grid_slices.append(slice(first, last + 1))
            sub_tiled.append(int(o[last] + patch_size[axis] - o[first]))
            crop.append(slice(start - int(o[first]), stop - int(o[first])))
        sub = patches[tuple(grid_slices)]
        shape = tuple(stop - start for start, stop in (bounds[axis][i] for axis, i in enumerate(index)))
        task = dask.delayed(merged_block, pure=True)(sub, lead + tuple(sub_tiled), tuple(crop))
        return da.from_delayed(task, shape=lead + shape, dtype=result_dtype)

    def nest(prefix: tuple[int, ...]) -> Any:
        axis = len(prefix)
        if axis == d:
            return block_at(prefix)
        return [nest((*prefix, i)) for i in range(len(bounds[axis]))]

    # da.block joins the nested list along the last d axes
    return da.block(nest(()))


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


def apply_tiled(plan: Any, runner: Any, image: Any, batch: int) -> Any:
    """The lazy twin of the in-memory run (validated and planned by the caller).

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

    from napari_gridmip.core.patches import tiled

    task = _tasks("apply_tiled")
    d = len(plan.axes)
    out_shape, out_dtype = runner.probe(plan.lead + plan.window, image.dtype)
    tiled._check_output(plan, np.broadcast_to(np.zeros((), out_dtype), out_shape), None)
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
        blocks = _label_blocks(groups, owned, valid, group_task, shape_of, tiled.label_dtype(out_dtype), task)
    elif plan.blend == "crop":
        blocks = {
            g: da.from_delayed(group_task(g, owned[g]), shape=shape_of(owned[g]), dtype=out_dtype) for g in groups
        }
    else:
        compute = tiled._weighted_compute(np.dtype(out_dtype))
        result = tiled.merge_dtypes(np.dtype(out_dtype), "mean")[1]
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


def _label_blocks(groups, owned, valid, group_task, shape_of, dtype, task) -> dict:
    """Labels: per-group ids linked across groups by one lookup-table task (see :func:`apply_tiled`)."""
    import dask.array as da

    from napari_gridmip.core.patches import tiled

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
            root = tiled._components(n, both[:, 0], both[:, 1])
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
) -> Any:
    """The mosaic of a dask tile stack, one task per output chunk (validated by the caller).

    Each task fuses the tiles whose footprint (plus the interpolation's taps)
    touches its chunk, in tile order, with the in-memory kernel on a window
    of the full chunk size (edge chunks cropped after): every pixel sums the
    same tiles in the same order as the in-memory mosaic. The tile count of a
    task is padded to a power of two with repeats of its first tile marked
    invalid, so that few programs are compiled.
    """
    import dask
    import dask.array as da

    from napari_gridmip.core.patches.fuse import fuse_window

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
        out = fuse_window(
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
