"""The Correlation map widget in a real viewer, driven through its buttons."""

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from qtpy.QtWidgets import QApplication

from napari_gridmip._jobs import correlation as correlation_jobs
from napari_gridmip._jobs.plan import KEY
from napari_gridmip._widgets.correlation_widget import PAIR, STACKS, TIME_SERIES, CorrelationWidget
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


def test_a_sample_sets_every_option_of_its_workflow(viewer_and_widget):
    """Options remembered from another sample (the DIC pair's) do not carry into the speckle pair: its first Run
    then compiles what the speckle workflow compiled before (docs/benchmarks.md, section 10)."""
    from napari_gridmip._sample_data.dic import DIC_SETTINGS

    viewer, widget = viewer_and_widget
    widget._apply(DIC_SETTINGS)
    widget.out_uncertainty.value = True
    assert widget.subpixel.value == "refine" and widget.window_rows.value == 11
    viewer.open_sample("napari-gridmip", "speckle")
    assert widget.mode.value == "stacks"
    assert (widget.window_rows.value, widget.window_cols.value) == (9, 9)
    assert widget.subpixel.value == "hessian" and widget.spacing.value == 8
    assert widget.chosen_outputs() == ()


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


# -- the three modes on their samples, the outputs, the clicked surface ----------------------------------------

EXACT = {"rtol": 0, "atol": 1e-6}  # the widget calls the same function on the same arrays: equal to rounding


def run(widget, wait_idle, timeout=120_000):
    widget.run_button.native.click()
    wait_idle(widget, timeout=timeout)
    assert widget.status.value.startswith("Done"), widget.status.value


def assert_copy_reproduces(widget, viewer):
    """ "Copy as Python", run beside the viewer: every layer the widget made, array for array."""
    widget.copy_button.native.click()
    text = QApplication.clipboard().text()
    namespace = {}
    exec(compile(text, "<copied>", "exec"), namespace)
    results = namespace["results"]
    ours = [layer.name for layer in viewer.layers if KEY in layer.metadata]
    assert sorted(results) == sorted(ours), text
    for name, array in results.items():
        np.testing.assert_allclose(np.asarray(array), np.asarray(viewer.layers[name].data), err_msg=name, **EXACT)
    return text


def test_dic_sample_opens_pair_mode_and_gives_strain(viewer_and_widget, wait_idle, small_samples):
    from napari_gridmip import strain_field

    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "dic")
    deformed, reference = viewer.layers["DIC deformed (img1)"], viewer.layers["DIC reference (img2)"]
    assert widget.mode.value == PAIR and widget.img1.value is deformed and widget.img2.value is reference
    assert (widget.window_rows.value, widget.subset_rows.value, widget.step.value) == (11, 31, 4)
    assert widget.chosen_outputs() == ("strain",)
    run(widget, wait_idle)
    name = "DIC reference (img2)"
    dy, dx = viewer.layers[f"{name} dy"], viewer.layers[f"{name} dx"]
    expected = find_displacement(
        deformed.data[None], reference.data[None], (11, 11), subset=(31, 31), step=4, subpixel="refine"
    )
    np.testing.assert_allclose(dy.data, np.asarray(expected.dy), **EXACT)
    np.testing.assert_allclose(dx.data, np.asarray(expected.dx), **EXACT)
    strain = strain_field(expected.dy, expected.dx, window=11, spacing=4)
    for part in ("exx", "eyy", "exy"):
        layer = viewer.layers[f"{name} {part}"]
        np.testing.assert_allclose(layer.data, np.asarray(getattr(strain, part)), **EXACT)
        low, high = layer.contrast_limits
        assert low == -high and high > 0 and layer.colormap.name == "coolwarm"  # symmetric about 0
    # only the topmost field is shown (exx), the vectors over it
    shown = [layer.name for layer in viewer.layers if layer.visible and KEY in layer.metadata]
    assert shown == [f"{name} exx", f"{name} displacement"]
    # placed exactly: output pixel (i, j) is the reference's pixel (4 i + 20, 4 j + 20), 4 px wide
    half = 5 + 15
    np.testing.assert_allclose(dy.data_to_world((0, 0)), reference.data_to_world((half, half)))
    np.testing.assert_allclose(dy.data_to_world((2, 3)), reference.data_to_world((half + 8, half + 12)))
    vectors = viewer.layers[f"{name} displacement"]
    first = vectors.data[0]  # the arrows start on their pixels, in the reference's pixels
    np.testing.assert_allclose(vectors.data_to_world(first[0]), reference.data_to_world((half, half)))
    # the known field, on the reference's grid (the small sample bends more within a 31 px subset than the
    # full-size one: test_full_size_samples_against_their_truth holds that to 0.03 px)
    truth = deformed.metadata["true_dy"][half::4, half::4][: dy.data.shape[0], : dy.data.shape[1]]
    assert np.nanmedian(np.abs(dy.data - truth)) < 0.15
    assert_copy_reproduces(widget, viewer)


