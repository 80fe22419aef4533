"""The "Sparse volume (large)" sample, at a small size: sparse, only occupied chunks stored, cached, multiscale."""

import numpy as np
import pytest

from napari_gridmip._sample_data import sparse


def test_small_sparse_volume_is_written_once_with_only_occupied_chunks(tmp_path):
    levels, attrs = sparse.open_sparse_volume(256, folder=tmp_path)
    assert [lv.shape for lv in levels] == [(256, 256, 256)]
    volume = np.asarray(levels[0][...])
    assert volume.dtype == np.uint16
    occupied = volume > 0
    assert 0 < occupied.mean() <= 0.02
    assert attrs["occupied"] == occupied.mean()
    # only the chunks holding a voxel are in the store
    chunk_max = volume.reshape(4, 64, 4, 64, 4, 64).max(axis=(1, 3, 5))
    assert attrs["chunks_written"][0] == int((chunk_max > 0).sum()) < attrs["chunks_total"][0]
    assert levels[0].nchunks_initialized == attrs["chunks_written"][0]
    # the stored cells are the occupancy of 8^3 cells
    np.testing.assert_array_equal(attrs["cells"], occupied.reshape(32, 8, 32, 8, 32, 8).any(axis=(1, 3, 5)))
    # thin filaments: many occupied voxels have few occupied neighbours
    assert (occupied[1:-1, 1:-1, 1:-1] & ~occupied[2:, 1:-1, 1:-1] & ~occupied[:-2, 1:-1, 1:-1]).sum() > 1000
    # a second open reads the cache (same folder, no rewrite)
    path = next(tmp_path.glob("*.zarr"))
    stamp = path.stat().st_mtime_ns
    sparse.open_sparse_volume(256, folder=tmp_path)
    assert path.stat().st_mtime_ns == stamp


def test_the_sample_command_gives_a_multiscale_layer_of_lazy_levels(tmp_path, monkeypatch):
    """The sample command at the small size (one level; the slow test below takes 512^3, two levels)."""
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    [(levels, kwargs, kind)] = sparse.sparse_volume_sample(size=256)
    assert kind == "image" and kwargs["multiscale"] and [lv.shape for lv in levels] == [(256, 256, 256)]
    assert kwargs["metadata"]["gridmip_cells"]["cells"].shape == (32, 32, 32)
    assert np.asarray(levels[0][100]).shape == (256, 256)


@pytest.mark.slow  # writes a 512^3 sample (two levels)
def test_coarse_levels_are_strided_and_the_layer_is_multiscale(tmp_path, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    [(levels, kwargs, kind)] = sparse.sparse_volume_sample(size=512)
    assert kind == "image" and kwargs["multiscale"] and len(levels) == 2
    fine, coarse = np.asarray(levels[0][...]), np.asarray(levels[1][...])
    np.testing.assert_array_equal(coarse, fine[::2, ::2, ::2])
    assert "vanish" in kwargs["metadata"]["description"]
    cells = kwargs["metadata"]["gridmip_cells"]
    assert cells["cell"] == 8 and cells["cells"].shape == (64, 64, 64)
    # lazy views of the Zarr levels (napari's 2D slicing of a Zarr level read the whole depth of the view), not dask
    # (napari caches dask layers' chunks), whose chunk files the live view still reads directly
    import dask

    from napari_gridmip.core.occupancy.chunk_files import chunk_reader

    assert not any(dask.is_dask_collection(level) for level in levels)
    assert all(chunk_reader(level) is not None for level in levels)
    # napari's 2D view of the layer reads chunks, not the whole depth of a level
    import zarr
    from napari.components import ViewerModel

    reads = []
    getitem = zarr.Array.__getitem__
    monkeypatch.setattr(zarr.Array, "__getitem__", lambda self, key: reads.append(getitem(self, key).nbytes) or
                        getitem(self, key))  # fmt: skip
    viewer = ViewerModel()
    layer = viewer.add_image(levels, **kwargs)
    assert viewer.dims.ndisplay == 2 and layer._slice.image.raw.ndim == 2
    assert reads and max(reads) <= 64**3 * 2  # a chunk at most (a Zarr level: 256^3 in one read)


def test_registered_in_the_manifest():
    import importlib
    from pathlib import Path

    import yaml

    manifest = yaml.safe_load((Path(__file__).parents[2] / "napari.yaml").read_text())
    (entry,) = [s for s in manifest["contributions"]["sample_data"] if s["key"] == "sparse-volume"]
    assert entry["display_name"] == "Sparse volume (large)"
    (command,) = [c for c in manifest["contributions"]["commands"] if c["id"] == entry["command"]]
    module, name = command["python_name"].split(":")
    assert getattr(importlib.import_module(module), name) is sparse.sparse_volume_sample
