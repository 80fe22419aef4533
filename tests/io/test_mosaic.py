"""read_mosaic and the mosaic writers: tiles with their stage positions, from OME-TIFF, OME-Zarr and Fiji's files."""

import json

import numpy as np
import pytest
import tifffile
import zarr

from napari_gridmip import read_mosaic, write_ome_zarr, write_tile_configuration
from napari_gridmip.io import TileMosaic

# ome-types' pydantic models warn of pydantic 2's deprecations at their first use
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pydantic")
RNG = np.random.default_rng(7)
# stage origins in pixels, (y, x): fractional, negative, beyond float32's 0.01 px
POSITIONS = np.array([[0.0, 0.0], [0.25, 90.125], [-80.5, 1.75], [-79.75, 91.0], [123456.789, -0.001]])


def tiles_of(n=5, shape=(6, 8), dtype=np.uint16):
    return RNG.integers(0, 60000, size=(n, *shape)).astype(dtype)


def write_ome_tiff(path, tiles, positions, *, size=(0.5, 0.25), unit="µm", size_unit="µm", axes="YX", stage=False):
    """One series per tile; positions (pixels) written in ``unit`` through the physical size (µm)."""
    factor = {"µm": 1.0, "nm": 1e3, "mm": 1e-3, "pixel": None}[unit]
    size_factor = {"µm": 1.0, "nm": 1e3, "mm": 1e-3}[size_unit]
    with tifffile.TiffWriter(path, ome=True) as tif:
        for k, (tile, position) in enumerate(zip(tiles, positions)):
            lengths = position if factor is None else position * np.asarray(size[-len(position) :]) * factor
            planes = int(np.prod([n for a, n in zip(axes, tile.shape) if a not in "YX"]))
            metadata = {"axes": axes, "Name": f"tile {k}"}
            for axis, value in zip("ZYX"[3 - len(size) :], size):
                metadata[f"PhysicalSize{axis}"] = value * size_factor
                metadata[f"PhysicalSize{axis}Unit"] = size_unit
            place = {}
            for axis, value in zip("ZYX"[3 - len(position) :], lengths):
                place[f"Position{axis}"] = [float(value)] * planes
                place[f"Position{axis}Unit"] = [unit] * planes
            if not stage:  # else no plane positions: the test puts a StageLabel in the OME-XML
                metadata["Plane"] = place
            tif.write(tile, metadata=metadata)


def test_ome_tiff_positions_names_and_pixel_size(tmp_path):
    tiles = tiles_of()
    path = tmp_path / "scan.ome.tif"
    write_ome_tiff(path, tiles, POSITIONS)
    mosaic = read_mosaic(path)
    assert isinstance(mosaic, TileMosaic)
    assert hasattr(mosaic.tiles, "dask") and mosaic.tiles.shape == tiles.shape and mosaic.tiles.dtype == np.uint16
    np.testing.assert_array_equal(mosaic.tiles.compute(), tiles)
    np.testing.assert_allclose(mosaic.positions, POSITIONS, atol=0.01, rtol=0)
    assert mosaic.positions.dtype == np.float64
    assert mosaic.names == [f"tile {k}" for k in range(5)]
    assert mosaic.pixel_size == (0.5, 0.25)


@pytest.mark.parametrize(("unit", "size_unit"), [("nm", "µm"), ("mm", "µm"), ("µm", "nm"), ("pixel", "mm")])
def test_ome_tiff_units(tmp_path, unit, size_unit):
    path = tmp_path / "scan.ome.tif"
    write_ome_tiff(path, tiles_of(), POSITIONS, unit=unit, size_unit=size_unit)
    mosaic = read_mosaic(path)
    np.testing.assert_allclose(mosaic.positions, POSITIONS, atol=0.01, rtol=0)
    np.testing.assert_allclose(mosaic.pixel_size, (0.5, 0.25), rtol=1e-12)


