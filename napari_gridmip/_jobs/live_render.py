"""Full resolution in napari's 3D view, without Qt: the camera's state (:class:`ViewState`), the layer's data and
progressive renders (:class:`LiveSource`), and the pictures a textured quad shows in napari's canvas.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_gridmip._jobs import is_lazy
from napari_gridmip.core.occupancy.camera import camera_rays
from napari_gridmip.core.runtime import compile_cache

SUPPORTED = ("mip", "minip", "attenuated_mip", "iso")
# the full-resolution level's cache: the occupied cells of the chunks read (a whole 2048^3 sample in view: 43 MiB
# of them, in 3058 chunks of 1.5 GiB; the pool never holds more than the level's occupied cells)
CACHE_BYTES = 512 << 20
COARSE_CACHE_BYTES = 128 << 20  # the coarse pass's level
COARSE_FACTOR = 4  # the coarse pass's pixels are this many canvas pixels a side
MAX_COARSE_LEVEL = 2  # the coarse pass reads at most level 2 (a 16th of level 0's chunks)
CELL = 8  # the occupancy cells computed for layers without stored ones (8 skips 3x more samples than 16)
MIN_CELL = 4  # render_view's smallest cell: coarser levels pool level 0's cells up to this
# a warm-up reads level 0's chunks with an occupied cell ahead of the first view where they fit its cache and
# are at most this many (the real volume's 526: 1.2 s of its first full-resolution render, docs/occupancy.md)
PRELOAD_CHUNKS = 1024
PRELOAD_BATCH = 64  # chunks read between two looks at the warm-up's cancel


@dataclass(frozen=True)
class Display:
    """How the source layer is shown: napari's rendering mode and its colour settings."""

    mode: str
    colormap: Any = field(compare=False)
    colormap_name: str
    contrast_limits: tuple[float, float]
    gamma: float
    iso_threshold: float
    attenuation: float
    step: float = 0.8  # samples this many voxels apart along a ray: vispy's relative_step_size, which napari leaves


@dataclass(frozen=True)
class ViewState:
    """Everything a render depends on; two equal states give the same picture."""

    center: tuple[float, float, float]
    view: tuple[float, float, float]
    up: tuple[float, float, float]
    zoom: float
    perspective: float
    handedness: str
    canvas: tuple[int, int]
    index: tuple[int, ...]  # the leading (non-displayed) data index of a >3D layer
    display: Display

    @classmethod
    def of(cls, viewer: Any, layer: Any, *, canvas: tuple[int, int] | None = None) -> ViewState:
        """The state of ``viewer``'s camera and ``layer`` now (napari models only, no Qt).

        ``canvas``: ``(height, width)`` of the view the camera projects onto; default ``viewer.canvas.size``
        (the Qt side passes the vispy view's own size, which the model may lag behind while hidden).
        """
        camera = viewer.scene.camera
        round3 = lambda v: tuple(round(float(x), 9) for x in v)  # noqa: E731 - tiny jitter is the same view
        data_point = np.asarray(layer.world_to_data(viewer.dims.point[-layer.ndim :]))
        shape = (layer.data[0] if layer.multiscale else layer.data).shape
        lead = layer.ndim - 3
        index = tuple(int(np.clip(round(p), 0, n - 1)) for p, n in zip(data_point[:lead], shape[:lead]))
        mode = str(layer.rendering)
        display = Display(
            mode=mode,
            colormap=layer.colormap,
            colormap_name=layer.colormap.name,
            contrast_limits=tuple(float(v) for v in layer.contrast_limits),
            gamma=float(layer.gamma),
            iso_threshold=float(layer.iso_threshold),
            attenuation=float(layer.attenuation),
        )
        return cls(
            center=round3(camera.center[-3:]),
            view=round3(camera.view_direction),
            up=round3(camera.up_direction),
            zoom=round(float(camera.zoom), 12),
            perspective=float(camera.perspective),
            handedness=str(camera.handedness),
            canvas=tuple(int(v) for v in (viewer.canvas.size if canvas is None else canvas)),
            index=index,
            display=display,
        )


@dataclass
class Picture:
    """One rendered view: RGBA float32 ``(rows, columns, 4)``, the world corners ``(4, 3)`` of the canvas on the
    plane through the camera's centre (top-left, top-right, bottom-right, bottom-left), and what it took."""

    rgba: np.ndarray
    texture: np.ndarray  # rgba as uint8, made in the worker: what the quad uploads (a quarter of float32's bytes)
    values: np.ndarray  # the render's values before the colormap (float32 (rows, columns), NaN: nothing)
    corners: np.ndarray
    final: bool
    level: int
    seconds: float
    chunks_read: int
    chunks_used: int
    chunks_total: int
    samples: int
    samples_dense: int