def test_dic_sample_with_affine_subsets(viewer_and_widget, wait_idle, small_samples):
    """Subset shape affine in the DIC mode: the field and strain of find_displacement(..., shape="affine") and
    strain_field(gradients=...), shown only in the pair mode, reproduced by Copy as Python."""
    from napari_gridmip import strain_field

    viewer, widget = viewer_and_widget

    def shown() -> bool:  # would be on screen with the dock (the test's window is not shown)
        return widget.subset_shape.native.isVisibleTo(widget.native)

    viewer.open_sample("napari-gridmip", "dic")
    deformed, reference = viewer.layers["DIC deformed (img1)"], viewer.layers["DIC reference (img2)"]
    assert not shown()  # an advanced option: the section is closed
    widget.advanced.native.click()
    assert shown()
    widget.subset_shape.value = "affine"
    run(widget, wait_idle)
    name = "DIC reference (img2)"
    expected = find_displacement(deformed.data[None], reference.data[None], (11, 11), subset=(31, 31), step=4,
                                 subpixel="refine", shape="affine")  # fmt: skip
    np.testing.assert_allclose(viewer.layers[f"{name} dx"].data, np.asarray(expected.dx), **EXACT)
    strain = strain_field(expected.dy, expected.dx, gradients=expected[3:])
    np.testing.assert_allclose(viewer.layers[f"{name} exx"].data, np.asarray(strain.exx), **EXACT)
    assert_copy_reproduces(widget, viewer)
    widget.mode.value = STACKS
    assert not shown()