def test_ome_tiff_channels_and_3d(tmp_path):
    # channels: (n, C, Y, X); tifffile stores "CYX"
    tiles = tiles_of(3, (2, 6, 8))
    write_ome_tiff(tmp_path / "c.ome.tif", tiles, POSITIONS[:3], axes="CYX")
    mosaic = read_mosaic(tmp_path / "c.ome.tif")
    assert mosaic.tiles.shape == (3, 2, 6, 8)
    np.testing.assert_array_equal(mosaic.tiles.compute(), tiles)
    # 3D with channels stored Z first ("ZCYX"): read back as (n, C, Z, Y, X), positions (z, y, x) from PositionZ
    stored = tiles_of(3, (4, 2, 6, 8))
    positions = np.column_stack([[0.0, 2.5, -1.0], POSITIONS[:3]])
    write_ome_tiff(tmp_path / "z.ome.tif", stored, positions, size=(2.0, 0.5, 0.25), axes="ZCYX")
    mosaic = read_mosaic(tmp_path / "z.ome.tif")
    assert mosaic.tiles.shape == (3, 2, 4, 6, 8) and mosaic.pixel_size == (2.0, 0.5, 0.25)
    np.testing.assert_array_equal(mosaic.tiles.compute(), stored.transpose(0, 2, 1, 3, 4))
    np.testing.assert_allclose(mosaic.positions, positions, atol=0.01, rtol=0)


def test_ome_tiff_stage_label_and_the_pixel_size_option(tmp_path):
    from ome_types import from_xml, to_xml
    from ome_types.model import StageLabel

    tiles = tiles_of(2)
    path = tmp_path / "stage.ome.tif"
    write_ome_tiff(path, tiles, POSITIONS[:2], stage=True)
    with tifffile.TiffFile(path) as tif:
        ome = from_xml(tif.ome_metadata)
    for image, (y, x) in zip(ome.images, POSITIONS[:2]):  # in mm, no PhysicalSize: pixel_size= must say it
        image.stage_label = StageLabel(name="p", x=x * 0.25e-3, y=y * 0.5e-3, x_unit="mm", y_unit="mm")
        image.pixels.physical_size_x = image.pixels.physical_size_y = None
    tifffile.tiffcomment(path, to_xml(ome).encode())
    with pytest.raises(ValueError, match="no PhysicalSize .* pass pixel_size="):
        read_mosaic(path)
    mosaic = read_mosaic(path, pixel_size=(0.5, 0.25))
    np.testing.assert_allclose(mosaic.positions, POSITIONS[:2], atol=0.01, rtol=0)
    assert mosaic.pixel_size == (0.5, 0.25)
    np.testing.assert_array_equal(mosaic.tiles.compute(), tiles)


def test_ome_tiff_errors(tmp_path):
    tifffile.imwrite(tmp_path / "plain.tif", tiles_of(1)[0])
    with pytest.raises(ValueError, match="TIFF without OME-XML"):
        read_mosaic(tmp_path / "plain.tif")
    path = tmp_path / "unplaced.ome.tif"
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(tiles_of(1)[0], metadata={"axes": "YX", "Name": "nowhere"})
    with pytest.raises(ValueError, match="'nowhere' has no stage position"):
        read_mosaic(path)
    with tifffile.TiffWriter(tmp_path / "t.ome.tif", ome=True) as tif:
        tif.write(tiles_of(1, (3, 6, 8))[0], metadata={"axes": "TYX"})
    with pytest.raises(ValueError, match="3 time points"):
        read_mosaic(tmp_path / "t.ome.tif")


def test_tile_configuration_round_trip_2d_and_3d(tmp_path):
    tiles = tiles_of()
    names = [f"tile_{k}.tif" for k in range(5)]
    for name, tile in zip(names, tiles):
        tifffile.imwrite(tmp_path / name, tile)
    path = write_tile_configuration(names, POSITIONS, tmp_path / "TileConfiguration.registered.txt")
    text = path.read_text()
    assert "dim = 2" in text and "tile_1.tif; ; (90.125, 0.25)" in text  # x first, as Fiji reads it
    for source in (path, tmp_path):  # the file, or its folder
        mosaic = read_mosaic(source)
        np.testing.assert_array_equal(mosaic.positions, POSITIONS)  # every digit written
        assert mosaic.names == names and mosaic.pixel_size is None
        np.testing.assert_array_equal(mosaic.tiles.compute(), tiles)
    stacks = tiles_of(2, (3, 6, 8))
    (tmp_path / "sub").mkdir()
    for k, stack in enumerate(stacks):
        tifffile.imwrite(tmp_path / "sub" / f"s{k}.tif", stack, photometric="minisblack")
    positions = np.array([[0.0, 1.5, 2.25], [-3.125, 4.0, 5.0]])
    write_tile_configuration(["sub/s0.tif", "sub/s1.tif"], positions, tmp_path / "TileConfiguration.txt")
    assert "(2.25, 1.5, 0.0)" in (tmp_path / "TileConfiguration.txt").read_text()
    mosaic = read_mosaic(tmp_path / "TileConfiguration.txt", pixel_size=0.5)
    np.testing.assert_array_equal(mosaic.positions, positions)
    assert mosaic.tiles.shape == (2, 3, 6, 8) and mosaic.pixel_size == (0.5, 0.5, 0.5)
    np.testing.assert_array_equal(mosaic.tiles.compute(), stacks)


