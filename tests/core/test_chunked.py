"""The public functions on dask arrays: lazy, block by block, equal to the in-memory results."""

import dask
import dask.array as da
import numpy as np
import pytest

from napari_gridmip import extract_patches, find_displacement, merge_patches, occupancy_mipmap, windowed_pearson
from tests.helpers import TaskCounter

EPS32 = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize(
    ("shape", "chunks"),
    [
        ((37, 300, 41), (10, 77, 41)),
        ((2, 37, 300, 41), (1, 37, 100, 13)),
        ((3, 1, 5, 9, 200), (2, 1, 3, 4, 64)),
        ((129, 130, 131), (129, 130, 131)),
        ((1, 1, 1), (1, 1, 1)),
    ],
)
def test_mipmap_equals_in_memory(shape, chunks):
    rng = np.random.default_rng(0)
    volume = rng.random(shape).astype(np.float32)
    volume[volume < 0.3] = np.nan
    lazy = da.from_array(volume, chunks=chunks)
    with TaskCounter() as counter:
        levels = occupancy_mipmap(lazy, threshold=0.99)
    assert counter.count == 0  # the call computes nothing
    assert all(isinstance(level, da.Array) for level in levels)
    expected = occupancy_mipmap(volume, threshold=0.99)
    assert len(levels) == len(expected)
    for level, reference in zip(levels, expected):
        np.testing.assert_array_equal(level.compute(), np.asarray(reference))


def test_mipmap_leading_axes_are_one_pyramid_each():
    rng = np.random.default_rng(1)
    series = rng.random((3, 2, 9, 6, 5)) > 0.9
    levels = occupancy_mipmap(series)
    for t in range(3):
        for c in range(2):
            single = occupancy_mipmap(series[t, c])
            for level, reference in zip(levels, single):
                np.testing.assert_array_equal(np.asarray(level)[t, c], np.asarray(reference))


def test_mipmap_blocks_are_aligned_and_bounded():
    """Each task reads one 2**7-aligned block, so a volume never has to fit in memory at once."""
    lazy = da.zeros((300, 300, 300), dtype=np.uint8, chunks=(100, 100, 100))
    levels = occupancy_mipmap(lazy)
    level0 = levels[0]
    assert all(c % 128 == 0 for axis in level0.chunks for c in axis[:-1])
    assert max(max(axis) for axis in level0.chunks) <= 128


@pytest.mark.parametrize("chunks", [(6, 20, 53), (6, 7, 10), (2, 33, 17), (6, 70, 53)])
def test_correlation_equals_in_memory(chunks):
    rng = np.random.default_rng(2)
    a, b = rng.random((2, 6, 70, 53), dtype=np.float32)
    lazy_a = da.from_array(a, chunks=chunks)
    with TaskCounter() as counter:
        full = windowed_pearson(lazy_a, b, (5, 3))
        dy, dx, peak = find_displacement(lazy_a, b, (5, 3))
    assert counter.count == 0
    # XLA's vectorised loops sum in another order with the band's height: 1 ulp on the CPU; on a TPU 3 EPS32 for
    # the map (3.6e-7) and 6.5 EPS32 for one peak of 3,366 (7.7e-7, chunks (6, 7, 10)). Each value is
    # a Pearson r of sums of 6 x 15 products: float32's summation bound for 90 terms is far above either, so
    # 1e-6 (8.4 EPS32) holds reordering and nothing more (the bound for correlations: 1e-4)
    np.testing.assert_allclose(full.compute(), np.asarray(windowed_pearson(a, b, (5, 3))), rtol=0, atol=1e-6)
    for lazy, reference in zip((dy, dx, peak), find_displacement(a, b, (5, 3))):
        np.testing.assert_allclose(lazy.compute(), np.asarray(reference), rtol=0, atol=1e-6)


