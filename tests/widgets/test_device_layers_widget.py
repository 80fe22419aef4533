"""Layers that stay on the device, through the widgets' buttons in a real viewer: a second Run
on the same layer takes its kept copy; an edit, a deleted layer, a closed widget, a small budget, the Preferences'
0 and "host CPU" each do what they say; the results are those of a run without the copies.

This machine has no accelerator: the process's cache is made to keep copies on the CPU, as only tests do.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from napari_gridmip._jobs import device_layers as _device_layers
from napari_gridmip._jobs import settings as _settings
from napari_gridmip._jobs.device_layers import DeviceLayerCache
from napari_gridmip._jobs.plan import KEY
from napari_gridmip._widgets.correlation_widget import PAIR, STACKS, CorrelationWidget
from napari_gridmip._widgets.mipmap_widget import MipmapWidget
from tests.helpers import reference_levels


@pytest.fixture(autouse=True)
def copies(monkeypatch):
    """The process's cache, keeping copies on this CPU; each copy it sends (its ``jax.device_put``) counted in
    ``copies.sends``; no early runs (each Run's outcome is then the test's to count)."""
    cache = DeviceLayerCache(keep_on_cpu=True)
    cache.sends = []
    send = _device_layers._send

    def counted(array, device):
        cache.sends.append(array.shape)
        copy = send(array, device)
        assert isinstance(copy, jax.Array)
        return copy

    monkeypatch.setattr(_device_layers, "_CACHE", cache)
    monkeypatch.setattr(_device_layers, "_send", counted)
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")
    return cache


def run(widget, wait_idle) -> None:
    widget.run_button.native.click()
    wait_idle(widget)
    assert widget.status.value.startswith("Done"), widget.status.value


def device_inputs(layer) -> list | None:
    return layer.metadata[KEY]["ran_on"].get("device_inputs")


def volume(seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((20, 24, 28)) * 1000).astype(np.uint16)


def kept_keys(cache, layer) -> list:
    return [key for key in cache.keys() if key[0] == layer.unique_id]


def test_a_second_mipmap_run_on_the_layer_takes_its_kept_copy(docked, wait_idle, copies):
    viewer, widget = docked(MipmapWidget)
    data = volume()
    layer = viewer.add_image(data, name="vol")
    widget.threshold.value = 500.0
    run(widget, wait_idle)
    occupancy = viewer.layers["vol occupancy"]
    assert [(e["source"], e["layer"], e["cache"]) for e in device_inputs(occupancy)] == [("volume", "vol", "miss")]
    assert device_inputs(occupancy)[0]["bytes"] == data.nbytes  # uint16 as the layer holds it
    assert copies.sends == [data.shape]

    widget.threshold.value = 800.0  # a new threshold: a new Run on the same layer
    run(widget, wait_idle)
    assert copies.sends == [data.shape]  # nothing sent again
    assert copies.stats()["hits"] == 1 and copies.stats()["misses"] == 1
    assert [e["cache"] for e in device_inputs(occupancy)] == ["hit"]
    np.testing.assert_array_equal(occupancy.data, reference_levels(data, 800.0)[widget.level.value])
    assert kept_keys(copies, layer) == [(layer.unique_id, "")]


def test_edits_drop_the_copy_and_the_next_run_sees_the_new_values(docked, wait_idle, copies):
    viewer, widget = docked(MipmapWidget)
    layer = viewer.add_image(volume(), name="vol")
    widget.threshold.value = 500.0
    run(widget, wait_idle)
    occupancy = viewer.layers["vol occupancy"]

    new = volume(seed=1)
    layer.data = new  # napari's layer.events.data: the copy goes at once
    assert kept_keys(copies, layer) == []
    run(widget, wait_idle)
    assert [e["cache"] for e in device_inputs(occupancy)] == ["miss"]
    np.testing.assert_array_equal(occupancy.data, reference_levels(new, 500.0)[widget.level.value])

    new[:] = 0  # edited in place, then announced on napari's refresh event
    new[4:9, 5:11, 6:13] = 900
    layer.events.refresh()
    assert kept_keys(copies, layer) == []
    run(widget, wait_idle)
    assert [e["cache"] for e in device_inputs(occupancy)] == ["miss"]
    np.testing.assert_array_equal(occupancy.data, reference_levels(new, 500.0)[widget.level.value])
    assert copies.stats()["hits"] == 0 and len(copies.sends) == 3


def test_painting_a_labels_layer_drops_its_copy(docked, wait_idle, copies):
    viewer, widget = docked(MipmapWidget)
    labels = viewer.add_labels(np.zeros((16, 16, 16), np.uint8), name="mask")
    labels.data[2:5, 2:5, 2:5] = 1
    run(widget, wait_idle)
    assert kept_keys(copies, labels) == [(labels.unique_id, "")]
    labels.paint((12, 12, 12), 2)  # napari's paint event
    assert kept_keys(copies, labels) == []
    run(widget, wait_idle)
    occupancy = viewer.layers["mask occupancy"]
    np.testing.assert_array_equal(occupancy.data, reference_levels(labels.data, 0.0)[widget.level.value])


def test_deleting_the_layer_frees_its_copy(docked, wait_idle, copies):
    viewer, widget = docked(MipmapWidget)
    layer = viewer.add_image(volume(), name="vol")
    run(widget, wait_idle)
    assert copies.stats()["entries"] == 1
    viewer.layers.remove(layer)  # viewer.layers.events.removed
    assert copies.stats() | {"budget": None} == {"hits": 0, "misses": 1, "evictions": 0, "entries": 0, "bytes": 0,
                                                 "budget": None}  # fmt: skip


def test_under_a_small_budget_the_least_recently_used_layer_goes(docked, wait_idle, copies, monkeypatch):
    data = volume()
    # the device's memory, as the cache asks it: half of it (the default share) holds one volume, not two
    monkeypatch.setattr(_device_layers, "_device_memory", lambda device: 3 * data.nbytes)
    viewer, widget = docked(MipmapWidget)
    first = viewer.add_image(data, name="first")
    second = viewer.add_image(volume(seed=2), name="second")
    for layer, outcome in ((first, "miss"), (second, "miss"), (first, "miss"), (first, "hit")):
        widget.layer.value = layer
        run(widget, wait_idle)
        assert [e["cache"] for e in device_inputs(viewer.layers[f"{layer.name} occupancy"])] == [outcome]
    assert copies.stats()["evictions"] == 2 and copies.stats()["entries"] == 1
    assert kept_keys(copies, first) and not kept_keys(copies, second)


@pytest.mark.parametrize("setting", [{"device_layers": 0}, {"compute_on": "host CPU"}])
def test_the_preferences_turn_it_off(docked, wait_idle, copies, setting):
    viewer, widget = docked(MipmapWidget)
    viewer.add_image(volume(), name="vol")
    _settings.save("general", setting)  # as napari's Preferences would (the tests' settings file)
    run(widget, wait_idle)
    run(widget, wait_idle)
    assert copies.keys() == [] and copies.sends == []
    assert device_inputs(viewer.layers["vol occupancy"]) is None  # the record as before


def test_closing_the_widget_undoes_its_connections_and_frees_the_copies(docked, wait_idle, copies):
    viewer, widget = docked(MipmapWidget)
    layer = viewer.add_image(volume(), name="vol")
    before = {name: len(getattr(layer.events, name).callbacks) for name in ("data", "refresh")}
    removed_before = len(viewer.layers.events.removed.callbacks)
    run(widget, wait_idle)
    assert len(layer.events.data.callbacks) == before["data"] + 1
    widget.release()  # as closing its dock does
    assert copies.keys() == []
    assert {name: len(getattr(layer.events, name).callbacks) for name in ("data", "refresh")} == before
    assert len(viewer.layers.events.removed.callbacks) < removed_before


def test_a_plugin_dock_reaches_its_layers_copies_through_napari_s_proxy(make_napari_viewer, qtbot, wait_idle, copies):
    """napari hands a plugin's widget its viewer behind a proxy whose layers are new wrappers at every access."""
    viewer = make_napari_viewer()
    _, widget = viewer.window.add_plugin_dock_widget("napari-gridmip", "Occupancy mipmap")
    try:
        viewer.add_image(volume(), name="vol")
        run(widget, wait_idle)
        widget.threshold.value = 700.0
        widget.reset_choices()  # the layer choices made again: other wrappers of the same layer
        run(widget, wait_idle)
        assert [e["cache"] for e in device_inputs(viewer.layers["vol occupancy"])] == ["hit"]
    finally:
        widget.release()
        qtbot.waitUntil(lambda: not widget.runner.busy, timeout=60_000)


