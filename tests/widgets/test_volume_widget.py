"""The Digital volume correlation widget in a real viewer, on its sample at test size, driven through its buttons."""

import types

import numpy as np
import pytest
from napari.layers import Image, Labels, Vectors
from qtpy.QtWidgets import QApplication

from napari_gridmip._jobs.plan import KEY
from napari_gridmip._sample_data import dvc
from napari_gridmip._widgets.volume_widget import VolumeWidget

SUBSET, STEP = 13, 8


@pytest.fixture
def viewer_and_widget(docked, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")  # Run computes, so that Cancel has a run to stop
    monkeypatch.setattr(dvc, "SAMPLE_SHAPE", (48, 48, 48))
    viewer, widget = docked(VolumeWidget)
    widget.subset.value, widget.step.value = SUBSET, STEP
    return viewer, widget


def results(viewer):
    return [layer for layer in viewer.layers if KEY in layer.metadata]


def click(layer, position, view_direction=None, dims_displayed=(1, 2)):
    """Press and release on ``layer`` without a drag, through its mouse callbacks (as napari calls them)."""
    event = types.SimpleNamespace(type="mouse_press", button=1, position=position, view_direction=view_direction,
                                  dims_displayed=list(dims_displayed))  # fmt: skip
    for callback in list(layer.mouse_drag_callbacks):
        steps = callback(layer, event)
        if isinstance(steps, types.GeneratorType):
            next(steps)
            event.type = "mouse_release"
            next(steps, None)
            event.type = "mouse_press"


def test_the_sample_end_to_end(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "dvc")
    reference, deformed = viewer.layers["DVC reference"], viewer.layers["DVC deformed"]
    assert widget.volumes.value is reference and widget.deformed.value is deformed  # the sample's roles
    reference.scale = (2.0, 1.0, 0.5)  # a placed volume: the results follow it
    deformed.scale = (2.0, 1.0, 0.5)
    reference.translate = deformed.translate = (5.0, 0.0, -3.0)
    viewer.dims.set_point(0, reference.data_to_world((20, 0, 0))[0])  # between two planes of grid points
    widget.run_button.native.click()
    assert not widget.run_button.enabled
    wait_idle(widget, timeout=240_000)
    assert widget.status.value.startswith("Done"), widget.status.value
    assert "100% found" in widget.summary.value

    half = SUBSET // 2
    made = {layer.metadata[KEY]["role"]: layer for layer in results(viewer)}
    assert {"dz", "dy", "dx", "zncc", "status", "volumetric", "deviatoric", "e_zz", "e_yx", "vectors"} <= set(made)
    vectors = made["vectors"]
    assert isinstance(vectors, Vectors) and vectors.data.shape[1:] == (2, 3)
    assert viewer.layers[-1] is vectors and vectors.visible
    # napari draws a 3D arrow only on its point's plane: the slider moved to the nearest plane of grid points
    assert viewer.dims.point[0] == pytest.approx(reference.data_to_world((22, 0, 0))[0])
    dz = made["dz"]
    assert isinstance(dz, Image) and isinstance(made["status"], Labels) and not dz.visible
    # every grid layer lines up with the volume: element (0, 0, 0) on voxel (h, h, h), one step per element
    for role, layer in made.items():
        if role == "vectors":
            continue
        np.testing.assert_allclose(layer.scale, STEP * reference.scale, err_msg=role)
        np.testing.assert_allclose(layer.data_to_world((0, 0, 0)), reference.data_to_world((half,) * 3), err_msg=role)
        np.testing.assert_allclose(layer.data_to_world((1, 2, 3)), reference.data_to_world(
            (half + STEP, half + 2 * STEP, half + 3 * STEP)), err_msg=role)  # fmt: skip
    # the arrows sit on the grid's voxels, in the volume's world
    np.testing.assert_allclose(vectors.data_to_world(vectors.data[0, 0]), reference.data_to_world((half,) * 3))
    # the known field, from the sample's metadata
    truth = {key: reference.metadata[f"true_{key}"] for key in ("matrix", "translation", "centre")}
    axes = [np.arange(half, n - half, STEP, dtype=float) for n in reference.data.shape]
    expected = dvc.true_displacement(truth, *axes)
    assert np.nanmax(np.abs(dz.data - expected[0])) < 0.05

    # a click on a grid point (2D view: the displayed slice) shows its values
    viewer.dims.ndisplay = 2
    point = reference.data_to_world((half + STEP, half + 2 * STEP, half + 3 * STEP))
    click(vectors, point)
    text = widget.point_info.value
    assert "voxel (z, y, x) = (14, 22, 30)" in text and "status ok" in text and "ZNCC 0.9" in text, text
    assert f"{dz.data[1, 2, 3]:.3f}" in text and "sigma" in text
    # a line each (the widget is narrow), one line in the status bar
    assert [line.split(" ")[0] for line in text.splitlines()] == ["voxel", "d", "sigma", "ZNCC"]
    assert viewer.status == text.replace("\n", "; ")
    # in 3D: the front point on the clicked ray, looking down z
    widget.point_info.value = ""
    click(vectors, reference.data_to_world((-20.0, half + STEP, half + 2 * STEP)), (1.0, 0.0, 0.0), (0, 1, 2))
    assert "voxel (z, y, x) = (6, 14, 22)" in widget.point_info.value, widget.point_info.value

    # Copy as Python remakes every layer
    widget.copy_button.native.click()
    namespace = {}
    exec(QApplication.clipboard().text(), namespace)  # noqa: S102 - the widget's own script
    for layer in results(viewer):
        expected_data = np.asarray(namespace["results"][layer.name]).astype(layer.data.dtype)
        np.testing.assert_array_equal(expected_data, layer.data, err_msg=layer.name)

    # closing the dock takes the widget's click callback off the result layers
    callback = widget._on_click
    assert all(callback in layer.mouse_drag_callbacks for layer in results(viewer))
    viewer.window.remove_dock_widget(widget.native)  # what the dock's close button does
    assert widget.released
    assert not any(callback in layer.mouse_drag_callbacks for layer in results(viewer))
    before = widget.point_info.value
    click(vectors, point)  # napari's own callbacks only: nothing reaches the closed widget
    assert widget.point_info.value == before and "(6, 14, 22)" in before


def test_cancel_adds_nothing_and_bad_input_is_a_notification(viewer_and_widget, wait_idle, monkeypatch):
    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "dvc")
    names = [layer.name for layer in viewer.layers]
    widget.run_button.native.click()
    widget.cancel_button.native.click()
    wait_idle(widget, timeout=240_000)
    assert widget.status.value == "Cancelled" and widget.run_button.enabled
    assert [layer.name for layer in viewer.layers] == names

    widget.deformed.value = widget.volumes.value
    widget.run_button.native.click()
    assert "same layer" in shown[-1]
    widget.deformed.value = viewer.layers["DVC deformed"]
    widget.subset.value = 49  # larger than the volume
    widget.run_button.native.click()
    assert "larger than" in shown[-1]
    widget.subset.value = SUBSET
    widget.subset_shape.value = "translation"  # the subsets' strain needs their gradients
    widget.run_button.native.click()
    assert "affine" in shown[-1]
    viewer.add_labels(np.zeros((48, 48, 40), np.uint8), name="wrong roi")
    widget.subset_shape.value = "affine"
    widget.roi.value = viewer.layers["wrong roi"]
    widget.run_button.native.click()
    assert "reference's shape" in shown[-1]
    wait_idle(widget)
    assert [layer.name for layer in viewer.layers] == [*names, "wrong roi"]


