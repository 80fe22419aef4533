"""Chunks read from a local Zarr v3 array's files equal Zarr's own reads; other layouts go through Zarr."""

import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, TransposeCodec, ZstdCodec

from napari_gridmip import occupancy_mipmap, render_view
from napari_gridmip.core.occupancy.chunk_files import chunk_reader, zarr_behind
from napari_gridmip.core.occupancy.raycast import ChunkCache

SHAPE, CHUNKS = (40, 37, 21), (16, 16, 8)  # edge chunks along every axis


def volume(dtype="uint16"):
    rng = np.random.default_rng(0)
    out = np.full(SHAPE, 7, dtype)  # the fill value: chunks equal to it are not written
    out[3:20, 2:30, 1:12] = rng.integers(0, 1000, (17, 28, 11))
    out[33:, 35:, 18:] = rng.integers(0, 1000, (7, 2, 3))
    return out


def write(path, data, **options):
    array = zarr.create_array(store=str(path), shape=data.shape, chunks=CHUNKS, dtype=data.dtype, fill_value=7,
                              **options)  # fmt: skip
    array[...] = data
    return zarr.open_array(str(path), mode="r")


LAYOUTS = {
    "zstd": {},
    "zstd with checksum": {"compressors": ZstdCodec(level=3, checksum=True)},
    "gzip": {"compressors": GzipCodec()},
    "blosc": {"compressors": BloscCodec()},
    "none": {"compressors": None},
    "big-endian": {"serializer": BytesCodec(endian="big")},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_chunk_equals_zarrs_read(tmp_path, layout):
    data = volume()
    array = write(tmp_path / "a.zarr", data, **LAYOUTS[layout])
    read = chunk_reader(array)
    assert read is not None
    grid = [-(-n // c) for n, c in zip(SHAPE, CHUNKS)]
    missing = 0
    for index in np.ndindex(*grid):
        region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, CHUNKS, SHAPE))
        got = read(index)
        assert got.shape == CHUNKS and got.dtype == data.dtype
        np.testing.assert_array_equal(got[tuple(slice(0, r.stop - r.start) for r in region)], data[region])
        missing += not (tmp_path / "a.zarr" / "c" / "/".join(map(str, index))).exists()
    assert 0 < missing < np.prod(grid)  # some chunks were never written: the fill value


@pytest.mark.parametrize("dtype, fill", [("uint8", 3), ("float32", np.nan), ("int16", -5)])
def test_other_dtypes_and_fill_values(tmp_path, dtype, fill):
    data = np.full(SHAPE, fill, dtype)
    data[3:20, 2:30, 1:12] = np.random.default_rng(2).integers(0, 100, (17, 28, 11))
    array = zarr.create_array(store=str(tmp_path / "d.zarr"), shape=SHAPE, chunks=CHUNKS, dtype=dtype,
                              fill_value=fill)  # fmt: skip
    array[...] = data
    read = chunk_reader(zarr.open_array(str(tmp_path / "d.zarr"), mode="r"))
    for index in [(0, 0, 0), (1, 1, 1), (2, 2, 2)]:  # written, written, never written (the fill value)
        region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, CHUNKS, SHAPE))
        got = read(index)[tuple(slice(0, r.stop - r.start) for r in region)]
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, data[region])
    assert not (tmp_path / "d.zarr" / "c" / "2" / "2" / "2").exists()


def test_other_layouts_have_no_reader(tmp_path):
    data = volume()
    assert chunk_reader(data) is None
    assert chunk_reader(da.from_array(data, chunks=CHUNKS)) is None
    assert chunk_reader(write(tmp_path / "v2.zarr", data, zarr_format=2)) is None
    assert chunk_reader(write(tmp_path / "shards.zarr", data, shards=(32, 32, 16))) is None
    transposed = write(tmp_path / "t.zarr", data, filters=[TransposeCodec(order=(2, 1, 0))])
    assert chunk_reader(transposed) is None
    in_memory = zarr.create_array(store={}, shape=SHAPE, chunks=CHUNKS, dtype="uint16")
    assert chunk_reader(in_memory) is None


def test_a_render_through_the_files_equals_the_in_memory_one(tmp_path):
    data = np.zeros(SHAPE, np.uint16)
    data[3:20, 2:30, 1:12] = volume()[3:20, 2:30, 1:12]
    array = zarr.create_array(store=str(tmp_path / "r.zarr"), shape=SHAPE, chunks=CHUNKS, dtype="uint16")
    array[...] = data
    array = zarr.open_array(str(tmp_path / "r.zarr"), mode="r")
    cache = ChunkCache(array, capacity=1 << 20)
    assert cache._reader is not None
    cells = np.asarray(occupancy_mipmap(data)[3])
    rng = np.random.default_rng(1)
    origins = rng.uniform(-5, 45, (300, 3))
    directions = np.array(SHAPE) / 2 - origins + rng.normal(0, 4, (300, 3))
    got = render_view(array, cells, origins, directions, cache=cache)
    want = render_view(data, cells, origins, directions)
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.depth, want.depth)
    assert 0 < got.chunks_read < got.chunks_total and np.sum(got.values > 0) > 30


def test_a_lazy_view_of_a_zarr_array_chunk_for_chunk_is_read_from_the_files(tmp_path):
    data = volume()
    array = write(tmp_path / "a.zarr", data)
    lazy = da.from_zarr(array)
    assert zarr_behind(lazy) is array and zarr_behind(da.from_array(array, chunks=CHUNKS)) is array
    from napari_gridmip.io.lazy import LazyLevel

    assert zarr_behind(LazyLevel(array)) is array and zarr_behind(LazyLevel(array)[1:]) is not array
    assert ChunkCache(LazyLevel(array), capacity=1 << 20)._reader is not None
    read = chunk_reader(lazy)
    assert read is not None
    np.testing.assert_array_equal(read((1, 1, 1)), data[16:32, 16:32, 8:16])
    assert ChunkCache(lazy, capacity=1 << 20)._reader is not None
    # anything else is read through dask: other chunks, a computed array, a slice, a dask array of NumPy
    for other in (lazy.rechunk((8, 8, 8)), lazy + 1, lazy[1:], da.from_array(data, chunks=CHUNKS)):
        assert zarr_behind(other) is other and chunk_reader(other) is None
