"""tools/swc_to_volume.py, which drew docs/occupancy.md's real sparse volume: hand-made SWC files against the voxels
they must give."""

import importlib.util
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

TOOL = Path(__file__).parents[1] / "tools" / "swc_to_volume.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("swc_to_volume", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["swc_to_volume"] = module
    spec.loader.exec_module(module)
    return module


def write_swc(path, rows, header="#n,type,x,y,z,radius,parent"):
    path.write_text(header + "\n" + "\n".join(" ".join(str(v) for v in row) for row in rows) + "\n\n")
    return path


def test_read_swc_maps_ids_to_rows(tmp_path, tool):
    # ids out of order and not consecutive; 9's parent 4 is not in the file (a root)
    path = write_swc(tmp_path / "a.swc", [(7, 2, 1.0, 2.0, 3.0, 80, 3), (3, 1, 0.0, 0.0, 0.0, 40, -1),
                                          (9, 2, 5.0, 5.0, 5.0, 1, 4), (12, 2, 1.5, 2, 3, 1, 7)])  # fmt: skip
    points, parents = tool.read_swc(path)
    np.testing.assert_array_equal(points, [[1, 2, 3], [0, 0, 0], [5, 5, 5], [1.5, 2, 3]])
    np.testing.assert_array_equal(parents, [1, -1, -1, 0])
    assert tool.read_swc(write_swc(tmp_path / "empty.swc", []))[0].shape == (0, 3)


def test_segments_are_drawn_without_gaps(tool):
    """Each segment's voxels form one 26-connected chain from one end's voxel to the other's, and stay within
    half a voxel's diagonal of the segment."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        a, b = rng.uniform(0, 12, (2, 3))
        voxels = tool.segment_voxels(np.array([a, b]), np.array([-1, 0]))
        assert {tuple(np.floor(a + 0.5).astype(int)), tuple(np.floor(b + 0.5).astype(int))} <= set(map(tuple, voxels))
        # connected: a flood fill over the 26 neighbours from the first voxel reaches them all
        left, todo = set(map(tuple, voxels[1:])), [tuple(voxels[0])]
        while todo:
            z, y, x = todo.pop()
            for step in itertools.product((-1, 0, 1), repeat=3):
                neighbour = (z + step[0], y + step[1], x + step[2])
                if neighbour in left:
                    left.remove(neighbour)
                    todo.append(neighbour)
        assert not left
        direction = (b - a) / np.linalg.norm(b - a)
        offsets = voxels - a
        distance = np.linalg.norm(offsets - (offsets @ direction)[:, None] * direction, axis=1)
        assert distance.max() <= np.sqrt(3) / 2 + 1e-9
    # an axis-aligned segment is exactly its voxels
    voxels = tool.segment_voxels(np.array([[0.0, 1.0, 2.0], [0.0, 1.0, 6.0]]), np.array([-1, 0]))
    np.testing.assert_array_equal(voxels, [[0, 1, x] for x in range(2, 7)])


def test_neurons_at_a_finer_voxel_size(tmp_path, tool):
    """25 um coordinates drawn at 10 um; neuron i has the value i + 1, the larger where two meet."""
    first = write_swc(tmp_path / "a.swc", [(1, 1, 0, 0, 0, 1, -1), (2, 2, 2, 0, 0, 1, 1)])  # x 0..5 at 10 um
    second = write_swc(tmp_path / "b.swc", [(1, 1, 2, 0, 0, 1, -1), (2, 2, 2, 0.8, 0, 1, 1)])  # y 0..2 at x 5
    coords, values = tool.neuron_voxels([first, second], voxel_um=10, source_um=25)
    expected = {(x, 0, 0): 1 for x in range(6)} | {(5, y, 0): 2 for y in range(3)}
    assert dict(zip(map(tuple, coords), values)) == expected
    assert values.dtype == np.uint8


def test_written_volume_holds_only_the_occupied_chunks(tmp_path, tool):
    import zarr

    coords = np.array([[0, 0, 0], [1, 2, 3], [40, 9, 1]])
    path = tmp_path / "v.zarr"
    assert tool.write_volume(path, coords, np.array([5, 6, 7], np.uint8), (50, 20, 30), chunk=16) == 2
    array = zarr.open_array(str(path), mode="r")
    expected = np.zeros((50, 20, 30), np.uint8)
    expected[tuple(coords.T)] = [5, 6, 7]
    np.testing.assert_array_equal(array[...], expected)
    assert array.nchunks_initialized == 2 and array.nchunks == 4 * 2 * 2
    with pytest.raises(ValueError, match="outside the shape"):
        tool.write_volume(tmp_path / "w.zarr", np.array([[50, 0, 0]]), np.array([1], np.uint8), (50, 20, 30))


def test_command_line(tmp_path, tool, capsys):
    import zarr

    folder = tmp_path / "swc"
    folder.mkdir()
    write_swc(folder / "n1.swc", [(1, 1, 1, 1, 1, 1, -1), (2, 2, 3, 1, 1, 1, 1)])
    tool.main([str(folder), str(tmp_path / "out.zarr"), "--extent", "8", "4", "4", "--source", "here"])
    array = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    assert array.shape == (20, 10, 10) and int((array[...] > 0).sum()) == 6  # x 2.5..7.5 -> voxels 3..8 (half up)
    assert array.attrs["neurons"] == {"n1.swc": 1} and array.attrs["source"] == "here"
    assert "6 voxels occupied" in capsys.readouterr().out
