"""The one place that asks which backend runs, for the algorithms whose best strategy differs by backend.

Each function names a strategy and says, with the measurement behind it, why it is chosen where it is; every
branch stays under the same tests (the kernels' tests force each strategy on the CPU). The rules that move work
to the host CPU follow the user's setting (:func:`napari_gridmip.compute_on`) and name themselves in the job's log.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import jax

from napari_gridmip.core.runtime import choice


def on_cpu() -> bool:
    """Whether the work about to be traced runs on the host CPU: JAX's default device when one is set (a float64
    call on a TPU runs inside ``jax.default_device(cpu)``, :mod:`.precision`), else the default backend.

    Asking the default backend alone chose the accelerator's strategies for that host work: find_displacement
    float64 256^2 took 0.54 s on a TPU machine's host against 0.075 s in a CPU-only process of the same machine
    (``benchmarks/bench_accelerator.py``, case find_displacement_f64).
    """
    return _platform() == "cpu"


def _platform() -> str:
    """The platform the work about to be traced runs on: JAX's default device's when one is set, else the default
    backend's."""
    device = jax.config.jax_default_device  # a Device, a platform name, or None
    return getattr(device, "platform", device) if device is not None else jax.default_backend()


AT_ONCE_SUBSET_ROWS = 16  # subsets at least this tall are summed at once on accelerators (subset_row_sums)


def subset_row_sums(subset_rows: int) -> str:
    """How the subset sweep (:mod:`.correlation.subsets`) sums its products down the image, for subsets of
    ``subset_rows`` rows: ``"running"``, one output row at a time, each adding the ``s`` rows entering its
    subsets and subtracting the ``s`` leaving them (a fresh sum of the ``sh`` rows where ``2 s >= sh``);
    ``"fresh"``, one output row at a time, each summing its subsets' ``sh`` rows afresh; or ``"at_once"``, every
    output row of a band summed together, one window offset at a time, by a strided ``reduce_window``.

    Running sums on the CPU: O(s) instead of O(sh) work a row; the 1024^2 DIC pair (subset 31, step 4) runs
    2.2x faster warm with them, 0.342 against 0.748 s with fresh sums (docs/benchmarks.md, "DIC: one pair").
    Never on a TPU v5e (JAX 0.10.2): the running sums' program returns sums up to 80% off there (a probe since
    removed, "raw sweep step=4": 8e-1 against the CPU, while every primitive
    it uses, a plain running sum among them, agrees within 2e-7); the speckle-tracking and DIC fields were wrong
    there for this alone. There, the row-at-a-time loop is ``rows sh`` small iterations, each a wait for the chip:
    tall subsets are summed at once (DIC 2048^2, subset 31: 1.93 s with fresh sums, 0.86 s at once), short ones
    afresh (track_speckles K=20 512^2, subset 5: 0.52 s fresh, 0.73 s at once). The threshold lies between the two
    measured heights (``benchmarks/bench_accelerator.py``, docs/accelerator.md).
    """
    if on_cpu():
        return "running"
    return "at_once" if subset_rows >= AT_ONCE_SUBSET_ROWS else "fresh"


def per_pixel_gathers() -> bool:
    """Whether the subset refinement (:mod:`.correlation.subsets`) reads each pixel's 5 x 5 block of sums (its
    cross sums, box sums and Gram planes around its integer peak) by gathers at the pixel's own offsets; or, on a
    TPU, by selects: the pixels' neighbourhoods as static strided slices, then a compare-and-select summed over
    each axis (exact: one term is kept), and the Gram matrix from static slices.

    On a TPU v5e the gathers were 90% of the warm time of DIC 2048^2 (0.75 of 0.84 s) and of track_speckles
    K=20 512^2 (0.45 of 0.50 s): 20 small gathers per output row, each 24 to 120 us, where the sums themselves
    took milliseconds (``benchmarks/probes/accelerator_profile.py``, docs/accelerator.md); with the selects,
    0.33 and 0.11 s. A CPU gathers from its caches, and the selects' extra work is its cost there: forced on this
    2-core CPU, the 1024^2 DIC pair (subset 31, step 4, refine) ran 11.3 s warm against 0.89 s, and
    track_speckles K=20 256^2 3.0 against 1.2 s, each compiling 2 to 2.5x longer.
    """
    return not _on_tpu()


