"""The largest programs' executables, kept on disk and loaded in a later process without tracing them.

JAX's persistent cache (:mod:`.compile_cache`) finds an executable only after tracing and lowering its program
(0.4 s of DIC 2048^2's 2.5 s first call in a later process on a 2-core CPU, 2.1 of 3.8 s on a TPU v5e:
docs/accelerator.md). A :class:`KeptProgram` keys its executables by what decides the program without tracing it
(:func:`_key`) and loads and calls them directly; whatever does not fit goes through ``jax.jit`` as before.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import logging
import os
import pickle
import platform
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jaxlib
import numpy as np
from jax.experimental import serialize_executable

from napari_gridmip.core.options import switched_off
from napari_gridmip.core.runtime import compile_cache
from napari_gridmip.core.runtime.files import write_atomically
from napari_gridmip.core.runtime.strategy import _target_device  # the device a call made now runs on

_LOG = logging.getLogger(__name__)
CORE = Path(__file__).resolve().parents[1]
"""The folder of ``napari_gridmip.core``, whose every source is part of a kept program's key."""
_SOURCES: dict[str, str] = {}  # the key's per-process parts, made once: the sources' hash ("core"), the host's
# processor and flags ("host")
#: Where kept executables are used by default: the CPU, where they are tested and measured, and a TPU, where a
#: later process loaded and ran them (DIC 2048^2's next process 3.78 -> 1.97 s) and executables serialized and
#: loaded in a new process gave outputs identical to a fresh compile's (docs/accelerator.md).
#: A GPU only with ``NAPARI_GRIDMIP_EXECUTABLE_CACHE=1`` until a run there shows the same: an executable that
#: fails in a later process fails when waited for, past the first dispatch's check.
_PLATFORMS = frozenset({"cpu", "tpu"})
_FOLDERS: dict[tuple, Path | None] = {}  # folder()'s answer by the settings it reads
_KEYS: dict[tuple, str] = {}  # each key's hash by the facts it is made of (_key)


def folder() -> Path | None:
    """Where executables are kept, or None when this cache is off.

    On the CPU and a TPU (a GPU with ``NAPARI_GRIDMIP_EXECUTABLE_CACHE=1``, :data:`_PLATFORMS`), only where the
    library's persistent cache is on in its own folder (:func:`.compile_cache.enable`; not with the user's
    ``JAX_COMPILATION_CACHE_DIR``, nor ``NAPARI_GRIDMIP_COMPILE_CACHE=0``), and not with
    ``NAPARI_GRIDMIP_EXECUTABLE_CACHE=0``.
    """
    if not compile_cache.is_ours():
        return None
    settings = (os.environ.get("NAPARI_GRIDMIP_EXECUTABLE_CACHE"), os.environ.get("NAPARI_GRIDMIP_CACHE_DIR"))
    if settings not in _FOLDERS:  # once per setting: a band program asks at each band
        off = switched_off("NAPARI_GRIDMIP_EXECUTABLE_CACHE")
        _FOLDERS[settings] = None if off else compile_cache.cache_dir().parent / "executables"
    return _FOLDERS[settings]


def _package_version() -> str:
    """The installed distribution's version (the core never imports the package above it)."""
    try:
        return importlib.metadata.version("napari-gridmip")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0.0.0"


def sources_hash() -> str:
    """SHA-256 of the package's version and every Python source of ``napari_gridmip/core``: an edited kernel is
    another program."""
    if "core" not in _SOURCES:
        digest = hashlib.sha256(_package_version().encode())  # also where the sources are not files (a frozen app)
        for path in sorted(CORE.rglob("*.py")):
            digest.update(str(path.relative_to(CORE)).encode())
            digest.update(path.read_bytes())
        _SOURCES["core"] = digest.hexdigest()
    return _SOURCES["core"]


def host_fingerprint() -> str:
    """The machine's processor and its instruction-set flags: an XLA CPU executable is built for them, and a cache
    folder may be shared between machines (a network home)."""
    if "host" not in _SOURCES:
        flags = ""
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
                flags = next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
        except OSError:
            pass
        identity = f"{platform.machine()} {platform.processor()} {flags}"
        _SOURCES["host"] = hashlib.sha256(identity.encode()).hexdigest()
    return _SOURCES["host"]