def test_speckle_contrast_sample_tracks_and_shows_a_clicked_surface(viewer_and_widget, wait_idle, small_samples):
    from napari_gridmip import integrate_gradient, track_speckles

    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "speckle-contrast")
    sample, reference = viewer.layers["speckle sample"], viewer.layers["speckle reference"]
    assert widget.mode.value == PAIR and widget.img1.value is sample and widget.img2.value is reference
    assert widget.chosen_outputs() == ("transmission", "dark_field", "phase")
    widget.out_uncertainty.value = True
    run(widget, wait_idle)
    tracked = track_speckles(sample.data, reference.data, (9, 9), subset=(3, 3), subpixel="refine")
    name = "speckle sample"  # tracking results sit on the sample's pixels
    for role, suffix, colormap in [
        ("transmission", "transmission", "gray"),
        ("dark_field", "dark-field", "gray"),
        ("sigma_dy", "sigma dy", "magma"),
        ("dy", "dy", "coolwarm"),
    ]:
        layer = viewer.layers[f"{name} {suffix}"]
        np.testing.assert_allclose(layer.data, np.asarray(getattr(tracked, role)), err_msg=role, **EXACT)
        assert layer.colormap.name == colormap
    phase = viewer.layers[f"{name} phase"]
    np.testing.assert_allclose(phase.data, np.asarray(integrate_gradient(tracked.dy, tracked.dx)), **EXACT)
    assert phase.colormap.name == "gray" and phase.metadata["gridmip_unit"] == "px^2"
    np.testing.assert_allclose(phase.data_to_world((0, 0)), sample.data_to_world((0, 5, 5))[1:])
    # the known transmission, on the sample's grid
    truth = sample.metadata["true_transmission"][5:-5, 5:-5]
    assert np.nanmedian(np.abs(viewer.layers[f"{name} transmission"].data / truth - 1)) < 0.02

    # a click on a result pixel: its correlation surface beside the data, the refined peak marked
    dy, dx = viewer.layers[f"{name} dy"], viewer.layers[f"{name} dx"]
    pixel = (20, 31)
    click(viewer, dy.data_to_world(pixel))
    wait_idle(widget)
    surface = viewer.layers[f"{name} correlation surface"]
    peak = viewer.layers[f"{name} surface peak"]
    full = np.asarray(windowed_pearson(reference.data, sample.data, (9, 9), subset=(3, 3)))[pixel]
    np.testing.assert_allclose(surface.data, full[::-1, ::-1], **EXACT)  # over the displacement (dy, dx)
    fitted = np.array([dy.data[pixel], dx.data[pixel]])
    np.testing.assert_allclose(peak.data, [fitted + 4], **EXACT)  # surface pixel (k, l) is (k - 4, l - 4)
    top = np.unravel_index(np.argmax(surface.data), surface.data.shape)
    assert np.all(np.abs(np.array(top) - (fitted + 4)) <= 0.5 + 1e-6)  # the refined peak is by the highest cell
    # beside the data, right of it, and not over it
    assert surface.extent.world[0][1] > dy.extent.world[1][1]
    assert peak.scale[0] == surface.scale[0] and peak.translate[1] == surface.translate[1]
    assert "fitted dy" in widget.surface_info.value
    np.testing.assert_allclose(viewer.layers[f"{name} clicked pixel"].data, [pixel])
    text = assert_copy_reproduces(widget, viewer)
    assert "gm.windowed_pearson(pixel2, pixel1, (9, 9), subset=(3, 3)" in text
    count = len(viewer.layers)
    click(viewer, dy.data_to_world((5, 6)))  # another pixel: the same three layers, new data
    wait_idle(widget)
    assert len(viewer.layers) == count and viewer.layers[f"{name} correlation surface"] is surface
    np.testing.assert_allclose(surface.data, np.asarray(windowed_pearson(
        reference.data, sample.data, (9, 9), subset=(3, 3)))[5, 6, ::-1, ::-1], **EXACT)  # fmt: skip
    drag(viewer, dy.data_to_world((9, 9)))  # a drag pans: nothing
    click(viewer, dy.data_to_world((-30, 6)))  # off the result: nothing
    assert not widget.runner.busy and np.asarray(viewer.layers[f"{name} clicked pixel"].data)[0, 0] == 5


def test_calcium_sample_gives_the_local_correlation_image(viewer_and_widget, wait_idle, small_samples):
    from napari_gridmip import local_correlation_image

    viewer, widget = viewer_and_widget
    widget.mode.value = STACKS
    viewer.open_sample("napari-gridmip", "calcium")
    movie = viewer.layers["calcium movie"]
    assert widget.mode.value == TIME_SERIES and widget.movie.value is movie
    widget.neighbours.value = 4
    run(widget, wait_idle)
    image = viewer.layers["calcium movie correlation image"]
    np.testing.assert_allclose(image.data, np.asarray(local_correlation_image(movie.data, neighbours=4)), **EXACT)
    assert image.colormap.name == "magma" and tuple(image.contrast_limits) == (0, 1)
    np.testing.assert_allclose(image.data_to_world((3, 4)), movie.data_to_world((0, 3, 4))[1:])
    cells = movie.metadata["true_footprints"].max(axis=0)
    assert np.median(image.data[cells > 0.5]) > np.median(image.data[cells == 0]) + 0.3
    assert "local correlation image" in widget.summary.value
    click(viewer, image.data_to_world((10, 10)))  # no surface in this mode
    assert not widget.runner.busy
    assert_copy_reproduces(widget, viewer)


