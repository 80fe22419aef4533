"""Kept executables (core/runtime/executables.py): the same results as jax.jit, loaded in a later process with no
tracing, a key for everything that changes the program, and jax.jit's own path wherever the key cannot hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napari_gridmip.core.runtime import compile_cache
from napari_gridmip.core.runtime import executables as _executables
from napari_gridmip.core.runtime.executables import KeptProgram

ROOT = Path(__file__).resolve().parents[2]
RUN = int(np.random.default_rng().integers(1, 2**16))  # this run's, in each test's scale (the k fixture)


@pytest.fixture
def kept_on(tmp_path, monkeypatch):
    """This cache on, in a folder of its own (the suite turns it off: tests/conftest.py)."""
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NAPARI_GRIDMIP_EXECUTABLE_CACHE", "1")  # on every platform (by default the CPU and a TPU)
    monkeypatch.setattr(compile_cache, "is_ours", lambda: True)
    folder = _executables.folder()
    assert folder == tmp_path / "executables"
    return folder


@pytest.fixture
def k(request):
    """A scale no other test compiles: each program here is new to JAX's caches (its persistent one is shared by
    the session's tests), so XLA compiles it and it is kept."""
    # and no earlier run's: JAX's persistent cache may be a folder that outlives the run
    return 3.0 + (zlib.crc32(request.node.nodeid.encode()) % 4096) / 8192 + RUN / 2**20


def _scaled(x, y, *, k, flip):
    out = x * k + y
    return (out[::-1] if flip else out), {"total": jnp.sum(y)}


def _written(folder: Path, count: int) -> list[Path]:
    """The kept files once ``count`` are written (each in a thread of its own)."""
    import time

    for _ in range(600):  # up to 30 s: the writer threads share the cores with the suite's other workers
        files = sorted(folder.glob("*.pickle")) if folder.is_dir() else []
        if len(files) >= count:
            return files
        time.sleep(0.05)
    raise AssertionError(f"{count} executables not written to {folder}")


def test_the_results_are_jits_and_a_new_program_loads_them_from_disk(kept_on, monkeypatch, k):
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    program = KeptProgram(_scaled, static_argnames=("k", "flip"))
    got = program(x, y, k=k, flip=True)
    expected = jax.jit(_scaled, static_argnames=("k", "flip"))(x, y, k=k, flip=True)
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, expected)
    (path,) = _written(kept_on, 1)
    # a later process: a program object with nothing in memory, and nothing it may trace
    later = KeptProgram(_scaled, static_argnames=("k", "flip"))
    monkeypatch.setattr(later, "jitted", None)
    jax.tree_util.tree_map(np.testing.assert_array_equal, later(x, y, k=k, flip=True), expected)
    shapes = later.out_info(x, y, k=k, flip=True)
    assert shapes[0].shape == (6,) and shapes[0].dtype == np.float32 and shapes[1]["total"].shape == ()
    assert path.stat().st_size > 0 and not list(kept_on.glob(".*.partial-*"))  # no partial write left


def test_each_change_of_the_program_is_another_key(kept_on, k):
    program = KeptProgram(_scaled, static_argnames=("k", "flip"))
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    calls = [
        ((x, y), {"k": k, "flip": True}),
        ((x, y), {"k": k + 1, "flip": True}),  # a static option
        ((x, y), {"k": k, "flip": False}),
        ((x[:5], y[:5]), {"k": k, "flip": True}),  # a shape
        ((x.astype(np.int32), y), {"k": k, "flip": True}),  # a dtype
        ((x, 1.0), {"k": k, "flip": True}),  # a weak-typed scalar
        ((x, np.float32(1.0)), {"k": k, "flip": True}),  # the same, not weak
    ]
    for args, kwargs in calls:
        program(*args, **kwargs)
    with jax.enable_x64(True):  # the float64 scope
        program(x, y, k=k, flip=True)
    # eight keys; files for those XLA compiled here (two that lower alike may share JAX's compile: not kept)
    assert len(program._executables) == len(calls) + 1
    assert 1 <= len(_written(kept_on, 1)) <= len(calls) + 1


def test_another_source_is_another_key_and_an_option_of_ours_is_not(kept_on, monkeypatch):
    device = jax.devices()[0]
    dynamic = ((np.ones(3, np.float32),), {})
    key = _executables._key("p", dynamic, {"k": 1}, device)
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")  # read by no kernel: the programs stay
    assert _executables._key("p", dynamic, {"k": 1}, device) == key
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert _executables._key("p", dynamic, {"k": 1}, device) != key
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setitem(_executables._SOURCES, "core", "an edited kernel")
    assert _executables._key("p", dynamic, {"k": 1}, device) != key