def speckles(seed: int, shape=(4, 48, 48)) -> np.ndarray:
    return np.random.default_rng(seed).random(shape).astype(np.float32)


def layers_of(viewer, names) -> list[np.ndarray]:
    return [np.asarray(viewer.layers[name].data) for name in names]


def test_correlation_runs_on_kept_copies_give_the_results_without_them(docked, wait_idle, copies, monkeypatch):
    viewer, widget = docked(CorrelationWidget)
    b = speckles(3)
    viewer.add_image(np.roll(b, (1, -1), axis=(-2, -1)), name="a")
    viewer.add_image(b, name="b")
    widget.mode.value = STACKS
    widget.img1.value, widget.img2.value = viewer.layers["a"], viewer.layers["b"]
    results = ("b dy", "b dx", "b peak")
    found = {}
    for window in (5, 7):  # a new window on the same stacks: the second run on the kept copies
        widget.window_rows.value = widget.window_cols.value = window
        run(widget, wait_idle)
        found[window] = layers_of(viewer, results)
    assert [e["cache"] for e in device_inputs(viewer.layers["b dy"])] == ["hit", "hit"]
    assert len(copies.sends) == 2

    widget.mode.value = PAIR  # DIC on two images: a new subset on the kept copies
    viewer.add_image(speckles(4, (40, 40)), name="ref")
    viewer.add_image(speckles(5, (40, 40)), name="def")
    widget.img1.value, widget.img2.value = viewer.layers["def"], viewer.layers["ref"]
    widget.window_rows.value = widget.window_cols.value = 5
    widget.step.value = 3
    for subset in (7, 9):
        widget.subset_rows.value = widget.subset_cols.value = subset
        run(widget, wait_idle)
        found[("pair", subset)] = layers_of(viewer, ("ref dy", "ref dx"))
    assert [e["cache"] for e in device_inputs(viewer.layers["ref dy"])] == ["hit", "hit"]

    # the same runs without copies (the cache keeps nothing on a CPU unless told): the same layers
    monkeypatch.setattr(_device_layers, "_CACHE", DeviceLayerCache())
    widget.mode.value = STACKS
    widget.img1.value, widget.img2.value = viewer.layers["a"], viewer.layers["b"]
    for window in (5, 7):
        widget.window_rows.value = widget.window_cols.value = window
        run(widget, wait_idle)
        for kept, plain in zip(found[window], layers_of(viewer, results)):
            np.testing.assert_array_equal(kept, plain)
    assert device_inputs(viewer.layers["b dy"]) is None
    widget.mode.value = PAIR
    widget.img1.value, widget.img2.value = viewer.layers["def"], viewer.layers["ref"]
    widget.window_rows.value = widget.window_cols.value = 5
    widget.subset_rows.value = widget.subset_cols.value = 9
    run(widget, wait_idle)
    # the subsets' kernel centres a device input by its float32 mean on the device, a NumPy one by its float64 mean
    # on the host (core/correlation/subsets.py, _centre_of): the fields agree to float32's rounding, NaN for NaN
    for kept, plain in zip(found[("pair", 9)], layers_of(viewer, ("ref dy", "ref dx"))):
        np.testing.assert_array_equal(np.isnan(kept), np.isnan(plain))
        np.testing.assert_allclose(kept, plain, rtol=0, atol=1e-5)