def test_a_widget_docked_after_the_sample_takes_its_mode(make_napari_viewer, small_samples):
    viewer = make_napari_viewer()
    viewer.open_sample("napari-gridmip", "calcium")
    widget = CorrelationWidget(viewer)  # e.g. from the Plugins menu, once the sample is open
    viewer.window.add_dock_widget(widget)
    assert widget.mode.value == TIME_SERIES and widget.movie.value is viewer.layers["calcium movie"]


def test_each_mode_shows_only_its_controls(viewer_and_widget):
    _, widget = viewer_and_widget

    def shown(*names):  # would be on screen with the dock (the test's window is not shown)
        return [widget[name].native.isVisibleTo(widget.native) for name in names]

    pair_only = ("subset_rows", "subset_cols", "step")
    advanced = ("subpixel", "precision", "spacing", "vector_scale", "full_map", "keep_previous")
    widget.mode.value = STACKS
    assert not any(shown(*advanced)), "the Advanced section starts closed"
    widget.advanced.native.click()
    assert all(shown(*advanced))
    assert all(shown("img1", "img2", "window_rows", "full_map", "outputs", "show_surface"))
    assert not any(shown(*pair_only, "movie", "neighbours"))
    widget.mode.value = PAIR
    assert all(shown(*pair_only)) and not any(shown("full_map", "strain_window", "pixel_size"))
    widget.out_strain.value = widget.out_phase.value = True
    assert all(shown("strain_window", "pixel_size", "distance", "wavelength"))
    widget.mode.value = TIME_SERIES
    assert all(shown("movie", "neighbours", "precision"))
    assert not any(shown("img1", "window_rows", "outputs", "show_surface", "strain_window", "spacing"))
    widget.advanced.native.click()  # closed again: only the mode's main fields
    assert shown("movie", "neighbours") == [True, True] and not any(shown("precision", "keep_previous"))


def test_bad_input_says_why_and_adds_nothing(viewer_and_widget, wait_idle, monkeypatch):
    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    viewer, widget = viewer_and_widget
    rng = np.random.default_rng(4)
    viewer.add_image(rng.random((40, 44)), name="a")
    viewer.add_image(rng.random((40, 44)), name="b")
    widget.mode.value = STACKS
    widget.img1.value, widget.img2.value = viewer.layers["a"], viewer.layers["b"]
    widget.run_button.native.click()
    assert "stacks mode" in shown[-1] and "2D image" in shown[-1] and "single pair, subset" in shown[-1]
    widget.mode.value = PAIR
    widget.img1.value, widget.img2.value = viewer.layers["a"], viewer.layers["b"]
    widget.subset_rows.value = 4
    widget.run_button.native.click()
    assert "subset must be odd" in shown[-1] and "4 x" in shown[-1]
    widget.subset_rows.value = widget.subset_cols.value = 1
    widget.run_button.native.click()
    assert "larger than 1 x 1" in shown[-1]
    widget.subset_rows.value = widget.subset_cols.value = 7
    widget.out_phase.value = True
    widget.pixel_size.value = 1.0  # but no distance nor wavelength
    widget.run_button.native.click()
    assert "all three" in shown[-1]
    widget.mode.value = TIME_SERIES
    widget.movie.value = viewer.layers["a"]
    widget.run_button.native.click()
    assert "time series mode needs a movie" in shown[-1] and "(40, 44)" in shown[-1]
    assert [layer.name for layer in viewer.layers] == ["a", "b"]
    assert not widget.runner.busy


