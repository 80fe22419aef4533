"""Layers that stay on the device, without Qt: the cache of device copies, a widget's watch over
napari's layer events (on a ``ViewerModel``), and the jobs fed from the copies.

This machine has no accelerator: the cache is made to keep copies on the CPU (``keep_on_cpu``), as only tests do.
"""

from __future__ import annotations

import threading

import dask.array as da
import jax
import numpy as np
import pytest

from napari_gridmip._jobs import device_layers, placed
from napari_gridmip._jobs.correlation import CorrelationRequest, make_correlation_job
from napari_gridmip._jobs.device_layers import DeviceInput, DeviceLayerCache, LayerWatch, resolve
from napari_gridmip._jobs.mipmap import MipmapRequest, make_mipmap_job
from napari_gridmip._jobs.plan import KEY
from napari_gridmip._jobs.timeseries import TimeSeriesRequest, make_timeseries_job
from napari_gridmip._jobs.world import Frame
from napari_gridmip.core import compute_on
from napari_gridmip.core.runtime import strategy
from tests.helpers import reference_levels

MiB = 2**20


@pytest.fixture
def sends(monkeypatch):
    """Every ``jax.device_put`` the cache makes, counted."""
    made = []
    put = jax.device_put

    def counted(x, *args, **kwargs):
        made.append(getattr(x, "shape", None))
        return put(x, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", counted)
    return made


def kept(budget=64 * MiB) -> DeviceLayerCache:
    return DeviceLayerCache(budget, keep_on_cpu=True)


def array(seed=0, shape=(8, 16, 16), dtype=np.float32):
    return (np.random.default_rng(seed).random(shape) * 200).astype(dtype)


# -- the cache ---------------------------------------------------------------------------------------------------


def test_a_second_get_of_one_version_is_a_hit_without_a_transfer(sends):
    cache, data = kept(), array()
    first = cache.get(("layer", ""), 1, data)
    second = cache.get(("layer", ""), 1, data)
    assert isinstance(first, jax.Array) and second is first
    assert len(sends) == 1
    assert cache.stats() == {"hits": 1, "misses": 1, "evictions": 0, "entries": 1, "bytes": data.nbytes,
                             "budget": 64 * MiB}  # fmt: skip
    np.testing.assert_array_equal(np.asarray(first), data)


def test_the_copy_keeps_the_sources_dtype_and_is_not_the_host_array():
    cache, data = kept(), array(dtype=np.uint16)
    copy = cache.get(("layer", ""), 1, data)
    assert copy.dtype == np.uint16  # not widened on the host: 2 bytes a value over the link
    data[0, 0, 0] += 1  # an edit in place does not reach the kept copy (JAX's CPU client would alias the array)
    assert np.asarray(copy)[0, 0, 0] == data[0, 0, 0] - 1


def test_a_new_version_is_a_miss_with_the_new_values(sends):
    cache, data = kept(), array()
    cache.get(("layer", ""), 1, data)
    data *= 2  # edited in place; the layer's version moves on
    copy = cache.get(("layer", ""), 2, data)
    np.testing.assert_array_equal(np.asarray(copy), data)
    assert len(sends) == 2 and cache.stats()["entries"] == 1 and cache.stats()["misses"] == 2


def test_drop_drop_layer_and_clear_free_the_copies():
    cache = kept()
    for key in (("a", ""), ("a", "[3]"), ("b", "")):
        cache.get(key, 1, array())
    assert cache.drop(("b", "")) and not cache.drop(("b", ""))
    assert cache.drop_layer("a") == 2
    assert cache.stats()["entries"] == 0 and cache.stats()["bytes"] == 0
    cache.get(("c", ""), 1, array())
    cache.clear()
    assert cache.keys() == []


def test_the_least_recently_used_copy_goes_first_under_the_budget():
    data = array()
    cache = kept(budget=2 * data.nbytes)  # room for two
    for name in "abc":
        cache.get((name, ""), 1, array())
        if name == "b":
            cache.get(("a", ""), 1, data)  # a used again: b is now the least recently used
    assert cache.keys() == [("a", ""), ("c", "")]
    assert cache.stats()["evictions"] == 1 and cache.stats()["bytes"] <= 2 * data.nbytes


def test_a_smaller_budget_evicts_at_the_next_get():
    cache, data = kept(), array()
    cache.get(("a", ""), 1, data)
    cache.get(("b", ""), 1, data)
    cache.configure(budget_bytes=data.nbytes)
    cache.get(("b", ""), 1, data)
    assert cache.keys() == [("b", "")]
    cache.configure(percent=0)  # off: everything freed at once
    assert cache.keys() == []


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (da.zeros((8, 8, 8), chunks=4), "not a NumPy array in memory"),
        (np.zeros((8, 8, 8), np.float64), "64-bit"),
        (np.zeros((8, 8, 8), np.complex64), "dtype complex64"),
        (np.zeros((64, 64, 64), np.float32), "over the budget"),
    ],
)
def test_what_is_not_kept_passes_unchanged(value, why):
    cache = kept(budget=MiB // 2)
    out, outcome, reason = cache.lookup(("a", ""), 1, value)
    assert out is value and outcome == "skipped" and why in reason
    assert cache.stats()["entries"] == 0


def test_nothing_is_kept_without_an_accelerator_under_host_or_with_budget_0(sends):
    data = array()
    cpu = DeviceLayerCache(64 * MiB)  # no keep_on_cpu: this machine's CPU is JAX's default device
    assert cpu.lookup(("a", ""), 1, data) == (data, "off", "no accelerator: JAX's default device is the CPU")
    forced = kept()
    with compute_on("host"):
        assert forced.lookup(("a", ""), 1, data)[:2] == (data, "off")
    assert kept(budget=0).lookup(("a", ""), 1, data)[:2] == (data, "off")
    assert DeviceLayerCache(percent=0, keep_on_cpu=True).lookup(("a", ""), 1, data)[:2] == (data, "off")
    assert not sends


def test_the_default_budget_is_a_share_of_the_devices_memory(monkeypatch):
    monkeypatch.setattr(device_layers, "_device_memory", lambda device: 1000 * MiB)
    cache = DeviceLayerCache(keep_on_cpu=True)
    assert cache.stats()["budget"] is None  # not asked on the GUI thread: the device says in a worker
    cache.get(("a", ""), 1, array())
    assert cache.stats()["budget"] == 500 * MiB
    cache.configure(percent=10)
    assert cache.budget(jax.devices()[0]) == 100 * MiB


def test_two_workers_asking_for_one_copy_send_it_once(sends, monkeypatch):
    cache, data = kept(), array(shape=(32, 64, 64))
    started, release = threading.Event(), threading.Event()
    send = device_layers._send

    def slow_send(a, device):
        started.set()
        release.wait(10)
        return send(a, device)

    monkeypatch.setattr(device_layers, "_send", slow_send)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.lookup(("a", ""), 1, data))) for _ in range(2)]
    threads[0].start()
    started.wait(10)
    threads[1].start()
    release.set()
    for thread in threads:
        thread.join(10)
    assert sorted(outcome for _, outcome, _ in results) == ["hit", "miss"]
    assert results[0][0] is results[1][0] and len(sends) == 1


