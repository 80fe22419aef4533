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
    # empty cells transparent, occupied ones cyan, with no per-process colour lookup to compile (not direct)
    colours = occupancy.colormap.map(np.array([0, 1], dtype=np.uint8))
    np.testing.assert_allclose(colours, [[0, 0, 0, 0], [0, 1, 1, 1]])
    assert type(occupancy.colormap).__name__ == "CyclicLabelColormap"
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
    assert "after the first run" in widget.device.value  # the device is named once a run has used it
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


# -- the threshold slider, Crop to occupied, Render full-resolution view ------------------------------------------


def copy_as_python(widget):
    """Click "Copy as Python" and run the script beside the viewer: its ``results``."""
    from qtpy.QtWidgets import QApplication

    widget.copy_button.native.click()
    text = QApplication.clipboard().text()
    namespace = {}
    exec(compile(text, "<copied>", "exec"), namespace)  # the script finds the viewer as napari's current one
    return namespace["results"], text


def no_worker(widget, monkeypatch):
    """From now on starting a worker fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(widget.runner, "start", refuse)


def blobs(shape=(20, 22, 18), seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    volume = np.zeros(shape, dtype)
    volume[3:8, 4:9, 5:9] = rng.random((5, 5, 4)) + 0.5
    volume[12:15, 15:20, 2:6] = rng.random((3, 5, 4)) * 2
    volume[17, 1, 16] = 3.0
    return volume


def test_slider_rethresholds_the_level_shown_without_a_run(viewer_and_widget, wait_idle, monkeypatch):
    from napari_gridmip import occupancy_mipmap

    viewer, widget = viewer_and_widget
    volume = blobs()
    volume[0, 0, 0] = np.nan  # NaN is empty at every threshold
    viewer.add_image(volume, name="vol")
    widget.per_level.value = True
    widget.run_button.native.click()
    wait_idle(widget)
    slider = widget.threshold_slider
    assert (slider.min, slider.max) == (0.0, 3.0)  # the data's range, NaN left out
    occupancy = viewer.layers["vol occupancy"]
    no_worker(widget, monkeypatch)
    for level, value in ((1, 0.9), (0, 1.7), (2, 0.25)):
        widget.level.value = level
        slider.value = value  # as a drag sets it
        t = widget.threshold.value
        assert t == pytest.approx(value, abs=1e-3) and slider.value == t  # one value
        expected = [np.asarray(lv) for lv in occupancy_mipmap(volume, threshold=t)]
        np.testing.assert_array_equal(occupancy.data, expected[level])
        for k, lv in enumerate(expected):
            np.testing.assert_array_equal(viewer.layers[f"vol mipmap level {k}"].data, lv)
        assert f"{int(expected[level].sum())} of {expected[level].size} cells occupied" in widget.summary.value
        assert occupancy.metadata["napari_gridmip"]["calls"][0]["kwargs"] == {"threshold": t}
        assert not widget.runner.busy
    # typing into the spin box moves the slider, and what is shown
    widget.threshold.value = 2.5
    assert slider.value == 2.5
    np.testing.assert_array_equal(occupancy.data, np.asarray(occupancy_mipmap(volume, threshold=2.5)[2]))
    results, text = copy_as_python(widget)
    assert "threshold=2.5" in text
    for name, array in results.items():
        np.testing.assert_array_equal(np.asarray(array), np.asarray(viewer.layers[name].data), err_msg=name)


def test_crop_to_occupied_overlays_the_input(viewer_and_widget, wait_idle, monkeypatch):
    from napari_gridmip import occupancy_mipmap, occupied_bbox

    viewer, widget = viewer_and_widget
    volume = blobs()
    layer = viewer.add_image(volume, name="vol", scale=(2.0, 1.0, 0.5), translate=(10.0, -4.0, 3.0), colormap="magma")
    assert not widget.crop_button.enabled  # nothing to crop before a run
    widget.threshold.value = 0.4
    widget.run_button.native.click()
    wait_idle(widget)
    assert widget.view_info.native.isHidden()  # no empty "Made" line before anything was made
    widget.threshold.value = 1.2  # the crop follows the current threshold
    widget.crop_button.native.click()
    assert not (widget.crop_button.enabled or widget.render_button.enabled or widget.run_button.enabled)
    wait_idle(widget)
    assert widget.crop_button.enabled and widget.render_button.enabled
    assert not widget.view_info.native.isHidden() and "crop" in widget.view_info.value.lower()
    crop = viewer.layers["vol crop"]
    box = occupied_bbox(occupancy_mipmap(volume, threshold=1.2))
    np.testing.assert_array_equal(crop.data, volume[box.slices])
    assert crop.colormap.name == "magma" and crop.contrast_limits == layer.contrast_limits
    for corner in ((0, 0, 0), np.array(box.shape) - 1):
        np.testing.assert_allclose(crop.data_to_world(corner), layer.data_to_world(np.array(box.lo) + corner))
    crop.data[...] = 0  # a copy: the input is never edited through it
    assert volume.max() == 3.0
    results, text = copy_as_python(widget)  # the occupancy at 1.2 ... and the crop's own pyramid
    assert sorted(results) == ["vol crop", "vol occupancy"]
    np.testing.assert_array_equal(results["vol crop"], volume[box.slices])
    np.testing.assert_array_equal(np.asarray(results["vol occupancy"]), viewer.layers["vol occupancy"].data)

    widget.threshold.value = 0.4  # another crop replaces the first; the script names the two pyramids apart
    widget.crop_button.native.click()
    wait_idle(widget)
    assert [lyr.name for lyr in viewer.layers].count("vol crop") == 1
    widget.threshold.value = 1.2
    results, text = copy_as_python(widget)
    assert "levels_2" in text
    np.testing.assert_array_equal(results["vol crop"], viewer.layers["vol crop"].data)

    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    widget.threshold.value = 3.0  # nothing above it
    widget.crop_button.native.click()
    assert not widget.runner.busy and shown and "nothing in 'vol' is above the threshold 3" in shown[-1]


def test_crop_of_labels_is_labels(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    labels = np.zeros((9, 9, 9), np.uint16)
    labels[2:4, 5, 1:7] = 3
    viewer.add_labels(labels, name="mask")
    widget.run_button.native.click()
    wait_idle(widget)
    widget.crop_button.native.click()
    wait_idle(widget)
    crop = viewer.layers["mask crop"]
    assert type(crop).__name__ == "Labels" and crop.data.dtype == np.uint16
    np.testing.assert_array_equal(crop.data, labels[2:4, 5:6, 1:7])


def test_lazy_summary_counts_chunks_holding_data(viewer_and_widget, wait_idle):
    import dask.array as da

    from napari_gridmip import occupancy_mipmap, occupied_chunks

    viewer, widget = viewer_and_widget
    volume = blobs(shape=(24, 24, 24))
    viewer.add_image(da.from_array(volume, chunks=8), name="lazy")
    widget.run_button.native.click()
    wait_idle(widget)
    for t in (0.0, 1.5, 3.0):
        widget.threshold.value = t
        held = occupied_chunks(occupancy_mipmap(volume, threshold=t), (8, 8, 8)).sum()
        assert f"{held} of 27 chunks hold data" in widget.summary.value


def set_camera_along_z(viewer, centre):
    viewer.dims.ndisplay = 3
    viewer.camera.angles = (0.0, 0.0, 0.0)  # napari's default 3D view: along z (towards you), y down, x right
    assert np.allclose(viewer.camera.view_direction, (-1, 0, 0)) and np.allclose(viewer.camera.up_direction, (0, -1, 0))
    viewer.camera.zoom = 1.0  # one canvas pixel per world unit
    viewer.camera.center = centre


def wait_render(widget, wait_idle, qtbot, viewer):
    """Wait for the render, and for the camera to be put back where the render started."""
    zoom, center = viewer.camera.zoom, viewer.camera.center
    wait_idle(widget)
    qtbot.waitUntil(lambda: viewer.camera.zoom == zoom and viewer.camera.center == center, timeout=5000)


def expected_along_z(volume, layer, render):
    """The dense NumPy answer at every pixel of ``render``: the voxel column under the pixel's centre."""
    rows, columns = render.data.shape
    pixels = np.stack(np.mgrid[:rows, :columns], -1).reshape(-1, 2)
    np.testing.assert_allclose(render.data_to_world((rows - 1, 2)), render.translate + render.scale * (rows - 1, 2))
    world = render.translate + render.scale * pixels
    data = (world - np.asarray(layer.translate[1:])) / np.asarray(layer.scale[1:])
    index = np.floor(data + 0.5).astype(int)
    inside = np.all((index >= 0) & (index < volume.shape[1:]), axis=1)
    return index, inside