def _leaf_type(leaf: Any, device: Any) -> tuple | None:
    """``(shape, dtype, weak type)`` of one argument, or None where the call must go through ``jax.jit``
    (traced; an array or a shape placed elsewhere than ``device`` or on several devices)."""
    if isinstance(leaf, np.ndarray | np.generic):  # NumPy's arrays and scalars are never weakly typed
        return leaf.shape, leaf.dtype, False
    if isinstance(leaf, jax.core.Tracer):
        return None
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None:
        devices = sharding.device_set
        if len(devices) != 1 or next(iter(devices)) != device:
            return None
    if isinstance(leaf, jax.ShapeDtypeStruct | jax.Array):
        return tuple(leaf.shape), np.dtype(leaf.dtype), bool(leaf.weak_type)
    aval = jax.typeof(leaf)
    return tuple(aval.shape), np.dtype(aval.dtype), bool(getattr(aval, "weak_type", False))


def _key(name: str, dynamic: tuple, static: dict[str, Any], device: Any) -> str | None:
    """The executable's key, or None where the call must go through ``jax.jit``.

    A SHA-256 of: the program's module and name (and its file's source outside the core); its static options'
    types and ``repr``; the tree, shapes, dtypes and weak types of its array arguments; the device it runs on
    (platform, kind, XLA's platform version, and the host's processor flags: a cache folder may be shared between
    machines); the float64, matmul precision and NumPy promotion scopes; JAX's and jaxlib's versions and
    ``XLA_FLAGS``/``LIBTPU_INIT_ARGS``; and the package's version and its sources under ``core/``. Closures,
    lambdas and local functions, static options passed by position, and calls under ``jax.disable_jit`` or JAX's
    NaN and infinity checks are left to ``jax.jit``. The core reads no environment option while it traces (a test
    holds it to that). What a program reads at trace time beyond those (a module constant changed in place, a
    strategy function replaced) is not in it, as it is not in JAX's own in-memory cache: the test suite, which
    replaces strategies, turns this cache off (``tests/conftest.py``) and tests it on its own.

    The hash is made once per process for each cheap tuple of the same facts (a band program is called per band:
    the hash and the options' ``repr`` were 0.5 ms a call, 6% of find_displacement refine 1024^2's warm 0.81 s).
    """
    leaves, tree = jax.tree_util.tree_flatten(dynamic)
    types = []
    for leaf in leaves:
        found = _leaf_type(leaf, device)
        if found is None:
            return None
        types.append(found)
    config = jax.config
    scope = (
        bool(config.jax_enable_x64),
        str(config.jax_default_matmul_precision),
        str(config.jax_numpy_dtype_promotion),
        str(config.jax_numpy_rank_promotion),
    )
    flags = (os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""))
    options = tuple(sorted((k, type(v).__qualname__, v) for k, v in static.items()))  # 2 and 2.0 are two programs
    facts = (name, options, tree, tuple(types), device, scope, flags, sources_hash())
    try:
        return _KEYS[facts]
    except KeyError:
        pass
    except TypeError:  # an option that cannot be hashed: jax.jit rejects it too
        return None
    parts = (
        name,
        sorted((k, type(v).__qualname__, repr(v)) for k, v in static.items()),
        str(tree),
        types,
        (device.platform, device.device_kind, device.id, device.client.platform_version, host_fingerprint()),
        scope,
        (jax.__version__, jaxlib.__version__, sys.version_info[:2]),
        flags,
        sources_hash(),
    )
    _KEYS[facts] = key = hashlib.sha256(repr(parts).encode()).hexdigest()
    return key


def _load(path: Path, device: Any) -> Any:
    """The executable stored at ``path`` loaded onto ``device``, or None (missing, or unreadable: then removed)."""
    try:
        if not path.is_file():
            return None
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        return serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, backend=device.platform, execution_devices=[device]
        )
    except Exception:  # noqa: BLE001 - a damaged or foreign file: compiled again and rewritten
        _LOG.debug("could not load %s", path, exc_info=True)
        _remove(path)
        return None


