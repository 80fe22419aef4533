"""Band programs over every local device: a driver's bands side by side, one per device, with ``jax.sharding``.

Each device runs the very band program a single device runs, on the same inputs, so the answers are the same
(``tests/core/test_sharding.py``, run by CI on 8 host devices). On one device, or with
``NAPARI_GRIDMIP_SHARD_BANDS=0``, the bands run one after the other as before; beyond one machine, the kernels'
dask twins on dask.distributed are the way out.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from napari_gridmip.core.options import switched_off
from napari_gridmip.core.runtime import strategy

VARIABLE = "NAPARI_GRIDMIP_SHARD_BANDS"
_AXIS = "bands"

Progress = Callable[[int], None]


def band_devices() -> tuple[Any, ...]:
    """The devices the band programs run on: the call's device (:func:`.strategy._target_device`) first, then
    the other local devices of its platform. Only the call's device when ``NAPARI_GRIDMIP_SHARD_BANDS`` is off
    (``0``, ``false``, ``no``, ``off``).

    Under ``compute_on("host")`` on an accelerator machine the platform is the host CPU's, which has one device
    unless XLA was told otherwise.
    """
    target = strategy._target_device()
    if switched_off(VARIABLE):
        return (target,)
    try:
        devices = jax.local_devices(backend=target.platform)
    except RuntimeError:
        return (target,)
    if target not in devices:
        return (target,)
    return (target, *(d for d in devices if d != target))


def spread_rows(rows: int, out_rows: int, devices: int) -> int:
    """Rows per band for ``devices`` devices: ``rows`` (the driver's plan), lowered where needed so that the
    output's ``out_rows`` make at least one band per device. ``rows`` itself on one device."""
    if devices <= 1:
        return rows
    return max(1, min(rows, -(-out_rows // devices)))


def band_starts(rows: int, out_rows: int) -> list[int]:
    """The first rows of bands of ``rows`` rows covering ``out_rows``; the last band ends flush with the output."""
    return sorted({min(start, out_rows - rows) for start in range(0, out_rows, rows)})


def run_bands(
    band: Callable[..., Any],
    args: Sequence[Any],
    starts: Sequence[int],
    *,
    row_arg: int,
    static: dict[str, Any],
    devices: Sequence[Any] | None = None,
    progress: Progress | None = None,
) -> list[Any]:
    """Run ``band(*args with the first row inserted at row_arg, **static)`` for each of ``starts``.

    Parameters
    ----------
    band
        A band program (a jitted function, or the library's :func:`.executables.kept` one): the positional
        arrays ``args`` with the band's first row (an ``int32`` scalar) inserted at position ``row_arg``, and
        its static options ``static`` by keyword; returns a pytree of arrays (one band's outputs).
    args
        The band program's other positional arguments (arrays, NumPy or JAX, scalars, None).
    starts
        The bands' first rows, in order.
    row_arg
        Where the first row goes among the positional arguments.
    static
        The static keyword options (hashable values).
    devices
        Where to run (default :func:`band_devices`); the first is the call's device, where the pieces end up.
    progress
        ``progress(done)``, called with the number of bands done before each step (one band, or one band per
        device); it may raise to stop between steps.

    Returns
    -------
    list
        One output pytree per band, in the order of ``starts``, each on ``devices[0]``.
    """
    devices = _home_first(tuple(band_devices() if devices is None else devices), args)
    traced = any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(args))
    if len(devices) == 1 or len(starts) == 1 or traced:
        return _one_by_one(band, args, starts, row_arg=row_arg, static=static, progress=progress)
    count = len(devices)
    grid = mesh(devices)
    layout = [None] * len(args)
    layout.insert(row_arg, ONE_EACH)
    program = per_device(band, grid, tuple(layout), tuple(sorted(static.items())))
    everywhere = list(jax.device_put(tuple(args), split(grid, axis=None)))
    groups = []
    for first in range(0, len(starts), count):
        if progress is not None:
            progress(first)
        rows = list(starts[first : first + count])
        rows += rows[-1:] * (count - len(rows))  # a short last group repeats its last band; the copies are dropped
        call = list(everywhere)
        call.insert(row_arg, jax.device_put(np.asarray(rows, np.int32), split(grid, axis=0)))
        groups.append(program(*call))
        jax.block_until_ready(groups[-1])  # progress means work done; a stop between steps stops the work
    # each device's pieces cross to the call's device (one transfer of the tree), then one program takes them apart
    return list(_apart(count, len(starts))(jax.device_put(groups, devices[0])))


def _home_first(devices: tuple[Any, ...], args: Sequence[Any]) -> tuple[Any, ...]:
    """``devices`` with the device that the inputs are committed to first, where one of them is (a user's array put
    on a device of its own): the pieces then land there, beside the inputs that the driver's later steps take with
    them (the refinement, the affine IC-GN). Only that device where it is not among ``devices``."""
    homes = {
        device
        for leaf in jax.tree_util.tree_leaves(args)
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer) and leaf.committed
        for device in leaf.devices()
    }
    if len(homes) != 1:
        return devices
    (home,) = homes
    if home == devices[0]:
        return devices
    return (home, *(d for d in devices if d != home)) if home in devices else (home,)


def spread_blocks(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel``, for a dask twin's blocks, each call run on the next local device, in turn, of the platform
    the work is placed on now (:func:`band_devices`); ``kernel`` itself where that is one device.

    A dask twin's blocks are independent tasks that dask's threads run side by side: each device then takes
    every ``N``-th block's levels (the mipmaps of large volumes) or moments (the correlation image), and the
    results come back to the host as NumPy. Apply it outside :func:`.strategy.keep_place`, whose host placement
    then wins. The device is looked up by platform where the task runs, so a task sent to another process
    (dask.distributed) uses that process's devices.
    """
    devices = band_devices()
    if len(devices) == 1:
        return kernel
    return _InTurn(kernel, devices[0].platform)


class _InTurn:
    """A kernel whose calls go to the local devices of ``platform`` in turn (:func:`spread_blocks`)."""

    def __init__(self, kernel: Callable[..., Any], platform: str):
        self.kernel, self.platform = kernel, platform
        self._turns = itertools.count()  # next() is atomic under the GIL: dask's threads share it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            devices = jax.local_devices(backend=self.platform)
        except RuntimeError:  # a process without that platform (a cluster's CPU worker): its own default device
            return self.kernel(*args, **kwargs)
        with jax.default_device(devices[next(self._turns) % len(devices)]):
            return self.kernel(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return (_InTurn, (self.kernel, self.platform))


def wait_for(result: object) -> None:
    """Block until a band's (or a chunk's) result is computed, unless it is traced by a caller's jit: progress
    then means work done, a stop between bands stops the work, and a driver's loop does not run ahead of the
    asynchronous computation with its inputs queued (``local_correlation_image``'s chunks: 898 MiB of them
    before it waited, docs/timeseries.md)."""
    if not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(result)):
        jax.block_until_ready(result)


def _one_by_one(band, args, starts, *, row_arg, static, progress) -> list[Any]:
    """The bands one after the other on the call's device: the single-device path, as before sharding."""
    pieces = []
    for done, start in enumerate(starts):
        if progress is not None:
            progress(done)
        call = list(args)
        call.insert(row_arg, np.int32(start))
        pieces.append(band(*call, **static))
        wait_for(pieces[-1])
    return pieces


ONE_EACH = "one each"  # a layout entry of per_device: one element per device, handed to it alone


@functools.lru_cache(maxsize=8)
def mesh(devices: tuple[Any, ...]) -> Mesh:
    """A one-axis :class:`~jax.sharding.Mesh` of ``devices``, its axis named ``"bands"``."""
    return Mesh(np.asarray(devices, dtype=object), (_AXIS,))


def split(grid: Mesh, *, axis: int | None) -> NamedSharding:
    """A sharding over ``grid``: split into one equal part per device along ``axis``, or replicated (None)."""
    if axis is None:
        return NamedSharding(grid, PartitionSpec())
    return NamedSharding(grid, PartitionSpec(*([None] * axis), _AXIS))


@functools.lru_cache(maxsize=64)
def per_device(
    program: Callable[..., Any], grid: Mesh, layout: tuple[int | str | None, ...], static: tuple[tuple[str, Any], ...]
) -> Callable[..., Any]:
    """``program`` run on every device of ``grid`` at once, as one compiled program (``jax.shard_map``).

    ``layout`` says, per positional argument, what each device is handed: None, the whole argument (replicated,
    :func:`split` with ``axis=None``); an axis, its own part along that axis (split there); :data:`ONE_EACH`, its
    own element of a ``(devices,)`` array. ``static`` are ``program``'s static keyword options, as sorted items.
    The outputs are each device's outputs stacked along a new leading axis, split over the devices. Kept per
    program, mesh, layout and options: a later call with the same family of shapes reuses the compiled program.
    """
    options = dict(static)

    def on_each_device(*args: Any) -> Any:
        mine = [a[0] if how == ONE_EACH else a for a, how in zip(args, layout)]
        return jax.tree_util.tree_map(lambda x: x[None], program(*mine, **options))

    specs = tuple(
        PartitionSpec(_AXIS) if how == ONE_EACH else split(grid, axis=how).spec for how in layout
    )  # fmt: skip
    # check_vma off: the programs mix a device's own part with replicated inputs in loops whose carries JAX's
    # varying-axes check would ask to be marked by hand; every output is per device (out_specs)
    mapped = jax.shard_map(on_each_device, mesh=grid, in_specs=specs, out_specs=PartitionSpec(_AXIS), check_vma=False)
    return jax.jit(mapped)


@functools.lru_cache(maxsize=16)
def _apart(count: int, bands: int) -> Callable:
    """One program that takes the groups' stacked outputs (``count`` bands each) apart into ``bands`` pieces."""

    def apart(groups: list[Any]) -> list[Any]:
        pieces = [jax.tree_util.tree_map(lambda x, i=i: x[i], group) for group in groups for i in range(count)]
        return pieces[:bands]

    return jax.jit(apart)