def spline_windows() -> bool:
    """Whether the affine IC-GN (:mod:`.correlation.affine`) reads each point's subset and its B-spline taps
    from one window of the image per point, as slices, or gathers every pixel's 16 taps (and its subset's
    pixels) one element at a time.

    Gathers on the CPU, which reads scattered elements from its caches; the window's 64 weighted slices
    (``SPLINE_MARGIN`` 2) are 4x the taps' products. Gathers on a GPU too, which gathers well (not measured:
    no GPU was available). Windows on a TPU: on a TPU v5e one IC-GN interpolation of the 1024^2 pair (60,025 points
    x 961 pixels) took 6.69 s as element gathers against 0.222 s on the host CPU, and gathers of rows run 0.3 GB/s
    one element wide against 40 GB/s 128 wide (docs/accelerator.md). 8000 points' interpolation there: 0.80 s as
    gathers, 0.015 s from windows; with it and :func:`ic_gn_rows_together`, the 1024^2 affine DIC ran 1.52 s warm
    on the chip against 1.95 s on the host's 13 cores (``benchmarks/bench_accelerator.py``), 33.8 s with gathers.
    """
    return _on_tpu()


def ic_gn_rows_together() -> bool:
    """Whether the affine IC-GN takes a band's rows of points together (each from its own start), or one row
    after the other, each starting from the converged warps of the row above (ncorr's seed propagation).

    Row by row on the CPU, where the propagated starts save a step for most points and each row's work is
    its cost. Together elsewhere: each row is a loop of small steps, an accelerator's slowest shape (a 1024^2
    pair has 252 rows of 249 points), and the points still iterating after the first steps then make batches
    of an eighth of a band, not of a row. Without the propagation, the fields of a 512^2 pair moved by at most
    3.5e-5 px (CPU, docs/accelerator.md); the TPU's 1024^2 fields differ from the host's by at
    most 6.2e-6 (``benchmarks/bench_accelerator.py``, case dic_affine).
    """
    return not on_cpu()


def ic_gn_compile_ahead() -> bool:
    """Whether the affine IC-GN's programs compile in a thread beside the translation search's
    (:func:`.correlation.affine.compile_ahead`).

    Not on the CPU: on this 2-core machine three compiles side by side made the 1024^2 pair's first call 5.52 s
    against 5.08 and 5.14 s (docs/benchmarks.md, "First calls"). Elsewhere, whose compiles run on the host's cores
    beside a device that waits: on a TPU v5e with its 13-core host, the 1024^2 affine DIC's first call took
    40.6 s with it against 48.6 s without (``benchmarks/bench_accelerator.py --cases dic_affine``,
    docs/accelerator.md; the two compiles one after the other in that thread then). On a GPU by
    the same reasoning, not measured (no GPU was available).
    """
    return not on_cpu()


def render_on_host() -> bool:
    """Whether :func:`.occupancy.raycast.render_view` (the live view's full-resolution render) runs on the host
    CPU rather than on the default device: on a TPU only.

    The render's segments look their samples up in a pool of bricks through a table, point by point, and step
    each ray by data-dependent counts: scattered gathers, a TPU's slow path. On a TPU
    v5e the 2048^3 sparse sample's close-up (800x600, mip) took 4.27 s warm there against 2.15 s on the same
    machine's CPU, and its first call 54.7 s (48.7 s compiling 5 programs) against 4.2 s
    (``benchmarks/bench_accelerator.py``, case render_view). Its inputs are chunks read on the host
    and its outputs come back to the host, so the host run moves nothing.

    Always under the setting ``"host"``, never under ``"accelerator"`` (:mod:`.choice`).
    """
    return _host_rule("render_on_host")


