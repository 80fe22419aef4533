"""The Process in tiles widget in a real viewer, driven through its buttons."""

import dask.array as da
import numpy as np
import pytest
from qtpy.QtWidgets import QApplication
from scipy import ndimage

from napari_gridmip._jobs.tiled import CUSTOM
from napari_gridmip._widgets.tiled_widget import TiledWidget


@pytest.fixture
def viewer_and_widget(docked):
    return docked(TiledWidget)


def shown(field):
    return not field.native.isHidden()  # (visible also needs the dock on screen)


def run(widget, wait_idle):
    widget.run_button.native.click()
    assert not widget.run_button.enabled
    wait_idle(widget)


def test_named_filter_equals_the_untiled_filter(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    image = np.random.default_rng(0).random((3, 150, 130)).astype(np.float32)
    viewer.add_image(image, name="cells", scale=(1, 0.5, 0.5), translate=(0, 10, 20))
    widget.filter.value = "median"
    assert [field.name for field in widget.parameters] == ["size", "mode"]  # the filter's own controls
    assert not shown(widget.import_path) and not shown(widget.halo)  # the named filter sets its halo
    widget.parameters["size"].value = 5
    widget.tile.value = 64
    run(widget, wait_idle)
    result = viewer.layers["cells median"]
    np.testing.assert_array_equal(result.data, ndimage.median_filter(image, size=(1, 5, 5)))
    np.testing.assert_allclose(result.scale, (1, 0.5, 0.5))
    np.testing.assert_allclose(result.translate, (0, 10, 20))
    assert "overlap" in widget.overlap.tooltip.lower() and "halo" in widget.halo.tooltip.lower()

    # Copy as Python remakes it with the public API
    widget.copy_button.native.click()
    namespace = {}
    exec(QApplication.clipboard().text(), namespace)
    np.testing.assert_array_equal(namespace["results"]["cells median"], result.data)


def test_own_function_by_import_path_and_labels(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    rng = np.random.default_rng(1)
    image = ndimage.gaussian_filter(rng.random((120, 140)), 3).astype(np.float32)  # float64 running sums: ulps
    viewer.add_image(image, name="img")
    widget.filter.value = CUSTOM
    assert shown(widget.import_path) and not shown(widget.parameters)
    widget.import_path.value = "scipy.ndimage:uniform_filter"
    widget.arguments.value = "size=7, mode='nearest'"
    widget.halo.value = 3
    widget.tile.value = 48
    run(widget, wait_idle)
    np.testing.assert_array_equal(
        viewer.layers["img uniform_filter"].data, ndimage.uniform_filter(image, size=7, mode="nearest")
    )

    widget.filter.value = "connected_components"
    widget.parameters["threshold"].value = float(np.quantile(image, 0.7))
    run(widget, wait_idle)
    labels = viewer.layers["img connected_components"]
    assert type(labels).__name__ == "Labels"
    expected, count = ndimage.label(image > widget.parameters["threshold"].value)
    assert labels.data.max() == count


def test_dask_layer_gives_a_lazy_result(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    image = np.random.default_rng(2).random((200, 180)).astype(np.float32)
    viewer.add_image(da.from_array(image, chunks=(64, 90)), name="big")
    widget.filter.value = "gaussian"
    widget.parameters["sigma"].value = 2.0
    run(widget, wait_idle)
    result = viewer.layers["big gaussian"].data
    assert type(result).__module__.startswith("dask")
    np.testing.assert_array_equal(np.asarray(result), ndimage.gaussian_filter(image, 2.0))


def test_bad_input_is_a_notification(viewer_and_widget, wait_idle, monkeypatch):
    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    viewer, widget = viewer_and_widget
    viewer.add_image(np.zeros((40, 40)), name="flat")
    widget.filter.value = CUSTOM
    widget.import_path.value = "no_such_module:thing"
    widget.run_button.native.click()
    assert "cannot import" in shown[-1] and len(viewer.layers) == 1
    widget.import_path.value = "scipy.ndimage:uniform_filter"
    widget.arguments.value = "size=="
    widget.run_button.native.click()
    assert "keywords with literal values" in shown[-1]
    widget.tiled_axes.value = 3
    widget.run_button.native.click()
    assert "cannot be tiled along 3" in shown[-1] and len(viewer.layers) == 1


def test_a_filter_parameter_or_an_advanced_option_is_part_of_the_run_key(viewer_and_widget):
    """A run started early stands for Run only with the same options: those nested in the filter's parameters
    and in the (closed) Advanced section count too, and the blend shows only where tiles overlap."""
    viewer, widget = viewer_and_widget
    viewer.add_image(np.zeros((40, 40), np.float32), name="img")
    widget.filter.value = "median"
    key = widget.run_key()
    widget.parameters["size"].value += 2
    assert widget.run_key() != key
    key = widget.run_key()
    widget.tile.value = 64  # an Advanced option, its section closed
    assert widget.run_key() != key and not shown(widget.tile)
    widget.advanced.native.click()
    assert shown(widget.tile) and shown(widget.overlap) and not shown(widget.blend)
    widget.overlap.value = 8
    assert shown(widget.blend)
