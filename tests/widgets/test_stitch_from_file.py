"""The Stitch tiles widget on a microscope file (OME-TIFF, TileConfiguration, OME-Zarr collection): tiles placed by
the file's stage positions, results in micrometres, and Export... to Fiji's TileConfiguration and OME-Zarr."""

import numpy as np
import pytest
import tifffile
import zarr

from napari_gridmip import read_mosaic, write_ome_zarr, write_tile_configuration
from napari_gridmip._jobs.plan import KEY
from napari_gridmip._widgets import stitch_widget
from napari_gridmip._widgets.stitch_widget import FROM_FILE, FROM_LAYER, StitchWidget

# ome-types' pydantic models warn of pydantic 2's deprecations at their first use
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pydantic")
PIXEL = 0.65  # micrometres
TILE = (64, 64)


@pytest.fixture
def viewer_and_widget(docked):
    return docked(StitchWidget)


@pytest.fixture(scope="module")
def sample():
    from napari_gridmip._sample_data.mosaic import make_mosaic

    return make_mosaic(grid_shape=(2, 2), tile_shape=TILE, overlap=0.3, stage_error=2, noise=0.0, seed=5)


def write_ome_tiff(path, tiles, positions, pixel=PIXEL):
    """One series per tile, each placed by its first plane's PositionY/X in micrometres."""
    with tifffile.TiffWriter(path, ome=True) as tif:
        for k, (tile, (y, x)) in enumerate(zip(tiles, positions)):
            metadata = {"axes": "YX", "Name": f"field {k}", "PhysicalSizeX": pixel, "PhysicalSizeY": pixel,
                        "PhysicalSizeXUnit": "µm", "PhysicalSizeYUnit": "µm",
                        "Plane": {"PositionX": [x * pixel], "PositionY": [y * pixel],
                                  "PositionXUnit": ["µm"], "PositionYUnit": ["µm"]}}  # fmt: skip
            tif.write(tile, metadata=metadata)
    return path


def run_and_wait(widget, wait_idle):
    widget.run_button.native.click()
    wait_idle(widget, timeout=300_000)
    assert widget.status.value.startswith("Done"), widget.status.value


def shown(field):
    return not field.native.isHidden()  # (visible also needs the dock on screen)


def outline_origins(viewer, name):
    return np.array([corners[0] for corners in viewer.layers[f"{name} tile placement"].data])


def test_ome_tiff_in_micrometres_and_its_export(viewer_and_widget, wait_idle, sample, tmp_path, monkeypatch):
    viewer, widget = viewer_and_widget
    path = write_ome_tiff(tmp_path / "scan.ome.tif", sample.tiles, sample.stage_positions)
    widget.source.value = FROM_FILE
    assert shown(widget.microscope_file) and shown(widget.zarr_button) and not shown(widget.layer)
    assert not shown(widget.grid_shape) and not shown(widget.overlap) and "file" in widget.stage_note.value
    assert not widget.export_button.enabled  # nothing to export yet
    widget.microscope_file.value = str(path)
    run_and_wait(widget, wait_idle)

    mosaic = viewer.layers["scan mosaic"]
    for name in ("scan mosaic", "scan tile placement", "scan pairs"):
        layer = viewer.layers[name]
        np.testing.assert_allclose(layer.scale[-2:], (PIXEL, PIXEL))
        assert [str(u) for u in layer.units] == ["micrometer", "micrometer"]
    assert [str(u) for u in viewer.layers.units] == ["micrometer", "micrometer"]  # the scale bar reads µm
    # the mosaic's pixel 0 at its origin in micrometres, the tiles where they truly are
    found = outline_origins(viewer, "scan")
    np.testing.assert_allclose(found - found[0], sample.true_positions - sample.true_positions[0], atol=0.25)
    # the provenance names the file, and Copy as Python reads it again
    sources = mosaic.metadata[KEY]["sources"]
    assert {"variable": "tiles", "expression": f"gm.read_mosaic({str(path)!r}).tiles"} in sources
    assert any(str(path) in s.get("expression", "") and ".positions" in s["expression"] for s in sources)
    widget.copy_button.native.click()
    from qtpy.QtWidgets import QApplication

    namespace = {}
    exec(QApplication.clipboard().text(), namespace)
    np.testing.assert_allclose(namespace["results"][mosaic.name], mosaic.data, atol=1e-5)

    # Export: the series are no files, so they are written beside the registered TileConfiguration
    assert widget.export_button.enabled
    out = tmp_path / "export"
    out.mkdir()
    asked = []
    monkeypatch.setattr(stitch_widget, "choose_folder", lambda *a: asked.append(a) or str(out))
    widget.export_button.native.click()
    assert not widget.export_button.enabled and not widget.run_button.enabled  # in the background
    wait_idle(widget)
    assert len(asked) == 1 and widget.status.value.startswith("Done: wrote"), widget.status.value
    assert widget.export_button.enabled and widget.run_button.enabled
    assert sorted(p.name for p in out.iterdir()) == [
        "TileConfiguration.registered.txt", "mosaic.ome.zarr", "tile_000.tif", "tile_001.tif", "tile_002.tif",
        "tile_003.tif",
    ]  # fmt: skip
    back = read_mosaic(out / "TileConfiguration.registered.txt")
    np.testing.assert_allclose(back.positions, found, atol=0.01, rtol=0)
    np.testing.assert_array_equal(back.tiles.compute(), sample.tiles)
    image = zarr.open_group(str(out / "mosaic.ome.zarr"), mode="r")
    ome = image.attrs.asdict()
    multiscale = ome.get("ome", ome)["multiscales"][0]
    assert [axis.get("unit") for axis in multiscale["axes"]] == ["micrometer", "micrometer"]
    scale, translation = multiscale["datasets"][0]["coordinateTransformations"]
    np.testing.assert_allclose(scale["scale"], (PIXEL, PIXEL))
    np.testing.assert_allclose(translation["translation"], np.asarray(mosaic.translate), atol=1e-9)
    np.testing.assert_allclose(image[multiscale["datasets"][0]["path"]][:], mosaic.data)
    assert ome[KEY]["calls"][-1]["function"] == "napari_gridmip.fuse_tiles"  # the provenance kept with it

    # a failing export notifies and leaves nothing of itself
    errors = []
    monkeypatch.setattr("napari.utils.notifications.show_error", errors.append)
    failed = tmp_path / "failed"
    failed.mkdir()
    monkeypatch.setattr(stitch_widget, "choose_folder", lambda *a: str(failed))

    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("napari_gridmip._jobs.stitch.write_ome_zarr", full_disk)  # where the job holds it
    widget.export_button.native.click()
    wait_idle(widget)
    assert errors and "No space left" in errors[-1]
    assert list(failed.iterdir()) == []  # not the tiles, nor the configuration, nor a temporary
    # no result, no export: the mosaic layer removed
    viewer.layers.remove(mosaic)
    assert not widget.export_button.enabled


