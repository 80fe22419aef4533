"""LazyLevel: a Zarr array indexed lazily (napari's multiscale slicing reads only the plane it shows)."""

import dask.array as da
import numpy as np
import pytest
import zarr

from napari_gridmip.io.lazy import LazyLevel

KEYS = [np.s_[:], np.s_[2], np.s_[-1], np.s_[1:5], np.s_[::2], np.s_[::-1], np.s_[5:1:-2], np.s_[..., 3],
        np.s_[1, ..., 2:4], np.s_[np.int64(3), 2:, ::-3], np.s_[:, 0:448, 0:576], np.s_[3:3]]  # fmt: skip


@pytest.fixture
def arrays():
    data = np.arange(7 * 9 * 11, dtype=np.uint16).reshape(7, 9, 11)
    array = zarr.create_array(store={}, shape=data.shape, chunks=(4, 4, 4), dtype=data.dtype)
    array[...] = data
    return data, array


def test_indexing_composes_as_numpys_and_reads_at_asarray(arrays):
    data, array = arrays
    reads = []
    getitem = zarr.Array.__getitem__

    class Counted(zarr.Array):
        def __getitem__(self, key):
            reads.append(key)
            return getitem(self, key)

    array.__class__ = Counted
    level = LazyLevel(array)
    assert (level.shape, level.dtype, level.ndim, level.chunks, len(level)) == (data.shape, data.dtype, 3, (4, 4, 4), 7)
    for first in KEYS:
        view = level[first]
        assert isinstance(view, LazyLevel) and view.shape == data[first].shape and not reads
        np.testing.assert_array_equal(np.asarray(view), data[first])
        assert len(reads) == 1
        reads.clear()
        for second in KEYS:
            try:
                want = data[first][second]
            except IndexError:
                with pytest.raises(IndexError):
                    view[second]
                continue
            np.testing.assert_array_equal(np.asarray(view[second]), want)
        reads.clear()
    # napari's 2D slice: the displayed region with the other axes whole, then the dims point: one read, a plane
    reads.clear()
    plane = np.asarray(level[:, 0:5, 0:6][3])
    np.testing.assert_array_equal(plane, data[3, 0:5, 0:6])
    assert len(reads) == 1 and reads[0][0] == 3
    # other indices read the view, then index it
    np.testing.assert_array_equal(level[[1, 2]], data[[1, 2]])
    np.testing.assert_array_equal(level[1:][data[1:] > 300], data[1:][data[1:] > 300])


def test_whole_view_only_names_its_array_and_dask_reads_it(arrays):
    data, array = arrays
    level = LazyLevel(array)
    assert level.stored_array is array and level[:].stored_array is array and level[1:].stored_array is None
    lazy = da.from_array(level, chunks=level.chunks)
    np.testing.assert_array_equal(lazy.sum(axis=0).compute(), data.sum(axis=0))
    assert np.asarray(level, dtype=np.float32).dtype == np.float32