def _remove(path: Path) -> None:
    """Delete a kept file, if this process may."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        _LOG.debug("could not remove %s", path, exc_info=True)


_WRITES: set[threading.Thread] = set()  # the writes under way (wait_for_writes)
_WRITES_LOCK = threading.Lock()


def _save(path: Path, compiled: Any) -> None:
    """Write ``compiled`` to ``path`` in a daemon thread (a first call does not wait for it); a file appears whole
    or not at all (written aside, then renamed)."""

    def write() -> None:
        try:
            write_atomically(path, pickle.dumps(serialize_executable.serialize(compiled)))
        except Exception:  # noqa: BLE001 - not kept: the next process compiles it again
            _LOG.debug("could not keep %s", path, exc_info=True)
        finally:
            with _WRITES_LOCK:
                _WRITES.discard(threading.current_thread())

    thread = threading.Thread(target=write, name="napari-gridmip executable write", daemon=True)
    with _WRITES_LOCK:
        _WRITES.add(thread)
    thread.start()


def wait_for_writes(timeout: float | None = None) -> None:
    """Wait until the executables this process is writing are on disk (at most ``timeout`` seconds each): the
    writes are daemon threads, which the interpreter's exit stops (``napari-gridmip --prepare`` waits before it
    records the machine as prepared)."""
    with _WRITES_LOCK:
        under_way = list(_WRITES)
    for thread in under_way:
        thread.join(timeout)


_WATCH = threading.local()  # the JAX events of this thread's compile, while _compiled_for_keeping runs
_LISTENING: list[bool] = []
_COMPILED = "/jax/core/compile/backend_compile_duration"  # XLA was asked (it may answer from JAX's cache)
_CACHE_HIT = "/jax/compilation_cache/cache_hits"  # JAX's persistent cache answered


def _heard(event: str, *_: Any, **__: Any) -> None:
    seen = getattr(_WATCH, "events", None)
    if seen is not None:
        seen.add(event)


def _compiled_for_keeping(jitted: Any, args: tuple, kwargs: dict) -> tuple[Any, bool]:
    """``jitted.lower(*args, **kwargs).compile()``, and whether that executable may be kept: only one XLA compiled
    here. One read from JAX's persistent cache, or reused from JAX's memory after such a read, and serialized again
    failed in the next process, at its first run ("Function reverse_concatenate_fusion.2 not found" at dispatch,
    "Function wrapped_broadcast not found" when waited for; XLA CPU, JAX 0.10.2).
    Those are not kept: the calls then trace as before."""
    if not _LISTENING:
        jax.monitoring.register_event_listener(_heard)
        jax.monitoring.register_event_duration_secs_listener(_heard)
        _LISTENING.append(True)
    _WATCH.events = set()
    try:
        compiled = jitted.lower(*args, **kwargs).compile()
        events = _WATCH.events
    finally:
        _WATCH.events = None
    return compiled, _COMPILED in events and _CACHE_HIT not in events


def _file_hash(fun: Callable) -> str | None:
    """SHA-256 of the file that defines ``fun``, or None where it cannot be read."""
    try:
        return hashlib.sha256(Path(inspect.getsourcefile(fun) or "").read_bytes()).hexdigest()
    except (OSError, TypeError):
        return None


def _debugging() -> bool:
    """Whether JAX runs programs op by op or checks them for NaN or infinity: jax.jit's own path does that."""
    config = jax.config
    return bool(config.jax_disable_jit or config.jax_debug_nans or config.jax_debug_infs)


