"""What a user sees in a real window: results drawn where they belong, in 3D too, and the canvas keeps its room."""

import numpy as np
import pytest

from napari_gridmip._widgets.base import DOCK_MAX_WIDTH
from napari_gridmip._widgets.correlation_widget import CorrelationWidget
from napari_gridmip._widgets.mipmap_widget import MipmapWidget
from napari_gridmip._widgets.patches_widget import PatchesWidget
from napari_gridmip._widgets.stitch_widget import StitchWidget
from napari_gridmip._widgets.tiled_widget import TiledWidget
from tests.helpers import two_balls

WINDOW = (1400, 900)


@pytest.fixture
def shown(make_napari_viewer, qtbot):
    """``shown(WidgetClass)`` -> ``(viewer, widget)`` in a shown 1400x900 window."""
    widgets = []

    def make(widget_class):
        viewer = make_napari_viewer(show=True)
        viewer.window._qt_window.resize(*WINDOW)
        widget = widget_class(viewer)
        viewer.window.add_dock_widget(widget)
        widgets.append(widget)
        qtbot.wait(50)
        return viewer, widget

    yield make
    for widget in widgets:
        widget.runner.cancel()
        qtbot.waitUntil(lambda w=widget: not w.runner.busy, timeout=120_000)


def test_mipmap_draws_blocks_around_the_balls_in_3d(shown, wait_idle, qtbot):
    viewer, widget = shown(MipmapWidget)
    volume = viewer.add_image(two_balls(radius=5, dtype=np.uint8), name="balls")
    widget.run_button.native.click()
    wait_idle(widget)
    volume.visible = False  # look at the occupancy blocks alone
    viewer.dims.ndisplay = 3
    viewer.reset_view()
    qtbot.wait(100)
    picture = np.asarray(viewer.screenshot(canvas_only=True, flash=False))[..., :3].astype(int)
    drawn = picture.sum(axis=-1) > 60  # anything brighter than the background
    rows, cols = np.nonzero(drawn)
    assert rows.size, "nothing drawn"
    h, w = drawn.shape
    # the blocks sit in two clusters (top-left and bottom-right of the view), not a box over the volume
    extent = (rows.min(), rows.max(), cols.min(), cols.max())
    middle = drawn[
        rows.min() + (rows.max() - rows.min()) // 3 : rows.min() + 2 * (rows.max() - rows.min()) // 3,
        cols.min() + (cols.max() - cols.min()) // 3 : cols.min() + 2 * (cols.max() - cols.min()) // 3,
    ]
    assert not middle.any(), extent
    assert drawn.mean() < 0.15
    top_left = drawn[: h // 2, : w // 2].any()
    bottom_right = drawn[h // 2 :, w // 2 :].any()
    assert top_left and bottom_right
    # and they are cyan
    colour = picture[drawn].mean(axis=0)
    assert colour[1] > colour[0] and colour[2] > colour[0]


@pytest.mark.parametrize(
    ("widget_class", "sample", "fields"),
    [
        (MipmapWidget, "occupancy", {"per_level": True}),
        (CorrelationWidget, "speckle", {"full_map": True, "window_rows": 5, "window_cols": 5}),
        (CorrelationWidget, "dic", {}),
        (PatchesWidget, "tiles", {}),
        (StitchWidget, "mosaic", {}),
        (TiledWidget, "occupancy", {"tile": 32}),
    ],
)
def test_the_canvas_keeps_its_room(shown, wait_idle, qtbot, widget_class, sample, fields):
    """Issue 35: with napari's layer controls on the left (320 px under PyQt6, 337 px under PyQt5) and one of our
    docks on the right, the canvas keeps at least 60% of a 1400 px wide window, before and after a run, with the
    Advanced section open too; every field fits the dock's width (nothing clipped), which scrolls instead."""
    viewer, widget = shown(widget_class)
    viewer.open_sample("napari-gridmip", sample)
    window = viewer.window._qt_window
    canvas = viewer.window._qt_viewer.canvas.native
    body = widget.native  # the dock's scroll area

    def check() -> None:
        qtbot.wait(100)
        assert window.width() <= WINDOW[0] + 2  # nothing widens the window
        assert canvas.width() >= 0.6 * window.width(), (canvas.width(), window.width())
        assert body.width() <= DOCK_MAX_WIDTH
        fields = body.widget()
        assert fields.minimumSizeHint().width() <= body.viewport().width(), "a field is wider than the dock"
        assert fields.width() <= body.viewport().width()

    check()
    for name, value in fields.items():
        getattr(widget, name).value = value
    widget.advanced.native.click()  # opened: still as narrow
    check()
    widget.run_button.native.click()
    wait_idle(widget, timeout=180_000)
    assert widget.status.value.startswith("Done")
    check()
    # the full text stays reachable in the tooltip
    assert widget.status.tooltip and widget.summary.tooltip
