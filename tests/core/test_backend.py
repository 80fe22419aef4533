"""The backend choice follows where the work runs: a float64 call on a TPU runs on the host and takes the CPU's
strategies there (core.runtime.strategy.on_cpu, core.runtime.precision)."""

from __future__ import annotations

import jax
import numpy as np

from napari_gridmip.core.runtime import precision, strategy


def test_a_scoped_cpu_device_counts_as_the_cpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # as on the TPU machine
    assert not strategy.on_cpu()
    assert strategy.offset_sweeps() and strategy.subset_row_sums(31) == "at_once"
    assert strategy.subset_row_sums(5) == "fresh"
    assert strategy.spline_windows() and strategy.ic_gn_rows_together()
    with jax.default_device(jax.devices("cpu")[0]):
        assert strategy.on_cpu()
        assert not strategy.offset_sweeps() and strategy.subset_row_sums(31) == "running"
        assert not strategy.spline_windows() and not strategy.ic_gn_rows_together()
        assert strategy.cache_sized_bands()
    with jax.default_device("cpu"):  # a platform name is accepted by JAX too
        assert strategy.on_cpu()


def test_float64_work_on_a_tpu_takes_the_cpu_strategies(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with precision.precision_scope(np.float64):
        assert strategy.on_cpu() and not strategy.spline_windows()
    with precision.precision_scope(np.float32):  # float32 stays on the (pretended) accelerator
        assert not strategy.on_cpu()


def test_memory_bound_kernels_stay_on_the_host_for_host_inputs_on_a_tpu(monkeypatch):
    """The placement on the backend this runs on: on a CPU-only machine (or ``JAX_PLATFORMS=cpu``) nothing moves;
    on a TPU (a real one, else the CPU pretending to be one) NumPy inputs run on the host and a device array stays
    put. The answers are the same wherever it runs."""
    import contextlib

    import napari_gridmip as gm

    volume = np.random.default_rng(0).random((8, 12, 6)).astype(np.float32)
    movie = np.random.default_rng(1).random((20, 9, 7)).astype(np.float32)
    expected = [np.asarray(level) for level in gm.occupancy_mipmap(volume, threshold=0.7)]
    expected_max = [np.asarray(level) for level in gm.max_mipmap(volume)]
    expected_image = np.asarray(gm.local_correlation_image(movie))
    backend = jax.default_backend()
    if backend == "cpu":  # nothing to move: the CPU backend is the host
        assert isinstance(strategy.memory_bound_place(volume), contextlib.nullcontext)
        assert not strategy.series_on_host()
    if backend != "tpu":  # the TPU's rule, on this machine's devices
        monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    placed = strategy.memory_bound_place(volume)
    device_input = strategy.memory_bound_place(volume, jax.numpy.asarray(volume))
    assert isinstance(device_input, contextlib.nullcontext)  # a device array keeps the work on its device
    if not strategy._has_host():  # a TPU process without the CPU backend (JAX_PLATFORMS=tpu): all stays there
        assert isinstance(placed, contextlib.nullcontext) and not strategy.series_on_host()
    else:
        # a few KiB of NumPy input: the host wins whatever the link's rates (its latency alone outweighs the work),
        # and where the rates cannot be had (the pretended TPU's device is the CPU) the host is the rule
        assert not isinstance(placed, contextlib.nullcontext)
        with placed:
            assert strategy.on_cpu()
        assert strategy.series_on_host()
    for got, want in zip(gm.occupancy_mipmap(volume, threshold=0.7), expected, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    for got, want in zip(gm.max_mipmap(volume), expected_max, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_allclose(np.asarray(gm.local_correlation_image(movie)), expected_image, rtol=1e-6, atol=1e-6)