def series_on_host() -> bool:
    """Whether :func:`.correlation.series.correlate_series` runs its IC-GN on the host CPU rather than on the
    default device: on a TPU only, under the setting ``"auto"``.

    On an accelerator the series reads each point's frame values from one window of the spline's coefficients
    per point, a batched matrix product of the B-spline's weights (``series._windowed_spline``), instead of 16
    element gathers a pixel (a TPU's slow path, 0.3 GB/s, docs/accelerator.md), in batches of 512 points; with the
    gathers, the 8 x 512^2 rotation sequence took 20 s warm on a TPU v5e against 2.07 s on the same machine's
    13-core host (``benchmarks/bench_accelerator.py``, case dic_series). The windowed path gives the gathers'
    answers (forced on the CPU, ``tests/core/correlation/test_series_windows.py``) but its time on the chip is
    not measured yet (cases dic_series and dic_series_turning, which runs under ``"accelerator"``), so ``"auto"``
    keeps the host, where the frames' guesses are host work anyway and nothing crosses the link.

    Always under the setting ``"host"``, never under ``"accelerator"`` (:mod:`.choice`): a run under
    ``compute_on("accelerator")`` measures the chip.
    """
    return _host_rule("series_on_host")


def memory_bound_place(*inputs: object, kernel: str = "max_mipmap") -> contextlib.AbstractContextManager:
    """Where a memory-bound kernel (a few operations per input byte: the pyramids, the local correlation image)
    runs, for host inputs (NumPy, dask or Zarr, as a napari layer gives them) on a machine with an accelerator:
    where it finishes first by this machine's measured rates, the accelerator or the host CPU
    (:mod:`.rates`): the bytes that must cross (the inputs' as the source holds them, where the kernel sends
    them so), over the link's rate, plus the work on the accelerator's rate, against the work on the host's rate.
    ``kernel`` names the kernel, whose work and bytes sent :data:`.rates.KERNELS` describes
    (``"occupancy_mipmap"``, ``"max_mipmap"``, ``"local_correlation_image"``). Where the rates cannot be had (a
    measurement failed), the host.

    Why: such a kernel's work is one pass over its input, which the host's memory may read faster than the link
    carries it to the chip. On a TPU v5e machine (13-core host, link about 0.5-1.2 GB/s), with NumPy inputs on the
    chip, occupancy_mipmap of 1024^3 float32 ran 0.4x the host's speed, max_mipmap of 512^3 0.8x and
    local_correlation_image of 2000 x 512^2 0.8x, where with the inputs already on the chip they ran 44x, 120x and
    12x faster (``benchmarks/bench_accelerator.py``, docs/accelerator.md). The rates, not a fixed rule, decide, so
    that a source that crosses cheaply (uint8) or a slow host can take the chip. Compute-bound kernels (DIC,
    tracking, the maps) are not placed by this: their work per byte makes the chip worth the link (3.4x-16x with
    NumPy inputs). The rates are measured once per machine, at the first call that needs them, and kept
    (:func:`.rates.rates_for`); never where there is no accelerator.

    A device array input keeps the work on its device; the CPU backend changes nothing. The host under the setting
    ``"host"``; JAX's default device under ``"accelerator"`` (:mod:`.choice`); neither measures. A move to the
    host is noted in the job's log (the provenance's ``"ran_on"``). A dask input's blocks run later, in dask's
    threads (or a cluster's processes): the kernel hands them :func:`keep_place`, so that they run where this
    placed the call.
    """
    where = choice.setting()
    if where == "host":
        return on_host()
    if where == "accelerator" or not _on_accelerator() or any(isinstance(x, jax.Array) for x in inputs):
        return contextlib.nullcontext()
    from napari_gridmip.core.runtime import rates as _rates

    if _rates.place(_target_device(), kernel, inputs) == "accelerator":
        return contextlib.nullcontext()
    choice.moved_to_host("memory_bound_place")
    return on_host()


