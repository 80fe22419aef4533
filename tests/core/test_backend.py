"""The backend choice follows where the work runs: a float64 call on a TPU runs on the host and takes the CPU's
strategies there (core._backend.on_cpu, core._precision)."""

from __future__ import annotations

import jax
import numpy as np

from napari_gridmip.core import _backend, _precision


def test_a_scoped_cpu_device_counts_as_the_cpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # as on the TPU machine
    assert not _backend.on_cpu()
    assert _backend.offset_sweeps() and _backend.subset_row_sums(31) == "at_once"
    assert _backend.subset_row_sums(5) == "fresh"
    assert _backend.spline_windows() and _backend.ic_gn_rows_together()
    with jax.default_device(jax.devices("cpu")[0]):
        assert _backend.on_cpu()
        assert not _backend.offset_sweeps() and _backend.subset_row_sums(31) == "running"
        assert not _backend.spline_windows() and not _backend.ic_gn_rows_together()
        assert _backend.cache_sized_bands()
    with jax.default_device("cpu"):  # a platform name is accepted by JAX too
        assert _backend.on_cpu()


def test_float64_work_on_a_tpu_takes_the_cpu_strategies(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with _precision.precision_scope(np.float64):
        assert _backend.on_cpu() and not _backend.spline_windows()
    with _precision.precision_scope(np.float32):  # float32 stays on the (pretended) accelerator
        assert not _backend.on_cpu()