def test_a_copy_dropped_while_it_is_sent_serves_its_run_but_is_not_kept(monkeypatch):
    cache, data = kept(), array()
    send = device_layers._send

    def drop_meanwhile(a, device):  # the layer changed on the GUI thread during the transfer
        cache.drop_layer("a")
        return send(a, device)

    monkeypatch.setattr(device_layers, "_send", drop_meanwhile)
    copy, outcome, _ = cache.lookup(("a", ""), 1, data)
    assert outcome == "miss" and isinstance(copy, jax.Array)
    assert cache.keys() == [] and cache.stats()["bytes"] == 0


def test_a_failed_transfer_hands_the_host_array_to_the_kernels(monkeypatch):
    cache, data = kept(), array()
    cache.get(("b", ""), 1, data)

    def out_of_memory(a, device):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory\nmore")

    monkeypatch.setattr(device_layers, "_send", out_of_memory)
    out, outcome, why = cache.lookup(("a", ""), 1, data)
    assert out is data and outcome == "skipped" and why == "not sent: RESOURCE_EXHAUSTED: out of memory"
    assert cache.keys() == []  # the kernel needs the memory more than the copies do

    def interrupted(a, device):
        raise KeyboardInterrupt

    monkeypatch.setattr(device_layers, "_send", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.lookup(("a", ""), 1, data)
    monkeypatch.undo()
    assert cache.lookup(("a", ""), 1, data)[1] == "miss"  # nothing left half-sent to wait for


# -- a widget's watch over napari's layer events (Qt-free: a ViewerModel) -------------------------------------------


@pytest.fixture
def viewer():
    from napari.components import ViewerModel

    return ViewerModel()


def test_edits_and_removal_drop_the_copies_and_close_undoes_the_connections(viewer):
    cache = kept()
    image = viewer.add_image(array(), name="image")
    labels = viewer.add_labels(np.zeros((8, 16, 16), np.uint8), name="labels")
    watch = LayerWatch(viewer.layers, cache=cache)
    before = {name: len(getattr(image.events, name).callbacks) for name in ("data", "refresh")}

    def sent(layer):
        handle = watch.input(layer, layer.data)
        return resolve(handle, layer.data, "x")

    def run_twice(layer):
        sent(layer)
        handle = watch.input(layer, layer.data)
        assert cache.lookup(handle.key, handle.version, layer.data)[1] == "hit"

    run_twice(image)
    image.data = array(seed=1)  # data replaced: napari's layer.events.data
    assert cache.keys() == []
    run_twice(image)
    image.events.refresh()  # an edit announced on napari's refresh event
    assert cache.keys() == []
    run_twice(labels)
    labels.paint((0, 1, 1), 3)  # painting: napari's Labels paint event
    assert cache.keys() == []
    run_twice(labels)
    viewer.layers.remove(labels)  # viewer.layers.events.removed
    assert cache.keys() == []
    assert not watch.watching(labels)

    sent(image)
    watch.close()
    assert cache.keys() == []  # no other widget watches it: freed
    after = {name: len(getattr(image.events, name).callbacks) for name in ("data", "refresh")}
    assert after == before


def test_two_widgets_on_one_layer_share_its_copy(viewer):
    cache = kept()
    image = viewer.add_image(array(), name="image")
    first, second = LayerWatch(viewer.layers, cache=cache), LayerWatch(viewer.layers, cache=cache)
    a, b = first.input(image, image.data), second.input(image, image.data)
    assert a.key == b.key and a.version == b.version
    resolve(a, image.data, "x")
    first.close()  # the other widget still watches the layer: its copy stays
    assert cache.lookup(b.key, b.version, image.data)[1] == "hit"
    second.close()
    assert cache.keys() == []


def test_layers_are_known_through_the_proxy_napari_hands_a_plugin(viewer):
    from napari.utils._proxies import PublicOnlyProxy  # what a plugin's widget gets in place of the viewer

    cache = kept()
    proxy = PublicOnlyProxy(viewer)
    image = viewer.add_image(array(), name="image")
    watch = LayerWatch(proxy.layers, cache=cache)
    one, two = proxy.layers["image"], proxy.layers["image"]
    assert one is not two  # a new wrapper at each access: its id is not the layer's
    handle = watch.input(one, one.data)
    resolve(handle, one.data, "x")
    assert cache.lookup(watch.input(two, two.data).key, handle.version, image.data)[1] == "hit"
    image.data = array(seed=2)  # the real layer's event reaches the watch made through the proxy
    assert cache.keys() == []
    resolve(watch.input(two, two.data), two.data, "x")
    viewer.layers.remove(image)
    assert cache.keys() == []
    watch.close()


def test_budget_0_frees_everything_and_lazy_data_has_no_input(viewer):
    cache = kept()
    image = viewer.add_image(array(), name="image")
    watch = LayerWatch(viewer.layers, cache=cache)
    resolve(watch.input(image, image.data), image.data, "x")
    assert watch.input(image, image.data, percent=0) is None and cache.keys() == []
    lazy = viewer.add_image(da.zeros((4, 8, 8), chunks=4), name="lazy")
    assert watch.input(lazy, lazy.data) is None and not watch.watching(lazy)
    watch.close()


# -- the jobs fed from the copies: the same results, and a record of where their inputs came from -------------------


def run(job):
    with placed("auto"):
        return job.run(lambda done, total: None)


def inputs_of(result):
    return result.layers[-1][1]["metadata"][KEY]["ran_on"].get("device_inputs")


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.uint8, np.float16, bool])
def test_the_mipmap_job_gives_the_same_layers_from_the_copy(dtype):
    cache = kept()
    volume = array(shape=(9, 14, 21), dtype=np.float32)
    volume[0, 0, :3] = np.nan if dtype is np.float32 else 0
    volume = (volume > 100) if dtype is bool else volume.astype(dtype)
    for threshold in (0.5, 120.0):
        plain = run(make_mipmap_job(MipmapRequest("v", volume, Frame.unit(3), threshold, per_level=True)))
        handle = DeviceInput(("v", ""), 1, volume, "v", None, cache)
        kept_run = run(make_mipmap_job(MipmapRequest("v", volume, Frame.unit(3), threshold, per_level=True,
                                                     device=handle)))  # fmt: skip
        assert [meta["name"] for _, meta, _ in kept_run.layers] == [meta["name"] for _, meta, _ in plain.layers]
        for (a, _, _), (b, _, _) in zip(plain.layers, kept_run.layers):
            assert isinstance(b, np.ndarray) and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(kept_run.layers[0][0], reference_levels(volume, threshold)[0])
        assert kept_run.details["counts"] == plain.details["counts"]
        assert kept_run.details["pyramid"].value_range == plain.details["pyramid"].value_range
        assert all(isinstance(level, np.ndarray) for level in kept_run.details["pyramid"].max_levels)
    assert [entry["cache"] for entry in inputs_of(kept_run)] == ["hit"]  # the second threshold: the kept copy
    assert inputs_of(plain) is None  # nothing consulted: the record is as before