def test_physical_phase_uses_phase_from_displacement(viewer_and_widget, wait_idle):
    from napari_gridmip import phase_from_displacement
    from napari_gridmip._sample_data import make_speckle_pair_with_contrast

    viewer, widget = viewer_and_widget
    sample, reference, _ = make_speckle_pair_with_contrast(4, (40, 44))
    viewer.add_image(sample, name="s")
    viewer.add_image(reference, name="r")
    widget.mode.value = PAIR
    widget.img1.value, widget.img2.value = viewer.layers["s"], viewer.layers["r"]
    widget.window_rows.value = widget.window_cols.value = 7
    widget.subset_rows.value = widget.subset_cols.value = 5
    widget.step.value = 2
    widget.out_phase.value = widget.out_transmission.value = True
    widget.pixel_size.value, widget.distance.value, widget.wavelength.value = 6.5, 500.0, 0.6
    run(widget, wait_idle)
    dy, dx = viewer.layers["s dy"].data, viewer.layers["s dx"].data
    expected = phase_from_displacement(dy, dx, pixel_size=6.5e-6, distance=0.5, wavelength=0.6e-10, magnification=0.5)
    phase = viewer.layers["s phase"]
    np.testing.assert_allclose(phase.data, np.asarray(expected), rtol=1e-5, atol=1e-5 * np.abs(phase.data).max())
    assert phase.metadata["gridmip_unit"] == "rad"
    np.testing.assert_allclose(phase.scale[-2:], [2, 2])  # each output pixel covers 2 x 2 input pixels
    assert_copy_reproduces(widget, viewer)


def test_closing_takes_the_click_callback_off_the_viewer(viewer_and_widget):
    viewer, widget = viewer_and_widget
    assert widget._on_click in viewer.mouse_drag_callbacks
    viewer.window.remove_dock_widget(widget.native)
    assert widget.released and widget._on_click not in viewer.mouse_drag_callbacks


@dataclass
class MouseEvent:
    """What napari's canvas hands the viewer's mouse callbacks (the fields ours reads)."""

    type: str
    position: tuple
    button: int = 1
    is_dragging: bool = False
    modifiers: list = field(default_factory=list)
    pos: np.ndarray = field(default_factory=lambda: np.zeros(2))
    view_direction: list | None = None
    up_direction: list | None = None
    dims_displayed: list = field(default_factory=lambda: [0, 1])


def _event(kind, position):
    from napari.utils._proxies import ReadOnlyWrapper

    return ReadOnlyWrapper(MouseEvent(kind, tuple(position)), exceptions=("handled",))


def click(viewer, position):
    """Press and release at ``position`` (world), through napari's own dispatch of the viewer's callbacks."""
    from napari.utils.interactions import mouse_press_callbacks, mouse_release_callbacks

    mouse_press_callbacks(viewer, _event("mouse_press", position))
    mouse_release_callbacks(viewer, _event("mouse_release", position))


def drag(viewer, position):
    from napari.utils.interactions import mouse_move_callbacks, mouse_press_callbacks, mouse_release_callbacks

    mouse_press_callbacks(viewer, _event("mouse_press", position))
    mouse_move_callbacks(viewer, _event("mouse_move", np.asarray(position) + 3))
    mouse_release_callbacks(viewer, _event("mouse_release", np.asarray(position) + 3))


