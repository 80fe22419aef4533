"""``napari-gridmip stitch`` on a microscope file (Fiji's TileConfiguration, an OME-TIFF): the tiles placed by the
file's stage positions, no grid; ``--tile-configuration`` writes the registered positions in Fiji's format beside
the mosaic; bad input is one line, a non-zero exit and nothing written."""

import csv

import numpy as np
import pytest
import tifffile
import zarr

from napari_gridmip import read_mosaic, write_tile_configuration
from tests.helpers import assert_one_line_error_and_nothing_written, run_cli

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pydantic")
PIXEL = 0.5  # micrometres


def run(*args, cwd):
    return run_cli("stitch", *args, cwd=cwd)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 2x2 mosaic (64 px tiles, 30% overlap, +-2 px stage errors) as TIFF tiles named in a TileConfiguration,
    and as an OME-TIFF whose series carry the stage positions in micrometres."""
    from napari_gridmip._sample_data.mosaic import make_mosaic

    folder = tmp_path_factory.mktemp("acquisition")
    sample = make_mosaic(grid_shape=(2, 2), tile_shape=(64, 64), overlap=0.3, stage_error=2, noise=0.0, seed=5)
    scans = folder / "scans"
    scans.mkdir()
    names = [f"field_{k}.tif" for k in range(4)]
    for name, tile in zip(names, sample.tiles):
        tifffile.imwrite(scans / name, tile)
    write_tile_configuration(names, sample.stage_positions, scans / "TileConfiguration.txt")
    with tifffile.TiffWriter(folder / "scan.ome.tif", ome=True) as tif:
        for k, (tile, (y, x)) in enumerate(zip(sample.tiles, sample.stage_positions)):
            tif.write(tile, metadata={
                "axes": "YX", "Name": f"field {k}", "PhysicalSizeX": PIXEL, "PhysicalSizeY": PIXEL,
                "Plane": {"PositionX": [x * PIXEL], "PositionY": [y * PIXEL]},
            })  # fmt: skip
    (folder / "notes.txt").write_text("not a tile configuration\n")
    return folder, sample, names


def test_tile_configuration_in_registered_configuration_out(files, tmp_path):
    from napari_gridmip import register_tiles

    folder, sample, names = files
    done = run(str(folder / "scans" / "TileConfiguration.txt"), "m.ome.zarr", "--tile-configuration", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pairs used" in done.stderr
    # beside the mosaic: the registered positions, each tile named by its path from there (nothing copied)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["TileConfiguration.registered.txt", "m.ome.zarr",
                                                          "m.ome.zarr.positions.csv"]  # fmt: skip
    registered = tmp_path / "TileConfiguration.registered.txt"
    lines = registered.read_text().splitlines()
    assert [line.split(";")[0] for line in lines[4:]] == [f"../{folder.name}/scans/{name}" for name in names]
    expected = register_tiles(sample.tiles, sample.stage_positions)
    back = read_mosaic(registered)
    np.testing.assert_allclose(back.positions, expected.positions, atol=0.01, rtol=0)
    np.testing.assert_array_equal(back.tiles.compute(), sample.tiles)
    # the mosaic spans the registered tiles (the fusion itself is checked against fuse_tiles in tests/io/test_cli.py)
    image, _ = _zarr_image(tmp_path / "m.ome.zarr")
    span = expected.positions.max(axis=0) + 64 - expected.positions.min(axis=0)
    assert np.all(np.abs(np.array(image.shape) - span) <= 2), (image.shape, span)
    # no grid: the CSV has no grid columns, and the tiles by their names in the file
    with open(tmp_path / "m.ome.zarr.positions.csv") as f:
        rows = list(csv.DictReader(f))
    assert not any(key.startswith("grid_") for key in rows[0]) and [r["name"] for r in rows] == names
    refined = np.array([[float(r["refined_y"]), float(r["refined_x"])] for r in rows])
    np.testing.assert_allclose(refined - refined[0], expected.positions - expected.positions[0], atol=1e-3)
    assert np.all(refined.min(axis=0) > -1) and np.all(refined.min(axis=0) < 1)  # in the mosaic's pixels


def _zarr_image(path):
    """(level 0, its multiscale metadata) of an OME-Zarr image."""
    attrs = zarr.open_group(str(path), mode="r").attrs.asdict()
    multiscale = attrs.get("ome", attrs)["multiscales"][0]
    return zarr.open_group(str(path), mode="r")[multiscale["datasets"][0]["path"]][:], multiscale


def test_ome_tiff_in_micrometres_with_its_tiles_written(files, tmp_path):
    folder, sample, _ = files
    out = tmp_path / "out"
    out.mkdir()
    done = run(str(folder / "scan.ome.tif"), "out/m.ome.zarr", "--tile-configuration", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # the series are no files of their own: written beside the configuration, which names them
    tiles = [f"tile_00{k}.tif" for k in range(4)]
    assert sorted(p.name for p in out.iterdir()) == ["TileConfiguration.registered.txt", "m.ome.zarr",
                                                     "m.ome.zarr.positions.csv", *tiles]  # fmt: skip
    back = read_mosaic(out / "TileConfiguration.registered.txt")
    np.testing.assert_array_equal(back.tiles.compute(), sample.tiles)
    found = back.positions - back.positions[0]
    np.testing.assert_allclose(found, sample.true_positions - sample.true_positions[0], atol=0.25)
    image, multiscale = _zarr_image(out / "m.ome.zarr")
    assert [axis.get("unit") for axis in multiscale["axes"]] == ["micrometer", "micrometer"]
    scale, translation = multiscale["datasets"][0]["coordinateTransformations"]
    assert scale["scale"] == [PIXEL, PIXEL]
    with open(out / "m.ome.zarr.positions.csv") as f:
        first = next(csv.DictReader(f))
    origin = back.positions[0] - [float(first["refined_y"]), float(first["refined_x"])]  # the mosaic's pixel 0
    np.testing.assert_allclose(translation["translation"], origin * PIXEL, atol=1e-3)
    assert image.shape[0] > 64 and "gm.read_mosaic(" in str(zarr.open_group(str(out / "m.ome.zarr")).attrs.asdict())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{folder}/scans/TileConfiguration.txt", "m.ome.zarr", "--grid", "2", "2"], "leave out --grid"),
        (["{folder}/scan.ome.tif", "m.ome.zarr", "--overlap", "0.3"], "leave out --overlap"),
        (["{folder}/missing.ome.tif", "m.ome.zarr"], "does not exist"),
        (["{folder}/notes.txt", "m.ome.zarr"], "notes.txt, line 1"),
        (["{folder}/scans", "m.ome.zarr", "--pattern", "field_{{index}}.tif", "--grid", "2", "2"],
         "--overlap is required"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(files, tmp_path, args, message):
    folder = files[0]
    done = run(*(a.format(folder=folder) for a in args), cwd=tmp_path)
    assert_one_line_error_and_nothing_written(done, message, tmp_path)


def test_an_existing_registered_configuration_is_kept(files, tmp_path):
    (tmp_path / "TileConfiguration.registered.txt").write_text("mine")
    done = run(str(files[0] / "scan.ome.tif"), "m.ome.zarr", "--tile-configuration", cwd=tmp_path)
    assert done.returncode == 2 and "already exists" in done.stderr and "Traceback" not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["TileConfiguration.registered.txt"]
    assert (tmp_path / "TileConfiguration.registered.txt").read_text() == "mine"