def test_the_correlation_jobs_give_the_same_layers_from_the_copies():
    cache = kept()
    img2 = array(seed=3, shape=(4, 40, 40))
    img1 = np.roll(img2, (1, -2), axis=(-2, -1))
    handles = (DeviceInput(("a", ""), 1, img1, "a", None, cache), DeviceInput(("b", ""), 1, img2, "b", None, cache))
    for window in ((7, 7), (9, 9)):  # a new window on the same layers
        request = CorrelationRequest("a", "b", img1, img2, Frame.unit(3), window, full_map=True)
        plain = run(make_correlation_job(request))
        from_copies = run(make_correlation_job(CorrelationRequest(**{**request.__dict__, "devices": handles})))
        for (x, _, _), (y, _, _) in zip(plain.layers, from_copies.layers):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert [(e["source"], e["cache"]) for e in inputs_of(from_copies)] == [("img1", "hit"), ("img2", "hit")]
    # DIC: two images, a subset and a step; the second subset on the kept copies
    ref, deformed = array(seed=4, shape=(48, 48), dtype=np.uint8), array(seed=5, shape=(48, 48), dtype=np.uint8)
    pair = (DeviceInput(("c", ""), 1, deformed, "c", None, cache), DeviceInput(("d", ""), 1, ref, "d", None, cache))
    for subset in ((11, 11), (13, 13)):
        request = CorrelationRequest("c", "d", deformed, ref, Frame.unit(2), (5, 5), subset=subset, step=3,
                                     index="[None]", subpixel="refine")  # fmt: skip
        plain = run(make_correlation_job(request))
        from_copies = run(make_correlation_job(CorrelationRequest(**{**request.__dict__, "devices": pair})))
        for (x, _, _), (y, _, _) in zip(plain.layers, from_copies.layers):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert [e["cache"] for e in inputs_of(from_copies)] == ["hit", "hit"]