def test_tile_configuration_as_fiji_writes_it(tmp_path):
    # Fiji's Stitching writes Java doubles; comments and blank lines anywhere
    tiles = tiles_of(2)
    for k, tile in enumerate(tiles):
        tifffile.imwrite(tmp_path / f"img_{k}.tif", tile)
    (tmp_path / "TileConfiguration.registered.txt").write_text(
        "# Define the number of dimensions we are working on\ndim = 2\n\n# Define the image coordinates\n"
        "img_0.tif; ; (0.0, 0.0)\n  img_1.tif;;(921.6000000000001,-3.4E-2)  \n"
    )
    mosaic = read_mosaic(tmp_path / "TileConfiguration.registered.txt")
    np.testing.assert_allclose(mosaic.positions, [[0, 0], [-0.034, 921.6]], atol=1e-9)


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("dim = 2\nmissing.tif; ; (0, 0)\n", FileNotFoundError, "'missing.tif'|missing.tif"),
        ("a.tif; ; (0, 0)\n", ValueError, "line 1: a tile before 'dim = 2'"),
        ("dim = 4\n", ValueError, "line 1: 'dim = 4'"),
        ("dim = 2\na.tif; (0, 0)\n", ValueError, "line 2: expected 'file; ; \\(x, y\\)'"),
        ("dim = 2\na.tif; ; (0, 0, 0)\n", ValueError, "line 2: dim = 2 needs 2 finite coordinates"),
        ("dim = 2\na.tif; ; (0, zero)\n", ValueError, "line 2: cannot read the coordinates"),
        ("dim = 2\nmultiseries = true\nscan.czi; 0; (0, 0)\n", ValueError, "multiseries = true.* not supported"),
        ("# nothing\ndim = 2\n", ValueError, "names no tile"),
        ("dim = 3\na.tif; ; (0, 0, 0)\n", ValueError, "no Z axis"),
    ],
)
def test_tile_configuration_errors(tmp_path, text, error, message):
    tifffile.imwrite(tmp_path / "a.tif", tiles_of(1)[0])
    (tmp_path / "TileConfiguration.txt").write_text(text)
    with pytest.raises(error, match=message):
        read_mosaic(tmp_path / "TileConfiguration.txt")


def test_write_tile_configuration_errors(tmp_path):
    with pytest.raises(ValueError, match=r"\(n, 2\) \(y, x\) or \(n, 3\)"):
        write_tile_configuration(["a"], [[1.0]], tmp_path / "T.txt")
    with pytest.raises(ValueError, match="2 names for 1 positions"):
        write_tile_configuration(["a", "b"], [[1.0, 2.0]], tmp_path / "T.txt")
    with pytest.raises(ValueError, match="cannot hold .* ';'"):
        write_tile_configuration(["a;b"], [[1.0, 2.0]], tmp_path / "T.txt")
    write_tile_configuration(["a"], [[1.0, 2.0]], tmp_path / "T.txt")
    with pytest.raises(ValueError, match="already exists"):
        write_tile_configuration(["a"], [[1.0, 2.0]], tmp_path / "T.txt")


def ngff_image(group, key, tile, *, scale, translation, axes, version):
    """One tile as an NGFF image, the metadata written by hand (0.4: zarr v2, at the top; 0.5: under "ome")."""
    image = group.create_group(key)
    image.create_array("0", shape=tile.shape, chunks=tile.shape, dtype=tile.dtype)[...] = tile
    transforms = [{"type": "scale", "scale": scale}, {"type": "translation", "translation": translation}]
    multiscale = {"axes": axes, "datasets": [{"path": "0", "coordinateTransformations": transforms}]}
    if version == "0.4":
        image.attrs["multiscales"] = [{**multiscale, "version": "0.4"}]
    else:
        image.attrs["ome"] = {"version": "0.5", "multiscales": [multiscale]}


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_ome_zarr_collection(tmp_path, version):
    tiles = tiles_of(3, (2, 6, 8))  # (n, C, Y, X), stored (c, z=1, y, x)
    root = zarr.open_group(str(tmp_path / "plate.zarr"), mode="w", zarr_format=2 if version == "0.4" else 3)
    axes = [{"name": "c", "type": "channel"}] + [{"name": a, "type": "space", "unit": "nanometer"} for a in "zyx"]
    for k in (2, 10, 1):  # natural order: 1, 2, 10
        position = POSITIONS[[1, 2, 10].index(k)]
        ngff_image(root, str(k), tiles[[1, 2, 10].index(k)][:, None], scale=[1, 1000, 500, 250],
                   translation=[0, 0, *(position * [500, 250])], axes=axes, version=version)  # fmt: skip
    root.create_group("OME")  # bioformats2raw's metadata group: no image, skipped
    mosaic = read_mosaic(tmp_path / "plate.zarr")
    assert mosaic.names == ["1", "2", "10"] and mosaic.pixel_size == (0.5, 0.25)
    np.testing.assert_allclose(mosaic.positions, POSITIONS[:3], atol=0.01, rtol=0)
    np.testing.assert_array_equal(mosaic.tiles.compute(), tiles)


