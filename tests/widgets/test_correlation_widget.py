"""The Correlation map widget in a real viewer, driven through its buttons."""

import numpy as np
import pytest

from napari_gridmip._widgets import correlation_widget as module
from napari_gridmip._widgets.correlation_widget import CorrelationWidget
from napari_gridmip.core import find_displacement, windowed_pearson


@pytest.fixture
def viewer_and_widget(docked):
    return docked(CorrelationWidget)


def test_speckle_sample_end_to_end(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "speckle")
    img1, img2 = viewer.layers["speckle sample (img1)"], viewer.layers["speckle reference (img2)"]
    assert widget.img1.value is img1 and widget.img2.value is img2  # picked up as they are
    before = np.array(img1.data)
    widget.run_button.native.click()
    assert not widget.run_button.enabled
    wait_idle(widget, timeout=120_000)

    m = 4  # the default 9x9 window
    dy = viewer.layers["speckle reference (img2) dy"]
    dx = viewer.layers["speckle reference (img2) dx"]
    peak = viewer.layers["speckle reference (img2) peak"]
    true_dy, true_dx = img1.metadata["true_dy"][m:-m, m:-m], img1.metadata["true_dx"][m:-m, m:-m]
    error = np.hypot(dy.data - true_dy, dx.data - true_dx)[8:-8, 8:-8]
    assert np.nanmedian(error) < 0.25
    assert np.nanmedian(peak.data) > 0.8
    # output pixel (i, j) sits on img2's pixel (i + m, j + n)
    np.testing.assert_allclose(dy.data_to_world((0, 0)), img2.data_to_world((0, m, m))[1:])
    vectors = viewer.layers["speckle reference (img2) displacement"]
    assert vectors.data.shape[1:] == (2, 2) and len(vectors.data) > 900
    first = vectors.data[0]
    np.testing.assert_allclose(first[0], [m, m])
    np.testing.assert_allclose(first[1], [dy.data[0, 0], dx.data[0, 0]], rtol=1e-6)
    np.testing.assert_array_equal(img1.data, before)


def test_full_map_eager_and_lazy(viewer_and_widget, wait_idle, monkeypatch):
    viewer, widget = viewer_and_widget
    rng = np.random.default_rng(0)
    a, b = rng.random((2, 5, 30, 26), dtype=np.float32)
    viewer.add_image(a, name="a")
    viewer.add_image(b, name="b")
    assert widget.img1.value.name == "a" and widget.img2.value.name == "b"
    widget.window_rows.value, widget.window_cols.value = 5, 3
    widget.full_map.value = True
    widget.run_button.native.click()
    wait_idle(widget)
    expected = np.moveaxis(np.asarray(windowed_pearson(a, b, (5, 3))), (-2, -1), (0, 1))
    eager = viewer.layers["b correlation map"]
    np.testing.assert_allclose(np.asarray(eager.data), expected, atol=1e-6)
    np.testing.assert_allclose(eager.translate[:2], [-2, -1])  # slider value = row offset - m

    viewer.layers.remove(eager)
    monkeypatch.setattr(module, "EAGER_MAP_BYTES", 1000)
    widget.run_button.native.click()
    wait_idle(widget)
    lazy = viewer.layers["b correlation map"].data
    assert type(lazy).__module__.startswith("dask")
    np.testing.assert_allclose(np.asarray(lazy), expected, atol=1e-6)


def test_cancel_and_bad_input(viewer_and_widget, wait_idle, monkeypatch):
    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    viewer, widget = viewer_and_widget
    rng = np.random.default_rng(1)
    viewer.add_image(rng.random((4, 40, 40)), name="a")
    viewer.add_image(rng.random((4, 40, 41)), name="b")
    widget.run_button.native.click()
    wait_idle(widget)
    assert "same shape" in shown[-1] and "(4, 40, 41)" in shown[-1]
    viewer.layers["b"].data = rng.random((4, 40, 40))
    widget.window_rows.value = 4
    widget.run_button.native.click()
    wait_idle(widget)
    assert "odd" in shown[-1]
    assert [layer.name for layer in viewer.layers] == ["a", "b"]

    widget.window_rows.value = 5
    widget.run_button.native.click()
    widget.cancel_button.native.click()
    wait_idle(widget)
    assert [layer.name for layer in viewer.layers] == ["a", "b"]
    assert widget.status.value == "Cancelled" and widget.run_button.enabled
    widget.run_button.native.click()
    wait_idle(widget)
    dy, _, _ = find_displacement(viewer.layers["a"].data, viewer.layers["b"].data, (5, 9))
    np.testing.assert_array_equal(viewer.layers["b dy"].data, np.asarray(dy))