def test_the_time_series_job_gives_the_same_image_from_the_copy():
    cache = kept()
    movie = array(seed=6, shape=(30, 24, 24))
    handle = DeviceInput(("m", ""), 1, movie, "m", None, cache)
    for neighbours in (8, 4):
        plain = run(make_timeseries_job(TimeSeriesRequest("m", movie, Frame.unit(3), neighbours)))
        from_copy = run(make_timeseries_job(TimeSeriesRequest("m", movie, Frame.unit(3), neighbours, device=handle)))
        np.testing.assert_array_equal(plain.layers[0][0], from_copy.layers[0][0])
    assert [e["cache"] for e in inputs_of(from_copy)] == ["hit"]


def test_float64_work_on_a_tpu_takes_the_host_arrays(monkeypatch):
    """The chip has no float64: the kernels run on its host (runtime.precision): copies would only cross back."""
    cache = kept()
    img = array(shape=(3, 24, 24))
    handles = (DeviceInput(("a", ""), 1, img, "a", None, cache), DeviceInput(("b", ""), 1, img, "b", None, cache))
    monkeypatch.setattr(strategy, "_platform", lambda: "tpu")
    assert not device_layers.runs_on_device("float64") and device_layers.runs_on_device("float32")
    assert resolve(handles[0], img, "img1", wanted=False) is img
    assert cache.keys() == []


def test_a_run_out_of_device_memory_runs_again_without_the_copies(monkeypatch):
    cache = kept()
    monkeypatch.setattr(device_layers, "_CACHE", cache)
    cache.get(("other layer", ""), 1, array())
    attempts = []

    def job_run(progress):
        attempts.append(cache.stats()["entries"])
        if len(attempts) == 1:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8.00G")
        return "result"

    assert device_layers.run_freeing_copies(job_run, None) == "result"
    assert attempts == [1, 0]  # the second run had the device to itself
    attempts.clear()
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):  # nothing kept to free: the error stands
        device_layers.run_freeing_copies(job_run, None)
    assert attempts == [0]

    def failing(progress):
        raise RuntimeError("INVALID_ARGUMENT: not a memory error")

    cache.get(("other layer", ""), 1, array())
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
        device_layers.run_freeing_copies(failing, None)
    assert cache.stats()["entries"] == 1  # kept: the copies were not the cause
