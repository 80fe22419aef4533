"""Where a memory-bound call finishes first: this machine's link and compute rates, measured once and kept, and
the estimate made from them (:func:`napari_gridmip.core.runtime.strategy.memory_bound_place`).

A memory-bound kernel (the pyramids, the local correlation image) makes a pass or two over its input: on a machine
with an accelerator, a host input may be read faster by the host's memory than the link carries it to the chip.
``python -m napari_gridmip.cli.rates`` prints this machine's rates and where the benchmark's cases would run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from napari_gridmip.core.runtime.compile_cache import cache_dir
from napari_gridmip.core.runtime.files import write_atomically

FORMAT = "napari-gridmip rates 1"
FILE_NAME = "rates.json"
LINK_BYTES = 32 * 2**20  # the link's probe: tens of MiB, as one chunk or a small layer
LATENCY_BYTES = 4096
REPEATS = 3
#: The accelerator is chosen only when its estimate is this much smaller than the host's: the rates come from
#: probes of tens of MiB, and a call of GiBs may find the link slower (a TPU v5e host's ran 0.47 GB/s for one
#: 4 GiB ``device_put``, 2.5 GB/s for 236 MB); near a tie the host, where nothing can go slower.
MARGIN = 1.25

_LOG = logging.getLogger(__name__)
_LOCK = threading.Lock()  # one measurement at a time in a process (two jobs may place calls at once)
_KEPT: dict[tuple[str, str], dict[str, Any]] = {}  # (file, machine key) -> its entry, as read or measured here
_FAILED: set[tuple[str, str]] = set()  # measurements that failed in this process: not tried again


# -- the kernels and the estimate (pure) ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Kernel:
    """What a memory-bound kernel does with ``n`` input elements, for :func:`estimate`.

    ``program``: the measured program its work is like (:data:`PROGRAMS`). ``work_itemsize``: the bytes an element
    takes in its work (None: the input's own itemsize). ``sent_itemsize``: the bytes an element takes on the link
    (None: the input's own, as the source holds it). ``passes``: its work in passes of ``program`` over the input
    (a pyramid's levels: 1 + 1/8 + 1/64 ... = 8/7). ``returned``: the bytes that come back to the host, in units
    of the work's bytes of one pass (a pyramid's levels are 8/7 of its level 0; a correlation image, next to
    nothing).
    """

    program: str
    work_itemsize: int | None = None
    sent_itemsize: int | None = None
    passes: float = 1.0
    returned: float = 0.0


PYRAMID = 8 / 7  # 1 + 1/8 + 1/64 + ...: a pyramid's levels, in units of its level 0

#: The memory-bound kernels placed by :func:`napari_gridmip.core.runtime.strategy.memory_bound_place`.
KERNELS = {
    # level 0 is thresholded on the host in either case (common work) and crosses as bools
    "occupancy_mipmap": Kernel("any", work_itemsize=1, sent_itemsize=1, passes=PYRAMID, returned=PYRAMID),
    "max_mipmap": Kernel("max", passes=PYRAMID, returned=PYRAMID),
    # the chunks' sums in float32 whatever the source; the image (one frame) comes back. A source of at most 2
    # bytes an element crosses as held (timeseries.sent_as_held); a wider one as float32 (4 bytes: an 8-byte source
    # is counted at 8, erring towards the host)
    "local_correlation_image": Kernel("products", work_itemsize=4),
}


def estimate(
    rates: Mapping[str, Any],
    kernel: Kernel,
    *,
    elements: float,
    held_bytes: float,
    sent_itemsize: int | None = None,
) -> tuple[float, float]:
    """``(host seconds, accelerator seconds)`` of one call of ``kernel`` on ``elements`` input elements that the
    source holds in ``held_bytes``; ``sent_itemsize``, where given, is what each element takes on the link
    (overriding the kernel's own). ``rates`` as kept (:func:`rates_for`), with ``kernel.program`` measured::

        accelerator = latency + bytes sent / to_device + bytes returned / to_host + work / accelerator's rate
        host        = work / host's rate

    Pure arithmetic, no JAX. Work common to both (reading a Zarr chunk, the NumPy threshold of
    ``occupancy_mipmap``, the aligned copy of ``to_device``) is left out: it does not change which is smaller.
    The bytes sent are the input's as the source holds them (a uint8 volume crosses at a byte a voxel), except
    where a kernel sends something else (``occupancy_mipmap`` sends its level 0 as bools); the work is counted in
    bytes of the kernel's own compute dtype (:data:`KERNELS`).
    """
    itemsize = held_bytes / elements if elements else 0.0
    work = elements * (kernel.work_itemsize or itemsize)
    sent = elements * (sent_itemsize or kernel.sent_itemsize or itemsize)
    program = rates["programs"][kernel.program]
    host = kernel.passes * work / program["host"]
    accelerator = (
        rates["latency_s"]
        + sent / rates["to_device"]
        + kernel.returned * work / rates["to_host"]
        + kernel.passes * work / program["accelerator"]
    )
    return host, accelerator


def choose(host_s: float, accelerator_s: float, margin: float = MARGIN) -> str:
    """``"accelerator"`` where its estimate is ``margin`` times smaller than the host's, else ``"host"``."""
    return "accelerator" if accelerator_s * margin < host_s else "host"


def sizes(inputs: tuple[object, ...]) -> tuple[float, float]:
    """``(elements, bytes)`` of the arrays among ``inputs`` as their sources hold them (NumPy, dask, Zarr: their
    ``size`` and ``dtype``, nothing read); NaN where a size is unknown (a dask array of unknown chunks)."""
    elements = held = 0.0
    for x in inputs:
        size, dtype = getattr(x, "size", None), getattr(x, "dtype", None)
        if size is None or dtype is None:
            continue
        try:
            size, itemsize = float(size), np.dtype(dtype).itemsize
        except (TypeError, ValueError):
            return math.nan, math.nan
        elements += size
        held += size * itemsize
    return elements, held


def place(device: Any, kernel: str, inputs: tuple[object, ...]) -> str:
    """``"host"`` or ``"accelerator"``: where a call of ``kernel`` (a name in :data:`KERNELS`) on ``inputs``,
    host arrays, finishes first, ``device`` being the accelerator it would otherwise run on. The host where the
    rates cannot be had (:func:`rates_for`) or the sizes are unknown."""
    profile = KERNELS[kernel]
    elements, held = sizes(inputs)
    if not elements or not math.isfinite(elements):
        return "host"
    rates = rates_for(device, profile.program)
    if rates is None:
        return "host"
    return choose(*estimate(rates, profile, elements=elements, held_bytes=held))


# -- the kept rates --------------------------------------------------------------------------------------------


def path() -> Path:
    """The rates file: ``rates.json`` in the library's cache folder, beside the compiled programs' folder."""
    return cache_dir().parent / FILE_NAME


def machine(device: Any) -> dict[str, str]:
    """What the rates depend on: the device's platform and kind, the host's processor and cores, JAX's version."""
    return {"platform": device.platform, "device_kind": device.device_kind, "host": _host(), "jax": jax.__version__}


def key_of(facts: Mapping[str, str]) -> str:
    return " | ".join(facts[name] for name in ("platform", "device_kind", "host", "jax"))


@functools.cache
def _host() -> str:
    """The host's processor (its model name where Linux gives it) and the cores this process may use."""
    name = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            line = next((line for line in cpuinfo if line.startswith("model name")), "")
            name = line.partition(":")[2].strip()
    name = name or platform.processor() or platform.machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name} x{cores}"


def rates_for(device: Any, program: str) -> dict[str, Any] | None:
    """This machine's rates for ``device`` with ``program`` among them (:func:`estimate`'s ``rates``), from this
    process's memory, else the file, else measured now and kept (only what is missing: the link, ``program``).

    The file (:func:`path`, beside the compiled programs) keys them by the device's platform and kind, the host's
    processor and core count, and JAX's version. Measured, best of :data:`REPEATS`: the link
    (:func:`measure_link`: ``jax.device_put`` of :data:`LINK_BYTES` and the copy back; the latency, a round trip of
    4 KiB) and each kernel's work on the host CPU backend and on the accelerator with the data already there
    (:func:`measure_program`: one tiny program per kind of work, :data:`PROGRAMS`, the kernels' own building
    blocks), as bytes of input per second. Only the program of the kernel being placed is measured.

    None where ``device`` is the CPU (nothing to measure: the work is on the host wherever it runs), and where a
    measurement failed (logged once a process).
    """
    if getattr(device, "platform", "cpu") == "cpu":
        return None
    file = path()
    facts = machine(device)
    key = (str(file), key_of(facts))
    with _LOCK:
        entry = _KEPT.get(key)
        if entry is None or program not in entry["programs"]:  # another process may have measured it since
            entry = _read(file).get(key[1]) or entry or {**facts, "programs": {}, "cost_s": {}}
        if "to_device" in entry and program in entry["programs"]:
            _KEPT[key] = entry
            return entry
        if key in _FAILED:
            return None
        try:
            entry = _measured(entry, device, program)
        except Exception:  # noqa: BLE001 - any failure of the probe: the call runs on the host, as before
            _FAILED.add(key)
            _LOG.warning("could not measure this machine's rates for %s: placing on the host", key[1], exc_info=True)
            return None
        machines = _read(file)
        machines[key[1]] = entry
        _write(file, machines)
        _KEPT[key] = entry
        return entry


def measure_again(device: Any) -> None:
    """Forget ``device``'s kept rates, in this process and in the file: the next :func:`rates_for` measures."""
    file = path()
    key = key_of(machine(device))
    with _LOCK:
        _KEPT.pop((str(file), key), None)
        _FAILED.discard((str(file), key))
        machines = _read(file)
        if machines.pop(key, None) is not None:
            _write(file, machines)


def forget() -> None:
    """Drop what this process kept (the file stays): the next :func:`rates_for` reads the file again."""
    with _LOCK:
        _KEPT.clear()
        _FAILED.clear()


def _measured(entry: dict[str, Any], device: Any, program: str) -> dict[str, Any]:
    """``entry`` with the link's rates and ``program``'s measured where it lacks them."""
    entry = {**entry, "programs": dict(entry["programs"]), "cost_s": dict(entry.get("cost_s", {}))}
    if "to_device" not in entry:
        start = time.perf_counter()
        entry.update(measure_link(device))
        entry["cost_s"]["link"] = round(time.perf_counter() - start, 4)
    if program not in entry["programs"]:
        start = time.perf_counter()
        entry["programs"][program] = measure_program(program, device)
        entry["cost_s"][program] = round(time.perf_counter() - start, 4)
    entry["measured"] = datetime.datetime.now().isoformat(timespec="seconds")
    return entry


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _valid(entry: Any) -> dict[str, Any] | None:
    """The usable part of a kept entry: its link rates and the programs whose two rates are sound; None where its
    link rates are not (it is measured again)."""
    if not isinstance(entry, dict) or not all(_positive(entry.get(k)) for k in ("to_device", "to_host", "latency_s")):
        return None
    programs = entry.get("programs")
    programs = programs if isinstance(programs, dict) else {}
    sound = {
        name: rates
        for name, rates in programs.items()
        if name in PROGRAM_NAMES and isinstance(rates, dict) and all(_positive(rates.get(s)) for s in SIDES)
    }
    cost = entry.get("cost_s")
    return {**entry, "programs": sound, "cost_s": cost if isinstance(cost, dict) else {}}


def _read(file: Path) -> dict[str, dict[str, Any]]:
    """The file's sound entries by machine key; nothing where it is missing, unreadable, corrupt or of another
    format (its entries are then measured again, and the file rewritten)."""
    try:
        kept = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(kept, dict) or kept.get("format") != FORMAT or not isinstance(kept.get("machines"), dict):
        return {}
    entries = {key: _valid(entry) for key, entry in kept["machines"].items()}
    return {key: entry for key, entry in entries.items() if entry is not None}


def _write(file: Path, machines: dict[str, Any]) -> None:
    """Keep ``machines`` (every machine's entry: a cache folder may be shared), atomically; an unwritable folder
    keeps them in this process only."""
    text = json.dumps({"format": FORMAT, "machines": machines}, indent=1, sort_keys=True)
    try:
        write_atomically(file, text)
    except OSError:
        _LOG.warning("could not keep this machine's rates in %s", file, exc_info=True)


# -- the measurements ----------------------------------------------------------------------------------------

SIDES = ("host", "accelerator")


def _best(call: Callable[[], Any], repeats: int = REPEATS) -> float:
    """The shortest of ``repeats`` timed calls (seconds)."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def measure_link(device: Any, nbytes: int = LINK_BYTES) -> dict[str, float]:
    """``{"to_device": B/s, "to_host": B/s, "latency_s": s}`` of ``device``'s link, best of :data:`REPEATS` each:
    a ``device_put`` of ``nbytes`` of NumPy data waited for (``block_until_ready``), the copy back of a fresh
    device array (``np.asarray``), and the round trip of :data:`LATENCY_BYTES`. The rates include each transfer's
    fixed cost."""
    buffer = np.ones(max(nbytes, LATENCY_BYTES) // 4, np.float32)
    small = np.ones(LATENCY_BYTES // 4, np.float32)
    there: list[Any] = []
    latency = _best(lambda: np.asarray(jax.device_put(small, device).block_until_ready()))
    to_device = _best(lambda: there.append(jax.device_put(buffer, device).block_until_ready()))
    to_host = _best(lambda: np.asarray(there.pop()))  # a fresh array each time: a fetched one keeps its host copy
    return {"to_device": buffer.nbytes / to_device, "to_host": buffer.nbytes / to_host, "latency_s": latency}


def cube_shape(scale: float, elements: int) -> tuple[int, int, int]:
    """A ``(D, 256, 256)``-like shape of about ``elements * scale**3`` elements, every side even (a probe's input)."""
    side = max(2, 2 * round(128 * scale))
    return max(2, 2 * round(elements * scale**3 / side**2 / 2)), side, side


Probe = Callable[[], tuple[Callable, Callable[[float], np.ndarray]]]

#: The measured programs: the memory-bound kernels' work (:data:`KERNELS`), each a maker of its program and of its
#: input (at a scale). The kernels' modules register their own (:func:`probe`), so that this module imports none of
#: them (they import it, through ``core.runtime.strategy``): ``"any"`` and ``"max"``, the pyramids' 2x2x2 steps
#: (``occupancy.pyramid``), ``"products"``, the correlation image's per-frame sums (``correlation.timeseries``).
PROGRAMS: dict[str, Probe] = {}
#: Their names, which the rates file may hold (known before the kernels' modules are imported).
PROGRAM_NAMES = ("any", "max", "products")


def probe(name: str) -> Callable[[Probe], Probe]:
    """A decorator: register ``name``'s probe in :data:`PROGRAMS` (where the kernel's module defines it)."""

    if name not in PROGRAM_NAMES:
        raise ValueError(f"probe name must be one of {PROGRAM_NAMES}; got {name!r}")

    def register(make: Probe) -> Probe:
        PROGRAMS[name] = make
        return make

    return register


def measure_program(program: str, device: Any, *, host: Any = None, scale: float = 1.0) -> dict[str, float]:
    """``{"host": B/s, "accelerator": B/s}``: bytes of input per second of ``program`` (:data:`PROGRAMS`) on the host
    CPU backend (``host``, default its first device) and on ``device``, the data already there, each compiled
    first; best of :data:`REPEATS`. ``scale`` shrinks the data per side (a test's)."""
    function, make = PROGRAMS[program]()  # registered by the kernel's module, imported by its caller
    compiled = jax.jit(function)
    data = make(scale)
    rates = {}
    for side, where in (("host", host or jax.devices("cpu")[0]), ("accelerator", device)):
        x = jax.device_put(data, where)
        jax.block_until_ready(compiled(x))  # compiled, and run once
        rates[side] = data.nbytes / _best(lambda x=x: jax.block_until_ready(compiled(x)))
        del x
    return rates
