"""Band programs over every local device (``core.runtime.sharding``): the same answers as on one device.

The comparisons need several devices: CI runs this file on 8 host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``, ``.ci/run``), where each public kernel that shards is run
with the bands spread and with ``NAPARI_GRIDMIP_SHARD_BANDS=0`` in the same process. In the default run (one
device) they skip, and :func:`test_eight_host_devices_in_a_new_process` runs the small cases in a child process
with 4 host devices, so that the README's command covers the sharded path too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import napari_gridmip as gm
from napari_gridmip.core.runtime import sharding

several = pytest.mark.skipif(jax.device_count() < 2, reason="needs several devices (CI: 8 host devices)")


def _both(monkeypatch, call):
    """``call()`` on one device, then with the bands over every device: both results, as NumPy leaves."""
    monkeypatch.setenv(sharding.VARIABLE, "0")
    one = call()
    monkeypatch.delenv(sharding.VARIABLE)
    many = call()
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(one)], [
        np.asarray(x) for x in jax.tree_util.tree_leaves(many)
    ]


@partial(jax.jit, static_argnames=("rows",))
def _toy_band(x, start, offset, *, rows):
    part = jax.lax.dynamic_slice_in_dim(x, start, rows, 0)
    return {"scaled": part * 2 + offset, "first": part[:, :1]}


def _pair(shape=(96, 88), shift=(2, -1), seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random(shape).astype(np.float32)
    b = np.roll(a, shift, (0, 1)) + np.float32(0.01) * rng.random(shape).astype(np.float32)
    return a, b


def test_band_devices_puts_the_calls_device_first_and_honours_the_switch(monkeypatch):
    devices = sharding.band_devices()
    assert devices[0] == jax.devices()[0]
    assert set(devices) == set(jax.local_devices(backend=devices[0].platform))
    monkeypatch.setenv(sharding.VARIABLE, "off")
    assert sharding.band_devices() == (jax.devices()[0],)


def test_spread_rows_gives_every_device_a_band():
    assert sharding.spread_rows(40, 100, 1) == 40
    assert sharding.spread_rows(40, 100, 8) == 13
    assert len(sharding.band_starts(13, 100)) == 8
    assert sharding.spread_rows(5, 100, 8) == 5  # already small: kept
    assert sharding.spread_rows(3, 2, 8) == 1
    assert sharding.band_starts(30, 100) == [0, 30, 60, 70]


def test_one_device_runs_the_bands_in_turn_and_reports_progress():
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    seen = []
    pieces = sharding.run_bands(
        _toy_band, (x, np.float32(1)), [0, 7, 14], row_arg=1, static=dict(rows=6),
        devices=jax.devices()[:1], progress=seen.append,
    )  # fmt: skip
    assert seen == [0, 1, 2]
    np.testing.assert_array_equal(pieces[1]["scaled"], x[7:13] * 2 + 1)


@several
def test_the_bands_over_every_device_equal_one_devices_and_land_on_the_first():
    x = np.arange(100 * 5, dtype=np.float32).reshape(100, 5)
    starts = sharding.band_starts(13, 100)  # 8 bands: not a multiple of every device count
    seen = []
    one = sharding.run_bands(_toy_band, (x, np.float32(1)), starts, row_arg=1, static=dict(rows=13),
                              devices=jax.devices()[:1])  # fmt: skip
    many = sharding.run_bands(
        _toy_band, (x, np.float32(1)), starts, row_arg=1, static=dict(rows=13),
        devices=tuple(jax.devices()[:3]), progress=seen.append,
    )  # fmt: skip
    assert seen == [0, 3, 6]  # one step per group of 3 bands, the last one short
    assert len(many) == len(starts)
    for a, b in zip(one, many):
        for p, q in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_array_equal(np.asarray(p), np.asarray(q))
            assert q.devices() == {jax.devices()[0]}


@several
def test_inputs_committed_to_another_device_keep_their_pieces_there():
    """A user's array put on a device of its own: the pieces land on it (the driver's later steps take them with
    the inputs), on every device count."""
    home = jax.devices()[1]
    x = jax.device_put(np.arange(40 * 3, dtype=np.float32).reshape(40, 3), home)
    pieces = sharding.run_bands(_toy_band, (x, np.float32(0)), [0, 10, 20, 30], row_arg=1, static=dict(rows=10))
    assert all(leaf.devices() == {home} for piece in pieces for leaf in jax.tree_util.tree_leaves(piece))
    np.testing.assert_array_equal(np.concatenate([np.asarray(p["scaled"]) for p in pieces]), np.asarray(x) * 2)
    a, b = _pair((60, 56))
    field = gm.find_displacement(jax.device_put(a[None], home), jax.device_put(b[None], home), (9, 9),
                                 subset=(15, 15), step=4, subpixel="refine", shape="affine")  # fmt: skip
    assert field.dy.devices() == {home}


@several
def test_a_stop_between_steps_stops_the_work():
    class Stop(Exception):
        pass

    def stop_at(done):
        if done >= 2:
            raise Stop

    with pytest.raises(Stop):
        sharding.run_bands(_toy_band, (np.zeros((40, 2), np.float32), np.float32(0)), [0, 10, 20, 30], row_arg=1,
                            static=dict(rows=10), devices=tuple(jax.devices()[:2]), progress=stop_at)  # fmt: skip


@several
@pytest.mark.parametrize(
    "options",
    [
        dict(window=(9, 9), subset=(15, 15), step=4),  # DIC, translation
        dict(window=(9, 9), subset=(15, 15), step=4, shape="affine", subpixel="refine"),  # DIC, affine
    ],
    ids=["dic", "dic-affine"],
)
def test_dic_is_the_same_over_every_device(monkeypatch, options):
    a, b = _pair()
    one, many = _both(monkeypatch, lambda: tuple(gm.find_displacement(a[None], b[None], **options)))
    for p, q in zip(one, many):
        np.testing.assert_array_equal(p, q)


@several
@pytest.mark.parametrize("subpixel", ["hessian", "refine"])
def test_the_maps_displacement_is_the_same_over_every_device(monkeypatch, subpixel):
    a, b = _pair((70, 64))
    stack1 = np.stack([np.roll(a, i, 1) for i in range(4)])
    stack2 = np.stack([np.roll(b, i, 1) for i in range(4)])
    one, many = _both(
        monkeypatch, lambda: tuple(gm.find_displacement(stack1, stack2, window=(7, 7), subpixel=subpixel))
    )
    for p, q in zip(one, many):
        np.testing.assert_array_equal(p, q)


@several
def test_speckle_tracking_is_the_same_over_every_device(monkeypatch):
    a, b = _pair((60, 56))
    stack1 = np.stack([np.roll(a, i, 1) for i in range(4)])
    stack2 = np.stack([np.roll(b, i, 1) for i in range(4)])
    one, many = _both(monkeypatch, lambda: vars(gm.track_speckles(stack2, stack1, window=(7, 7), subset=(5, 5))))
    for p, q in zip(one, many):
        np.testing.assert_array_equal(p, q)


@several
@pytest.mark.parametrize(
    "dtype, held, ahead", [(np.float32, False, False), (np.uint8, False, False), (np.uint16, True, True)]
)
def test_the_correlation_image_is_the_same_over_every_device(monkeypatch, dtype, held, ahead):
    from napari_gridmip.core.correlation import timeseries

    if held:  # as off the CPU: the narrow chunk crosses as held, widened on each device (timeseries.sent_as_held)
        monkeypatch.setattr(timeseries, "sent_as_held", lambda source: np.dtype(source).itemsize <= 2)
    if ahead:  # as off the CPU: each next chunk read and sent in a thread (timeseries._prefetched)
        monkeypatch.setattr(timeseries, "_prefetched", partial(_ahead, timeseries._prefetched))
    rng = np.random.default_rng(1)
    movie = (rng.normal(size=(2, 83, 20, 18)) * 30 + 100).clip(0, 255).astype(dtype)
    movie[:, :, 4:8, 4:8] += (20 * rng.random((2, 83, 1, 1))).astype(dtype)
    for chunk_frames in (None, 17):
        one, many = _both(monkeypatch, lambda c=chunk_frames: gm.local_correlation_image(movie, chunk_frames=c))
        # each device's part of a chunk has its own centre (float32 sums, merged in float64): a few ulp of 1
        np.testing.assert_allclose(many[0], one[0], rtol=0, atol=1e-6)


def _ahead(prefetched, send, starts, dtype):
    """timeseries._prefetched as off the CPU (only the chunk loop is told so; the kernels' strategies keep the
    CPU's): each next chunk read and sent in a thread."""
    from napari_gridmip.core.correlation import timeseries

    real = timeseries.strategy.on_cpu
    timeseries.strategy.on_cpu = lambda: False
    try:
        generator = prefetched(send, starts, dtype)
        first = next(generator)  # the thread started while "off the CPU"
    finally:
        timeseries.strategy.on_cpu = real
    yield first
    yield from generator


@several
def test_dask_mipmaps_spread_their_blocks_and_equal_one_devices(monkeypatch):
    import dask.array as da

    rng = np.random.default_rng(2)
    volume = (rng.random((37, 30, 41)) > 0.97).astype(np.float32) * rng.random((37, 30, 41)).astype(np.float32)
    lazy = da.from_array(volume, chunks=(16, 16, 16))
    seen = set()
    original = sharding._InTurn.__call__

    def noting(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        seen.update(d for leaf in jax.tree_util.tree_leaves(out) if isinstance(leaf, jax.Array) for d in leaf.devices())
        return out

    monkeypatch.setattr(sharding._InTurn, "__call__", noting)
    for build in (partial(gm.occupancy_mipmap, threshold=0.5), gm.max_mipmap):
        one, many = _both(monkeypatch, lambda b=build: [level.compute() for level in b(lazy)])
        for p, q in zip(one, many):
            np.testing.assert_array_equal(p, q)
    assert len(seen) > 1  # the blocks ran on several devices


def test_a_traced_call_runs_its_bands_in_turn():
    x = jnp.arange(40.0).reshape(20, 2)

    @jax.jit
    def traced(x):
        pieces = sharding.run_bands(_toy_band, (x, np.float32(0)), [0, 10], row_arg=1, static=dict(rows=10))
        return jnp.concatenate([p["scaled"] for p in pieces])

    np.testing.assert_array_equal(traced(x), np.asarray(x) * 2)


@pytest.mark.skipif(jax.device_count() > 1, reason="the parent has several devices already")
def test_eight_host_devices_in_a_new_process():
    """The sharded path in the default run: this file's cheap comparisons in a child with 4 host devices."""
    code = textwrap.dedent(
        """
        import sys, pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", __file__, "-k",
                              "every_device_equal or stop_between or maps_displacement and hessian"]))
        """
    ).replace("__file__", repr(__file__))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 passed" in done.stdout, done.stdout[-2000:]
