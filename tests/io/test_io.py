"""Lazy readers, the OME-Zarr pyramid writer, and napari's reader/writer contributions."""

import numpy as np
import pytest

from napari_gridmip import occupancy_mipmap, read_array, write_mipmap


@pytest.fixture
def volume():
    rng = np.random.default_rng(0)
    return (rng.random((2, 19, 40, 33)) > 0.99).astype(np.uint16) * 300


def test_block_writer_on_a_volume_larger_than_a_block(tmp_path):
    """Levels 0-2 written by the block tasks, 3-7 assembled from them, 8+ from level 7: all exact."""
    import dask.array as da

    rng = np.random.default_rng(6)
    volume = rng.random((300, 140, 260), dtype=np.float32) > 0.99995
    out = write_mipmap(da.from_array(volume, chunks=(100, 70, 130)), tmp_path / "big.ome.zarr")
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    node = next(iter(Reader(parse_url(str(out)))()))
    expected = occupancy_mipmap(volume)
    assert len(node.data) == len(expected) == 10
    for level, reference in zip(node.data, expected):
        np.testing.assert_array_equal(np.asarray(level), np.asarray(reference))


def test_readers_are_lazy_and_exact(tmp_path, volume):
    import tifffile
    import zarr

    np.save(tmp_path / "v.npy", volume)
    tifffile.imwrite(tmp_path / "v.tif", volume)
    zarr.save_array(str(tmp_path / "v.zarr"), volume)
    for name in ("v.npy", "v.tif", "v.zarr"):
        lazy = read_array(tmp_path / name)
        assert type(lazy).__module__.startswith("dask"), name
        assert lazy.shape == volume.shape and lazy.dtype == volume.dtype
        np.testing.assert_array_equal(lazy.compute(), volume)


@pytest.mark.parametrize("lazy", [True, False], ids=["dask", "in-memory"])
def test_write_mipmap_is_standard_ome_zarr(tmp_path, volume, lazy):
    import dask.array as da
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    out = write_mipmap(
        da.from_array(volume, chunks=(1, 10, 20, 33)), tmp_path / "p.ome.zarr", threshold=100, scale=(2, 1, 0.5)
    )
    node = next(iter(Reader(parse_url(str(out)))()))
    expected = occupancy_mipmap(volume, threshold=100)
    assert len(node.data) == len(expected)
    for level, reference in zip(node.data, expected):
        np.testing.assert_array_equal(np.asarray(level), np.asarray(reference))
    transforms = node.metadata["coordinateTransformations"]
    for k, level in enumerate(transforms):
        by_type = {t["type"]: t for t in level}
        np.testing.assert_allclose(by_type["scale"]["scale"], [1, 2 * 2**k, 2**k, 0.5 * 2**k])
        # a level-k voxel's centre sits (2**k - 1) / 2 level-0 voxels in: the widget's placement
        np.testing.assert_allclose(
            by_type["translation"]["translation"], [0, *(np.array([2, 1, 0.5]) * (2**k - 1) / 2)]
        )
    assert [axis["name"] for axis in node.metadata["axes"]] == ["t", "z", "y", "x"]
    # level 0 reads back through read_array (OME-Zarr: level 0)
    np.testing.assert_array_equal(read_array(out).compute(), np.asarray(expected[0]))


def test_write_mipmap_leaves_nothing_behind_on_failure(tmp_path, volume):
    def failing(graphs):
        raise MemoryError("out of memory half-way")

    import dask.array as da

    with pytest.raises(MemoryError):
        write_mipmap(da.from_array(volume), tmp_path / "p.ome.zarr", compute=failing)
    assert list(tmp_path.iterdir()) == []
    write_mipmap(volume, tmp_path / "p.ome.zarr")
    with pytest.raises(ValueError, match="already exists"):
        write_mipmap(volume, tmp_path / "p.ome.zarr")
    write_mipmap(volume[:, :5], tmp_path / "p.ome.zarr", overwrite=True)
    assert read_array(tmp_path / "p.ome.zarr").shape == (2, 5, 40, 33)
    assert [p.name for p in tmp_path.iterdir()] == ["p.ome.zarr"]


def test_bad_paths_are_clear(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_array(tmp_path / "missing.npy")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"expected a \.npy, \.tif/\.tiff file or a Zarr folder"):
        read_array(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="folder .* does not exist"):
        write_mipmap(np.zeros((2, 2, 2)), tmp_path / "no" / "p.zarr")