class KeptProgram:
    """A jitted program whose executables are kept on disk by a key made without tracing (:func:`_key`).

    Called as the ``jax.jit`` of ``fun`` is, with the same results; ``lower`` is the jitted program's.

    Parameters
    ----------
    fun : callable
        The program.
    static_argnames : sequence of str
        Its static options, all passed by keyword.
    donate_argnums : sequence of int
        Its donated positional arguments, as for ``jax.jit``.
    """

    def __init__(self, fun: Callable, *, static_argnames: Sequence[str], donate_argnums: Sequence[int] = ()):
        self.jitted = jax.jit(fun, static_argnames=tuple(static_argnames), donate_argnums=tuple(donate_argnums))
        self.name = f"{fun.__module__}.{fun.__qualname__}"
        self._static = frozenset(static_argnames)
        # what a name does not tell apart, a closure's values and a lambda's or local function's code, goes through
        # jax.jit alone; a program defined outside the core has its own file's source in the key
        self._source = "" if fun.__module__.startswith("napari_gridmip.core") else _file_hash(fun)
        self._keyable = fun.__closure__ is None and "<" not in fun.__qualname__ and self._source is not None
        # the statics that could come by position: a call that passes that many positions goes through jax.jit
        parameters = list(inspect.signature(fun).parameters.values())
        by_position = [
            i for i, p in enumerate(parameters) if p.name in self._static and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        self._positions = min(by_position, default=len(parameters) + 1)
        self._executables: dict[str, Any] = {}  # this process's, by key
        self._unproven: set[str] = set()  # keys read from disk and not yet run (__call__ checks their first run)
        self._locks: dict[str, threading.Lock] = {}  # per key, held while it is read or compiled (_find)
        self._locks_lock = threading.Lock()
        functools.update_wrapper(self, fun)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The jitted program's ``lower``."""
        return self.jitted.lower(*args, **kwargs)

    def clear_cache(self) -> None:
        """Forget this process's programs, as ``jax.jit``'s ``clear_cache`` does: the jitted program's traces and
        the executables found or loaded here (not the files kept on disk)."""
        self.jitted.clear_cache()
        self._executables.clear()
        self._unproven.clear()

    def _find(self, args: tuple, kwargs: dict, compile_missing: bool) -> tuple[str, Any] | None:
        """``(key, executable)``: this process's, else the disk's, else (``compile_missing``) compiled now and
        written; None where the call must go through ``jax.jit`` or none is found."""
        where = folder()
        if where is None or not self._keyable or len(args) > self._positions or _debugging():
            return None
        device = _target_device()
        if device.platform not in _PLATFORMS and os.environ.get("NAPARI_GRIDMIP_EXECUTABLE_CACHE") != "1":
            return None
        static = {k: v for k, v in kwargs.items() if k in self._static}
        dynamic = (args, {k: v for k, v in kwargs.items() if k not in self._static})
        try:
            key = _key(self.name + self._source, dynamic, static, device)
        except Exception:  # noqa: BLE001 - an argument this key cannot describe: jax.jit's own path
            _LOG.debug("no key for %s", self.name, exc_info=True)
            return None
        if key is None:
            return None
        found = self._executables.get(key)
        if found is None:
            # one thread reads or compiles a key at a time: a second one (a sample's run ahead beside the
            # widget's run of the same inputs) waits for that executable rather than compiling it again; a
            # question that must stay quick (out_info) does not wait, and is answered by tracing instead
            lock = self._lock_of(key)
            if not lock.acquire(blocking=compile_missing):
                return None
            try:
                found = self._executables.get(key)
                if found is None:
                    found = self._read_or_compile(key, where, device, args, kwargs, compile_missing)
            finally:
                lock.release()
            if found is None:
                return None
        return key, found

    def _lock_of(self, key: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(key, threading.Lock())

    def _read_or_compile(self, key: str, where: Path, device: Any, args: tuple, kwargs: dict,
                         compile_missing: bool) -> Any:  # fmt: skip
        """The executable of ``key`` from the disk, else (``compile_missing``) compiled now and written; None."""
        found = _load(where / f"{key}.pickle", device)
        if found is not None:
            self._unproven.add(key)
        elif compile_missing:
            try:
                found, fresh = _compiled_for_keeping(self.jitted, args, kwargs)
            except Exception:  # noqa: BLE001 - the call through jax.jit raises it where it belongs
                return None
            if fresh:
                _save(where / f"{key}.pickle", found)
        if found is not None:
            self._executables[key] = found
        return found

    def executable(self, *args: Any, **kwargs: Any) -> Any:
        """The executable for these arguments (arrays, or ``jax.ShapeDtypeStruct``), kept or compiled now; None
        where the call must go through ``jax.jit``. A compile ahead of the call uses it."""
        found = self._find(args, kwargs, compile_missing=True)
        return None if found is None else found[1]

    def out_info(self, *args: Any, **kwargs: Any) -> Any:
        """The outputs' ``jax.ShapeDtypeStruct`` tree for these arguments from a kept executable, with no
        tracing, or None where there is none yet (then ``jax.eval_shape`` answers)."""
        found = self._find(args, kwargs, compile_missing=False)
        return None if found is None else found[1].out_info

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        found = self._find(args, kwargs, compile_missing=True)
        if found is None:
            return self.jitted(*args, **kwargs)
        key, executable = found
        dynamic = {k: v for k, v in kwargs.items() if k not in self._static}
        if key not in self._unproven:
            return executable(*args, **dynamic)
        try:  # read from disk: one XLA cannot run (see _compiled_for_keeping) is dropped for jax.jit's own path
            out = executable(*args, **dynamic)
        except jax.errors.JaxRuntimeError:
            _LOG.debug("kept executable %s of %s failed; dropped", key, self.name, exc_info=True)
            self._executables.pop(key, None)
            where = folder()
            if where is not None:
                _remove(where / f"{key}.pickle")
            return self.jitted(*args, **kwargs)
        finally:
            self._unproven.discard(key)
        return out


def kept(
    *, static_argnames: Sequence[str] = (), donate_argnums: Sequence[int] = ()
) -> Callable[[Callable], KeptProgram]:
    """A decorator: ``@kept(static_argnames=...)`` in place of ``@partial(jax.jit, static_argnames=...)``."""
    return functools.partial(KeptProgram, static_argnames=static_argnames, donate_argnums=donate_argnums)