def _host_rule(rule: str) -> bool:
    """Whether ``rule``, which moves its work to the host CPU of a TPU, applies: under the setting ``"auto"`` on a
    TPU (noted in the job's log), always under ``"host"``, never under ``"accelerator"``."""
    where = choice.setting()
    if where != "auto":
        return where == "host"
    if not _on_tpu():
        return False
    choice.moved_to_host(rule)
    return True


_OUTSIDE = object()  # no compute_scope("host") around
# JAX's default device from before the innermost compute_scope("host"), which a nested "auto" or "accelerator" restores
_OUTER_DEVICE: contextvars.ContextVar[Any] = contextvars.ContextVar("napari_gridmip_outer_device", default=_OUTSIDE)


@contextlib.contextmanager
def compute_scope(where: str) -> Iterator[Any]:
    """The setting ``where`` (checked) for the block (:func:`napari_gridmip.compute_on`); yields the device its
    kernels run on unless a rule moves them.

    ``"host"`` sets JAX's default device, in this thread, to the host CPU; ``"auto"`` and ``"accelerator"`` inside
    a ``"host"`` block restore the default device from before it. No global flag of JAX changes.
    """
    choice.check(where)
    outer = _OUTER_DEVICE.get()
    with contextlib.ExitStack() as stack:
        if where == "host":
            if outer is _OUTSIDE:
                stack.enter_context(_scoped_var(_OUTER_DEVICE, jax.config.jax_default_device))
            stack.enter_context(on_host())
        elif outer is not _OUTSIDE:
            stack.enter_context(_scoped_var(_OUTER_DEVICE, _OUTSIDE))
            stack.enter_context(jax.default_device(outer))
        stack.enter_context(choice.scoped(where))
        yield _target_device()


@contextlib.contextmanager
def _scoped_var(variable: contextvars.ContextVar, value: Any) -> Iterator[None]:
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)


def placed() -> contextlib.AbstractContextManager:
    """The setting's placement in this thread, for the kernels' own scope (:func:`.precision.precision_scope`):
    the host CPU under ``"host"`` where JAX's default device here is not it already (a dask task in one of
    dask's threads, which the setting follows and JAX's per-thread default device does not; a library call with
    ``NAPARI_GRIDMIP_COMPUTE_ON=host``); else nothing."""
    if choice.setting() == "host" and _platform() != "cpu":
        return on_host()
    return contextlib.nullcontext()


def keep_place(kernel: Callable) -> Callable:
    """``kernel``, for a dask twin's blocks, run on the host CPU wherever it runs, when the work placed now runs
    there on a machine with an accelerator (:func:`memory_bound_place`'s move, the setting ``"host"``, the caller's
    own ``jax.default_device``): the blocks run later, in dask's threads or a cluster's processes, where JAX's
    default device, set per thread, is not the caller's. Else ``kernel`` itself."""
    if not on_cpu() or jax.default_backend() == "cpu":
        return kernel

    def on_the_host(*args: Any, **kwargs: Any) -> Any:
        with jax.default_device("cpu"):  # a platform name, not a device: the task may be pickled to a worker
            return kernel(*args, **kwargs)

    return on_the_host


def current_device() -> dict[str, str]:
    """The device a call made here runs on, unless a rule moves it: ``{"platform": ..., "device_kind": ...}``."""
    device = _target_device()
    return {"platform": device.platform, "device_kind": device.device_kind}


def _target_device() -> Any:
    """JAX's default device here where one is set (a device or a platform's name), else the default backend's."""
    device = jax.config.jax_default_device
    if device is None:
        return jax.devices()[0]
    if isinstance(device, str):
        return jax.devices(device)[0]
    return device