@pytest.mark.slow
def test_full_size_samples_against_their_truth(viewer_and_widget, wait_idle):
    """The samples as File > Open Sample makes them, with the widget's suggested settings: the known truth."""
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "dic")
    run(widget, wait_idle, timeout=600_000)
    deformed = viewer.layers["DIC deformed (img1)"]
    dy = viewer.layers["DIC reference (img2) dy"].data
    exx = viewer.layers["DIC reference (img2) exx"].data
    half, rows, cols = 20, *dy.shape
    truth = {k: deformed.metadata[f"true_{k}"][half::4, half::4][:rows, :cols] for k in ("dy", "exx")}
    assert np.nanmedian(np.abs(dy - truth["dy"])) < 0.03
    inner = (slice(5, -5), slice(5, -5))  # the strain fit's whole windows
    assert np.nanmedian(np.abs(exx - truth["exx"])[inner]) < 1e-3  # of strains up to 1.3%

    viewer.layers.clear()
    viewer.open_sample("napari-gridmip", "speckle-contrast")
    run(widget, wait_idle, timeout=600_000)
    sample = viewer.layers["speckle sample"]
    for suffix, key in (("transmission", "transmission"), ("dark-field", "dark_field")):
        found = viewer.layers[f"speckle sample {suffix}"].data
        true = sample.metadata[f"true_{key}"][5:-5, 5:-5]
        assert np.nanmedian(np.abs(found / true - 1)) < 0.01, suffix
    assert viewer.layers["speckle sample phase"].visible

    viewer.layers.clear()
    viewer.open_sample("napari-gridmip", "calcium")
    run(widget, wait_idle, timeout=600_000)
    image = viewer.layers["calcium movie correlation image"].data
    cells = viewer.layers["calcium movie"].metadata["true_footprints"].max(axis=0)
    assert np.median(image[cells > 0.5]) > 0.7 and np.median(image[cells == 0]) < 0.3


# -- the run started before Run is pressed ------------------------------------------------------------------


def _pair(viewer, shape=(5, 40, 36)):
    rng = np.random.default_rng(3)
    a, b = rng.random((2, *shape), dtype=np.float32)
    viewer.add_image(a, name="a")
    viewer.add_image(b, name="b")
    return a, b


def _around_jobs(widget, monkeypatch, around):
    """Every job the widget makes from now on runs as ``around(job, progress)``.

    Patched on the class, not the instance: pytest >= 9.1 undoes an instance attribute absent from its ``__dict__``
    with ``delattr``, which a magicgui Container takes as removing the widget of that name (a ValueError in the
    teardown, once Qt had deleted the widget's children)."""
    cls = type(widget)
    make_job = cls.make_job

    def wrapped(self):
        job = make_job(self)
        if self is not widget:  # another widget of the class (none in these tests) keeps its own jobs
            return job
        return type(job)(job.description, lambda progress: around(job, progress))

    monkeypatch.setattr(cls, "make_job", wrapped)


