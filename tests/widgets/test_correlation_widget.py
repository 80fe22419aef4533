"""The Correlation map widget in a real viewer, driven through its buttons."""

import numpy as np
import pytest

from napari_gridmip._jobs import correlation as correlation_jobs
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

    # what the user sees: vectors on top, dy below them in a diverging map symmetric about 0, peak hidden
    names = [layer.name for layer in viewer.layers]
    assert names[-1] == vectors.name
    assert names.index(peak.name) < names.index(dx.name) < names.index(dy.name) < names.index(vectors.name)
    assert not peak.visible and dy.visible
    low, high = dy.contrast_limits
    assert low == -high and high > 0 and dy.colormap.name == "coolwarm"
    # the median displacement is drawn at 80% of the vector spacing
    magnitude = np.hypot(dy.data, dx.data)
    np.testing.assert_allclose(vectors.length * np.nanmedian(magnitude), 0.8 * widget.spacing.value, rtol=1e-5)
    assert "median |d|" in widget.summary.value and "% NaN" in widget.summary.value
    widget.vector_scale.value = 3.0  # the user's own length, applied to the same layer
    assert vectors.length == 3.0
    assert widget.device.value.startswith("JAX device")


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
    expected = np.moveaxis(np.asarray(windowed_pearson(a, b, (5, 3))), (-2, -1), (0, 1))[:, :, None]
    eager = viewer.layers["b correlation map"]
    np.testing.assert_allclose(np.asarray(eager.data), expected, atol=1e-6)
    np.testing.assert_allclose(eager.translate[:2], [-2, -1])  # slider value = row offset - m
    # the offsets have sliders of their own; the map's length-1 K axis spans the stacks' K range, so the
    # frame slider never moves the map
    assert eager.axis_labels[:2] == ("row offset", "column offset")
    assert eager.data.shape[2] == 1
    for frame in range(a.shape[0]):  # every position of the frame slider shows the map's one plane
        assert round(float(eager.world_to_data([0, 0, frame, 0, 0])[2])) == 0

    viewer.layers.remove(eager)
    monkeypatch.setattr(correlation_jobs, "EAGER_MAP_BYTES", 1000)
    widget.run_button.native.click()
    wait_idle(widget)
    lazy_layer = viewer.layers["b correlation map"]
    lazy = lazy_layer.data
    assert type(lazy).__module__.startswith("dask")
    names = [layer.name for layer in viewer.layers]
    assert names.index("b correlation map") == len(names) - 2  # below the vectors only
    np.testing.assert_allclose(np.asarray(lazy), expected, atol=1e-6)


def test_cancel_and_bad_input(viewer_and_widget, wait_idle, monkeypatch):
    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    viewer, widget = viewer_and_widget
    rng = np.random.default_rng(1)
    viewer.add_image(rng.random((4, 40, 40)), name="a")
    viewer.add_image(rng.random((4, 40, 41)), name="b")
    assert widget.img1.value is widget.img2.value  # no pair of one shape to pick: the user must choose
    widget.run_button.native.click()
    assert "the same layer" in shown[-1]
    widget.img1.value, widget.img2.value = viewer.layers["a"], viewer.layers["b"]
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


def test_user_choices_are_never_overridden(viewer_and_widget):
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "speckle")
    img1, img2 = viewer.layers["speckle sample (img1)"], viewer.layers["speckle reference (img2)"]
    assert widget.img1.value is img1 and widget.img2.value is img2
    other = viewer.add_image(np.zeros((3, 20, 20)), name="other")
    widget.img1.value = other  # the user's choice
    viewer.add_image(np.zeros((3, 20, 20)), name="newer")  # any later layer leaves it alone
    viewer.add_image(np.zeros((20, 20)), name="flat")
    assert widget.img1.value is other and widget.img2.value is img2


def test_refine_is_cancelled_between_bands(viewer_and_widget, wait_idle, qtbot):
    """A long refinement stops within a second or two of Cancel, and adds nothing."""
    import time

    viewer, widget = viewer_and_widget
    rng = np.random.default_rng(2)
    a, b = rng.random((2, 6, 2000, 128), dtype=np.float32)
    viewer.add_image(a, name="a")
    viewer.add_image(b, name="b")
    widget.subpixel.value = "refine"
    widget.window_rows.value = widget.window_cols.value = 5
    steps = []
    widget.runner._relay.progressed.connect(lambda done, total: steps.append((done, total)))
    widget.run_button.native.click()
    # 8 search bands, then 63 refinement bands: wait until the refinement is well under way
    qtbot.waitUntil(lambda: bool(steps) and steps[-1][0] >= 0.3 * steps[-1][1], timeout=120_000)
    start = time.perf_counter()
    widget.cancel_button.native.click()
    wait_idle(widget)
    assert time.perf_counter() - start < 3.0
    assert steps[-1][0] < steps[-1][1]  # it stopped before the last band
    assert [layer.name for layer in viewer.layers] == ["a", "b"]
    assert widget.status.value == "Cancelled"
