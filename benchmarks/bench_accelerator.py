"""The library on an accelerator against the same library on the host CPU: speed, transfers and agreement.

Peers: the same cases on the CPU (``JAX_PLATFORMS=cpu``), each backend in a worker process of its own; per case the
first call, warm calls with host inputs, device inputs and device-resident outputs, and the outputs' differences.

    python -m benchmarks run accelerator [--quick] [--cases dic,dic_affine] [--table accelerator.md]
    python benchmarks/bench_accelerator.py --list                  # the cases and their full sizes
    python benchmarks/bench_accelerator.py --table-only --workdir DIR  # the table of every case in DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(HERE), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from _harness import device, note, record, start_run  # noqa: E402 - the harness imports NumPy alone, not JAX

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
SUBSAMPLE = 1_000_000


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Why: the kernels are written once for XLA, and a backend may be fast and wrong (on a TPU the subset sweep's running
sums once came out 80% off). Each case is run on the default backend and on the CPU, each backend in
one process of its own (the CPU one with ``JAX_PLATFORMS=cpu``: the parent never imports JAX, and runs the two
workers one after the other, as one process holds a TPU chip), and the outputs are compared element by element.

Per case, in the worker (``--worker --backend default|cpu --out FILE.json``):

- the inputs are made on the host (NumPy, seeded; the makers of the other benchmarks and of
  ``napari_gridmip._sample_data``), not timed;
- *first call*: the process's first call of the case, compiling included (JAX's persistent compilation cache is
  switched off in the workers unless ``--keep-compile-cache``, so a first call compiles; programs that an earlier
  case compiled are not compiled again, so the order of ``--cases`` matters a little);
- *warm, host inputs*: NumPy in, best of ``--repeats``;
- *warm, device inputs*: the inputs ``jax.device_put`` first (not timed), best of ``--repeats`` (a first call
  that compiles a new program for device inputs is left out and called again);
- every timed call ends with ``jax.block_until_ready`` on its outputs and ``np.asarray`` of each: bringing the
  results to the host is part of the call, as for a user;
- *warm, device-resident*: device inputs again, the outputs waited for but left on the device (no
  ``np.asarray``): the kernel's own time, as in a pipeline whose next step runs on the device too (a 1024^3
  occupancy pyramid is 1.2 GB of bools to bring back, more time than its compute);
- the device's peak memory so far (``memory_stats()``; None on the CPU), the programs compiled by the first call;
- the first call's outputs are saved whole (``FILE.<case>.npz``) when they fit in ``--save-limit-gib``, else
  the same 1e6 evenly spaced elements of each array on both backends.

A case whose first call takes longer than ``--case-timeout`` seconds skips its warm calls; its warm calls stop
once the case has taken that long (at least one of each is made). The worker rewrites FILE.json after every
case, so a crash keeps the cases before it, and a failing case records its error and the run goes on. A record
already at FILE.json keeps its other cases: runs split by ``--cases`` into one ``--workdir`` add up.

The parent then writes a Markdown table (``--table FILE.md``, default stdout): per case the first and warm
times on both backends, the speed-ups without and with the transfers, the largest difference (absolute, and
relative to the CPU output's largest magnitude; bool outputs: the count of differing elements; a NaN in one
output and not the other is counted apart) and both NaN fractions. The outputs are deleted after the table
(``--keep-npz`` keeps them); the differences stay in the work folder's ``differences.json``.

``render_view``'s volume is a Zarr store read chunk by chunk, never a device array: its "host inputs" calls
start from an empty chunk cache (every chunk read again), its "device inputs" calls keep one cache (the live
view's warm render: the chunks' occupied cells already in the pool). The 2048^3 sample is written once into
``--sample-dir`` (default: the sample's own cache folder; about 10 s, 27 MB); ``--render-size`` makes it smaller.

Only napari_gridmip's core, NumPy, SciPy, dask and zarr are imported (no napari, no Qt): it runs on a bare
accelerator host from the repository root.
"""


@dataclasses.dataclass
class Options:
    """What the input makers need from the command line."""

    quick: bool
    render_size: int
    sample_dir: str | None


@dataclasses.dataclass
class Case:
    """One benchmark case: ``make`` builds host inputs and a description; ``call`` runs the library on them.

    ``to_device``: how the inputs go to the device (default: ``jax.device_put`` of every NumPy array, lists
    included); it may return None where the case has no device inputs.
    """

    name: str
    full: str  # the full-size case, for --list
    make: Callable[[Options], tuple[dict[str, Any], str]]
    call: Callable[[dict[str, Any]], Any]
    to_device: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None