def test_render_matches_a_dense_mip_along_z(viewer_and_widget, wait_idle, qtbot):
    viewer, widget = viewer_and_widget
    volume = blobs(shape=(20, 30, 26))
    layer = viewer.add_image(volume, name="vol", scale=(2.0, 1.0, 1.0), translate=(5.0, -3.0, 2.0))
    widget.threshold.value = 0.6
    widget.run_button.native.click()
    wait_idle(widget)
    widget.render_button.native.click()  # in 2D: a notification, nothing rendered
    assert not widget.runner.busy and "vol render (MIP)" not in viewer.layers
    set_camera_along_z(viewer, (30.0, 11.3, 14.8))
    widget.render_button.native.click()
    assert not (widget.render_button.enabled or widget.crop_button.enabled)
    wait_render(widget, wait_idle, qtbot, viewer)
    render = viewer.layers["vol render (MIP)"]
    assert render.ndim == 2 and render.colormap.name == layer.colormap.name
    index, inside = expected_along_z(volume, layer, render)
    dense = volume.max(axis=0)
    expected = np.full(len(index), np.nan, np.float32)
    column = dense[index[inside, 0], index[inside, 1]]
    expected[inside] = np.where(column > 0.6, column, np.nan)  # a ray meeting nothing above the threshold: NaN
    assert inside.sum() > 500 and np.isfinite(expected).sum() > 30
    np.testing.assert_array_equal(render.data.reshape(-1), expected)

    widget.render_mode.value = "depth (first hit)"
    widget.render_button.native.click()
    wait_render(widget, wait_idle, qtbot, viewer)
    depth = viewer.layers["vol render (depth)"]
    occupied = volume > 0.6  # napari looks from +z (towards): the first hit is the highest occupied z
    top = np.where(occupied.any(axis=0), volume.shape[0] - 1 - np.argmax(occupied[::-1], axis=0), -1)
    z = top[index[inside, 0], index[inside, 1]]
    expected = np.full(len(index), np.nan)
    face = 5.0 + 2.0 * (z + 0.5)  # the world z of the voxel's near face
    expected[inside] = np.where(z >= 0, 30.0 - face, np.nan)
    np.testing.assert_allclose(depth.data.reshape(-1), expected, atol=1e-4)
    results, _ = copy_as_python(widget)
    for name in ("vol render (MIP)", "vol render (depth)"):
        np.testing.assert_array_equal(results[name], viewer.layers[name].data, err_msg=name)