def test_the_key_hashes_every_kernel_source():
    import napari_gridmip.core

    assert _executables.CORE == Path(napari_gridmip.core.__file__).resolve().parent
    assert (_executables.CORE / "correlation" / "maps.py").is_file()


def test_traced_arguments_go_through_jit(kept_on, k):
    program = KeptProgram(_scaled, static_argnames=("k", "flip"))
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    outer = jax.jit(lambda a, b: program(a, b, k=k, flip=False)[0] + 1)
    np.testing.assert_allclose(outer(x, y), x * np.float32(k) + y + 1, rtol=1e-6)
    assert program._executables == {} and not list(kept_on.glob("*.pickle"))
    assert program.out_info(x, y, k=k, flip=False) is None  # nothing kept: eval_shape answers


def _accumulated(a, b, *, k):
    return a + b * k


def test_donation_is_kept(kept_on, k):
    program = KeptProgram(_accumulated, static_argnames=("k",), donate_argnums=(0,))
    a, through_jit = jnp.ones(4), jnp.ones(4)
    np.testing.assert_allclose(program(a, jnp.ones(4), k=k), (1 + k) * np.ones(4), rtol=1e-6)
    jax.jit(_accumulated, static_argnames=("k",), donate_argnums=(0,))(through_jit, jnp.ones(4), k=k)
    assert program._executables and a.is_deleted() == through_jit.is_deleted()


def test_a_damaged_file_is_removed_and_the_call_compiles(kept_on, k):
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    expected = KeptProgram(_scaled, static_argnames=("k", "flip"))(x, y, k=k, flip=True)
    (path,) = _written(kept_on, 1)
    path.write_bytes(b"not an executable")
    later = KeptProgram(_scaled, static_argnames=("k", "flip"))
    np.testing.assert_array_equal(later(x, y, k=k, flip=True)[0], expected[0])
    # removed; not written again here, since this process's compile is reused (only XLA's own compiles are kept)
    assert not path.exists() and len(later._executables) == 1


def test_a_kept_file_that_xla_cannot_run_is_dropped_for_jit(kept_on, monkeypatch, k):
    """As an XLA CPU executable read from JAX's persistent cache and serialized again did in a later process
    ("Function reverse_concatenate_fusion.2 not found"): the call goes through jax.jit and the file is deleted."""
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    expected = KeptProgram(_scaled, static_argnames=("k", "flip"))(x, y, k=k, flip=True)
    (path,) = _written(kept_on, 1)

    class Broken:
        out_info = None

        def __call__(self, *args, **kwargs):
            raise jax.errors.JaxRuntimeError("INTERNAL: Error dispatching computation: Function f not found")

    monkeypatch.setattr(_executables, "_load", lambda path, device: Broken())
    later = KeptProgram(_scaled, static_argnames=("k", "flip"))
    np.testing.assert_array_equal(later(x, y, k=k, flip=True)[0], expected[0])
    assert not path.exists()
    assert not any(isinstance(v, Broken) for v in later._executables.values()) and not later._unproven


def test_a_program_jax_already_compiled_is_not_kept(kept_on, k):
    """Only XLA's own compiles are kept: one JAX answers from its caches (here its memory, after a jit call of
    the same program) may be one read from its persistent cache, which failed once serialized again."""
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    jax.jit(_scaled, static_argnames=("k", "flip"))(x, y, k=k, flip=True)
    program = KeptProgram(_scaled, static_argnames=("k", "flip"))
    program(x, y, k=k, flip=True)
    assert len(program._executables) == 1 and not list(kept_on.glob("*.pickle"))


def test_the_core_reads_no_environment_option_while_it_traces():
    """The key holds no environment option of ours: the core may read them only where no program is traced
    (the caches' switches). A new option read by a kernel must go into executables._key."""
    core = ROOT / "napari_gridmip" / "core"
    # runtime/choice.py: NAPARI_GRIDMIP_COMPUTE_ON picks the device a call runs on, and the key holds the device
    # runtime/sharding.py: NAPARI_GRIDMIP_SHARD_BANDS picks how many devices share the bands, read before any trace; it
    # changes the programs only through their static band sizes, which the key holds
    allowed = {
        "runtime/compile_cache.py",
        "runtime/executables.py",
        "options.py",
        "__init__.py",
        "runtime/choice.py",
        "runtime/sharding.py",
    }
    readers = [
        str(path.relative_to(core))
        for path in core.rglob("*.py")
        if str(path.relative_to(core)) not in allowed
        and path.name != "__init__.py"
        and ("environ" in path.read_text() or "switched_off(" in path.read_text())
    ]
    assert readers == []