def test_write_ome_zarr_and_read_back_as_a_collection(tmp_path):
    root = tmp_path / "tiles.zarr"
    zarr.open_group(str(root), mode="w")
    tiles = tiles_of(3)
    for k, (tile, position) in enumerate(zip(tiles, POSITIONS)):
        write_ome_zarr(tile, root / f"tile{k}", pixel_size=(0.5, 0.25), origin=position)
    mosaic = read_mosaic(root)
    np.testing.assert_allclose(mosaic.positions, POSITIONS[:3], atol=1e-9)
    np.testing.assert_array_equal(mosaic.tiles.compute(), tiles)
    assert mosaic.pixel_size == (0.5, 0.25)
    with pytest.raises(ValueError, match="one OME-Zarr image, not a collection"):
        read_mosaic(root / "tile0")


def test_write_ome_zarr_lazy_with_channels(tmp_path):
    import dask.array as da

    from napari_gridmip import read_array

    image = RNG.random((2, 700, 530)).astype(np.float32)
    path = write_ome_zarr(da.from_array(image, chunks=(1, 300, 300)), tmp_path / "m.ome.zarr", pixel_size=0.5,
                          origin=(-10, 4), axes="cyx", chunk=256, attributes={"by": "test"})  # fmt: skip
    np.testing.assert_array_equal(read_array(path).compute(), image)
    stored = json.loads((path / "zarr.json").read_text())["attributes"]
    meta = stored["ome"]["multiscales"][0]
    assert stored["by"] == "test" and zarr.open_array(str(path / "s0")).chunks == (1, 256, 256)
    transforms = meta["datasets"][0]["coordinateTransformations"]
    assert transforms == [{"type": "scale", "scale": [1.0, 0.5, 0.5]},
                          {"type": "translation", "translation": [0.0, -5.0, 2.0]}]  # fmt: skip
    assert [a.get("unit") for a in meta["axes"]] == [None, "micrometer", "micrometer"]
    with pytest.raises(ValueError, match="axes 'xy'"):
        write_ome_zarr(image[0], tmp_path / "bad.zarr", axes="xy")


def test_folder_pattern_on_its_grid(tmp_path):
    tiles = tiles_of(6)
    for k, tile in enumerate(tiles):
        tifffile.imwrite(tmp_path / f"tile_{k // 3}_{k % 3}.tif", tile)
    mosaic = read_mosaic(tmp_path, pattern="tile_{row}_{col}.tif", overlap=0.25)
    grid = np.array([[r, c] for r in range(2) for c in range(3)])
    np.testing.assert_allclose(mosaic.positions, grid * [4.5, 6.0])  # tiles 6x8, a quarter overlapping
    assert mosaic.names[1] == "tile_0_1.tif" and mosaic.pixel_size is None
    np.testing.assert_array_equal(mosaic.tiles.compute(), tiles)
    tifffile.imwrite(tmp_path / "img_0.tif", tiles[0])
    with pytest.raises(ValueError, match="numbers the tiles by acquisition"):
        read_mosaic(tmp_path, pattern="img_{index}.tif", overlap=0.1)
    with pytest.raises(ValueError, match="pattern= and overlap= go together"):
        read_mosaic(tmp_path, pattern="tile_{row}_{col}.tif")
    with pytest.raises(ValueError, match=r"overlap must lie in \[0, 1\)"):
        read_mosaic(tmp_path, pattern="tile_{row}_{col}.tif", overlap=1.5)


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_mosaic(tmp_path / "nope.ome.tif")
    with pytest.raises(ValueError, match="folder without TileConfiguration.registered.txt or TileConfiguration.txt"):
        read_mosaic(tmp_path)
    (tmp_path / "scan.czi").write_bytes(b"\0")
    with pytest.raises(ValueError, match="expected an OME-TIFF .* TileConfiguration"):
        read_mosaic(tmp_path / "scan.czi")
    zarr.open_group(str(tmp_path / "empty.zarr"), mode="w")
    with pytest.raises(ValueError, match="no child group is an OME-Zarr image"):
        read_mosaic(tmp_path / "empty.zarr")
    with pytest.raises(ValueError, match="pixel_size must be one positive number"):
        read_mosaic(tmp_path / "empty.zarr", pixel_size=(0.5, -1))


