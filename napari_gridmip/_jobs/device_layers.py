"""Layers that stay on the device: a widget's input layer is sent to the accelerator once and kept there while it is
unchanged, so that the next runs on it (a new threshold, window or subset) start from the device copy.

Qt-free (napari's layer events are plain callbacks): :class:`DeviceLayerCache` holds the copies under a budget,
:class:`DeviceInput` is what a widget captures, :func:`resolve` turns it into the kernels' array in the worker, and
:class:`LayerWatch` drops a layer's copies when it is edited or removed. JAX is imported only in the worker.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip.core.runtime import choice

DEFAULT_PERCENT = 50  # of the device's memory: the kernels need the rest (DIC 2048^2 peaks at a few GB on a TPU)
MAX_PERCENT = 90
FALLBACK_DEVICE_BYTES = 8 * 2**30  # a device that does not report its memory (the CPU, when tests keep copies)
CHANGE_EVENTS = ("data", "refresh", "paint")  # a layer's events that say its values changed (paint: Labels only)


@dataclass
class _Entry:
    version: Hashable
    array: Any  # a jax.Array on ``device``
    nbytes: int
    device: Any


class DeviceLayerCache:
    """Device copies of layers' data, by key and version, under a budget of bytes (least recently used evicted).

    Parameters
    ----------
    budget_bytes
        The budget; None: ``percent`` of the device's memory (``memory_stats()["bytes_limit"]``, asked in the
        worker; :data:`FALLBACK_DEVICE_BYTES` where the device does not say).
    percent
        The device's share when ``budget_bytes`` is None; 0 keeps nothing.
    keep_on_cpu
        Keep copies on the CPU too, where JAX's default device is the host itself and nothing is gained: for tests,
        which have no accelerator.

    Notes
    -----
    :meth:`get` runs in the workers; :meth:`drop`, :meth:`drop_layer` and :meth:`clear` on any thread (napari's
    events: the GUI thread). A copy dropped while a job computes on it lives until that job lets it go.

    Why: with NumPy inputs a run on a TPU pays the link for every input byte, every run. The memory-bound kernels
    then run on the host at best (``core.runtime.strategy.memory_bound_place``: ``max_mipmap`` 512^3 at 1.0x the host,
    120x
    with its input on the chip; ``local_correlation_image`` 2000 x 512^2 at 1.0x, 12x on the chip), and the
    compute-bound ones lose much of their lead (``find_displacement`` K=10 2048^2: 3.4x the host with NumPy in and
    out, 11.6x with its inputs on the chip; docs/accelerator.md). A device input keeps every kernel on the device by
    the existing rules.

    Nothing is kept where nothing is gained, and the input passes unchanged, so a CPU's runs and memory are as
    before: JAX's default device is the CPU (no accelerator), the setting ``compute_on`` is ``"host"``, the budget
    is 0, or the job's kernels would run on the host anyway (float64 on a TPU). An input that is not an in-memory
    NumPy array (dask, Zarr: read block by block, larger than memory), 64-bit data (JAX narrows it without x64; a TPU
    has no float64) and an array over the budget pass unchanged too. The data goes in its own dtype: a uint8 or uint16
    layer crosses the link at 1 or 2 bytes a value, the kernels cast it on the device.

    Not seen: an Image layer's array edited in place and then ``layer.refresh()``: napari's refresh emits only
    ``set_data``, which every slider move emits too. Emit ``layer.events.data`` (or assign ``layer.data``) after such
    an edit, as napari's own Labels painting does with its events.
    """

    def __init__(
        self, budget_bytes: int | None = None, *, percent: float = DEFAULT_PERCENT, keep_on_cpu: bool = False
    ) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()  # least recently used first
        self._sending: dict[Hashable, tuple[Hashable, threading.Event]] = {}  # key -> (version, set when sent)
        self._held = 0  # bytes of the entries
        self._reserved = 0  # bytes being sent
        self._budget_bytes = budget_bytes
        self._percent = float(percent)
        self._device_bytes: dict[Any, int] = {}
        self.keep_on_cpu = keep_on_cpu
        self.hits = self.misses = self.evictions = 0

    # -- the budget --------------------------------------------------------------------------------------------------
    def configure(self, *, percent: float | None = None, budget_bytes: int | None = None) -> None:
        """Change the budget: ``percent`` of the device's memory, or ``budget_bytes``; 0 frees every copy now. A
        smaller budget evicts at the next :meth:`get` (the device's memory is asked there, in a worker)."""
        with self._lock:
            if budget_bytes is not None:
                self._budget_bytes = int(budget_bytes)
            elif percent is not None:
                self._budget_bytes = None
                self._percent = float(percent)
            off = self._budget_bytes == 0 or (self._budget_bytes is None and self._percent <= 0)
        if off:
            self.clear()

    def budget(self, device: Any = None) -> int | None:
        """The budget in bytes on ``device`` (JAX's; None: the budget if it is known without asking JAX)."""
        if self._budget_bytes is not None:
            return self._budget_bytes
        if self._percent <= 0:
            return 0
        if device is None:
            known = list(self._device_bytes.values())
            return int(self._percent / 100 * known[0]) if known else None
        if device not in self._device_bytes:
            self._device_bytes[device] = _device_memory(device)
        return int(self._percent / 100 * self._device_bytes[device])

    # -- the copies (workers) ----------------------------------------------------------------------------------------
    def get(self, key: Hashable, version: Hashable, array: Any) -> Any:
        """The device copy of ``array`` kept under ``key`` at ``version``, sent now if there is none (a miss);
        ``array`` itself where nothing is kept (see :meth:`lookup`)."""
        return self.lookup(key, version, array)[0]

    def lookup(self, key: Hashable, version: Hashable, array: Any) -> tuple[Any, str, str]:
        """``(value, outcome, why)``: the device copy and ``"hit"`` (kept from an earlier run) or ``"miss"`` (sent
        now, and kept); or ``array`` itself and ``"off"`` (nothing is kept here: no accelerator, the setting
        ``"host"``, the budget 0) or ``"skipped"`` (this array is not kept: ``why``).

        In a worker, inside the job's :func:`napari_gridmip.compute_on` block: JAX's default device there is where
        the copy goes. Another worker sending the same key and version is waited for, not repeated.
        """
        from napari_gridmip.core.runtime import strategy  # imports JAX: in the worker, not as the widgets load

        if choice.setting() == "host":
            return array, "off", "compute_on is 'host'"
        device = strategy._target_device()
        if device.platform == "cpu" and not self.keep_on_cpu:
            return array, "off", "no accelerator: JAX's default device is the CPU"
        budget = self.budget(device) or 0
        if budget <= 0:
            return array, "off", "the budget is 0"
        why = _not_kept(array, budget)
        if why:
            return array, "skipped", why
        nbytes = int(array.nbytes)
        while True:
            with self._lock:
                self._shrink(budget)
                entry = self._entries.get(key)
                if entry is not None and entry.version == version and entry.device == device:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return entry.array, "hit", ""
                if entry is not None:  # another version, or another device: stale
                    self._remove(key)
                sending = self._sending.get(key)
                if sending is not None and sending[0] == version:
                    wait = sending[1]
                else:
                    wait = None
                    self._make_room(nbytes, budget)
                    token = threading.Event()
                    self._sending[key] = (version, token)
                    self._reserved += nbytes
                    self.misses += 1
            if wait is None:
                break
            wait.wait()  # a worker, never the GUI thread: the same copy is on its way
        try:
            copy = _send(array, device)
        except BaseException as error:  # the bookkeeping undone whatever stopped it: no waiter is left waiting
            with self._lock:
                self._reserved -= nbytes
                if self._sending.get(key, (None, None))[1] is token:
                    del self._sending[key]
            token.set()
            if not isinstance(error, RuntimeError):
                raise
            # XLA's errors (out of memory): the kernels get the host array, as before, and what memory there is
            self.clear()
            return array, "skipped", f"not sent: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
        with self._lock:
            self._reserved -= nbytes
            current = self._sending.get(key)
            if current is not None and current[1] is token:  # else dropped meanwhile: this run uses it, none keeps it
                del self._sending[key]
                self._make_room(nbytes, budget)
                self._entries[key] = _Entry(version, copy, nbytes, device)
                self._held += nbytes
        token.set()
        return copy, "miss", ""

    # -- dropping (any thread) ---------------------------------------------------------------------------------------
    def drop(self, key: Hashable) -> bool:
        """Forget the copy under ``key`` (and one being sent); whether there was one."""
        with self._lock:
            found = key in self._entries or key in self._sending
            self._remove(key)
            self._sending.pop(key, None)
            return found

    def drop_layer(self, identity: Hashable) -> int:
        """Forget every copy of one layer (keys ``(identity, ...)``); how many there were."""
        with self._lock:
            keys = [k for k in (*self._entries, *self._sending) if isinstance(k, tuple) and k and k[0] == identity]
            for key in keys:
                self._remove(key)
                self._sending.pop(key, None)
            return len(set(keys))

    def clear(self) -> None:
        """Forget every copy (those being sent are not kept)."""
        with self._lock:
            self._entries.clear()
            self._sending.clear()
            self._held = 0

    # -- what it holds -----------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """``{"hits", "misses", "evictions", "entries", "bytes", "budget"}`` (the budget None until a worker has
        asked the device its memory)."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "entries": len(self._entries),
                "bytes": self._held,
                "budget": self.budget(),
            }

    def keys(self) -> list[Hashable]:
        """The keys held, least recently used first."""
        with self._lock:
            return list(self._entries)

    # -- under the lock ----------------------------------------------------------------------------------------------
    def _remove(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._held -= entry.nbytes

    def _make_room(self, nbytes: int, budget: int) -> None:
        while self._entries and self._held + self._reserved + nbytes > budget:
            _, entry = self._entries.popitem(last=False)
            self._held -= entry.nbytes
            self.evictions += 1

    def _shrink(self, budget: int) -> None:
        self._make_room(0, budget)


def _not_kept(array: Any, budget: int) -> str:
    """Why ``array`` is not kept on the device ("" where it is)."""
    if not isinstance(array, np.ndarray):
        kind = "a device array" if hasattr(array, "devices") else type(array).__name__
        return f"{kind}, not a NumPy array in memory"
    dtype = array.dtype
    if dtype.kind not in "biuf":
        return f"dtype {dtype}"
    if dtype.itemsize > 4:
        return f"{dtype}: 64-bit data goes as the kernel needs it (JAX narrows it without x64; a TPU has no float64)"
    if array.nbytes > budget:
        return f"{array.nbytes / 2**20:.0f} MiB, over the budget of {budget / 2**20:.0f} MiB"
    if array.nbytes == 0:
        return "empty"
    return ""


def _send(array: np.ndarray, device: Any) -> Any:
    """``array`` on ``device``, the transfer finished (the layer's array may be edited once the job has its copy)."""
    import jax  # imports JAX: in the worker, not as the widgets load

    if device.platform == "cpu":  # JAX's CPU client may alias an aligned host array: a copy of our own, as elsewhere
        array = np.array(array, copy=True)
    copy = jax.device_put(array, device)
    copy.block_until_ready()
    return copy


def _device_memory(device: Any) -> int:
    """The device's memory in bytes (``memory_stats()["bytes_limit"]``), or :data:`FALLBACK_DEVICE_BYTES`."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - a backend without memory statistics
        stats = None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else FALLBACK_DEVICE_BYTES


_CACHE = DeviceLayerCache()


def device_cache() -> DeviceLayerCache:
    """The process's device copies (every widget's, every viewer's)."""
    return _CACHE


# -- what a widget captures, and what its job makes of it -----------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DeviceInput:
    """One input of a run, captured on the GUI thread: the key of its device copy (the layer's identity,
    :func:`layer_identity`, and how the run indexes its data, as code), the layer's version (:class:`LayerWatch`),
    the data itself, the layer's name (for the provenance), the Preferences' share of the device's memory, and the
    cache (None: the process's)."""

    key: tuple[Hashable, str]
    version: Hashable
    array: Any
    layer: str = ""
    percent: float | None = None
    cache: DeviceLayerCache | None = None


def resolve(handle: DeviceInput | None, data: Any, source: str, *, wanted: bool = True) -> Any:
    """The array a job's kernels get for ``data`` (a source variable ``source`` of its plan): the device copy of
    ``handle``'s layer, kept from an earlier run or sent now, where the kernels run on an accelerator; else
    ``data`` itself. ``wanted=False``: the job's kernels run on the host anyway (:func:`runs_on_device`).

    In the worker, inside the job's placement (:func:`napari_gridmip._jobs.placed`); notes the outcome in the job's
    record of where it ran (``"device_inputs"``, :func:`napari_gridmip.core.runtime.choice.record`).
    """
    if handle is None or not wanted or handle.array is not data:
        return data
    cache = handle.cache if handle.cache is not None else device_cache()
    if handle.percent is not None:
        cache.configure(percent=handle.percent)
    value, outcome, why = cache.lookup(handle.key, handle.version, data)
    if outcome != "off":
        from napari_gridmip.core.runtime import strategy  # imports JAX: in the worker, not as the widgets load

        entry = {"source": source, "layer": handle.layer, "cache": outcome, "bytes": int(data.nbytes),
                 **strategy.current_device()}  # fmt: skip
        if why:
            entry["why"] = why
        choice.note_input(entry)
    return value


def run_freeing_copies(run: Callable[[Any], Any], progress: Any) -> Any:
    """``run(progress)`` (a job's run, in its worker); once more, with every device copy freed, where the device ran
    out of memory while copies were kept: a kernel that fits the device alone must not fail for the copies (half
    of the device's memory by default)."""
    try:
        return run(progress)
    except RuntimeError as error:  # XLA's errors are RuntimeErrors
        if "RESOURCE_EXHAUSTED" not in str(error) or not device_cache().stats()["entries"]:
            raise
    # out of the except block: the failed run's arrays (its traceback's frames) are let go before the retry
    device_cache().clear()
    return run(progress)


def runs_on_device(dtype: Any = None) -> bool:
    """Whether a job's kernels, computing in ``dtype``, run on JAX's default device here: not float64 on a TPU
    (the chip has none; ``core.runtime.precision`` moves that work to the host). In the worker."""
    from napari_gridmip.core.runtime import strategy  # imports JAX: in the worker, not as the widgets load

    return not (dtype is not None and np.dtype(dtype) == np.float64 and strategy._platform() == "tpu")


def is_device_array(value: Any) -> bool:
    """A JAX array (duck-typed: JAX need not be imported to ask)."""
    return not isinstance(value, np.ndarray) and hasattr(value, "devices") and hasattr(value, "block_until_ready")


# -- a widget's watch over its viewer's layers (GUI thread) --------------------------------------------------------

# each layer's version, by its identity (napari's ``unique_id``). Process-wide, so that two widgets on one layer share
# its copy; the GUI thread alone reads and writes it.
_VERSIONS: dict[Hashable, int] = {}
_WATCHES: dict[Hashable, int] = {}  # how many watches connect to each layer's events
_COUNTER = itertools.count(1)


def layer_identity(layer: Any) -> Hashable:
    """A layer's identity for its device copies: napari's ``layer.unique_id``, the same through the proxy napari
    hands a plugin's widget (whose layer objects are new wrappers at each access, so that their ``id`` is not the
    layer's) and for the layer napari's events carry; unique for the process's life, so never another layer's."""
    identity = getattr(layer, "unique_id", None)
    return identity if identity is not None else id(layer)


def layer_version(layer: Any) -> tuple[int, int]:
    """The layer's version: a number bumped by each edit :class:`LayerWatch` sees, and its data object's id (data
    replaced is a new version even if an event was missed)."""
    identity = layer_identity(layer)
    if identity not in _VERSIONS:
        _VERSIONS[identity] = next(_COUNTER)
    return _VERSIONS[identity], id(layer.data)


def layer_changed(identity: Hashable, cache: DeviceLayerCache | None = None) -> None:
    """The values of the layer ``identity`` (:func:`layer_identity`) changed: a new version, its copies dropped."""
    _VERSIONS[identity] = next(_COUNTER)
    (cache or device_cache()).drop_layer(identity)


def layer_gone(identity: Hashable, cache: DeviceLayerCache | None = None) -> None:
    """The layer left the viewer (or nothing watches it any more): its copies freed, its version forgotten."""
    _VERSIONS.pop(identity, None)
    (cache or device_cache()).drop_layer(identity)


class LayerWatch:
    """One widget's connections to its viewer's layers for their device copies: made with the widget, undone by
    :meth:`close` (the widget's release).

    ``layers`` is the viewer's layer list (napari's public ``viewer.layers``); its ``removed`` event frees a
    layer's copies. A layer's own events (:data:`CHANGE_EVENTS`) are connected when a run first takes it
    (:meth:`input`), and disconnected when it leaves the viewer or the widget closes.
    """

    def __init__(self, layers: Any, *, cache: DeviceLayerCache | None = None) -> None:
        self._layers = layers
        self._cache = cache
        self._watched: dict[Hashable, list[tuple[Any, Any]]] = {}  # layer identity -> (emitter, callback)
        self.closed = False
        layers.events.removed.connect(self._removed)

    @property
    def cache(self) -> DeviceLayerCache:
        return self._cache if self._cache is not None else device_cache()

    def input(self, layer: Any, data: Any, *, index: str = "", percent: float | None = None) -> DeviceInput | None:
        """The :class:`DeviceInput` of ``data`` (``layer``'s data with ``index`` applied, as code) for a request; None
        where it cannot be kept (not an in-memory NumPy array) or the budget is 0 (every copy then freed)."""
        if self.closed or not isinstance(data, np.ndarray):
            return None
        if percent is not None and percent <= 0:
            self.cache.configure(percent=0)
            return None
        identity = layer_identity(layer)
        self._watch(layer, identity)
        return DeviceInput((identity, index), layer_version(layer), data, str(layer.name), percent, self._cache)

    def watching(self, layer: Any) -> bool:
        """Whether this watch follows ``layer``'s edits."""
        return layer_identity(layer) in self._watched

    def close(self) -> None:
        """Undo every connection; free the copies of the layers no other widget watches."""
        if self.closed:
            return
        self.closed = True
        self._layers.events.removed.disconnect(self._removed)
        for identity in list(self._watched):
            self._unwatch(identity)

    def _watch(self, layer: Any, identity: Hashable) -> None:
        if identity in self._watched:
            return
        owner = weakref.ref(self)

        def changed(event: Any = None) -> None:
            watch = owner()
            if watch is not None and not watch.closed:
                layer_changed(identity, watch._cache)

        connections = []
        for name in CHANGE_EVENTS:
            emitter = getattr(layer.events, name, None)
            if emitter is not None:
                emitter.connect(changed)
                connections.append((emitter, changed))
        self._watched[identity] = connections
        _WATCHES[identity] = _WATCHES.get(identity, 0) + 1

    def _unwatch(self, identity: Hashable) -> None:
        for emitter, callback in self._watched.pop(identity):
            emitter.disconnect(callback)
        left = _WATCHES.get(identity, 1) - 1
        if left > 0:
            _WATCHES[identity] = left
        else:  # no widget sees its edits any more: nothing may stay
            _WATCHES.pop(identity, None)
            layer_gone(identity, self._cache)

    def _removed(self, event: Any) -> None:
        layer = getattr(event, "value", None)
        if layer is None:
            return
        identity = layer_identity(layer)
        if identity in self._watched:
            self._unwatch(identity)
        layer_gone(identity, self._cache)
