"""The Correlation map's DIC series mode in a real viewer, on the rotation series sample, driven through its buttons:
its layers carry the time axis and sit on the frames; Cancel stops between frames and adds nothing."""

import time
from functools import partial

import numpy as np
import pytest
from qtpy.QtWidgets import QApplication

import napari_gridmip as gm
from napari_gridmip._jobs.plan import KEY
from napari_gridmip._widgets.correlation_widget import PAIR, SERIES, CorrelationWidget

FRAMES, SHAPE = 4, (128, 128)
NAME = "DIC series (rotation)"


@pytest.fixture
def viewer_and_widget(docked):
    return docked(CorrelationWidget)


@pytest.fixture
def small_series(monkeypatch, tmp_path):
    """The rotation series sample at test size (its own sample cache: never the full-size sample's)."""
    from napari_gridmip._sample_data import dic_series

    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dic_series, "make_dic_series", partial(dic_series.make_dic_series, shape=SHAPE, frames=FRAMES))


def run(widget, wait_idle):
    widget.run_button.native.click()
    wait_idle(widget, timeout=120_000)
    assert widget.status.value.startswith("Done"), widget.status.value


def test_the_sample_runs_with_the_time_axis(viewer_and_widget, wait_idle, small_series):
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "dic-series")
    frames, roi = viewer.layers[NAME], viewer.layers["DIC series ROI"]
    assert frames.data.shape == (FRAMES, *SHAPE) and type(roi).__name__ == "Labels"
    assert widget.mode.value == SERIES and widget.frames.value is frames and widget.roi.value is roi
    assert (widget.subset_rows.value, widget.subset_cols.value, widget.step.value) == (31, 31, 8)
    assert widget.reference_policy.value == "accumulated"
    run(widget, wait_idle)
    ours = [layer for layer in viewer.layers if KEY in layer.metadata]
    assert [layer.name for layer in ours] == [
        f"{NAME} {part}" for part in ("exy", "eyy", "exx", "dx", "dy", "status", "displacement")
    ]
    expected = gm.correlate_series(frames.data, subset=31, step=8, roi=roi.data)
    for layer in ours[:-1]:  # (T, R, C) on the frames' pixels: grid point (i, j) of frame t is pixel (8 i + 15, ...)
        assert layer.data.shape == (FRAMES, 13, 13), layer.name
        np.testing.assert_array_equal(layer.scale, (1, 8, 8))
        np.testing.assert_array_equal(layer.translate, (0, 15, 15))
        np.testing.assert_allclose(layer.data_to_world((2, 3, 4)), frames.data_to_world((2, 15 + 24, 15 + 32)))
    np.testing.assert_array_equal(viewer.layers[f"{NAME} dy"].data, expected.dy)
    np.testing.assert_array_equal(viewer.layers[f"{NAME} status"].data, expected.status)
    assert type(viewer.layers[f"{NAME} status"]).__name__ == "Labels"
    # the known rotation, on the sample's own grid
    truth = frames.metadata["true_dy"]
    assert truth.shape == (FRAMES, 13, 13) and np.nanmax(np.abs(viewer.layers[f"{NAME} dy"].data - truth)) < 0.1
    # one slider for the frames and the fields: the arrows of frame t carry t
    assert viewer.dims.nsteps[0] == FRAMES
    vectors = viewer.layers[f"{NAME} displacement"]
    assert vectors.data.shape[1:] == (2, 3) and set(vectors.data[:, 0, 0]) == set(range(FRAMES))
    viewer.dims.set_current_step(0, 2)
    shown = vectors.data[vectors._view_indices]
    assert len(shown) and np.all(shown[:, 0, 0] == 2)
    # only dy among the fields shown, the status and the arrows over it
    assert [layer.name for layer in ours if layer.visible] == [f"{NAME} {p}" for p in ("dy", "status", "displacement")]
    # Copy as Python: every layer again
    widget.copy_button.native.click()
    namespace = {}
    exec(compile(QApplication.clipboard().text(), "<copied>", "exec"), namespace)
    for layer in ours:
        np.testing.assert_array_equal(np.asarray(namespace["results"][layer.name]), layer.data, err_msg=layer.name)


@pytest.mark.slow  # a second run of the sample, with programs of its own
def test_the_advanced_options_reach_the_run(viewer_and_widget, wait_idle, small_series):
    """The rigid warp, Max. sigma and Refresh ZNCC, set in the Advanced section, are the run's and its script's."""
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "dic-series")
    frames, roi = viewer.layers[NAME], viewer.layers["DIC series ROI"]
    widget.advanced.native.click()  # open the section
    shown = [widget[name].native.isVisibleTo(widget.native) for name in ("series_shape", "subset_shape")]
    assert shown == [True, False]  # the series' warp, not the pair's

    def count():
        text = widget.advanced.text
        return int(text[text.index("(") + 1 : -1]) if text.endswith(")") else 0

    before = count()  # the sample's own suggestion (the arrows' spacing) is one
    widget.reference_policy.value = "auto"
    widget.series_shape.value = "rigid"
    widget.max_sigma.value = 0.05
    widget.refresh_zncc.value = 0.9
    assert count() == before + 3  # three more options differ from their defaults
    run(widget, wait_idle)
    options = {"reference": "auto", "shape": "rigid", "max_sigma": 0.05, "refresh_zncc": 0.9}
    expected = gm.correlate_series(frames.data, subset=31, step=8, roi=roi.data, **options)
    np.testing.assert_array_equal(viewer.layers[f"{NAME} dy"].data, expected.dy)
    np.testing.assert_array_equal(viewer.layers[f"{NAME} status"].data, expected.status)
    assert np.nanmax(np.abs(viewer.layers[f"{NAME} exx"].data)) < 1e-5  # a rigid warp: no strain
    widget.copy_button.native.click()
    script = QApplication.clipboard().text()
    assert "reference='auto', shape='rigid', max_sigma=0.05, refresh_zncc=0.9" in script
    namespace = {}
    exec(compile(script, "<copied>", "exec"), namespace)
    np.testing.assert_array_equal(np.asarray(namespace["results"][f"{NAME} dy"]), expected.dy)


