"""The Occupancy mipmap widget in a real viewer, driven through its buttons."""

import numpy as np
import pytest

from napari_gridmip._widgets.mipmap_widget import MipmapWidget
from tests.helpers import reference_levels


@pytest.fixture
def viewer_and_widget(docked):
    return docked(MipmapWidget)


def test_run_adds_aligned_levels(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    rng = np.random.default_rng(0)
    volume = rng.random((9, 6, 5)).astype(np.float32)
    before = volume.copy()
    layer = viewer.add_image(volume, name="vol", scale=(2.0, 1.0, 0.5), translate=(10.0, 0.0, -3.0))
    assert widget.layer.value is layer
    widget.threshold.value = 0.8
    widget.per_level.value = True

    widget.run_button.native.click()
    assert not widget.run_button.enabled  # disabled while busy
    assert widget.cancel_button.enabled
    wait_idle(widget)

    assert widget.run_button.enabled and not widget.cancel_button.enabled
    expected = reference_levels(volume, 0.8)
    for k, level in enumerate(expected):
        per_level = viewer.layers[f"vol mipmap level {k}"]
        assert not per_level.visible  # exported, not in the way
        np.testing.assert_array_equal(np.asarray(per_level.data), level)
        # a level-k voxel covers exactly its 2**k block of the input in world coordinates
        np.testing.assert_allclose(per_level.scale, np.array([2.0, 1.0, 0.5]) * 2**k)
        first_block_centre = layer.data_to_world(np.full(3, (2**k - 1) / 2))
        np.testing.assert_allclose(per_level.data_to_world(np.zeros(3)), first_block_centre)
        corner = per_level.data_to_world(np.full(3, -0.5))
        np.testing.assert_allclose(corner, layer.data_to_world(np.full(3, -0.5)))
    # the occupancy layer: level 1 (the finest above the data itself with few cells), on top
    occupancy = viewer.layers["vol occupancy"]
    assert viewer.layers[-1] is occupancy and occupancy.visible
    np.testing.assert_array_equal(occupancy.data, expected[1])
    assert widget.level.value == 1 and widget.level.max == len(expected) - 1
    np.testing.assert_allclose(occupancy.scale, np.array([2.0, 1.0, 0.5]) * 2)
    np.testing.assert_array_equal(volume, before)  # the input layer is untouched
    np.testing.assert_array_equal(layer.data, before)
    assert f"level 1 (5, 3, 3): {expected[1].sum()} of 45 cells occupied" in widget.summary.value
    assert widget.status.value.startswith("Done")

    # stepping through the levels swaps the same layer's data and placement, without a new run
    widget.level.value = 2
    assert not widget.runner.busy
    np.testing.assert_array_equal(occupancy.data, expected[2])
    np.testing.assert_allclose(occupancy.data_to_world(np.full(3, -0.5)), layer.data_to_world(np.full(3, -0.5)))
    np.testing.assert_allclose(occupancy.scale, np.array([2.0, 1.0, 0.5]) * 4)
    assert "level 2 (3, 2, 2)" in widget.summary.value
    assert [lyr.name for lyr in viewer.layers].count("vol occupancy") == 1


def test_layer_choice_follows_the_layer_list(viewer_and_widget):
    viewer, widget = viewer_and_widget
    assert widget.layer.value is None
    labels = viewer.add_labels(np.zeros((4, 4, 4), np.uint8), name="mask")
    viewer.add_points(np.zeros((1, 3)), name="points")  # not offered
    assert [c for c in widget.layer.choices] == [labels]
    image = viewer.add_image(np.zeros((4, 4, 4)), name="img")
    assert set(widget.layer.choices) == {labels, image}
    viewer.layers.remove(labels)
    assert list(widget.layer.choices) == [image]


def test_labels_input(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    labels = np.zeros((5, 5, 5), np.int32)
    labels[4, 4, 4] = 7
    viewer.add_labels(labels, name="mask")
    widget.run_button.native.click()
    wait_idle(widget)
    occupancy = viewer.layers["mask occupancy"]
    assert occupancy.data.shape == (3, 3, 3)  # level 1
    assert occupancy.data[2, 2, 2] == 1 and occupancy.data.sum() == 1
    assert widget.level.max == 3  # (5, 5, 5), (3, 3, 3), (2, 2, 2), (1, 1, 1)


def test_cancel_leaves_no_layer(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    viewer.add_image(np.random.default_rng(1).random((64, 64, 64)), name="vol")
    widget.run_button.native.click()
    widget.cancel_button.native.click()
    wait_idle(widget)
    assert [layer.name for layer in viewer.layers] == ["vol"]
    assert widget.status.value == "Cancelled"
    assert widget.run_button.enabled
    # still usable afterwards
    widget.run_button.native.click()
    wait_idle(widget)
    assert "vol occupancy" in viewer.layers


def test_bad_layer_gives_a_notification_and_stays_usable(viewer_and_widget, wait_idle, monkeypatch):
    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    viewer, widget = viewer_and_widget
    viewer.add_image(np.zeros((8, 8)), name="flat")
    widget.run_button.native.click()
    wait_idle(widget)
    assert shown and "must be 3D" in shown[-1] and "got shape (8, 8)" in shown[-1]
    assert [layer.name for layer in viewer.layers] == ["flat"]

    # an error raised inside the worker thread
    import napari_gridmip.core

    def fail(*args, **kwargs):
        raise MemoryError("out of memory on the device")

    viewer.add_image(np.zeros((2, 3, 4)), name="big")
    widget.layer.value = viewer.layers["big"]
    with monkeypatch.context() as patch:
        patch.setattr(napari_gridmip.core, "max_mipmap", fail)
        widget.run_button.native.click()
        wait_idle(widget)
    assert shown[-1] == "MemoryError: out of memory on the device"
    assert "big occupancy" not in viewer.layers
    assert widget.run_button.enabled

    viewer.add_image(np.ones((2, 3, 4)), name="good")
    widget.layer.value = viewer.layers["good"]
    widget.run_button.native.click()
    wait_idle(widget)
    assert "good occupancy" in viewer.layers


def test_device_is_shown_after_the_first_run(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    assert "after the first run" in widget.device.value  # building the widget starts no JAX backend
    viewer.add_image(np.ones((2, 2, 2)), name="vol")
    widget.run_button.native.click()
    wait_idle(widget)
    assert widget.device.value.startswith("JAX device: cpu")


def test_time_series_uses_the_time_point_shown(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    series = np.zeros((3, 8, 8, 8), np.uint8)
    series[1, 0, 0, 0] = 1
    series[2, 7, 7, 7] = 1
    viewer.add_image(series, name="series", scale=(5.0, 1.0, 1.0, 2.0))
    viewer.dims.set_current_step(0, 2)
    widget.run_button.native.click()
    wait_idle(widget)
    occupancy = viewer.layers["series occupancy"]
    assert occupancy.data.shape == (4, 4, 4) and occupancy.data[3, 3, 3] == 1 and occupancy.data.sum() == 1
    np.testing.assert_allclose(occupancy.scale, [2.0, 2.0, 4.0])


def test_lazy_layer_is_never_loaded_whole(viewer_and_widget, wait_idle):
    import dask.array as da

    viewer, widget = viewer_and_widget
    rng = np.random.default_rng(3)
    volume = rng.random((64, 80, 72)) > 0.999
    lazy = da.from_array(volume, chunks=(32, 40, 36))
    viewer.add_image(lazy, name="lazy", contrast_limits=(0, 1))
    widget.run_button.native.click()
    wait_idle(widget)
    occupancy = viewer.layers["lazy occupancy"]
    expected = reference_levels(volume, 0.0)
    level = widget.level.value
    np.testing.assert_array_equal(np.asarray(occupancy.data), expected[level])
    widget.level.value = 0  # level 0 stays lazy: a NumPy threshold that napari reads slice by slice
    assert type(occupancy.data).__module__.startswith("dask")
    np.testing.assert_array_equal(np.asarray(occupancy.data).astype(bool), expected[0])


def test_all_time_points_make_one_pyramid_each(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    series = np.zeros((3, 8, 8, 8), np.uint8)
    series[0, 0, 0, 0] = series[2, 7, 7, 7] = 1
    layer = viewer.add_image(series, name="series", scale=(5.0, 1.0, 1.0, 2.0), translate=(100.0, 0, 0, 0))
    widget.all_time_points.value = True
    widget.run_button.native.click()
    wait_idle(widget)
    occupancy = viewer.layers["series occupancy"]
    assert occupancy.data.shape == (3, 4, 4, 4)  # level 1 of every time point
    assert occupancy.data[0, 0, 0, 0] == 1 and occupancy.data[2, 3, 3, 3] == 1 and occupancy.data[1].sum() == 0
    np.testing.assert_allclose(occupancy.scale, [5.0, 2.0, 2.0, 4.0])  # time keeps its step
    # a level-1 cell covers its 2x2x2 block at the same time point
    np.testing.assert_allclose(occupancy.data_to_world((2, 0, 0, 0)), layer.data_to_world((2, 0.5, 0.5, 0.5)))
    widget.level.value = 3
    assert occupancy.data.shape == (3, 1, 1, 1)
    np.testing.assert_allclose(occupancy.scale, [5.0, 8.0, 8.0, 16.0])