def test_tile_configuration_export_names_its_files(viewer_and_widget, wait_idle, sample, tmp_path, monkeypatch):
    viewer, widget = viewer_and_widget
    scans = tmp_path / "scans"
    scans.mkdir()
    names = [f"img_{k}.tif" for k in range(len(sample.tiles))]
    for name, tile in zip(names, sample.tiles):
        tifffile.imwrite(scans / name, tile)
    config = write_tile_configuration(names, sample.stage_positions, scans / "TileConfiguration.txt")
    widget.source.value = FROM_FILE
    widget.microscope_file.value = str(config)
    run_and_wait(widget, wait_idle)
    mosaic = viewer.layers["scans mosaic"]
    assert tuple(mosaic.scale) == (1.0, 1.0) and [str(u) for u in mosaic.units] == ["pixel", "pixel"]  # no size
    found = outline_origins(viewer, "scans")

    # exported beside the tiles, as Fiji does: the configuration names them, nothing else is written
    monkeypatch.setattr(stitch_widget, "choose_folder", lambda *a: str(scans))
    widget.export_button.native.click()
    wait_idle(widget)
    registered = scans / "TileConfiguration.registered.txt"
    assert sorted(p.name for p in scans.iterdir()) == sorted([*names, "TileConfiguration.txt", registered.name,
                                                              "mosaic.ome.zarr"])  # fmt: skip
    assert [line.split(";")[0] for line in registered.read_text().splitlines()[4:]] == names
    np.testing.assert_allclose(read_mosaic(registered).positions, found, atol=0.01, rtol=0)
    # a second export asks before replacing; refused, the files stay as they are
    before = registered.stat().st_mtime_ns
    questions = []
    monkeypatch.setattr(stitch_widget, "confirm_replace", lambda parent, text: questions.append(text) or False)
    widget.export_button.native.click()
    assert questions and "TileConfiguration.registered.txt" in questions[0] and not widget.runner.busy
    assert registered.stat().st_mtime_ns == before
    # into another folder: each tile named by its path from there
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.setattr(stitch_widget, "choose_folder", lambda *a: str(other))
    widget.export_button.native.click()
    wait_idle(widget)
    assert sorted(p.name for p in other.iterdir()) == ["TileConfiguration.registered.txt", "mosaic.ome.zarr"]
    lines = (other / "TileConfiguration.registered.txt").read_text().splitlines()[4:]
    assert [line.split(";")[0] for line in lines] == [f"../scans/{name}" for name in names]
    np.testing.assert_allclose(read_mosaic(other / "TileConfiguration.registered.txt").positions, found, atol=0.01)