def test_run_takes_over_the_job_started_when_the_inputs_settled(viewer_and_widget, qtbot, wait_idle, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    viewer, widget = viewer_and_widget
    runs = []
    _around_jobs(widget, monkeypatch, lambda job, progress: runs.append(1) or job.run(progress))
    a, b = _pair(viewer)
    widget.window_rows.value, widget.window_cols.value = 5, 5
    qtbot.waitUntil(lambda: widget.runner.prefetched, timeout=120_000)
    assert widget.run_button.enabled and widget.status.value == "Ready"  # quietly: nothing to see before Run
    widget.run_button.native.click()
    wait_idle(widget)
    assert runs == [1]  # the early job's result, not a second run
    dy = viewer.layers["b dy"].data
    np.testing.assert_allclose(dy, np.asarray(find_displacement(a, b, (5, 5))[0]), atol=1e-6, equal_nan=True)
    assert widget.status.value.startswith("Done")
    # the same inputs again: Run computes again (a re-run is the user's choice), nothing was started early
    widget.run_button.native.click()
    wait_idle(widget)
    assert runs == [1, 1]


def test_new_layers_start_the_early_job_sooner_than_an_edited_option(viewer_and_widget, monkeypatch):
    from napari_gridmip._widgets import base

    monkeypatch.setattr(base, "PREFETCH_DELAY_MS", 10_000)  # long enough to be still pending on a loaded machine
    viewer, widget = viewer_and_widget
    _pair(viewer)  # layers added (a sample opened): their layers arrive at once, nothing is being typed
    assert widget._prefetch_timer.isActive()
    # (at most what an earlier layer change left of its own wait: Qt's coarse timers round a few ms up)
    assert base.LAYERS_PREFETCH_DELAY_MS <= widget._prefetch_timer.interval() < 2 * base.LAYERS_PREFETCH_DELAY_MS
    widget.window_rows.value = 7  # an option edited: wait for the user to stop
    assert widget._prefetch_timer.isActive() and widget._prefetch_timer.interval() == base.PREFETCH_DELAY_MS
    viewer.add_image(np.zeros((4, 4)), name="another")  # layers change meanwhile: the edit's wait is not cut short
    assert widget._prefetch_timer.interval() > 5_000


def test_an_option_changed_after_the_early_job_gives_its_own_result(viewer_and_widget, qtbot, wait_idle, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    viewer, widget = viewer_and_widget
    a, b = _pair(viewer)
    widget.window_rows.value, widget.window_cols.value = 5, 5
    qtbot.waitUntil(lambda: widget.runner.prefetched, timeout=120_000)
    widget.window_rows.value = 7  # then Run at once, before the next early job could start
    widget.run_button.native.click()
    wait_idle(widget)
    qtbot.waitUntil(lambda: not widget.runner.prefetching, timeout=120_000)
    dy = viewer.layers["b dy"].data
    assert dy.shape == (40 - 6, 36 - 4)
    np.testing.assert_allclose(dy, np.asarray(find_displacement(a, b, (7, 5))[0]), atol=1e-6, equal_nan=True)


def test_cancel_stops_a_taken_over_job_and_adds_nothing(viewer_and_widget, qtbot, wait_idle, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    viewer, widget = viewer_and_widget
    started = []

    def slow(job, progress):
        started.append(1)
        for step in range(400):  # long enough to be taken over, then cancelled
            progress(step, 400)
            time.sleep(0.01)
        return job.run(progress)

    _around_jobs(widget, monkeypatch, slow)
    _pair(viewer)
    qtbot.waitUntil(lambda: bool(started), timeout=60_000)
    layers_before = len(viewer.layers)
    widget.run_button.native.click()
    assert not widget.run_button.enabled and widget.cancel_button.enabled
    widget.cancel_button.native.click()
    wait_idle(widget)
    assert len(viewer.layers) == layers_before and widget.status.value == "Cancelled"
    assert started == [1]


@pytest.mark.parametrize("how", ["environment", "settings"])
def test_nothing_starts_early_when_switched_off(viewer_and_widget, qtbot, monkeypatch, how):
    from napari_gridmip._jobs import settings as _settings

    if how == "environment":
        monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")
    else:  # the Preferences' "Start a run before Run is pressed", unticked
        _settings.save("general", {"start_early": False})
    viewer, widget = viewer_and_widget
    _pair(viewer)
    qtbot.wait(1000)
    assert not widget.runner.prefetching and not widget.runner.prefetched


@pytest.mark.parametrize("switched_on", [True, False])
def test_the_first_widget_starts_jax_in_a_worker_once(docked, qtbot, monkeypatch, switched_on):
    import napari_gridmip._jobs as jobs
    from napari_gridmip._widgets import base

    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1" if switched_on else "0")
    monkeypatch.setattr(base, "_JAX_STARTED", {"worker": None})  # as in a new session
    threads = []
    prepare = jobs.prepare_jax
    monkeypatch.setattr(jobs, "prepare_jax", lambda: threads.append(threading.get_ident()) or prepare())
    docked(CorrelationWidget)
    worker = base._JAX_STARTED["worker"]
    if not switched_on:
        assert worker is None and threads == []
        return
    assert worker is not None
    qtbot.waitUntil(lambda: len(threads) == 1, timeout=60_000)
    assert threads[0] != threading.main_thread().ident  # never on the GUI thread
    qtbot.waitUntil(lambda: worker.done, timeout=60_000)
    docked(CorrelationWidget)  # a second widget: nothing started again
    assert base._JAX_STARTED["worker"] is worker
    qtbot.wait(50)
    assert len(threads) == 1
