"""read_tiles: a folder of TIFF tiles named by a pattern, as one lazy stack."""

import numpy as np
import pytest
import tifffile

from napari_gridmip import read_tiles


def write(folder, names, shape=(6, 8), dtype=np.uint16):
    rng = np.random.default_rng(0)
    data = {}
    for name in names:
        data[name] = rng.integers(0, 1000, size=shape).astype(dtype)
        tifffile.imwrite(folder / name, data[name])
    return data


def test_row_col_pattern_in_grid_order(tmp_path):
    names = [f"tile_{r}_{c}.tif" for r in (1, 2) for c in (1, 2, 3)]  # numbered from 1
    data = write(tmp_path, names)
    (tmp_path / "notes.txt").write_text("ignored")
    out = read_tiles(tmp_path, "tile_{row}_{col}.tif")
    assert out.tiles.shape == (6, 6, 8) and out.tiles.dtype == np.uint16
    assert out.index is None
    assert out.grid_index.tolist() == [[r, c] for r in range(2) for c in range(3)]
    assert [p.name for p in out.paths] == names
    np.testing.assert_array_equal(out.tiles.compute(), np.stack([data[n] for n in names]))


def test_index_pattern_with_width(tmp_path):
    names = [f"img_{i:03}.tif" for i in range(4)]
    write(tmp_path, names + ["img_12.tif"])  # not three digits: not a tile
    out = read_tiles(tmp_path, "img_{index:03}.tif")
    assert out.grid_index is None and out.index.tolist() == [0, 1, 2, 3] and out.tiles.shape[0] == 4
    with pytest.raises(ValueError, match="missing between index 0 and 12"):  # any digits: 12 counts
        read_tiles(tmp_path, "img_{index}.tif")


def test_lazy(tmp_path):
    write(tmp_path, [f"t{c}_{r}.tif" for r in range(2) for c in range(2)])
    out = read_tiles(tmp_path, "t{col}_{row}.tif")
    assert len(out.tiles.dask) >= 4 and hasattr(out.tiles, "compute")  # a graph, nothing read yet
    assert out.grid_index.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]  # rows first whatever the name's order


@pytest.mark.parametrize(
    ("names", "pattern", "message"),
    [
        (["tile_0_0.tif", "tile_0_1.tif", "tile_1_1.tif"], "tile_{row}_{col}.tif", r"1 tile\(s\) missing .*_1_0.tif"),
        (["img_0.tif", "img_2.tif"], "img_{index}.tif", "missing between index 0 and 2: img_1.tif"),
        ([], "tile_{row}_{col}.tif", "no file .* matches"),
        (["a_1.tif"], "a_{row}.tif", "needs both {row} and {col}"),
        (["a_1.tif"], "a_{tile}.tif", "unknown field {tile}"),
        (["a_1.tif"], "a.tif", "has no field"),
        (["a_1_1.tif"], "a_{index}_{row}.tif", "cannot be combined"),
        (["a_1.tif", "a_01.tif"], "a_{index}.tif", "are the same tile"),
    ],
)
def test_errors(tmp_path, names, pattern, message):
    write(tmp_path, names)
    with pytest.raises(ValueError, match=message):
        read_tiles(tmp_path, pattern)


def test_mixed_shapes_and_missing_folder(tmp_path):
    write(tmp_path, ["a_0.tif"], shape=(6, 8))
    write(tmp_path, ["a_1.tif"], shape=(6, 9))
    with pytest.raises(ValueError, match=r"tiles differ: 'a_0.tif' is \(6, 8\) uint16, 'a_1.tif' is \(6, 9\)"):
        read_tiles(tmp_path, "a_{index}.tif")
    with pytest.raises(ValueError, match="is not a folder"):
        read_tiles(tmp_path / "nope", "a_{index}.tif")