def host_pool_aliased() -> bool:
    """Whether the render's pool of bricks (:class:`.occupancy.raycast.ChunkCache`) is handed to JAX as the host
    array itself, or kept as a copy on the device that only the newly written bricks update.

    The host array on the CPU: ``jax.device_put`` of a host array there aliases it (no copy). Elsewhere it copied
    the whole pool, 512 MiB by default, once per band of every render: over a TPU host's link, about 2.5 GB/s
    (``benchmarks/bench_accelerator.py``, the offsets-first map's 236 MB in 0.094 s), 0.2 s a band for bricks
    mostly on the device already. Measured since: a render on a TPU v5e spent 7 ms updating the pool
    (``benchmarks/probes/accelerator_profile.py``, case render_view_on_chip), its element gathers being what
    holds it there (:func:`render_on_host`).
    """
    return on_cpu()


def _on_tpu() -> bool:
    """Whether the work about to be traced runs on a TPU (JAX's default device when one is set, else the default
    backend)."""
    return _platform() == "tpu" and _has_host()


def _on_accelerator() -> bool:
    """Whether the work about to be traced runs on an accelerator (a TPU, a GPU) of a process that also has the
    host's CPU backend."""
    return _on_tpu() or (_platform() != "cpu" and _has_host())


def _has_host() -> bool:
    """Whether this process has the host CPU backend: one started with JAX_PLATFORMS=tpu has none, and then
    everything stays on the accelerator."""
    try:
        jax.devices("cpu")
    except RuntimeError:
        return False
    return True


def on_host() -> contextlib.AbstractContextManager:
    """The scope that runs JAX's work on the host CPU (its first device)."""
    return jax.default_device(jax.devices("cpu")[0])


RECORD_RING_STEPS = 32  # steps between two flushes of traverse's ring of records (step_record_ring)


def step_record_ring() -> int:
    """How :func:`.occupancy.traverse.traverse_occupied` records the voxels its rays cross at each step: ``0``,
    a scatter into each ray's next slot (``.at[rows, slot].set``) at every step; else the number of steps of a
    ring of records, whole rows written at every step, sorted into the rays' slots once per ring.

    Scatters on the CPU: each is a few thousand stores into memory the cores cache. A ring elsewhere: on a TPU
    v5e the scatters were 3.4 of the 4.4 s of device time of traverse_occupied 512^3 with 1M rays, which ran at
    0.7x the same machine's CPU (``benchmarks/probes/accelerator_profile.py``, case traverse_occupied,
    docs/accelerator.md).
    """
    return 0 if on_cpu() else RECORD_RING_STEPS


def offset_sweeps() -> bool:
    """Whether the dense maps (:mod:`.correlation.maps`: find_displacement's peak search and windowed_pearson's
    offsets-first map) sweep the window's offsets one at a time over a whole band of rows, or run the CPU's
    tiles of a few rows through all offsets at once.

    Tiles on the CPU, where a tile of 32 rows (or 4 for the map) and its offsets stay in the cores' caches and
    XLA fuses each tile's sums into vectorised loops (``benchmarks/bench_correlation.py``). Sweeps
    elsewhere: a tile is too small a step for an accelerator, whose loop iterations each cost a launch, and
    the tiles' gathers (the 3x3 neighbourhood of every pixel's peak, the map's runs of the flattened image)
    are where a TPU is slowest; a sweep reads the band once per offset with static and row-aligned slices
    and takes the peak's neighbourhood in a second sweep of selects, no gather. On a TPU v5e,
    find_displacement K=10 2048^2 15x15 took 9.7 s with the tiles against 2.5 s on the 13-core host
    (the sweep's figures: docs/accelerator.md).
    """
    return not on_cpu()


def cache_sized_bands() -> bool:
    """Whether the bands of the gathering refinements (:mod:`.correlation.refine`) are sized for the CPU's
    caches (9 MiB of gathered blocks, at most 64 rows), or large, for an accelerator.

    On the CPU a band's gathered 4x4 blocks stay in cache (K=10, 900x900: 16 rows refine in 0.42 s, 32 rows in
    0.83 s). On an accelerator each band is a launch and a wait: the 1024^2 refinement's 73 bands of 14 rows
    made find_displacement(refine) 5.6x slower on a TPU v5e than on its host; large bands make few.
    """
    return on_cpu()
