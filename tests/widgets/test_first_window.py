"""The window ``napari-gridmip`` opens: most of its screen, and every docked widget's tab showing its whole name."""

import pytest

from napari_gridmip._widgets.first_window import SCREEN_SHARE, fit_first_window
from napari_gridmip.cli import PLUGIN, WIDGET_NAMES


@pytest.fixture
def first_window(make_napari_viewer, qtbot):
    """``(viewer, docks)``: a shown viewer with every widget docked as tabs, as ``napari-gridmip`` docks them."""
    viewer = make_napari_viewer(show=True)
    pairs = [viewer.window.add_plugin_dock_widget(PLUGIN, name, tabify=True) for name in WIDGET_NAMES]
    yield viewer, [dock for dock, _ in pairs]
    for _, widget in pairs:
        widget.release()
        qtbot.waitUntil(lambda w=widget: not w.runner.busy and not w.runner.prefetching, timeout=120_000)


def _tab_bar(docks):
    """The tab bar of the docks' column (Qt makes one per group of tabified docks)."""
    from qtpy.QtWidgets import QTabBar

    for bar in docks[0].window().findChildren(QTabBar):
        texts = [bar.tabText(i) for i in range(bar.count())]
        if (
            bar.isVisible()
            and len(texts) == len(WIDGET_NAMES)
            and all(any(text.startswith(name) for text in texts) for name in WIDGET_NAMES)
        ):
            return bar
    raise AssertionError("no tab bar of the docked widgets")


def test_the_first_window_takes_most_of_the_screen_and_each_tab_its_whole_name(first_window, monkeypatch):
    from napari.settings import get_settings

    viewer, docks = first_window
    monkeypatch.setattr(get_settings().application, "window_size", None)  # napari remembers no size of the user's
    window = docks[0].window()
    screen = window.screen().availableGeometry()
    fit_first_window(viewer, docks)
    _, _, width, height = viewer.window.geometry()
    assert abs(width - SCREEN_SHARE * screen.width()) <= 2 and abs(height - SCREEN_SHARE * screen.height()) <= 2
    bar = _tab_bar(docks)
    metrics = bar.fontMetrics()
    for index in range(bar.count()):
        name = next(name for name in WIDGET_NAMES if bar.tabText(index).startswith(name))
        # the tabs run down the column's side: a tab's length along the bar is its height
        assert bar.tabRect(index).height() > metrics.horizontalAdvance(name), bar.tabText(index)


def test_a_window_size_napari_remembers_is_kept(first_window, monkeypatch):
    from napari.settings import get_settings

    viewer, docks = first_window
    application = get_settings().application
    monkeypatch.setattr(application, "save_window_geometry", True)
    monkeypatch.setattr(application, "window_size", (900, 700))
    before = viewer.window.geometry()
    fit_first_window(viewer, docks)
    assert viewer.window.geometry() == before
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QTabWidget

    assert docks[0].window().tabPosition(Qt.DockWidgetArea.RightDockWidgetArea) == QTabWidget.TabPosition.East