def test_napari_reader_and_writer(tmp_path, volume):
    from napari_gridmip.io._napari import get_reader, write_mipmap_layer

    path = str(tmp_path / "saved.ome.zarr")
    meta = {"scale": (1.0, 2.0, 1.0, 0.5), "metadata": {"gridmip_threshold": 100}}
    assert write_mipmap_layer(path, volume, meta) == [path]
    reader = get_reader(path)
    assert reader is not None and get_reader(str(tmp_path)) is None
    ((data, layer_meta, kind),) = reader(path)
    assert kind == "image" and layer_meta["multiscale"]
    np.testing.assert_allclose(layer_meta["scale"], [1, 2, 1, 0.5])
    np.testing.assert_array_equal(np.asarray(data[0]), np.asarray(occupancy_mipmap(volume, threshold=100)[0]))


def test_the_writer_saves_level_0_of_a_multiscale_layer_block_by_block(tmp_path, volume, monkeypatch):
    """napari hands a writer a multiscale layer's MultiScaleData (np.asarray of it is the coarsest level); the
    reader's lazy levels are written through dask, block by block, never read whole."""
    from napari.layers._multiscale_data import MultiScaleData

    from napari_gridmip.io import _write
    from napari_gridmip.io._napari import read_ome_zarr, write_mipmap_layer

    source = write_mipmap(volume[0], tmp_path / "source.ome.zarr")
    ((levels, meta, _),) = read_ome_zarr(str(source))
    monkeypatch.setattr(_write, "_write_levels_in_memory", lambda *a: pytest.fail("read whole"))
    path = str(tmp_path / "saved.ome.zarr")
    assert write_mipmap_layer(path, MultiScaleData(levels), {"multiscale": True}) == [path]
    ((saved, _, _),) = read_ome_zarr(path)
    np.testing.assert_array_equal(np.asarray(saved[0]), np.asarray(levels[0]))


def test_napari_opens_the_pyramid(make_napari_viewer, tmp_path, volume):
    path = write_mipmap(volume[0], tmp_path / "p.ome.zarr", scale=(2, 1, 1))
    viewer = make_napari_viewer()
    (layer,) = viewer.open(str(path), plugin="napari-gridmip")
    # level 0 (19, 40, 33) is within COARSEST_SIDE: napari's 3D view shows it, so the layer holds it alone
    assert layer.multiscale and len(layer.data) == 1
    np.testing.assert_allclose(layer.scale, [2, 1, 1])
    viewer.dims.ndisplay = 3
    assert layer.data_level == 0


def test_reader_stops_at_a_level_napari_can_show_and_carries_the_cells(tmp_path, monkeypatch):
    """napari's 3D view shows the coarsest level: not the (1, 1, 1) one. Level 3 is the live view's 8^3 cells."""
    from types import SimpleNamespace

    from napari_gridmip._jobs import live_render
    from napari_gridmip._jobs.live_render import occupancy_cells, source_for_layer
    from napari_gridmip.io._napari import COARSEST_SIDE, _has_cells, read_ome_zarr

    rng = np.random.default_rng(3)
    volume = rng.random((600, 9, 21)) > 0.999  # levels 600, 300, 150, ..., 1 along z
    path = write_mipmap(volume, tmp_path / "long.ome.zarr")
    ((levels, meta, kind),) = read_ome_zarr(str(path))
    assert [level.shape[0] for level in levels] == [600, 300, 150] and 150 <= COARSEST_SIDE < 300
    # lazy views of the Zarr arrays (not dask: napari caches a dask layer's chunks), read where they are indexed
    from napari_gridmip.core.occupancy.chunk_files import zarr_behind
    from napari_gridmip.io.lazy import LazyLevel

    assert all(isinstance(level, LazyLevel) for level in levels)
    assert type(zarr_behind(levels[0])).__module__.startswith("zarr")
    np.testing.assert_array_equal(np.asarray(levels[0][:, 4][17]), volume[17, 4])
    stored = meta["metadata"]["gridmip_cells"]
    assert stored["cell"] == 8 and stored["threshold"] == 0.0 and stored["cells"].shape == (75, 2, 3)
    np.testing.assert_array_equal(np.asarray(stored["cells"]), occupancy_cells(volume, 0.0))
    # the live view takes them as they are: no pass over level 0
    monkeypatch.setattr(live_render, "occupancy_cells", lambda *args: pytest.fail("a pass over level 0"))
    layer = SimpleNamespace(
        multiscale=True, data=levels, scale=np.ones(3), translate=np.zeros(3), metadata=meta["metadata"]
    )
    source = source_for_layer(layer, (), 0.0)
    assert source.cell == 8 and np.array_equal(source.cells, np.asarray(stored["cells"]))
    assert not _has_cells("mosaic", levels)  # only write_mipmap's occupancy pyramids
    assert not _has_cells("occupancy", levels[:3])  # no level 3
    assert not _has_cells("occupancy", [*levels[:3], levels[2]])  # a level 3 of the wrong shape