def canvas_corners(state: ViewState) -> np.ndarray:
    """The canvas's corners in world coordinates on the plane through the camera's centre."""
    view, up = np.asarray(state.view), np.asarray(state.up)
    up = up - np.dot(up, view) * view
    up /= np.linalg.norm(up)
    right = np.cross(view, up) if state.handedness == "right" else np.cross(up, view)
    height, width = state.canvas
    half_w, half_h = width / 2 / state.zoom, height / 2 / state.zoom
    c = np.asarray(state.center)
    return np.array([c - half_w * right + half_h * up, c + half_w * right + half_h * up,
                     c + half_w * right - half_h * up, c - half_w * right - half_h * up])  # fmt: skip


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, looked up once; None on other C libraries (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system: glibc's ``malloc_trim(0)``; nothing on other C libraries.

    A render allocates and frees a few hundred MiB of temporaries (NumPy's and XLA's) from several threads (the
    render's own, one per render, the chunk readers', XLA's), and glibc keeps what each thread arena freed for its
    own reuse. In a real viewer the free part grew by 0.1 to 0.25 GiB a camera move, to 2.7 of 4 GiB resident after
    a 20-move tour of the 2048^3 sample (benchmarks/bench_live_memory.py), with 1 GiB in use. Trimming after each
    render takes a few milliseconds and leaves the resident set near what is in use; the next render is no slower.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def occupancy_cells(volume: Any, threshold: float, cell: int = CELL) -> np.ndarray:
    """Bool occupancy of ``cell``^3 cells of a 3D volume (``> threshold``), block by block through dask."""
    import dask.array as da  # in the worker: dask.array takes 0.5 s to import

    lazy = volume if is_lazy(volume) and hasattr(volume, "map_blocks") else None
    if lazy is None:
        chunks = getattr(volume, "chunks", None)
        lazy = da.from_array(volume, chunks=chunks if is_lazy(volume) else (4 * cell,) * 3)
    padded = tuple(-(-n // cell) * cell for n in lazy.shape)
    occupied = lazy > threshold
    if padded != lazy.shape:
        occupied = da.pad(occupied, [(0, p - n) for p, n in zip(padded, lazy.shape)], constant_values=False)
    occupied = occupied.rechunk(tuple(max(cell, (c // cell) * cell) for c in (4 * cell,) * 3))
    return np.asarray(da.coarsen(np.any, occupied, {0: cell, 1: cell, 2: cell}).compute())


class LiveSource:
    """One layer's levels (finest first), placement, occupancy cells and chunk caches, for one leading index.

    ``levels``: 3D arrays (NumPy, dask, Zarr), level ``k`` strided or averaged by ``2**k`` from level 0 (napari's
    multiscale); ``cells``: bool occupancy of ``cell``^3 cells of level 0; ``scale``/``translate``: the layer's over
    its three displayed axes.

    :class:`LiveSource` holds one layer's levels, its
    occupancy cells and a bounded chunk cache per level, and turns a state into pictures: a coarse pass (a coarser
    level of a multiscale layer, or the full-resolution data at a quarter of the canvas's pixels), then the full
    resolution at the canvas's pixels. Each :class:`Picture` carries the world corners of the canvas on the plane
    through the camera's centre, where a textured quad shows it aligned with the volume in napari's 3D canvas.
    """

    def __init__(self, levels: list, cells: np.ndarray, cell: int, scale: Any, translate: Any, *,
                 threshold: float = 0.0, cache_bytes: int = CACHE_BYTES) -> None:  # fmt: skip
        from napari_gridmip.core.occupancy.raycast import ChunkCache  # JAX: in the worker

        compile_cache.enable()  # the render's programs then load from disk in a later process (once per process)
        self.levels = levels
        self.cells, self.cell = np.asarray(cells, bool), int(cell)
        self.scale, self.translate = np.asarray(scale, float), np.asarray(translate, float)
        self.background = 0.0 if threshold >= 0 else float(threshold)  # the empty voxels of a sparse volume
        self.factors = [round(levels[0].shape[0] / level.shape[0]) for level in levels]
        coarse = [k for k in range(1, len(levels)) if k <= MAX_COARSE_LEVEL]
        self.coarse_level = coarse[-1] if coarse else None
        self._cells_cache: dict[int, np.ndarray] = {}
        self.caches = {0: ChunkCache(levels[0], capacity=cache_bytes)}
        if self.coarse_level is not None:
            self.caches[self.coarse_level] = ChunkCache(levels[self.coarse_level], capacity=COARSE_CACHE_BYTES)
        # one render at a time per cache: a cancelled render stops only between its calls, and a newer one must
        # not load into the pool (or lay it out again) while the older still reads or loads it
        self._cache_locks = {level: threading.Lock() for level in self.caches}
        self._warmed: set[tuple[str, float, int]] = set()  # (mode, step, level) whose programs :meth:`warm` made
        self.preloading: threading.Thread | None = None  # :meth:`warm`'s read of level 0's chunks, once started
        self._renders_waiting = {level: 0 for level in self.caches}  # renders asking for each level's cache
        self._turns = threading.Condition()

    def _cell_at(self, level: int) -> tuple[int, int]:
        """(pooling of level 0's cells, cell side in level ``level``'s voxels)."""
        factor = self.factors[level]
        pool = max(1, -(-MIN_CELL * factor // self.cell))
        return pool, self.cell * pool // factor

    def _cells_at(self, level: int) -> np.ndarray:
        """The occupancy cells the render of ``level`` skips with (made once: the same array every render)."""
        if level not in self._cells_cache:
            self._cells_cache[level] = self._make_cells_at(level)
        return self._cells_cache[level]

    def _make_cells_at(self, level: int) -> np.ndarray:
        from napari_gridmip.core.occupancy.raycast import coarser_cells  # JAX: in the worker

        pool, cell = self._cell_at(level)
        cells = coarser_cells(self.cells, pool) if pool > 1 else self.cells
        target = tuple(-(-n // cell) for n in self.levels[level].shape)
        if cells.shape != target:  # level 0's cells cover the coarser level's edge cells too: trim or pad
            fixed = np.zeros(target, bool)
            common = tuple(slice(0, min(a, b)) for a, b in zip(target, cells.shape))
            fixed[common] = cells[common]
            cells = fixed
        return cells

    def _render_rays(self, display: Display, level: int, origins: np.ndarray, directions: np.ndarray,
                     t_near: float, cancel: Callable[[], bool] | None) -> Any:  # fmt: skip
        """:func:`~napari_gridmip.render_view` of ``level`` along rays in its voxel index coordinates."""
        from napari_gridmip.core.occupancy.raycast import render_view  # JAX: in the worker

        mode = display.mode if display.mode in SUPPORTED else "mip"
        _, cell = self._cell_at(level)
        with self._turns:  # a render waiting: the read ahead lets it have the cache next (Python's lock is not fair)
            self._renders_waiting[level] += 1
        try:
            self._cache_locks[level].acquire()
        finally:
            with self._turns:
                self._renders_waiting[level] -= 1
                self._turns.notify_all()
        try:
            return render_view(
                self.levels[level], self._cells_at(level), origins, directions, mode=mode,
                step=min(display.step, (cell - 1) / 3), t_near=t_near, iso_threshold=display.iso_threshold,
                contrast_limits=display.contrast_limits, attenuation=display.attenuation,
                background=self.background, cache=self.caches[level], cancel=cancel,
            )  # fmt: skip
        finally:
            self._cache_locks[level].release()

    def _warm(self, display: Display, level: int, cancel: Callable[[], bool] | None) -> None:
        """Compile ``level``'s render programs for ``display`` (or load them from the disk cache): a render of one
        ray through an occupied cell, which calls every program a view's render calls (each batch is padded to
        the same size, and the pool's arrays have the same shapes), reading the few chunks along that ray."""
        from napari_gridmip.core.occupancy.raycast import RenderCancelled  # JAX: in the worker

        key = (display.mode, display.step, level)
        if key in self._warmed:
            return
        cells = self._cells_at(level)
        occupied = np.flatnonzero(cells)
        if len(occupied):
            _, cell = self._cell_at(level)
            centre = (np.asarray(np.unravel_index(occupied[len(occupied) // 2], cells.shape)) + 0.5) * cell
            centre = np.minimum(centre, np.asarray(self.levels[level].shape) - 0.5)
            try:
                self._render_rays(display, level, centre[None], np.array([[1.0, 0.0, 0.0]]), -np.inf, cancel)
            except RenderCancelled:
                return
        self._warmed.add(key)

    def _preload(self, level: int, cancel: Callable[[], bool] | None) -> bool:
        """Read ``level``'s chunks with an occupied cell into its cache, when they all fit there and are at most
        :data:`PRELOAD_CHUNKS`, :data:`PRELOAD_BATCH` at a time. A render asking for the cache is let in before
        the next batch, so it waits for one batch at most, and then reads only the chunks not read yet. None is
        evicted: they all fit. Returns False where ``cancel`` stopped it."""
        from napari_gridmip.core.occupancy.raycast import cell_side  # JAX: in the worker

        cache, cells = self.caches[level], self._cells_at(level)
        cell = cell_side(self.levels[level].shape, cells.shape)  # as render_view lays the cache out
        with self._cache_locks[level]:
            cache.prepare(cells, cell)
            ids = cache.occupied()
            if not cache.bricked or len(ids) > PRELOAD_CHUNKS or not cache.fits(ids):
                return True
        for start in range(0, len(ids), PRELOAD_BATCH):
            with self._turns:
                self._turns.wait_for(lambda: self._renders_waiting[level] == 0)
            with self._cache_locks[level]:
                if cancel is not None and cancel():
                    return False
                cache.prepare(cells, cell)  # the same grid: kept as it is
                cache.load(ids[start : start + PRELOAD_BATCH])
        return True

    def _warming(self, display: Display, level: int, cancel: Callable[[], bool] | None) -> threading.Thread | None:
        """:meth:`_warm` of ``level`` started in a thread (None: its programs are made already)."""
        if (display.mode, display.step, level) in self._warmed:
            return None

        def warm() -> None:
            try:
                self._warm(display, level, cancel)
            except Exception:  # noqa: BLE001 - the render of this level reports the same failure on the GUI's path
                pass

        thread = threading.Thread(target=warm, name=f"napari-gridmip full resolution warm-up, level {level}")
        thread.start()
        return thread

    def warm(self, display: Display, *, cancel: Callable[[], bool] | None = None, preload: bool = True) -> None:
        """Make the render programs of every level a view of ``display`` renders (the coarse pass's and the full
        resolution's), side by side: XLA's compile releases the GIL. A live view calls it when it is switched on,
        before the camera has rested, so that its first view compiles nothing (or loads nothing from the disk
        cache): on 2 cores, a user's very first view came 1.6 s sooner
        (docs/screenshots_real_volume.py, docs/occupancy.md); the Occupancy mipmap widget calls it, with
        ``preload=False``, once a layer it could show is chosen, before the switch. Then, with ``preload``, in a
        thread of its own (:attr:`preloading`) that a render does not wait for, level 0's occupied chunks are read
        where they are few enough (:meth:`_preload`)."""
        thread = self._warming(display, 0, cancel) if self.coarse_level is not None else None
        try:
            self._warm(display, self.coarse_level if self.coarse_level is not None else 0, cancel)
        finally:
            if thread is not None:
                thread.join()
        if preload:
            self.start_preload(cancel)

    def preload_coarse(self, cancel: Callable[[], bool] | None = None) -> None:
        """Read the coarse pass's occupied chunks into its cache now (:meth:`_preload`; at most its 128 MiB and
        :data:`PRELOAD_CHUNKS`): the first coarse pass then reads none (the real volume's took 0.4 of its 0.6 s
        reading them, docs/occupancy.md)."""
        if self.coarse_level is not None:
            self._preload(self.coarse_level, cancel)

    def start_preload(self, cancel: Callable[[], bool] | None = None) -> None:
        """Start the read ahead of level 0's chunks (:meth:`_preload`) in its thread, unless it runs or ran already,
        or ``cancel`` says stop."""
        if (cancel is not None and cancel()) or self.preloading is not None:
            return

        def preload() -> None:
            try:
                done = self._preload(0, cancel)
            except Exception:  # noqa: BLE001 - a render reads what it needs itself, and reports a failure
                logging.getLogger(__name__).debug("the read ahead of level 0 failed", exc_info=True)
                done = False
            if not done:  # a later warm-up may try again
                self.preloading = None

        # a daemon: a read ahead never holds the interpreter's exit
        self.preloading = threading.Thread(target=preload, name="napari-gridmip full resolution preload", daemon=True)
        self.preloading.start()

    def render(self, state: ViewState, *, level: int, image_shape: tuple[int, int],
               cancel: Callable[[], bool] | None = None) -> Picture:  # fmt: skip
        """One picture of ``state`` from ``level`` at ``image_shape`` pixels covering the canvas."""
        from napari_gridmip.core.occupancy.raycast import colorize_view  # JAX: in the worker

        start = time.perf_counter()
        factor = self.factors[level]
        # level k's voxel j covers level 0's data coordinates [j f - 1/2, (j + 1) f - 1/2)
        scale = self.scale * factor
        translate = self.translate - 0.5 * self.scale + 0.5 * scale
        rays = camera_rays(state.center, state.view, state.up, state.canvas, zoom=state.zoom,
                           perspective=state.perspective, handedness=state.handedness, image_shape=image_shape,
                           scale=scale, translate=translate)  # fmt: skip
        display = state.display
        mode = display.mode if display.mode in SUPPORTED else "mip"
        result = self._render_rays(display, level, rays.origins, rays.directions, rays.t_near, cancel)
        depth = result.depth * rays.world_per_t if mode == "iso" else None
        rgba = colorize_view(result.values, colormap=display.colormap, contrast_limits=display.contrast_limits,
                             gamma=display.gamma, depth=depth)  # fmt: skip
        final = level == 0 and tuple(image_shape) == tuple(state.canvas)
        seconds = time.perf_counter() - start
        texture = np.round(np.clip(rgba, 0, 1) * 255).astype(np.uint8)
        return Picture(rgba, texture, result.values, canvas_corners(state), final, level, seconds, result.chunks_read,
                       result.chunks_used, result.chunks_total, result.samples, result.samples_dense)  # fmt: skip

    def progressive(self, state: ViewState, *, cancel: Callable[[], bool] | None = None) -> Iterator[Picture]:
        """The coarse pass, then the full resolution.

        Level 0's programs, if :meth:`warm` has not made them for this display's mode and step, are compiled (or
        loaded from the disk cache) in a thread of this render while the coarse pass runs, rather than after it:
        XLA's compile releases the GIL, so the two share the cores.
        """
        height, width = state.canvas
        coarse_shape = (max(1, height // COARSE_FACTOR), max(1, width // COARSE_FACTOR))
        if self.coarse_level is None:
            yield self.render(state, level=0, image_shape=coarse_shape, cancel=cancel)
            yield self.render(state, level=0, image_shape=state.canvas, cancel=cancel)
            return
        warm = self._warming(state.display, 0, cancel)
        if warm is None:  # level 0's programs made (by an early warm-up, the live view's being replaced by this
            self.start_preload(cancel)  # render in its lane): its chunks read beside the coarse pass
        try:
            yield self.render(state, level=self.coarse_level, image_shape=coarse_shape, cancel=cancel)
        finally:
            if warm is not None:  # the full render waits for it anyway (level 0's lock); a closed one: it stops
                warm.join()
        yield self.render(state, level=0, image_shape=state.canvas, cancel=cancel)


def has_stored_cells(layer: Any, threshold: float) -> bool:
    """Whether ``layer``'s occupancy cells are stored with it for ``threshold`` (a layer of this plugin's reader or
    sample): :func:`source_for_layer` then makes a 3D source without a pass over the data."""
    stored = layer.metadata.get("gridmip_cells")
    return stored is not None and float(stored.get("threshold", 0.0)) == float(threshold)


def source_for_layer(layer: Any, index: tuple[int, ...], threshold: float, *, cache_bytes: int = CACHE_BYTES
                     ) -> LiveSource:  # fmt: skip
    """The :class:`LiveSource` of ``layer`` at the leading ``index`` (run it in a worker: cells may need a pass)."""
    import dask.array as da  # in the worker: dask.array takes 0.5 s to import

    levels = list(layer.data) if layer.multiscale else [layer.data]
    if index:  # a lazy view of the 3D volume at the dims point (a Zarr array indexed directly would be read)
        levels = [
            (da.from_array(level, chunks=level.chunks) if is_lazy(level) and not hasattr(level, "map_blocks")
             else level)[index]
            for level in levels
        ]  # fmt: skip
    if not index and has_stored_cells(layer, threshold):
        stored = layer.metadata["gridmip_cells"]
        cells, cell = np.asarray(stored["cells"], bool), int(stored["cell"])
    else:
        cells, cell = occupancy_cells(levels[0], threshold), CELL
    return LiveSource(levels, cells, cell, layer.scale[-3:], layer.translate[-3:], threshold=threshold,
                      cache_bytes=cache_bytes)  # fmt: skip
