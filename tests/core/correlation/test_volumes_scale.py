"""Digital volume correlation beyond one device: the chunks of points side by side on every local device, and the
slabs of lazy volumes as a dask graph's tasks (``compute``, a dask.distributed cluster's): the answers of one
device, and of the slabs run in this process, bit for bit.

The device comparisons need several devices: they run where JAX has them (CI's 8 host devices), and in the
default run :func:`test_several_host_devices_in_a_new_process` runs them in a child process with 4 host devices.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import dask
import dask.array as da
import jax
import numpy as np
import pytest

import napari_gridmip as gm
from napari_gridmip._sample_data.dvc import make_dvc_pair
from napari_gridmip.core.correlation import volumes
from napari_gridmip.core.correlation.status import Status
from napari_gridmip.core.runtime import sharding

several = pytest.mark.skipif(jax.device_count() < 2, reason="needs several devices (CI: 8 host devices)")
FIELDS = ("dz", "dy", "dx", "zncc", "sigma", "status", "gradient", "iterations", "translation")
SHAPE = (48, 48, 48)
OPTIONS = dict(subset=15, step=8)


def _same(a, b):
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.fixture(scope="module")
def pair():
    reference, deformed, _ = make_dvc_pair(SHAPE, dtype=np.uint8, seed=3)
    return reference, deformed


def _one_device_then_every_device(monkeypatch, call):
    """``call()`` with the chunks on the call's device alone, then dealt to every device, noting the devices that
    took several chunks at once. Chunks of 8 subsets of 15^3: every device gets some."""
    monkeypatch.setattr(volumes, "CHUNK_VOXELS", 8 * 15**3)
    monkeypatch.setenv(sharding.VARIABLE, "0")
    one = call()
    monkeypatch.delenv(sharding.VARIABLE)
    used = set()
    original = volumes._chunked

    def noting(program, shared, index, per_point, chunk, *args, spread=None, **kwargs):
        if spread is not None and spread.many and len(index) > chunk:
            used.update(spread.devices[: -(-len(index) // chunk)])
        return original(program, shared, index, per_point, chunk, *args, spread=spread, **kwargs)

    monkeypatch.setattr(volumes, "_chunked", noting)
    return one, call(), used


# -- several devices -----------------------------------------------------------------------------------------------


@several
@pytest.mark.parametrize("options", [dict(), dict(roi="sphere", prefilter="auto"), dict(shape="translation", search=0)],
                         ids=["affine", "roi-prefilter", "translation"])  # fmt: skip
def test_every_device_gives_one_devices_answers(monkeypatch, pair, options):
    reference, deformed = pair
    options = dict(OPTIONS, **options)
    if options.get("roi") == "sphere":
        zz, yy, xx = np.mgrid[:48, :48, :48]
        options["roi"] = (zz - 24) ** 2 + (yy - 22) ** 2 + (xx - 25) ** 2 < 22**2
    one, many, used = _one_device_then_every_device(
        monkeypatch, lambda: gm.correlate_volumes(reference, deformed, **options)
    )
    assert len(used) > 1  # the chunks ran on several devices at once
    assert np.count_nonzero(one.status == Status.ok) >= 10  # (the ROI's edge band leaves the inner points)
    _same(one, many)


@several
def test_every_device_runs_the_slabs_of_lazy_volumes_alike(monkeypatch, pair):
    reference, deformed = pair
    monkeypatch.setattr(volumes, "SLAB_VOXELS", SHAPE[1] * SHAPE[2] * 40)
    lazy = [da.from_array(v, chunks=(16, 48, 48)) for v in pair]
    one, many, used = _one_device_then_every_device(monkeypatch, lambda: gm.correlate_volumes(*lazy, **OPTIONS))
    assert len(used) > 1
    _same(one, many)


@several
def test_progress_and_cancel_on_every_device(pair):
    reference, deformed = pair
    calls = []
    result = gm.correlate_volumes(reference, deformed, progress=lambda done, total: calls.append((done, total)),
                                  **OPTIONS)  # fmt: skip
    done, totals = np.array(calls).T
    assert set(totals) == {2 * result.dz.size} and done[-1] == totals[0]
    assert np.all(np.diff(done) >= 0) and len(np.unique(done)) > 3

    class Stop(Exception):
        pass

    def cancel(done, total):
        if done > 0:
            raise Stop

    with pytest.raises(Stop):
        gm.correlate_volumes(reference, deformed, progress=cancel, **OPTIONS)


@several
def test_a_host_run_keeps_to_the_host_and_a_default_device_leads(pair):
    """Under compute_on("host") the chunks go to the host CPU's devices; under JAX's default device set to
    another device, that device is the call's (the first of the spread) and the answers stay the same."""
    reference, deformed = pair
    with gm.compute_on("host"):
        hosted = gm.correlate_volumes(reference, deformed, **OPTIONS)
    assert sharding.band_devices()[0] == jax.devices()[0]
    with jax.default_device(jax.devices()[1]):
        assert sharding.band_devices()[0] == jax.devices()[1]
        moved = gm.correlate_volumes(reference, deformed, **OPTIONS)
    _same(hosted, moved)