def test_render_of_a_lazy_volume_reads_only_chunks_with_data(viewer_and_widget, wait_idle, qtbot):
    import dask.array as da

    class Counting:
        def __init__(self, array):
            self.array, self.shape, self.dtype, self.ndim = array, array.shape, array.dtype, array.ndim
            self.reads = set()

        def __getitem__(self, key):
            self.reads.add(tuple(s.start // 8 for s in key))
            return self.array[key]

    viewer, widget = viewer_and_widget
    volume = blobs(shape=(24, 32, 32))
    counting = Counting(volume)
    layer = viewer.add_image(da.from_array(counting, chunks=8), name="lazy", contrast_limits=(0, 3))
    widget.threshold.value = 0.6
    widget.run_button.native.click()
    wait_idle(widget)
    set_camera_along_z(viewer, (12.0, 15.3, 15.8))
    counting.reads.clear()
    widget.render_button.native.click()
    wait_render(widget, wait_idle, qtbot, viewer)
    render = viewer.layers["lazy render (MIP)"]
    holding = {tuple(c) for c in np.argwhere(da.from_array(volume, chunks=8).map_blocks(
        lambda b: np.full((1, 1, 1), (b > 0.6).any()), chunks=(1, 1, 1)).compute())}  # fmt: skip
    assert counting.reads and counting.reads <= holding
    index, inside = expected_along_z(volume, layer, render)
    column = volume.max(axis=0)[index[inside, 0], index[inside, 1]]
    expected = np.full(len(index), np.nan, np.float32)
    expected[inside] = np.where(column > 0.6, column, np.nan)
    np.testing.assert_array_equal(render.data.reshape(-1), expected)


def test_render_cancel_leaves_no_layer(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    viewer.add_image(blobs(), name="vol")
    widget.run_button.native.click()
    wait_idle(widget)
    viewer.dims.ndisplay = 3
    widget.render_button.native.click()
    widget.cancel_button.native.click()
    wait_idle(widget)
    assert "vol render (MIP)" not in viewer.layers and widget.status.value == "Cancelled"
    assert widget.render_button.enabled and widget.crop_button.enabled


def test_a_range_the_slider_rounds_is_accepted(viewer_and_widget):
    """The slider keeps its limits to a few decimals; a threshold at the data's unrounded maximum is clamped
    to them (the soak found a layer whose maximum, 0.8097108, refused the new widget: ValueError)."""
    viewer, widget = viewer_and_widget
    widget.threshold.value = 5.0
    volume = np.zeros((8, 8, 8), np.float32)
    volume[2, 3, 4] = 0.8097108006477356
    viewer.add_image(volume, name="odd max")
    second = MipmapWidget(viewer)  # made while the layer is there: its slider takes the layer's range
    assert second.threshold_slider.min <= second.threshold_slider.value <= second.threshold_slider.max
    second.close()


def test_a_threshold_at_the_unrounded_maximum_moves_the_slider_to_its_end(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    volume = np.zeros((8, 8, 8), np.float32)
    volume[2, 3, 4] = 0.8097108006477356
    viewer.add_image(volume, name="odd max")
    widget.run_button.native.click()
    wait_idle(widget)
    widget.threshold.value = float(volume.max())  # above the slider's rounded maximum: no ValueError
    assert widget.threshold_slider.value == widget.threshold_slider.max


def test_only_a_one_colour_direct_colormap_is_shown_as_cyclic():
    from napari_gridmip._widgets.runner import _shown_colormap

    one = {None: "transparent", 0: "transparent", 1: "cyan"}
    shown = _shown_colormap({"colormap": one, "name": "x"}, "labels")
    assert type(shown["colormap"]).__name__ == "CyclicLabelColormap" and shown["name"] == "x"
    np.testing.assert_allclose(shown["colormap"].map(np.array([0, 1, 1])), [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 1, 1]])
    for meta, kind in (
        ({"colormap": {0: "transparent", 1: "cyan", 2: "red"}}, "labels"),  # a second colour: stays direct
        ({"colormap": {0: "black", 1: "cyan"}}, "labels"),  # a visible background: stays direct
        ({"colormap": {0: np.array([0.0, 0.0, 0.0, 1.0]), 1: "cyan"}}, "labels"),  # an RGBA one too
        ({"colormap": "gray"}, "image"),
        ({"colormap": one}, "image"),
    ):
        assert _shown_colormap(meta, kind) is meta
