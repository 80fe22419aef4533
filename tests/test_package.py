"""Packaging: the pure core imports without GUI libraries; the manifest is valid and loads."""

import subprocess
import sys

import numpy as np
import pytest

from napari_gridmip.cli import WIDGET_NAMES


def test_import_pulls_in_no_gui():
    code = (
        "import sys, napari_gridmip\n"
        "bad = [m for m in sys.modules if m in ('napari', 'magicgui', 'qtpy', 'PyQt5', 'PySide2', 'PySide6')"
        " or m.startswith(('napari.', 'magicgui.', 'qtpy.', 'PyQt5.'))]\n"
        "assert not bad, bad\n"
        "assert callable(napari_gridmip.occupancy_mipmap)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_manifest_validates_and_is_the_top_level_one():
    from pathlib import Path

    import npe2

    import napari_gridmip

    manifest = npe2.PluginManifest.from_distribution("napari-gridmip")
    assert manifest.name == "napari-gridmip"
    package_copy = Path(napari_gridmip.__file__).parent / "napari.yaml"
    top_level = Path(napari_gridmip.__file__).parent.parent / "napari.yaml"
    if top_level.exists():  # a source checkout: the package sees the top-level manifest
        assert package_copy.read_text() == top_level.read_text()
    assert {w.display_name for w in manifest.contributions.widgets} == set(WIDGET_NAMES)
    assert {s.key for s in manifest.contributions.sample_data} >= {"occupancy", "tiles", "speckle"}
    from napari_gridmip.cli import SAMPLE_WIDGETS

    # every sample opens with a widget's tab in front, and every such sample is in the manifest
    assert {s.key for s in manifest.contributions.sample_data} == set(SAMPLE_WIDGETS)
    assert set(SAMPLE_WIDGETS.values()) <= set(WIDGET_NAMES)


def test_samples_open_in_a_viewer(make_napari_viewer):
    viewer = make_napari_viewer()
    viewer.open_sample("napari-gridmip", "occupancy")
    volume = viewer.layers["occupancy volume"].data
    assert volume.ndim == 3 and min(volume.shape) >= 128
    fraction = np.count_nonzero(volume) / volume.size
    assert 0.005 < fraction < 0.1  # sparse, not empty
    # structure at several scales: the occupied fraction grows steadily up the pyramid
    from napari_gridmip import occupancy_mipmap

    fractions = [float(np.asarray(level).mean()) for level in occupancy_mipmap(volume)]
    assert fractions[0] < fractions[2] < fractions[4] < 1.0


@pytest.mark.parametrize("name", WIDGET_NAMES)
def test_widgets_open_from_the_manifest(make_napari_viewer, name):
    viewer = make_napari_viewer()
    dock, widget = viewer.window.add_plugin_dock_widget("napari-gridmip", name)
    assert widget.run_button.text == "Run"
    assert widget.cancel_button.text == "Cancel"
    assert not widget.cancel_button.enabled


def test_main_opens_napari_with_the_widgets_and_a_sample(make_napari_viewer, monkeypatch):
    import napari

    from napari_gridmip import __main__

    viewers = []

    def fake_viewer(**kwargs):
        viewers.append(make_napari_viewer(**kwargs))
        return viewers[-1]

    monkeypatch.setattr(napari, "Viewer", fake_viewer)
    monkeypatch.setattr(napari, "run", lambda: None)
    __main__.main(["--sample", "tiles"])
    (viewer,) = viewers
    assert "astronaut tiles" in viewer.layers
    docked = " ".join(viewer.window.dock_widgets.keys())
    assert all(name in docked for name in __main__.WIDGET_NAMES), docked
    # the docks are tabs of one dock area, not a stack that needs a tall screen
    from qtpy.QtWidgets import QDockWidget

    qt_window = viewer.window._qt_window
    ours = [d for d in qt_window.findChildren(QDockWidget) if "napari-gridmip" in d.windowTitle()]
    assert len(ours) == len(__main__.WIDGET_NAMES)
    assert all(len(qt_window.tabifiedDockWidgets(dock)) == len(ours) - 1 for dock in ours)
    # their tabs run down the column's side, where each name is readable (below it they were cut to a letter)
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QTabWidget

    assert qt_window.tabPosition(Qt.DockWidgetArea.RightDockWidgetArea) == QTabWidget.TabPosition.East


def test_widget_modules_load_without_jax():
    """Building napari's menus imports the widget modules: that must not load JAX (let alone start a backend)."""
    code = (
        "import sys\n"
        "import napari_gridmip._widgets.mipmap_widget, napari_gridmip._widgets.patches_widget\n"
        "import napari_gridmip._widgets.correlation_widget, napari_gridmip._widgets.tiled_widget\n"
        "import napari_gridmip._jobs.mipmap, napari_gridmip._jobs.patches, napari_gridmip._jobs.tiled\n"
        "import napari_gridmip._jobs.correlation\n"
        "assert 'jax' not in sys.modules, 'jax imported at widget module load'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
