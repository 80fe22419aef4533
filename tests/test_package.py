"""Packaging: the pure core imports without GUI libraries; the manifest is valid and loads."""

import subprocess
import sys

import numpy as np


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
    assert {w.display_name for w in manifest.contributions.widgets} >= {"Occupancy mipmap"}
    assert {s.key for s in manifest.contributions.sample_data} >= {"occupancy"}


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


def test_widgets_open_from_the_manifest(make_napari_viewer):
    viewer = make_napari_viewer()
    dock, widget = viewer.window.add_plugin_dock_widget("napari-gridmip", "Occupancy mipmap")
    assert widget.run_button.text == "Run"
    assert widget.cancel_button.text == "Cancel"