@pytest.mark.parametrize("setting", ["switched off", "not our cache", "a platform not yet checked"])
def test_off_means_jit_and_no_files(kept_on, monkeypatch, setting, k):
    if setting == "not our cache":
        monkeypatch.setattr(compile_cache, "is_ours", lambda: False)
    elif setting == "switched off":
        monkeypatch.setenv("NAPARI_GRIDMIP_EXECUTABLE_CACHE", "0")
    else:  # unset: the default platforms, as if this one were not among them
        monkeypatch.delenv("NAPARI_GRIDMIP_EXECUTABLE_CACHE")
        monkeypatch.setattr(_executables, "_PLATFORMS", frozenset())
    assert (_executables.folder() is None) == (setting != "a platform not yet checked")
    program = KeptProgram(_scaled, static_argnames=("k", "flip"))
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    np.testing.assert_allclose(program(x, y, k=k, flip=False)[0], x * np.float32(k) + y, rtol=1e-6)
    assert program._executables == {} and not kept_on.exists()


def test_dic_and_tracking_give_jits_fields(kept_on, monkeypatch):
    """The subsets' kept programs (their band and input programs) against the same calls through jax.jit."""
    from napari_gridmip import find_displacement, track_speckles

    rng = np.random.default_rng(5)
    img = rng.random((48, 56), dtype=np.float32)
    moved = np.roll(img, (1, 2), axis=(0, 1))
    stack = rng.random((6, 40, 40), dtype=np.float32)

    def both():
        dic = find_displacement(img[None], moved[None], window=(7, 7), subset=(9, 9), step=2, subpixel="refine")
        tracked = track_speckles(stack, np.roll(stack, 1, axis=-1), window=(5, 5), subset=(5, 5))
        fields = [*dic, *(v for v in vars(tracked).values() if v is not None)]
        return [np.asarray(a) for a in fields]

    from napari_gridmip.core.correlation import subsets

    through_kept = both()
    # through the kept programs (their executables are this process's only where this cache is on)
    assert subsets._band._executables and subsets._prepared._executables
    monkeypatch.setenv("NAPARI_GRIDMIP_EXECUTABLE_CACHE", "0")
    through_jit = both()
    for a, b in zip(through_kept, through_jit, strict=True):
        np.testing.assert_array_equal(a, b)


CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from napari_gridmip import find_displacement
    from napari_gridmip.core.correlation import subsets

    traced = []
    for program in (subsets._band, subsets._prepared):
        jitted = program.jitted
        program.jitted = type("Counted", (), {
            "lower": lambda self, *a, _j=jitted, **k: traced.append(1) or _j.lower(*a, **k),
            "__call__": lambda self, *a, _j=jitted, **k: traced.append(1) or _j(*a, **k),
        })()
    rng = np.random.default_rng(3)
    img = rng.random((64, 64), dtype=np.float32)
    out = find_displacement(img[None], np.roll(img, 1, axis=0)[None], window=(7, 7), subset=(11, 11), step=4,
                            subpixel="refine")
    np.save(sys.argv[1], np.stack([np.asarray(a) for a in out]))
    print(json.dumps({"traced": len(traced)}))
    """
)


def _processes(folder: Path, names: list[str]) -> dict[str, dict]:
    """CHILD run in a new process per name on one cache folder (this cache on but where the name says "off"):
    each one's count of the two programs' jit calls and lowerings, and its field saved as NAME.npy."""
    env = {k: v for k, v in os.environ.items() if k != "NAPARI_GRIDMIP_EXECUTABLE_CACHE"}
    # the CPU: the parent may hold an accelerator, which one process at a time can; ROOT before what the machine
    # itself puts on the path (an accelerator host's own JAX comes from there)
    env.update(
        NAPARI_GRIDMIP_CACHE_DIR=str(folder),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    runs = {}
    for name in names:
        extra = {"NAPARI_GRIDMIP_EXECUTABLE_CACHE": "0"} if "off" in name else {}
        done = subprocess.run([sys.executable, "-c", CHILD, str(folder / f"{name}.npy")], env={**env, **extra},
                              check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
        runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
        if name == "first":
            _written(folder / "executables", 2)
    reference = np.load(folder / f"{names[0]}.npy")
    for name in names[1:]:
        np.testing.assert_array_equal(np.load(folder / f"{name}.npy"), reference)
    return runs


def test_a_later_process_loads_both_programs_and_traces_neither(tmp_path):
    """The first process compiles and keeps the band and input programs; a later one loads both (no lower, no
    jit call of either) and gives the same field."""
    runs = _processes(tmp_path, ["first", "later"])
    assert runs["first"]["traced"] >= 2 and runs["later"]["traced"] == 0


def test_programs_read_from_jaxs_cache_are_not_kept(tmp_path):
    """After a process with this cache off (JAX's persistent cache alone), the kept programs come from JAX's cache,
    and such an executable serialized again failed in the next process ("Function ... not found"): none is
    written, and the processes after trace as before and give the same field."""
    runs = _processes(tmp_path, ["off", "kept on", "after"])
    assert not list((tmp_path / "executables").glob("*.pickle"))  # none, or no folder at all
    assert runs["kept on"]["traced"] >= 2 and runs["after"]["traced"] >= 2


def _typed(x, k):
    return x * k


def test_what_jit_tells_apart_the_key_does_too(kept_on, k):
    """2 and 2.0 as a static option, strict dtype promotion, a static option passed by position: as jax.jit."""
    x = np.arange(3, dtype=np.int32)
    program = KeptProgram(_typed, static_argnames=("k",))
    assert (
        program(x, k=2).dtype == np.int32
        and program(x, k=2.0).dtype == jax.jit(_typed, static_argnames="k")(x, k=2.0).dtype
    )
    np.testing.assert_array_equal(program(x, 3), x * 3)  # by position: through jax.jit
    with jax.numpy_dtype_promotion("strict"), pytest.raises(jax.dtypes.TypePromotionError):
        program(x, k=2.5)


def _step_by_step(x, *, k):
    return jnp.log(x) * k


def test_debugging_modes_and_closures_go_through_jit(kept_on, k):
    program = KeptProgram(_step_by_step, static_argnames=("k",))
    x = np.ones(3, np.float32)
    program(x, k=k)
    with jax.disable_jit():
        np.testing.assert_array_equal(program(x, k=k), np.zeros(3))
    with jax.debug_nans(True), pytest.raises(FloatingPointError):
        program(-x, k=k)
    closure = KeptProgram(lambda a: a * k, static_argnames=())
    np.testing.assert_allclose(closure(x), x * k)
    assert closure._executables == {}


def test_a_folder_it_cannot_read_means_jit(kept_on, monkeypatch, k):
    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_file", refused)
    monkeypatch.setattr(Path, "read_bytes", refused)
    program = KeptProgram(_scaled, static_argnames=("k", "flip"))
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    np.testing.assert_allclose(program(x, y, k=k, flip=False)[0], x * np.float32(k) + y, rtol=1e-6)


def test_two_threads_calling_a_new_program_compile_it_once(kept_on, monkeypatch, k):
    """A sample's run ahead and a widget's run of the same inputs, in two threads at once: the second waits for the
    first's executable (one XLA compile), and both get its results."""
    import threading

    compiles = []
    real = _executables._compiled_for_keeping
    gate = threading.Event()

    def slow_compile(*args, **kwargs):
        compiles.append(threading.current_thread().name)
        gate.wait(10)  # the other thread arrives while this one compiles
        return real(*args, **kwargs)

    monkeypatch.setattr(_executables, "_compiled_for_keeping", slow_compile)
    program = KeptProgram(_scaled, static_argnames=("k", "flip"))
    x, y = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    results = {}

    def call(name):
        results[name] = program(x, y, k=k, flip=True)

    threads = [threading.Thread(target=call, args=(name,), name=name) for name in ("first", "second")]
    threads[0].start()
    for _ in range(1000):  # the first compiles (holding its key's lock) ...
        if compiles:
            break
        threading.Event().wait(0.01)
    assert compiles == ["first"] and any(lock.locked() for lock in program._locks.values())
    threads[1].start()  # ... when the second asks for the same key
    threading.Event().wait(0.2)
    assert threads[1].is_alive()  # waiting for the first's executable
    gate.set()
    for thread in threads:
        thread.join(30)
    assert set(results) == {"first", "second"} and len(compiles) == 1
    expected = (x * k + y)[::-1]
    for out, extra in results.values():
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)
        assert float(extra["total"]) == 6.0