def test_correlation_batch_axes():
    rng = np.random.default_rng(3)
    a, b = rng.random((2, 2, 5, 30, 20), dtype=np.float32)
    lazy = find_displacement(da.from_array(a, chunks=(1, 5, 12, 20)), da.from_array(b, chunks=(1, 5, 12, 20)), (3, 3))
    for got, reference in zip(lazy, find_displacement(a, b, (3, 3))):
        assert got.shape == reference.shape
        np.testing.assert_allclose(got.compute(), np.asarray(reference), rtol=0, atol=4 * EPS32)


def test_correlation_offsets_first_in_row_chunks():
    """Offsets first, the lazy map keeps the input's row bands: (..., wm, wn, rows, cols), chunked along rows."""
    rng = np.random.default_rng(7)
    a, b = rng.random((2, 2, 6, 41, 30), dtype=np.float32)
    lazy = windowed_pearson(da.from_array(a, chunks=(1, 6, 14, 30)), b, (5, 3), offsets_first=True)
    assert lazy.shape == (2, 5, 3, 37, 28)
    assert lazy.chunks == ((1, 1), (5,), (3,), (12, 14, 11), (28,))
    reference = np.asarray(windowed_pearson(a, b, (5, 3), offsets_first=True))
    np.testing.assert_allclose(lazy.compute(), reference, rtol=0, atol=2 * EPS32)


@pytest.mark.parametrize("blend", ["mean", "gaussian", "hann", "max", "overwrite"])
@pytest.mark.parametrize("chunk", [37, 64, 1024])
def test_merge_equals_in_memory(blend, chunk):
    from napari_gridmip.core.patches import _chunked

    rng = np.random.default_rng(4)
    image = rng.random((3, 250, 190), dtype=np.float32)
    patches = np.asarray(extract_patches(image, (32, 32), (20, 24)))
    reference = np.asarray(merge_patches(patches, image.shape, (20, 24), blend=blend))
    lazy = da.from_array(patches, chunks=(2, 3, 3, 32, 32))
    with TaskCounter() as counter:
        merged = _chunked.merge_patches(
            lazy, image.shape, (20, 24), blend=blend, sigma_scale=0.125, result_dtype=reference.dtype, chunk=chunk
        )
    assert counter.count == 0
    got = merged.compute()
    if blend in ("max", "overwrite"):
        np.testing.assert_array_equal(got, reference)
    else:  # the same patches and weights, summed over a chunk's sub-grid: within 2 ulp
        np.testing.assert_allclose(got, reference, rtol=0, atol=2 * EPS32 * np.abs(reference).max())
    public = merge_patches(lazy, image.shape, (20, 24), blend=blend)
    assert isinstance(public, da.Array)


def test_bad_dask_integers_are_refused_when_computed():
    big = da.from_array(np.full((4, 9, 9), 2**30, np.int64) + np.arange(4)[:, None, None])
    lazy = windowed_pearson(big, big, (3, 3))
    with pytest.raises(ValueError, match=r"pass dtype=np.float64"):
        lazy.compute()


@pytest.mark.slow
def test_distributed_cluster_gives_identical_results():
    """Two worker processes: blocks travel as NumPy arrays and the results match the local scheduler."""
    distributed = pytest.importorskip("distributed")
    rng = np.random.default_rng(5)
    volume = rng.random((40, 64, 70)) > 0.97
    a, b = rng.random((2, 5, 60, 40), dtype=np.float32)
    image = rng.random((130, 110), dtype=np.float32)
    patches = da.from_array(np.asarray(extract_patches(image, (32, 32), (24, 24))), chunks=(2, 2, 32, 32))
    graphs = {
        "levels": occupancy_mipmap(da.from_array(volume, chunks=(20, 32, 35))),
        "displacement": find_displacement(da.from_array(a, chunks=(5, 20, 40)), b, (5, 5)),
        "merged": merge_patches(patches, image.shape, (24, 24), blend="gaussian"),
    }
    with dask.config.set(scheduler="sync"):
        local = dask.compute(graphs)[0]
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        remote = client.compute(graphs, sync=True)
    for name in graphs:
        for got, expected in zip(remote[name], local[name]) if name != "merged" else [(remote[name], local[name])]:
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