@pytest.mark.slow  # a child process that compiles anew (about 20 s); CI's 8-host-device step runs the comparison
@pytest.mark.skipif(jax.device_count() > 1, reason="the parent has several devices already")
def test_several_host_devices_in_a_new_process():
    """The affine comparison of the devices in a child process with 4 host devices (the default run has one)."""
    code = textwrap.dedent(
        """
        import sys, pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", __file__, "-k",
                              "every_device_gives and affine"]))
        """
    ).replace("__file__", repr(__file__))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]


# -- the slabs as a dask graph's tasks -----------------------------------------------------------------------------

SLABBED = (64, 32, 32)
SLAB_OPTIONS = dict(subset=9, step=6, search=2)


@pytest.fixture(scope="module")
def slabbed():
    """A lazy pair read in slabs of 1 or 2 point planes (40 planes each), and its run in this process."""
    reference, deformed, _ = make_dvc_pair(SLABBED, dtype=np.uint8, seed=5, translation=(0.4, -0.3, 0.25))
    lazy = [da.from_array(v, chunks=(16, 32, 32)) for v in (reference, deformed)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(volumes, "SLAB_VOXELS", SLABBED[1] * SLABBED[2] * 40)
        here = gm.correlate_volumes(*lazy, **SLAB_OPTIONS)
    return lazy, here


def test_the_slabs_as_tasks_give_the_slabs_run_here(monkeypatch, slabbed):
    """dask's threads run each stage's slabs side by side (one at a time in the process's JAX): the answers of
    the run here, the progress counted up to its total, and Cancel between the stages."""
    lazy, here = slabbed
    monkeypatch.setattr(volumes, "SLAB_VOXELS", SLABBED[1] * SLABBED[2] * 40)
    stages, calls = [], []

    def compute(collections):
        stages.append(len(collections))
        return dask.compute(collections, scheduler="threads", num_workers=2)[0]  # as the command line's runner

    tasked = gm.correlate_volumes(*lazy, compute=compute, progress=lambda done, total: calls.append((done, total)),
                                  **SLAB_OPTIONS)  # fmt: skip
    _same(here, tasked)
    # one graph a stage: the binned copies (one each), the search, the first IC-GN, each retry round
    assert len(stages) >= 4 and set(stages) == {1}
    done, totals = np.array(calls).T
    assert np.all(np.diff(done) >= 0) and done[-1] == totals[0] == 2 * here.dz.size

    def cancel(done, total):
        if done > 0:
            raise KeyboardInterrupt

    stages.clear()
    with pytest.raises(KeyboardInterrupt):
        gm.correlate_volumes(*lazy, compute=compute, progress=cancel, **SLAB_OPTIONS)
    assert len(stages) <= 3  # stopped before the IC-GN's stage


def test_compute_is_checked_and_each_slab_is_a_task(slabbed):
    lazy, _ = slabbed
    with pytest.raises(TypeError, match="compute must be a callable"):
        gm.correlate_volumes(*lazy, compute="tcp://127.0.0.1:8786", **SLAB_OPTIONS)
    with pytest.raises(TypeError, match="must run a list of dask collections"):
        gm.correlate_volumes(*lazy, compute=lambda collections: collections, **SLAB_OPTIONS)
    seen = []
    original = volumes._slab_task

    def noting(stage, run, first, *rest):
        seen.append((stage, first))
        return original(stage, run, first, *rest)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(volumes, "SLAB_VOXELS", SLABBED[1] * SLABBED[2] * 40)
        patch.setattr(volumes, "_slab_task", noting)
        gm.correlate_volumes(*lazy, compute=dask.compute, **SLAB_OPTIONS)  # dask.compute itself: its threads
        slabs = volumes._slabs(SLABBED, np.arange(4, 60, 6.0), volumes._halo(4, 2, 0.4, 0.0, np.float32), 6)
    expected = [(stage, first) for stage in ("search", "first") for _, first, _ in slabs]  # a task a slab a stage
    assert len(slabs) > 2 and sorted(x for x in seen if x[0] != "again") == sorted(expected)


def test_a_distributed_cluster_gives_the_slabs_run_here(monkeypatch, slabbed):
    distributed = pytest.importorskip("distributed")
    lazy, here = slabbed
    monkeypatch.setattr(volumes, "SLAB_VOXELS", SLABBED[1] * SLABBED[2] * 40)
    with (
        distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        far = gm.correlate_volumes(*lazy, compute=lambda tasks: client.gather(client.compute(tasks)), **SLAB_OPTIONS)
    _same(here, far)