def test_cancel_between_frames_adds_nothing(viewer_and_widget, wait_idle, small_series, qtbot, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "dic-series")
    before = [layer.name for layer in viewer.layers]
    runner = widget.runner
    seen, report = [], runner._report

    def reporting(done, total):  # in the worker: after the reference frame, wait for Cancel
        seen.append((done, total))
        if done >= 1:
            deadline = time.monotonic() + 30
            while not runner._cancel_requested and time.monotonic() < deadline:
                time.sleep(0.01)
        report(done, total)

    monkeypatch.setattr(runner, "_report", reporting)
    widget.run_button.native.click()
    qtbot.waitUntil(lambda: any(done >= 1 for done, _ in seen), timeout=60_000)
    assert not widget.run_button.enabled and widget.cancel_button.enabled
    widget.cancel_button.native.click()
    wait_idle(widget)
    assert widget.status.value == "Cancelled" and widget.run_button.enabled
    assert [layer.name for layer in viewer.layers] == before
    assert max(done for done, _ in seen) < FRAMES + 1  # stopped between frames, before the strain


def test_its_controls_and_inputs(viewer_and_widget, monkeypatch):
    """The mode's own fields; a reference image before a stack, a Shapes ROI filled, and bad input said."""
    shown_errors = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown_errors.append)
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")
    viewer, widget = viewer_and_widget

    def shown(*names):
        return [widget[name].native.isVisibleTo(widget.native) for name in names]

    widget.mode.value = SERIES
    assert all(shown("frames", "first_frame", "roi", "subset_rows", "subset_cols", "step", "reference_policy"))
    assert not any(shown("img1", "img2", "movie", "window_rows", "outputs", "neighbours", "show_surface"))
    assert not any(shown("series_shape", "max_sigma", "refresh_zncc"))  # in the Advanced section, closed
    widget.advanced.native.click()
    assert all(shown("series_shape", "max_sigma")) and not any(shown("refresh_zncc", "subset_shape", "precision"))
    widget.reference_policy.value = "incremental"  # the refresh threshold is the incremental and auto policies'
    assert all(shown("refresh_zncc"))
    # every field fits the dock's column, a vertical scroll bar beside it: nothing cut off on the right
    from napari_gridmip._widgets.base import DOCK_WIDTH

    scroll = widget._scroll
    assert scroll.widget().minimumSizeHint().width() <= DOCK_WIDTH - scroll.verticalScrollBar().sizeHint().width()
    widget.mode.value = PAIR
    assert not any(shown("frames", "first_frame", "roi", "reference_policy", "series_shape", "max_sigma"))
    assert not any(shown("refresh_zncc")) and all(shown("subset_shape", "precision"))
    widget.mode.value = SERIES
    widget.advanced.native.click()  # closed again

    rng = np.random.default_rng(0)
    stack = viewer.add_image(rng.random((3, 64, 80)).astype(np.float32), name="stack")
    reference = viewer.add_image(rng.random((64, 80)).astype(np.float32), name="reference")
    shapes = viewer.add_shapes([np.array([[10, 10], [10, 60], [50, 60], [50, 10]])], shape_type="rectangle")
    widget.frames.value, widget.first_frame.value, widget.roi.value = stack, reference, shapes
    widget.subset_rows.value = widget.subset_cols.value = 15
    request = widget.series_request()
    assert request.count == 4 and request.reference_name == "reference" and request.subset == (15, 15)
    assert (request.shape, request.max_sigma, request.refresh_zncc) == ("affine", 0.1, 0.95)  # the defaults
    widget.series_shape.value, widget.max_sigma.value, widget.refresh_zncc.value = "rigid", 0.25, 0.8
    request = widget.series_request()
    chosen = (request.reference, request.shape, request.max_sigma, request.refresh_zncc)
    assert chosen == ("incremental", "rigid", 0.25, 0.8)
    assert request.roi.expression == "viewer.layers['Shapes'].to_labels(labels_shape=(64, 80))"
    np.testing.assert_array_equal(request.roi_data, shapes.to_labels(labels_shape=(64, 80)))
    assert request.roi_data[30, 30] and not request.roi_data[5, 5]

    widget.first_frame.value = None
    labels = viewer.add_labels(np.zeros((3, 64, 80), np.uint8), name="painted")
    widget.roi.value = labels
    widget.run_button.native.click()  # an empty ROI
    assert "is empty" in shown_errors[-1]
    labels.data[1, 20:40, 20:40] = 2  # painted on frame 1 of a (T, Y, X) labels layer: the ROI of the reference
    request = widget.series_request()
    assert request.roi.index == ".any(axis=0)" and request.roi_data[30, 30] and not request.roi_data[5, 5]
    labels.scale = (1, 2, 2)
    widget.run_button.native.click()
    assert "must lie on the frames' pixels" in shown_errors[-1]
    widget.roi.value = None
    widget.frames.value = reference  # 2D
    widget.run_button.native.click()
    assert "needs frames (T, Y, X)" in shown_errors[-1]
    widget.frames.value = stack
    widget.subset_rows.value = 14
    widget.run_button.native.click()
    assert "odd" in shown_errors[-1]
    assert not any(KEY in layer.metadata for layer in viewer.layers)