# -- inputs and calls -----------------------------------------------------------------------------------------


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _occupancy(o: Options) -> tuple[dict[str, Any], str]:
    n = 128 if o.quick else 1024
    volume = _rng().random((n, n, n), dtype=np.float32)  # bench_mipmap's volume, as float32 values
    volume[n // 4 : n // 2, n // 4 : n // 2, n // 3 : n // 2] = 1.0  # scattered voxels above 0.995 and a block
    return {"volume": volume}, f"{n}^3 float32, threshold 0.995"


def _max_mipmap(o: Options) -> tuple[dict[str, Any], str]:
    n = 64 if o.quick else 512
    return {"volume": _rng().random((n, n, n), dtype=np.float32)}, f"{n}^3 float32"


def _max_mipmap_uint8(o: Options) -> tuple[dict[str, Any], str]:
    n = 128 if o.quick else 1024
    volume = _rng().integers(0, 256, (n, n, n), dtype=np.uint8)  # crosses at a byte a voxel, as the source holds it
    return {"volume": volume}, f"{n}^3 uint8"


def _pearson(o: Options) -> tuple[dict[str, Any], str]:
    n, k = (64 if o.quick else 512), 10
    rng = _rng()  # bench_correlation's inputs: independent uniform stacks
    img1 = rng.random((k, n, n), dtype=np.float32)
    img2 = rng.random((k, n, n), dtype=np.float32)
    return {"img1": img1, "img2": img2}, f"K={k}, {n}^2 float32, window 15x15, offsets_first=True"


def _speckles(frames: int, n: int, dtype: Any = np.float32) -> dict[str, Any]:
    """A speckle stack and its displaced copy (field up to 1.6 px): img1 = sample, img2 = reference."""
    from napari_gridmip._sample_data import make_speckle_pair

    sample, reference, _ = make_speckle_pair(frames=frames, shape=(n, n))
    return {"img1": sample.astype(dtype), "img2": reference.astype(dtype)}


def _displacement(o: Options) -> tuple[dict[str, Any], str]:
    n = 256 if o.quick else 2048
    return _speckles(10, n), f"K=10, {n}^2 float32 speckle pair, window 15x15, hessian"


def _displacement_refine(o: Options) -> tuple[dict[str, Any], str]:
    n = 128 if o.quick else 1024
    return _speckles(10, n), f"K=10, {n}^2 float32 speckle pair, window 15x15, refine"


def _displacement_f64(o: Options) -> tuple[dict[str, Any], str]:
    n = 32 if o.quick else 256
    return _speckles(10, n, np.float64), f"K=10, {n}^2 float64 speckle pair, window 15x15, dtype=float64"


def _dic_pair(n: int) -> dict[str, Any]:
    from napari_gridmip._sample_data.dic import make_dic_pair

    reference, deformed, _ = make_dic_pair((n, n))  # the sample's field: up to 4.6 px, strains up to 0.6%
    # float32 as bench_dic.py passes them; img1 = deformed (DIC's convention)
    return {"img1": deformed[None].astype(np.float32), "img2": reference[None].astype(np.float32)}


def _dic(o: Options) -> tuple[dict[str, Any], str]:
    n = 256 if o.quick else 2048
    return _dic_pair(n), f"{n}^2 8-bit pair as float32, window 11x11, subset 31, step 4, refine"


def _dic_affine(o: Options) -> tuple[dict[str, Any], str]:
    n = 128 if o.quick else 1024
    return _dic_pair(n), f"{n}^2 8-bit pair as float32, window 11x11, subset 31, step 4, refine, affine"


def _dic_series(o: Options) -> tuple[dict[str, Any], str]:
    from napari_gridmip._sample_data.dic_series import make_dic_series

    n, count = (128, 4) if o.quick else (512, 8)
    frames, truth = make_dic_series("rotation", frames=count, shape=(n, n))  # 20 degrees a frame, a disk's mask
    return {"frames": frames, "roi": truth["roi"]}, f"{count} x {n}^2 uint8 rotation sequence, subset 31, step 8, ROI"


def _dic_series_call(i: dict[str, Any]) -> Any:
    # the whole Series (NumPy on the host: the loop's guesses and statuses are host work between frames)
    return _gm().correlate_series(i["frames"], subset=31, step=8, roi=i["roi"])


def _dic_series_turning(o: Options) -> tuple[dict[str, Any], str]:
    from bench_series import peer_sequence

    n, count = (128, 4) if o.quick else (512, 10)
    frames, _ = peer_sequence("rotation", count, (n, n))  # 4 degrees a frame about the centre, speckle to the edges
    return {"frames": frames}, f"{count} x {n}^2 uint8 rotation sequence, 4 degrees a frame, subset 31, step 8"


def _dic_series_turning_call(i: dict[str, Any]) -> Any:
    # under "accelerator": on the default device even where a rule would move the series' IC-GN to the host
    with _gm().compute_on("accelerator"):
        return _gm().correlate_series(i["frames"], subset=31, step=8)


def _mosaic(o: Options) -> tuple[dict[str, Any], str]:
    from napari_gridmip._sample_data.mosaic import make_mosaic

    grid, tile = ((3, 3), 256) if o.quick else ((6, 6), 512)
    sample = make_mosaic(grid_shape=grid, tile_shape=(tile, tile), overlap=0.1, stage_error=8, seed=2)
    # half the tiles drowned in white noise: their pairs go to the broad band's second search
    noise = np.random.default_rng(3).standard_normal(sample.tiles.shape).astype(np.float32)
    tiles = sample.tiles + 3 * noise * float(sample.tiles.std()) * (np.arange(len(sample.tiles)) % 2)[:, None, None]
    what = f"{grid[0]}x{grid[1]} tiles of {tile}^2, 10% overlap, +-8 px, half the tiles noisy; JAX engine"
    return {"tiles": tiles, "stage": sample.stage_positions}, what


def _register_tiles_call(i: dict[str, Any]) -> Any:
    from napari_gridmip.core.patches import stitch

    stitch.FORCE_ENGINE = "jax"  # the compiled engine (a mosaic this size would take NumPy's on the host)
    try:
        result = _gm().register_tiles(i["tiles"], i["stage"], max_shift=16)
    finally:
        stitch.FORCE_ENGINE = None
    return {"positions": result.positions, "ncc": result.ncc, "accepted": result.accepted.astype(np.int8),
            "broad_band": result.broad_band.astype(np.int8)}  # fmt: skip


def _tracking(o: Options) -> tuple[dict[str, Any], str]:
    n = 64 if o.quick else 512
    inputs = _speckles(20, n)
    return {"sample": inputs["img1"], "reference": inputs["img2"]}, f"K=20, {n}^2, window 11x11, subset 5x5"


def _movie(o: Options) -> tuple[dict[str, Any], str]:
    from bench_timeseries import make_movie

    frames, n = (250, 64) if o.quick else (2000, 512)
    return {"movie": make_movie(frames, n)}, f"{frames} x {n}^2 float32, 8 neighbours"


def _movie_uint16(o: Options) -> tuple[dict[str, Any], str]:
    inputs, what = _movie(o)
    movie = np.clip(inputs["movie"] * 100, 0, 65535).astype(np.uint16)  # about 10000 +- 300: a camera's counts
    return {"movie": movie}, what.replace("float32", "uint16 (counts)")


def _patches(o: Options) -> tuple[dict[str, Any], str]:
    grid, patch = 16, (32 if o.quick else 256)
    patches = _rng().random((grid, grid, 3, patch, patch), dtype=np.float32)
    side = grid * patch
    return {"patches": patches}, f"({grid}, {grid}, 3, {patch}, {patch}) float32 -> (3, {side}, {side}), no overlap"


def _traverse(o: Options) -> tuple[dict[str, Any], str]:
    from bench_mipmap import numpy_reshape_any
    from bench_traverse import clustered

    from napari_gridmip import orthographic_rays

    size, m = (64, 100) if o.quick else (512, 1024)
    occupied = clustered(size, 0.01)  # three balls and three shells, 1% of the voxels
    levels = numpy_reshape_any(occupied)  # occupancy_mipmap's levels, made on the host
    rays = orthographic_rays(np.full(3, size / 2), np.array([0.8, 0.5, 0.33]), (0, -1, 0), (m, m),
                             pixel_size=1.8 * size / m)  # fmt: skip
    inputs = {
        "levels": levels,
        "origins": rays.origins.reshape(-1, 3).astype(np.float32),
        "directions": rays.directions.reshape(-1, 3).astype(np.float32),
    }
    return inputs, f"{size}^3 clustered, {occupied.mean():.2%} occupied, {m * m} orthographic rays"


def _closeup(size: int, canvas: tuple[int, int]) -> dict[str, Any]:
    """bench_live_render.py's close-up view (perspective 40), as LiveSource.render makes its level-0 rays."""
    from napari_gridmip.core.occupancy.camera import camera_rays

    center = np.full(3, size / 2)
    view = np.array([-0.62, 0.45, 0.64])
    view /= np.linalg.norm(view)
    up = np.array([0.3, -0.9, 0.2])
    fit = min(canvas) / (size * 1.5)
    close = center + np.array([0.1, -0.12, 0.08]) * size
    rays = camera_rays(close, view, up, canvas, zoom=fit * 6, perspective=40.0, handedness="right",
                       image_shape=canvas)  # fmt: skip
    return {"origins": rays.origins, "directions": rays.directions, "t_near": rays.t_near}


def _render(o: Options) -> tuple[dict[str, Any], str]:
    from napari_gridmip._sample_data.sparse import open_sparse_volume

    size = 256 if o.quick else o.render_size
    canvas = (75, 100) if o.quick else (600, 800)
    levels, attrs = open_sparse_volume(size, folder=o.sample_dir)  # written on first use, then read from there
    inputs = {"volume": levels[0], "cells": attrs["cells"], "cell": int(attrs["cell"]), **_closeup(size, canvas)}
    return inputs, (
        f"{size}^3 sparse sample ({attrs['occupied']:.3%} occupied), close-up (perspective 40), "
        f"canvas {canvas[1]}x{canvas[0]}, mip"
    )


def _render_call(i: dict[str, Any]) -> Any:
    from napari_gridmip import render_view
    from napari_gridmip.core.occupancy.raycast import ChunkCache

    cache = i["cache"] if "cache" in i else ChunkCache(i["volume"], capacity=512 << 20)  # fresh: every chunk read
    # LiveSource.render's arguments for level 0: step min(0.8, (cell - 1) / 3), napari's display defaults
    return render_view(i["volume"], i["cells"], i["origins"], i["directions"], mode="mip",
                       step=min(0.8, (i["cell"] - 1) / 3), t_near=i["t_near"], iso_threshold=1000.0,
                       contrast_limits=(0.0, 2000.0), attenuation=0.05, background=0.0, cache=cache)  # fmt: skip


def _render_on_chip_call(i: dict[str, Any]) -> Any:
    """:func:`_render_call` with the render kept on the default device even on a TPU (``render_on_host`` off)."""
    from napari_gridmip.core.runtime import strategy

    chosen = strategy.render_on_host
    strategy.render_on_host = lambda: False
    try:
        return _render_call(i)
    finally:
        strategy.render_on_host = chosen


def _dic_affine_call(i: dict[str, Any]) -> Any:
    return _gm().find_displacement(
        i["img1"], i["img2"], (11, 11), subset=(31, 31), step=4, subpixel="refine", shape="affine"
    )


def _render_device(i: dict[str, Any]) -> dict[str, Any]:
    """One chunk cache kept across the calls, filled here (not timed) by a render of the same view."""
    from napari_gridmip.core.occupancy.raycast import ChunkCache

    kept = {**i, "cache": ChunkCache(i["volume"], capacity=512 << 20)}
    _render_call(kept)
    return kept


def _gm() -> Any:
    import napari_gridmip as gm

    return gm


def _merge(i: dict[str, Any]) -> Any:
    grid, _, channels, patch, _ = i["patches"].shape
    return _gm().merge_patches(i["patches"], (channels, grid * patch, grid * patch), (patch, patch))


CASES = [
    Case("occupancy_mipmap", "occupancy_mipmap 1024^3 float32", _occupancy,
         lambda i: _gm().occupancy_mipmap(i["volume"], threshold=0.995)),
    Case("max_mipmap", "max_mipmap 512^3 float32", _max_mipmap, lambda i: _gm().max_mipmap(i["volume"])),
    Case("max_mipmap_uint8", "max_mipmap 1024^3 uint8", _max_mipmap_uint8, lambda i: _gm().max_mipmap(i["volume"])),
    Case("windowed_pearson", "windowed_pearson K=10 512^2 15x15 offsets_first", _pearson,
         lambda i: _gm().windowed_pearson(i["img1"], i["img2"], (15, 15), offsets_first=True)),
    Case("find_displacement", "find_displacement K=10 2048^2 15x15 (hessian)", _displacement,
         lambda i: _gm().find_displacement(i["img1"], i["img2"], (15, 15))),
    Case("find_displacement_refine", "find_displacement subpixel='refine' K=10 1024^2 15x15",
         _displacement_refine, lambda i: _gm().find_displacement(i["img1"], i["img2"], (15, 15), subpixel="refine")),
    Case("dic", "DIC 2048^2, window 11, subset 31, step 4, refine", _dic,
         lambda i: _gm().find_displacement(i["img1"], i["img2"], (11, 11), subset=(31, 31), step=4,
                                           subpixel="refine")),
    Case("dic_affine", "DIC shape='affine' 1024^2, window 11, subset 31, step 4, refine", _dic_affine,
         _dic_affine_call),
    Case("dic_series", "correlate_series 8 x 512^2 rotation sequence, subset 31, step 8, ROI", _dic_series,
         _dic_series_call, lambda i: None),
    Case("dic_series_turning", "correlate_series 10 x 512^2, 4 degrees a frame, subset 31, step 8, on the device",
         _dic_series_turning, _dic_series_turning_call, lambda i: None),
    Case("register_tiles", "register_tiles 6x6 of 512^2, half noisy (broad band), JAX engine", _mosaic,
         _register_tiles_call, lambda i: None),
    Case("track_speckles", "track_speckles K=20 512^2, window 11, subset 5", _tracking,
         lambda i: _gm().track_speckles(i["sample"], i["reference"], (11, 11), subset=(5, 5))),
    Case("local_correlation_image", "local_correlation_image 2000 x 512^2", _movie,
         lambda i: _gm().local_correlation_image(i["movie"])),
    Case("local_correlation_image_uint16", "local_correlation_image 2000 x 512^2 uint16", _movie_uint16,
         lambda i: _gm().local_correlation_image(i["movie"])),
    Case("merge_patches", "merge_patches (16, 16, 3, 256, 256) -> 4096^2", _patches, _merge),
    Case("traverse_occupied", "traverse_occupied 512^3, 1024^2 rays", _traverse,
         lambda i: _gm().traverse_occupied(i["levels"], i["origins"], i["directions"], t_near=-np.inf)),
    Case("find_displacement_f64", "find_displacement float64 K=10 256^2 15x15", _displacement_f64,
         lambda i: _gm().find_displacement(i["img1"], i["img2"], (15, 15), dtype=np.float64)),
    Case("render_view", "render_view, 2048^3 sparse sample, close-up (--render-size)", _render, _render_call,
         _render_device),
    Case("render_view_on_chip", "render_view as above, on the default device even on a TPU (render_on_host off)",
         _render, _render_on_chip_call, _render_device),
]  # fmt: skip
BY_NAME = {case.name: case for case in CASES}


# -- the worker -----------------------------------------------------------------------------------------------


def leaves(result: Any, prefix: str = "") -> dict[str, Any]:
    """The arrays (and numbers) in a result: NamedTuples and dataclasses by field, lists by index."""
    if hasattr(result, "_asdict"):
        items = list(result._asdict().items())
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        items = [(f.name, getattr(result, f.name)) for f in dataclasses.fields(result)]
    elif isinstance(result, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(result)]
    elif isinstance(result, dict):
        items = list(result.items())
    elif result is None or isinstance(result, str):
        return {}
    else:
        return {prefix or "out": result}
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


class Compiles:
    """Counts XLA compilations (and their seconds) through jax.monitoring."""

    def __init__(self) -> None:
        import jax.monitoring

        self.count, self.seconds = 0, 0.0
        jax.monitoring.register_event_duration_secs_listener(self._event)

    def _event(self, event: str, duration: float, **_: Any) -> None:
        if event == COMPILE_EVENT:
            self.count += 1
            self.seconds += duration


def timed(
    call: Callable[[dict[str, Any]], Any], inputs: dict[str, Any], *, fetch: bool = True
) -> tuple[float, dict[str, np.ndarray]]:
    """One call: the library, waiting for its outputs, and each output brought to the host as NumPy (unless not
    ``fetch``: then the outputs stay where they are, and none are returned)."""
    import jax

    start = time.perf_counter()
    found = leaves(call(inputs))
    jax.block_until_ready(list(found.values()))
    arrays = {key: np.asarray(value) for key, value in found.items()} if fetch else {}
    return time.perf_counter() - start, arrays


def device_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Every NumPy array (lists of them too) put on the default device; the dtypes must survive."""
    import jax

    def put(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            moved = jax.device_put(value)
            if moved.dtype != value.dtype:
                raise TypeError(f"jax.device_put made {value.dtype} into {moved.dtype}")
            return moved
        if isinstance(value, list):
            return [put(v) for v in value]
        return value

    wide = any(isinstance(v, np.ndarray) and v.dtype.itemsize == 8 for v in inputs.values())
    if wide:  # float64 stays float64 only with x64 on
        with jax.enable_x64(True):
            moved = {key: put(value) for key, value in inputs.items()}
    else:
        moved = {key: put(value) for key, value in inputs.items()}
    return jax.block_until_ready(moved)


def memory(device: Any) -> dict[str, int] | None:
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - not every backend has them
        return None
    if not stats:
        return None
    return {key: int(stats[key]) for key in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if key in stats}


def summary(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    out = {}
    for key, a in arrays.items():
        entry: dict[str, Any] = {"shape": list(a.shape), "dtype": str(a.dtype)}
        if a.dtype.kind == "f" and a.size:
            finite = np.isfinite(a)
            entry["nan_fraction"] = float(np.isnan(a).mean())
            entry["finite_sum"] = float(np.sum(a, where=finite, dtype=np.float64))
        elif a.size:
            entry["sum"] = float(np.sum(a, dtype=np.float64))
        out[key] = entry
    return out


def save_outputs(path: Path, arrays: dict[str, np.ndarray], limit_bytes: float) -> str:
    """The whole outputs, or the same evenly spaced 1e6 elements of each larger array when they are too big."""
    total = sum(a.nbytes for a in arrays.values())
    if total <= limit_bytes:
        np.savez(path, **arrays)
        return "whole"
    kept = {}
    for key, a in arrays.items():
        flat = a.reshape(-1)
        kept[key] = flat[np.linspace(0, flat.size - 1, SUBSAMPLE).round().astype(np.int64)] if flat.size > SUBSAMPLE \
            else a  # fmt: skip
    np.savez(path, **kept)
    return f"subsample of {SUBSAMPLE} elements per array ({total / 2**30:.1f} GiB whole)"


def warm(
    case: Case,
    inputs: dict[str, Any],
    repeats: int,
    deadline: float,
    compiles: Compiles,
    label: str,
    result: dict[str, Any],
    *,
    fetch: bool = True,
) -> None:
    """Best of ``repeats`` calls; a first call that compiles is left out (and made again)."""
    times: list[float] = []
    calls = 0
    while len(times) < repeats:
        before = compiles.count
        seconds, arrays = timed(case.call, inputs, fetch=fetch)
        del arrays
        calls += 1
        if compiles.count > before and calls == 1:
            result[f"{label}_compiled_first"] = compiles.count - before
            result[f"{label}_first_s"] = seconds
        else:
            times.append(seconds)
            if compiles.count > before:
                result.setdefault("notes", []).append(f"{label}: a warm call compiled {compiles.count - before}")
        if times and time.perf_counter() > deadline and len(times) < repeats:
            result.setdefault("notes", []).append(f"{label}: {len(times)} of {repeats} repeats (case budget)")
            break
    result[f"{label}_s"] = min(times)
    result[f"{label}_all_s"] = times


def run_case(case: Case, opts: Options, args: argparse.Namespace, device: Any, compiles: Compiles) -> dict[str, Any]:
    result: dict[str, Any] = {"status": "ok"}
    start = time.perf_counter()
    stage = "inputs"
    try:
        inputs, result["description"] = case.make(opts)
        result["inputs_s"] = time.perf_counter() - start
        arrays_in = [v for v in inputs.values() if isinstance(v, np.ndarray)]
        arrays_in += [a for v in inputs.values() if isinstance(v, list) for a in v if isinstance(a, np.ndarray)]
        result["input_mib"] = sum(a.nbytes for a in arrays_in) / 2**20
        print(f"[{case.name}] {result['description']} (inputs {result['inputs_s']:.1f} s)", flush=True)
        stage = "first call"
        result["memory_before"] = memory(device)
        before, compile_s = compiles.count, compiles.seconds
        case_start = time.perf_counter()
        seconds, arrays = timed(case.call, inputs)
        result["first_s"] = seconds
        result["first_compiled"] = compiles.count - before
        result["first_compile_s"] = compiles.seconds - compile_s
        result["outputs"] = summary(arrays)
        npz = Path(f"{args.out}.{case.name}.npz")
        result["saved"] = save_outputs(npz, arrays, args.save_limit_gib * 2**30)
        result["npz"] = npz.name
        del arrays
        print(f"[{case.name}] first call {seconds:.2f} s ({result['first_compiled']} programs compiled)", flush=True)
        if seconds > args.case_timeout:
            result["status"] = f"first call over {args.case_timeout:g} s: warm calls skipped"
        else:
            deadline = case_start + args.case_timeout
            stage = "warm, host inputs"
            warm(case, inputs, args.repeats, deadline, compiles, "warm_host", result)
            stage = "device inputs"
            moved = (case.to_device or device_inputs)(inputs)
            if moved is None:
                result["warm_device_s"] = None
            else:
                stage = "warm, device inputs"
                warm(case, moved, args.repeats, deadline, compiles, "warm_device", result)
                stage = "warm, device-resident"  # the outputs left on the device: the kernel, without transfers
                warm(case, moved, args.repeats, deadline, compiles, "warm_resident", result, fetch=False)
                del moved
            print(f"[{case.name}] warm host {result['warm_host_s']:.3f} s, device "
                  f"{result.get('warm_device_s') or float('nan'):.3f} s", flush=True)  # fmt: skip
        result["memory_after"] = memory(device)
    except Exception as error:  # noqa: BLE001 - record it, go on with the next case
        result["status"] = f"failed in {stage}: {type(error).__name__}: {str(error)[:300]}"
        result["traceback"] = traceback.format_exc()[-4000:]
        print(f"[{case.name}] {result['status']}", flush=True)
    result["case_s"] = time.perf_counter() - start
    result["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    gc.collect()
    return result


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _set_constant(setting: str) -> str:
    """``MODULE.NAME=VALUE`` (a module of napari_gridmip, VALUE a Python literal): that constant set in this
    process, before any case traces; the setting as applied."""
    import ast
    import importlib

    target, _, value = setting.partition("=")
    module, _, name = target.rpartition(".")
    if not module or not name or not value:
        raise SystemExit(f"--set wants MODULE.NAME=VALUE; got {setting!r}")
    loaded = importlib.import_module(f"napari_gridmip.{module}")
    if not hasattr(loaded, name):
        raise SystemExit(f"--set: napari_gridmip.{module} has no {name}")
    setattr(loaded, name, ast.literal_eval(value))
    return f"napari_gridmip.{module}.{name} = {getattr(loaded, name)!r}"


def worker(args: argparse.Namespace) -> None:
    if args.backend == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    if not args.keep_compile_cache:  # a first call compiles, whatever an earlier run left on disk
        os.environ["NAPARI_GRIDMIP_COMPILE_CACHE"] = "0"
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as napari_gridmip sets it, before JAX starts
    import jax

    if args.backend == "cpu" and jax.default_backend() != "cpu":
        raise SystemExit(f"--backend cpu, but JAX's default backend is {jax.default_backend()}")
    device = jax.devices()[0]
    settings = [_set_constant(setting) for setting in args.set]
    compiles = Compiles()
    opts = Options(args.quick, args.render_size, args.sample_dir)
    report: dict[str, Any] = {
        "backend": args.backend,
        "platform": jax.default_backend(),
        "device_kind": device.device_kind,
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "quick": args.quick,
        "repeats": args.repeats,
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": settings,
        "cases": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():  # an earlier run into the same record (the other half of the cases): keep its other cases
        earlier = json.loads(out.read_text()).get("cases", {})
        report["cases"] = {name: case for name, case in earlier.items() if name not in selected(args.cases)}
    print(f"worker {args.backend}: JAX {jax.__version__}, {device.device_kind} ({jax.default_backend()})", flush=True)
    for name in selected(args.cases):
        report["cases"][name] = run_case(BY_NAME[name], opts, args, device, compiles)
        partial = out.with_name(out.name + ".partial")
        partial.write_text(json.dumps(report, indent=1))
        os.replace(partial, out)
    report["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    out.write_text(json.dumps(report, indent=1))


# -- the parent: two workers, then the table ------------------------------------------------------------------


def selected(cases: str | None) -> list[str]:
    if not cases:
        return [case.name for case in CASES]
    names = [name.strip() for name in cases.split(",") if name.strip()]
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(BY_NAME)}")
    return names


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, Any]:
    """``a`` (default backend) against ``b`` (CPU), output by output."""
    out: dict[str, Any] = {"abs": 0.0, "rel": 0.0, "worst": None, "bool_differ": 0, "bool_total": 0,
                           "nan_mismatch": 0, "over_1e-3": 0, "notes": [], "nan": [0, 0, 0], "differ": 0,
                           "numeric": 0}  # fmt: skip
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            out["notes"].append(f"{key} only on {'the default backend' if key in a else 'the CPU'}")
            continue
        x, y = a[key], b[key]
        if x.shape != y.shape:
            out["notes"].append(f"{key}: shape {x.shape} against {y.shape}")
            continue
        if x.dtype == bool or y.dtype == bool:
            out["bool_differ"] += int(np.count_nonzero(x != y))
            out["bool_total"] += x.size
            continue
        if x.dtype.kind in "iu" and y.dtype.kind in "iu":
            diff = np.abs(x.astype(np.int64) - y.astype(np.int64))
            out["differ"] += int(np.count_nonzero(diff))
            largest = float(diff.max()) if diff.size else 0.0
            scale = float(np.abs(y.astype(np.int64)).max()) if y.size else 0.0
        else:
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            nan_x, nan_y = np.isnan(x64), np.isnan(y64)
            out["nan"][0] += int(nan_x.sum())
            out["nan"][1] += int(nan_y.sum())
            out["nan"][2] += x.size
            out["nan_mismatch"] += int(np.count_nonzero(nan_x != nan_y))
            both = np.isfinite(x64) & np.isfinite(y64)
            out["differ"] += int(np.count_nonzero(~((x64 == y64) | (nan_x & nan_y))))
            diff = np.abs(x64 - y64)[both]
            largest = float(diff.max()) if diff.size else 0.0
            finite_y = np.abs(y64[np.isfinite(y64)])
            scale = float(finite_y.max()) if finite_y.size else 0.0
            if scale > 0:
                out["over_1e-3"] += int(np.count_nonzero(diff > 1e-3 * scale))
        out["numeric"] += 1
        rel = largest / scale if scale > 0 else (0.0 if largest == 0 else float("inf"))
        if out["worst"] is None or rel > out["rel"] or (rel == out["rel"] and largest > out["abs"]):
            out.update({"abs": largest, "rel": rel, "worst": key})
    return out


def _s(value: Any) -> str:
    return "" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _ratio(slow: Any, fast: Any) -> str:
    return f"{slow / fast:.1f}x" if slow and fast else ""


def _difference(d: dict[str, Any] | None) -> str:
    if d is None:
        return ""
    parts = []
    if d["numeric"] and d["differ"] == 0:
        parts.append(f"0: identical ({d['numeric']} numeric outputs compared)")
    elif d["worst"] is not None:
        parts.append(f"{d['abs']:.2e} ({d['worst']}), rel {d['rel']:.1e}; {d['differ']} elements not identical")
        if d["over_1e-3"]:
            parts.append(f"{d['over_1e-3']} over 1e-3 rel")
    if d["bool_total"]:
        parts.append(f"{d['bool_differ']} of {d['bool_total']} bool elements differ")
    if d["nan_mismatch"]:
        parts.append(f"NaN on one side only: {d['nan_mismatch']}")
    parts += d["notes"]
    return "; ".join(parts)


def _nan(d: dict[str, Any] | None) -> str:
    if d is None or not d["nan"][2]:
        return ""
    return f"{d['nan'][0] / d['nan'][2]:.3g} / {d['nan'][1] / d['nan'][2]:.3g}"


def _peak(case: dict[str, Any]) -> str:
    after, before = case.get("memory_after"), case.get("memory_before")
    if not after or "peak_bytes_in_use" not in after:
        return ""
    peak = after["peak_bytes_in_use"] / 2**30
    new = before is None or after["peak_bytes_in_use"] > before.get("peak_bytes_in_use", 0)
    return f"{peak:.2f}" if new else f"<= {peak:.2f}"


def load_outputs(folder: Path, case: dict[str, Any] | None) -> dict[str, np.ndarray] | None:
    if not case or "npz" not in case or not (folder / case["npz"]).exists():
        return None
    with np.load(folder / case["npz"]) as data:
        return {key: data[key] for key in data.files}


def make_table(folder: Path, names: list[str] | None, default_json: Path, cpu_json: Path) -> str:
    """The table of ``names`` (None: every case in either record), from the records and outputs in ``folder``.

    The differences are kept in ``differences.json`` there, so that a table can be made again (of both halves of
    a run split by ``--cases``) after the outputs are deleted.
    """
    runs = {}
    for label, path in (("default", default_json), ("cpu", cpu_json)):
        runs[label] = json.loads(path.read_text()) if path.exists() else {"cases": {}}
    d, c = runs["default"], runs["cpu"]
    if names is None:
        names = [case.name for case in CASES if case.name in d["cases"] or case.name in c["cases"]]
    stored_path = folder / "differences.json"
    stored = json.loads(stored_path.read_text()) if stored_path.exists() else {}
    kind = f"{d.get('device_kind', '?')} ({d.get('platform', '?')}, {len(d.get('devices', []))} device(s))"
    lines = [
        f"### Default backend against the CPU, {d.get('date') or c.get('date') or ''}",
        "",
        f"- default backend: {kind}; CPU worker: {c.get('device_kind', '?')} ({c.get('platform', '?')}), "
        f"{c.get('cpu_count', '?')} cores",
        f"- JAX {d.get('jax') or c.get('jax')}, NumPy {d.get('numpy') or c.get('numpy')}; "
        f"{'--quick sizes; ' if d.get('quick') or c.get('quick') else ''}best of {d.get('repeats', c.get('repeats'))}",
        f"- the last workers: `{d.get('command', 'not run')}` and `JAX_PLATFORMS=cpu {c.get('command', 'not run')}`",
        "",
        "| case | default device | first s (default) | warm host-input s (default) | warm device-input s (default) "
        "| warm device-resident s (default) | first s (CPU) | warm s (CPU) | speed-up on the device (CPU / "
        "default device-resident) | speed-up warm (CPU / default device-input) | speed-up with transfer "
        "(CPU / default host-input) | largest difference (abs, rel to max abs CPU) | NaN fraction default / CPU "
        "| device peak GiB (default) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    notes = []
    for name in names:
        dc, cc = d["cases"].get(name, {}), c["cases"].get(name, {})
        a, b = load_outputs(folder, dc), load_outputs(folder, cc)
        key = [dc.get("date"), cc.get("date")]  # the two runs the outputs came from
        if a is not None and b is not None:
            diff = compare(a, b)
            stored[name] = {"runs": key, "difference": diff}
        else:
            diff = stored[name]["difference"] if stored.get(name, {}).get("runs") == key else None
        del a, b
        cpu_warm = cc.get("warm_host_s")
        lines.append(
            f"| {name} | {d.get('device_kind', '')} | {_s(dc.get('first_s'))} | {_s(dc.get('warm_host_s'))} "
            f"| {_s(dc.get('warm_device_s'))} | {_s(dc.get('warm_resident_s'))} | {_s(cc.get('first_s'))} "
            f"| {_s(cpu_warm)} | {_ratio(cpu_warm, dc.get('warm_resident_s'))} "
            f"| {_ratio(cpu_warm, dc.get('warm_device_s'))} | {_ratio(cpu_warm, dc.get('warm_host_s'))} "
            f"| {_difference(diff)} | {_nan(diff)} | {_peak(dc)} |"
        )
        desc = dc.get("description") or cc.get("description") or ""
        compiled = " / ".join(f"{r.get('first_compiled', '?')} ({r.get('first_compile_s', 0):.1f} s)" for r in (dc, cc))
        inputs = " / ".join(_s(r.get("inputs_s")) or "?" for r in (dc, cc))
        text = f"- **{name}**: {desc}; inputs {dc.get('input_mib', cc.get('input_mib', 0)):.0f} MiB, made in "
        text += f"{inputs} s; programs compiled by the first call (compile s), default / CPU: {compiled}"
        for label, r in (("default", dc), ("CPU", cc)):
            if not r:
                text += f"; {label}: not run"
                continue
            if r.get("status", "ok") != "ok":
                text += f"; {label}: {r['status']}"
            if r.get("warm_device_compiled_first"):
                text += f"; {label}: device inputs compiled {r['warm_device_compiled_first']} more programs"
            for remark in r.get("notes", []):
                text += f"; {label}: {remark}"
        notes.append(text)
    stored_path.write_text(json.dumps(stored, indent=1))
    lines += ["", *notes]
    lines += ["", "Warm s (CPU): host inputs. Speed-ups: the CPU's warm time over the default backend's. "
              "render_view: \"device inputs\" keeps one chunk cache across calls (the volume never lives on the "
              "device); \"host inputs\" starts from an empty one each call. Device peak: the process's peak so far "
              "(JAX cannot reset it), \"<=\" where the case did not raise it."]  # fmt: skip
    return "\n".join(lines)


def _record_cases(folder: Path, names: list[str] | None, paths: dict[str, Path]) -> None:
    """The workers' cases into the run's record: per case and backend, the first call and the warm host-input
    calls, each backend's ratio against the CPU's; the device-input and device-resident times as extras."""
    runs = {label: json.loads(path.read_text()) for label, path in paths.items() if path.exists()}
    default = runs.get("default")
    if default:
        device(default.get("platform", "?"), default.get("device_kind", "?"), len(default.get("devices", [])))
    if names is None:
        names = [case.name for case in CASES if any(case.name in r.get("cases", {}) for r in runs.values())]
    for name in names:
        for label, run in runs.items():
            r = run.get("cases", {}).get(name)
            if not r:
                continue
            record(f"{name}, {label}", first_s=r.get("first_s"), times_s=r.get("warm_host_all_s", []), group=name,
                   reference=f"{name}, cpu", note="warm: host inputs, outputs fetched", status=r.get("status"),
                   warm_device_s=r.get("warm_device_s"), warm_resident_s=r.get("warm_resident_s"),
                   first_compiled=r.get("first_compiled"), first_compile_s=r.get("first_compile_s"),
                   description=r.get("description"), device_kind=run.get("device_kind"))  # fmt: skip
    differences = folder / "differences.json"
    if differences.exists():
        note("differences, default against cpu", json.loads(differences.read_text()))


def parent(args: argparse.Namespace) -> None:
    folder = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_accelerator_"))
    folder.mkdir(parents=True, exist_ok=True)
    names = selected(args.cases) if args.cases or not args.table_only else None
    paths = {"default": folder / "default.json", "cpu": folder / "cpu.json"}
    if not args.table_only:
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            env = dict(os.environ)
            if backend == "cpu":
                env["JAX_PLATFORMS"] = "cpu"
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--backend", backend,
                       "--out", str(paths[backend]), "--cases", ",".join(names or []), "--repeats", str(args.repeats),
                       "--case-timeout", str(args.case_timeout), "--render-size", str(args.render_size),
                       "--save-limit-gib", str(args.save_limit_gib)]  # fmt: skip
            command += ["--quick"] * args.quick + ["--keep-compile-cache"] * args.keep_compile_cache
            if backend == "default":  # the variant is the accelerator's; the CPU worker runs the library as it is
                command += [f"--set={setting}" for setting in args.set]
            if args.sample_dir:
                command += ["--sample-dir", args.sample_dir]
            print(f"$ {'JAX_PLATFORMS=cpu ' if backend == 'cpu' else ''}{shlex.join(command)}", flush=True)
            start = time.perf_counter()
            code = subprocess.run(command, env=env).returncode  # one at a time: a TPU chip is one process's
            print(f"worker {backend}: exit {code} after {time.perf_counter() - start:.0f} s", flush=True)
    text = make_table(folder, names, paths["default"], paths["cpu"])
    _record_cases(folder, names, paths)
    if args.table:
        Path(args.table).write_text(text + "\n")
        print(f"table written to {args.table}")
    print("\n" + text)
    if not args.keep_npz and not args.table_only:
        for path in folder.glob("*.npz"):
            path.unlink()
    print(f"\nworker records in {folder}" + ("" if args.keep_npz or args.table_only else " (outputs deleted)"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all; see --list)")
    parser.add_argument("--quick", action="store_true", help="every case ~8x smaller a side")
    parser.add_argument("--repeats", type=int, default=3, help="warm calls per variant (best taken)")
    parser.add_argument("--case-timeout", type=float, default=240.0, help="soft budget per case, seconds")
    parser.add_argument("--render-size", type=int, default=2048, help="side of the sparse sample for render_view")
    parser.add_argument("--sample-dir", default=None, help="where the sparse sample is written (default: its cache)")
    parser.add_argument("--save-limit-gib", type=float, default=2.0, help="larger outputs are subsampled")
    parser.add_argument("--keep-compile-cache", action="store_true", help="leave JAX's persistent cache on")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--worker", action="store_true", help="run the cases in this process (see the docstring)")
    parser.add_argument("--backend", choices=("default", "cpu"), default="default", help="the worker's backend")
    parser.add_argument("--out", default=None, help="the worker's JSON record (outputs beside it)")
    parser.add_argument("--backends", default="default,cpu", help="the parent's workers, in order")
    parser.add_argument("--workdir", default=None, help="the parent's folder for the records (default: a temp)")
    parser.add_argument("--table", default=None, help="write the Markdown table here too")
    parser.add_argument("--table-only", action="store_true", help="make the table from --workdir's records")
    parser.add_argument("--keep-npz", action="store_true", help="keep the saved outputs after the table")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                        help="set a constant of napari_gridmip in the default backend's worker, a variant to measure "
                             "before it is the library's (e.g. core.correlation.affine.TILE_WINDOWS=True)")  # fmt: skip
    args = parser.parse_args()
    if args.list:
        for case in CASES:
            print(f"{case.name:26s} {case.full}")
        return
    if args.worker:
        if not args.out:
            parser.error("--worker needs --out")
        worker(args)
        return
    if args.table_only and not args.workdir:
        parser.error("--table-only needs --workdir")
    start_run("accelerator", args)
    parent(args)


if __name__ == "__main__":
    main()
