"""The window ``napari-gridmip`` opens: most of the screen, and the tabs of its docked widgets readable.

napari opens its window at its own first-run size (1089 x 630 px on a 1280 x 1024 screen), and the widgets docked
as tabs in one narrow column (:data:`.base.DOCK_WIDTH`) had their tabs under the column, each cut to its first
letter ("O…", "R…", "S…") behind scroll arrows. Here the window takes most of its screen (unless napari remembers
a size the user gave it) and the tabs run down the column's side, where each name has room.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: the share of the screen's free width and height the first window takes
SCREEN_SHARE = 0.9


def fit_first_window(viewer: Any, docks: Sequence[Any]) -> None:
    """Size napari's window of ``viewer`` to :data:`SCREEN_SHARE` of its screen, centred, and put the tabs of the
    docks on the right (``docks``: the dock widgets napari's ``add_dock_widget`` or ``add_plugin_dock_widget``
    returned, tabified) along the column's side, their names written downwards.

    The size is left as it is where napari restores one the user gave it (napari's Preferences, "Save window
    geometry", and a saved size). napari's window is reached through the docks' own Qt window (``QWidget.window``)
    and resized through ``viewer.window.set_geometry``: napari's Qt objects are not public API.
    """
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QMainWindow, QTabWidget

    window = docks[0].window() if docks else None
    if not isinstance(window, QMainWindow):
        return
    window.setTabPosition(Qt.DockWidgetArea.RightDockWidgetArea, QTabWidget.TabPosition.East)
    if _size_remembered():
        return
    screen = window.screen().availableGeometry()
    width, height = int(screen.width() * SCREEN_SHARE), int(screen.height() * SCREEN_SHARE)
    left = screen.x() + (screen.width() - width) // 2
    top = screen.y() + (screen.height() - height) // 2
    viewer.window.set_geometry(left, top, width, height)


def _size_remembered() -> bool:
    """Whether napari restores a window size of the user's (napari's settings: the size saved at the last quit)."""
    from napari.settings import get_settings

    application = get_settings().application
    return bool(application.save_window_geometry and application.window_size)