def test_napari_readers_carry_the_stage_positions(tmp_path):
    from napari_gridmip.io._napari import MOSAIC_KEY, get_mosaic_reader, get_reader

    tiles = tiles_of(3, (2, 6, 8))
    write_ome_tiff(tmp_path / "scan.ome.tif", tiles, POSITIONS[:3], axes="CYX")
    reader = get_mosaic_reader(str(tmp_path / "scan.ome.tif"))
    ((data, meta, kind),) = reader(str(tmp_path / "scan.ome.tif"))
    assert kind == "image" and data.shape == (3, 2, 6, 8) and meta["name"] == "scan.ome"
    assert meta["scale"] == [1.0, 1.0, 0.5, 0.25]
    stage = meta["metadata"][MOSAIC_KEY]
    np.testing.assert_allclose(stage["stage_positions"], POSITIONS[:3], atol=0.01, rtol=0)
    assert stage["names"] == ["tile 0", "tile 1", "tile 2"] and stage["pixel_size"] == (0.5, 0.25)
    # one series is one image, not a mosaic: napari's other readers take it; so do other text files
    tifffile.imwrite(tmp_path / "one.ome.tif", tiles[0], ome=True)
    (tmp_path / "notes.txt").write_text("dim = 2\n")
    assert get_mosaic_reader(str(tmp_path / "one.ome.tif")) is None
    assert get_mosaic_reader(str(tmp_path / "notes.txt")) is None
    names = [f"t{k}.tif" for k in range(2)]
    for name, tile in zip(names, tiles):
        tifffile.imwrite(tmp_path / name, tile[0])
    config = write_tile_configuration(names, POSITIONS[:2], tmp_path / "TileConfiguration.txt")
    ((data, meta, _),) = get_mosaic_reader(str(config))(str(config))
    assert "scale" not in meta and data.shape == (2, 6, 8)
    np.testing.assert_array_equal(meta["metadata"][MOSAIC_KEY]["stage_positions"], POSITIONS[:2])
    # an OME-Zarr collection through the *.zarr reader; a single image still opens as a pyramid
    root = tmp_path / "tiles.zarr"
    zarr.open_group(str(root), mode="w")
    for k in range(2):
        write_ome_zarr(tiles[k, 0], root / f"tile{k}", pixel_size=(0.5, 0.25), origin=POSITIONS[k])
    ((data, meta, _),) = get_reader(str(root))(str(root))
    np.testing.assert_allclose(meta["metadata"][MOSAIC_KEY]["stage_positions"], POSITIONS[:2], atol=1e-9)
    assert get_reader(str(root / "tile0")).__name__ == "read_ome_zarr"


def test_registration_from_an_ome_tiff(tmp_path):
    """The acquisition's positions, off by a few pixels, go straight into register_tiles."""
    from napari_gridmip import register_tiles

    scene = np.cumsum(np.cumsum(RNG.normal(size=(120, 150)), axis=0), axis=1)  # smooth structure to match on
    truth = np.array([[0, 0], [0, 70], [50, 0], [50, 70]], dtype=float)
    tiles = np.stack([scene[int(y) : int(y) + 64, int(x) : int(x) + 80] for y, x in truth]).astype(np.float32)
    stage = truth + [[0, 0], [2, -1], [-1, 3], [1, 1]]
    write_ome_tiff(tmp_path / "scan.ome.tif", tiles, stage, size=(0.65, 0.65), unit="nm")
    mosaic = read_mosaic(tmp_path / "scan.ome.tif")
    registration = register_tiles(mosaic.tiles, mosaic.positions, max_shift=8)
    found = registration.positions - registration.positions[0]
    np.testing.assert_allclose(found, truth, atol=0.1)
