"""The user's override of where the kernels run (napari_gridmip.compute_on, NAPARI_GRIDMIP_COMPUTE_ON), and the log
of where a job's calls ran that its provenance records.

This machine has no accelerator: the rules are seen through a pretended TPU (``jax.default_backend`` answering
"tpu", as tests/core/test_backend.py does), where the scopes they choose are JAX's own and can be read back."""

from __future__ import annotations

import contextlib
import threading

import jax
import numpy as np
import pytest

import napari_gridmip as gm
from napari_gridmip._jobs import placed
from napari_gridmip._jobs.plan import Call, Plan, Source
from napari_gridmip.core.runtime import choice, precision, strategy

VOLUME = np.random.default_rng(0).random((8, 12, 6)).astype(np.float32)


@pytest.fixture
def tpu(monkeypatch):
    """The default backend pretends to be a TPU (the host CPU backend is there, as on the TPU machine)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")


def cpu_device():
    return jax.devices("cpu")[0]


def moves_to_host(scope) -> bool:
    """Whether ``scope`` (a rule's placement) runs its block on the host CPU under the pretended TPU."""
    with scope:
        return strategy.on_cpu()


def test_bad_values_name_themselves_and_the_choices(monkeypatch):
    with pytest.raises(ValueError, match=r"compute_on must be one of 'auto', 'accelerator', 'host'; got 'gpu'"):
        with gm.compute_on("gpu"):
            pass
    with pytest.raises(ValueError, match="got 'host CPU'"):  # the Preferences' words are the widgets', not the API's
        gm.compute_on("host CPU").__enter__()
    monkeypatch.setenv("NAPARI_GRIDMIP_COMPUTE_ON", "tpu")
    with pytest.raises(ValueError, match=r"NAPARI_GRIDMIP_COMPUTE_ON must be one of .*'host'; got 'tpu'"):
        gm.max_mipmap(VOLUME)  # read where a kernel needs it
    with gm.compute_on("auto"):  # a block's setting wins over the variable
        gm.max_mipmap(VOLUME)


def test_the_rules_follow_the_setting(tpu):
    # auto: today's rules (host inputs on a TPU go to the host; a device array stays)
    assert moves_to_host(strategy.memory_bound_place(VOLUME))
    assert isinstance(strategy.memory_bound_place(jax.numpy.asarray(VOLUME)), contextlib.nullcontext)
    assert strategy.series_on_host() and strategy.render_on_host()
    with gm.compute_on("accelerator"):  # the rules that move work to the host are off
        assert isinstance(strategy.memory_bound_place(VOLUME), contextlib.nullcontext)
        assert not strategy.series_on_host() and not strategy.render_on_host()
        assert not strategy.on_cpu()
    with gm.compute_on("host") as device:  # everything on the host, a device array's kernel too
        assert device == cpu_device() and jax.config.jax_default_device == cpu_device()
        assert strategy.on_cpu() and not strategy.spline_windows()  # the CPU's strategies
        assert moves_to_host(strategy.memory_bound_place(jax.numpy.asarray(VOLUME)))
        assert strategy.series_on_host() and strategy.render_on_host()
        with gm.compute_on("accelerator") as inner:  # the innermost block wins: JAX's default device again
            assert jax.config.jax_default_device is None and inner == jax.devices()[0]
            assert not strategy.on_cpu() and not strategy.series_on_host()
        assert strategy.on_cpu()
    assert jax.config.jax_default_device is None  # nothing global was left behind


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a machine without an accelerator")
def test_without_an_accelerator_the_rules_move_nothing():
    assert isinstance(strategy.memory_bound_place(VOLUME), contextlib.nullcontext)
    assert not strategy.series_on_host() and not strategy.render_on_host()
    with gm.compute_on("accelerator") as device:  # JAX's default device: this machine's CPU
        assert device.platform == "cpu"
    with gm.compute_on("host"):
        assert strategy.series_on_host() and strategy.render_on_host()  # an explicit host, harmless here


def test_the_variable_is_the_process_default(tpu, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_COMPUTE_ON", " Accelerator ")  # any case, spaces ignored
    assert choice.setting() == "accelerator"
    assert isinstance(strategy.memory_bound_place(VOLUME), contextlib.nullcontext)
    assert not strategy.series_on_host()
    monkeypatch.setenv("NAPARI_GRIDMIP_COMPUTE_ON", "host")
    with precision.precision_scope(np.float32):  # a kernel outside any block takes the host from its own scope
        assert strategy.on_cpu()
    assert moves_to_host(strategy.memory_bound_place(jax.numpy.asarray(VOLUME)))
    with gm.compute_on("auto"):
        assert moves_to_host(strategy.memory_bound_place(VOLUME))
        assert isinstance(strategy.memory_bound_place(jax.numpy.asarray(VOLUME)), contextlib.nullcontext)
    monkeypatch.setenv("NAPARI_GRIDMIP_COMPUTE_ON", "")
    assert choice.setting() == "auto"


def test_host_puts_the_outputs_on_the_host_cpu():
    with gm.compute_on("host") as device:
        levels = gm.max_mipmap(VOLUME)
        field = gm.find_displacement(VOLUME[:2, :8, :6], VOLUME[:2, :8, :6], (3, 3))
    assert device == cpu_device()
    assert all(level.devices() == {cpu_device()} for level in levels[1:])
    assert all(array.devices() == {cpu_device()} for array in field[:2])


def test_the_block_is_this_threads_alone():
    seen = {}
    with gm.compute_on("host"):
        thread = threading.Thread(target=lambda: seen.update(device=jax.config.jax_default_device))
        thread.start()
        thread.join()
    assert seen["device"] is None


def test_dasks_threads_follow_the_block(tpu):
    """JAX's default device is per thread and dask computes in threads of its own: the setting (a context
    variable) follows, and the kernels' own scope places their work there again."""
    import dask
    import dask.array as da

    seen = []

    def block(x):
        with precision.precision_scope(x.dtype):
            seen.append((threading.current_thread().name, choice.setting(), strategy.on_cpu()))
        return x

    lazy = da.ones((8, 4), chunks=(1, 4)).map_blocks(block, meta=np.empty((0, 0)))  # no call to infer it
    with gm.compute_on("host"):
        dask.compute(lazy, scheduler="threads")
    assert {s for _, s, _ in seen} == {"host"} and all(on_cpu for _, _, on_cpu in seen)
    assert any(name != threading.current_thread().name for name, _, _ in seen)  # some in dask's own threads


def test_a_dask_inputs_blocks_run_where_the_rule_put_the_call(tpu, monkeypatch):
    """memory_bound_place decides as the graph is made; the blocks run later in dask's threads, where JAX's
    default device is not the caller's: they keep the host (core.runtime.strategy.keep_place)."""
    import dask
    import dask.array as da

    from napari_gridmip.core.occupancy import pyramid

    seen = []
    kernel = pyramid._occupancy_kernel

    def spy(block, *, threshold):
        seen.append(strategy.on_cpu())
        return kernel(block, threshold=threshold)

    monkeypatch.setattr(pyramid, "_occupancy_kernel", spy)
    # one device: on 8 host devices (CI) the blocks would be spread over real CPU devices, which the pretended TPU
    # is not (core.runtime.sharding.spread_blocks; tests/core/test_sharding.py tests the spread)
    monkeypatch.setenv("NAPARI_GRIDMIP_SHARD_BANDS", "0")
    volume = da.from_array(VOLUME, chunks=(4, 4, 6))
    levels = gm.occupancy_mipmap(volume, threshold=0.5)  # auto, host inputs: the host
    computed = dask.compute(*levels, scheduler="threads")
    assert seen and all(seen)
    seen.clear()
    with gm.compute_on("accelerator"):
        levels = gm.occupancy_mipmap(volume, threshold=0.5)
    dask.compute(*levels, scheduler="threads")
    assert seen and not any(seen)
    monkeypatch.undo()
    for got, want in zip(computed, gm.occupancy_mipmap(VOLUME, threshold=0.5)):
        np.testing.assert_array_equal(got, np.asarray(want))


def plan_of(function: str, **kwargs) -> Plan:
    call = Call(function, ("v",), kwargs=kwargs, result="levels")
    return Plan([Source("v", layer="v")], [call], {"top": "levels[-1]"})


def test_the_log_records_where_each_call_ran(tpu):
    plan = plan_of("occupancy_mipmap", threshold=0.5)
    with placed("auto") as record:
        plan.run({"v": VOLUME})
        ran_on = plan.record()["napari_gridmip"]["ran_on"]
    assert ran_on == record and record["compute_on"] == "auto"
    (call,) = record["calls"]
    assert call["function"] == "napari_gridmip.occupancy_mipmap"
    assert call["moved_to_host"] == ["memory_bound_place"]
    default = jax.devices()[0]  # where the setting put it: JAX's default device (this machine's CPU, or the TPU)
    assert (call["platform"], call["device_kind"]) == (default.platform, default.device_kind)
    with placed("accelerator") as record:
        plan.run({"v": VOLUME})
    assert record["compute_on"] == "accelerator" and "moved_to_host" not in record["calls"][0]
    with placed("host") as record:  # the setting placed it, no rule moved it
        plan.run({"v": VOLUME})
    assert record["calls"] == [{"function": "napari_gridmip.occupancy_mipmap", "platform": "cpu",
                                "device_kind": cpu_device().device_kind}]  # fmt: skip
    with placed("accelerator") as record:  # a TPU has no float64: that work goes to its host under every setting
        plan_of("max_mipmap").run({"v": VOLUME.astype(np.float64)})
    assert record["calls"][0]["moved_to_host"] == ["float64"]
    assert plan.record()["napari_gridmip"].get("ran_on") is None  # outside a job: nothing recorded