def test_ome_zarr_folder_from_the_button_and_a_reader_layer(viewer_and_widget, wait_idle, sample, tmp_path,
                                                             monkeypatch):  # fmt: skip
    viewer, widget = viewer_and_widget
    root = tmp_path / "plate_well.zarr"
    zarr.open_group(str(root), mode="w")
    for k, (tile, position) in enumerate(zip(sample.tiles, sample.stage_positions)):
        write_ome_zarr(tile, root / f"{k}", pixel_size=PIXEL, origin=position)
    widget.source.value = FROM_FILE
    monkeypatch.setattr(stitch_widget, "choose_folder", lambda *a: str(root))
    widget.zarr_button.native.click()
    assert str(widget.microscope_file.value) == str(root)
    # Qt's file dialog picks files: the zarr.json (or .zgroup) inside the folder stands for the folder
    marker = next(root / name for name in ("zarr.json", ".zgroup") if (root / name).exists())
    widget.microscope_file.value = str(marker)
    run_and_wait(widget, wait_idle)
    from_file = viewer.layers["plate_well mosaic"]
    np.testing.assert_allclose(from_file.scale, (PIXEL, PIXEL))

    # the same tiles opened with napari's reader: a tile stack in micrometres, placed by its stage positions
    (layer,) = viewer.open(str(root), plugin="napari-gridmip")
    assert [str(u) for u in layer.units] == ["pixel", "micrometer", "micrometer"]
    widget.source.value = FROM_LAYER
    widget.layer.value = layer
    assert not shown(widget.grid_shape) and not shown(widget.overlap) and "metadata" in widget.stage_note.value
    run_and_wait(widget, wait_idle)
    from_layer = viewer.layers[f"{layer.name} mosaic"]
    np.testing.assert_allclose(from_layer.scale, (PIXEL, PIXEL))
    assert [str(u) for u in from_layer.units] == ["micrometer", "micrometer"]
    np.testing.assert_allclose(from_layer.translate, from_file.translate, atol=1e-6)
    np.testing.assert_allclose(from_layer.data, from_file.data, atol=1e-5)
    # exported from the layer: its tiles (an OME-Zarr's images, no files of their own) written beside the positions
    out = tmp_path / "export"
    out.mkdir()
    monkeypatch.setattr(stitch_widget, "choose_folder", lambda *a: str(out))
    widget.export_button.native.click()
    wait_idle(widget)
    back = read_mosaic(out / "TileConfiguration.registered.txt")
    np.testing.assert_array_equal(back.tiles.compute(), sample.tiles)
    found = outline_origins(viewer, layer.name)
    np.testing.assert_allclose(back.positions, found, atol=0.01, rtol=0)
    # the tile layer removed, its tiles cannot be written: said so, nothing written
    errors = []
    monkeypatch.setattr("napari.utils.notifications.show_error", errors.append)
    viewer.layers.remove(layer)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(stitch_widget, "choose_folder", lambda *a: str(empty))
    widget.export_button.native.click()
    assert errors and "layer was removed" in errors[0] and list(empty.iterdir()) == [] and not widget.runner.busy
    # a plain layer with no stage positions keeps the grid's fields
    viewer.add_image(np.zeros((4, *TILE), np.float32), name="plain")
    widget.layer.value = viewer.layers["plain"]
    assert shown(widget.grid_shape) and shown(widget.overlap) and "grid" in widget.stage_note.value


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda folder: folder / "missing.ome.tif", "does not exist"),
        (lambda folder: (folder / "notes.txt").write_text("hello\n") and folder / "notes.txt", "notes.txt, line 1"),
        (lambda folder: tifffile.imwrite(folder / "plain.tif", np.zeros((2, 8, 8), np.uint8)) or folder / "plain.tif",
         "without OME-XML"),
        (lambda folder: write_ome_zarr(np.zeros((8, 8)), folder / "one.zarr"), "not a collection"),
        (lambda folder: (folder / "broken.ome.tif").write_bytes(b"not a TIFF") and folder / "broken.ome.tif",
         "expected a TIFF image"),
        (lambda folder: "", "choose a microscope file"),
    ],
)  # fmt: skip
def test_a_bad_file_is_one_notification_and_no_layer(viewer_and_widget, wait_idle, tmp_path, monkeypatch, make,
                                                     message):  # fmt: skip
    viewer, widget = viewer_and_widget
    errors = []
    monkeypatch.setattr("napari.utils.notifications.show_error", errors.append)
    widget.source.value = FROM_FILE
    widget.microscope_file.line_edit.value = str(make(tmp_path))
    widget.run_button.native.click()  # read in the background: the error comes as the run's
    wait_idle(widget)
    assert len(errors) == 1 and message in errors[0], errors
    assert "Traceback" not in errors[0] and not widget.runner.busy and len(viewer.layers) == 0
    assert widget.status.value.startswith("Failed") and not widget.export_button.enabled