def test_a_series_and_the_inputs_the_widget_follows(viewer_and_widget, wait_idle):
    """A 4D layer is a time lapse (the deformed field hidden, the reference policy shown), its fields with a time
    axis; a sample opened later takes the inputs, and an Image layer of the volume's shape added after it (an ROI)
    does not displace them."""
    viewer, widget = viewer_and_widget
    reference, deformed, _ = dvc.make_dvc_pair((48, 48, 48))
    series = viewer.add_image(np.stack([reference, deformed, deformed]), name="series")
    assert widget.volumes.value is series
    assert widget._relevant[widget.reference_policy] and not widget._relevant[widget.deformed]
    assert widget.reference_policy.choices == ("accumulated", "incremental", "auto")  # correlate_volume_series'
    widget.reference_policy.value = "incremental"
    widget.run_button.native.click()
    wait_idle(widget, timeout=240_000)
    assert widget.status.value.startswith("Done"), widget.status.value
    assert widget.summary.value.startswith("3 time points; the last: 125 points, 100% found")
    dz, vectors = widget._layer("dz"), widget._layer("vectors")
    assert dz.data.shape == (3, 5, 5, 5) and vectors.data.shape[1:] == (2, 4)
    np.testing.assert_allclose(dz.data_to_world((0, 0, 0, 0)), [0, 6, 6, 6])  # time point t on element t
    assert np.all(dz.data[0] == 0) and np.nanmax(np.abs(dz.data[2] - dz.data[1])) < 0.02  # 2 is 1 again
    assert viewer.dims.nsteps[0] == 3  # one time slider for the series and its fields
    record = dz.metadata[KEY]
    assert [call["function"] for call in record["calls"]] == [
        "napari_gridmip.correlate_volume_series", "napari_gridmip.volume_strain"
    ]  # fmt: skip
    click(vectors, (2.0, 14.0, 22.0, 30.0), dims_displayed=(2, 3))
    text = widget.point_info.value
    assert text.startswith("time point 2, voxel (z, y, x) = (14, 22, 30): status ok") and "sigma" not in text

    viewer.open_sample("napari-gridmip", "dvc")
    assert (widget.volumes.value.name, widget.deformed.value.name) == ("DVC reference", "DVC deformed")
    assert widget._relevant[widget.deformed] and not widget._relevant[widget.reference_policy]
    viewer.add_image(np.ones((48, 48, 48), np.uint8), name="mask image")
    assert (widget.volumes.value.name, widget.deformed.value.name) == ("DVC reference", "DVC deformed")
