"""The DIC series over several local devices (each holds a part of the grid's points and runs their IC-GN): the
answers of one device: the same statuses, and values within the IC-GN's convergence tolerance, since a device's
batches of points are other batches, whose sums round otherwise, and a point's last increment, rounded otherwise,
can stop its IC-GN a step earlier or later (within a corner move of ``TOLERANCE`` pixels). CI runs tests/core on 8
host devices; in the default run the comparison skips and a slow case runs it in a child process with 3 host
devices (a grid that does not split evenly)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import napari_gridmip as gm
from napari_gridmip._sample_data.dic_series import make_dic_series
from napari_gridmip.core.correlation import series as series_module
from napari_gridmip.core.runtime import sharding

several = pytest.mark.skipif(jax.device_count() < 2, reason="needs several devices (CI: 8 host devices)")


@several
@pytest.mark.parametrize(("kind", "reference"), [("rotation", "auto"), ("translation", "incremental")])
def test_every_device_gives_one_devices_answers(monkeypatch, kind, reference):
    frames, truth = make_dic_series(kind, frames=4, shape=(96, 96))
    options = dict(subset=21, step=8, roi=truth.get("roi"), reference=reference)
    monkeypatch.setenv(sharding.VARIABLE, "0")
    assert len(series_module._Spread(100).devices) == 1
    one = gm.correlate_series(frames, **options)
    monkeypatch.delenv(sharding.VARIABLE)
    spread = series_module._Spread(100)
    assert len(spread.devices) == jax.device_count() and spread.padded % jax.device_count() == 0
    many = gm.correlate_series(frames, **options)
    assert (one.status == gm.Status.ok)[1:].sum() > 20
    for name in ("status", "key_frame", "y", "x"):
        np.testing.assert_array_equal(getattr(many, name), getattr(one, name), err_msg=name)
    # a warp whose step moves no corner of the subset by TOLERANCE has stopped: the displacement is known to
    # TOLERANCE, its gradient to TOLERANCE over the subset's half-width
    gradient = series_module.TOLERANCE / (21 // 2)
    bounds = dict(dy=series_module.TOLERANCE, dx=series_module.TOLERANCE, motion=series_module.TOLERANCE)
    bounds |= dict.fromkeys(("dy_y", "dy_x", "dx_y", "dx_x"), gradient)
    bounds |= dict.fromkeys(("zncc", "sigma_dy", "sigma_dx"), 1e-5)
    for name, bound in bounds.items():
        np.testing.assert_allclose(getattr(many, name), getattr(one, name), rtol=0, atol=bound, err_msg=name)


@pytest.mark.slow
def test_three_host_devices_in_a_new_process():
    code = textwrap.dedent(
        """
        import sys, pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", __file__, "-k", "every_device"]))
        """
    ).replace("__file__", repr(__file__))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=3", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout, done.stdout[-2000:]
