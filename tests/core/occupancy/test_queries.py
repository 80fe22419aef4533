"""occupied_bbox, is_empty and occupied_chunks against brute-force scans of level 0."""

import dask.array as da
import jax.numpy as jnp
import numpy as np
import pytest

from napari_gridmip import is_empty, occupancy_mipmap, occupied_bbox, occupied_chunks
from napari_gridmip.core.occupancy.queries import BoundingBox, empty_search
from tests.core.occupancy import reference

SLOW = pytest.mark.slow
SHAPES = [(1, 1, 1), (3, 1, 2), (16, 5, 11), (33, 2, 17)]
SHAPES += [pytest.param(s, marks=SLOW) for s in [(1, 1, 9), (7, 9, 3), (20, 31, 8)]]


def sparse(shape, count, seed):
    rng = np.random.default_rng(seed)
    volume = np.zeros(shape, bool)
    for _ in range(count):
        volume[tuple(rng.integers(0, n) for n in shape)] = True
    return volume


def pyramid(volume):
    return [np.asarray(level) for level in occupancy_mipmap(volume)]


@pytest.mark.parametrize("shape", SHAPES)
def test_bbox_matches_scan(shape):
    for seed, count in enumerate([0, 1, 2, 5, 40]):
        volume = sparse(shape, count, seed)
        levels = pyramid(volume)
        want = reference.bbox(volume)
        got = occupied_bbox(levels)
        assert (got is None) == (want is None)
        if want is not None:
            assert isinstance(got, BoundingBox) and tuple(got) == want
            assert all(isinstance(v, int) for v in got.lo + got.hi)
            assert volume[got.slices].sum() == volume.sum() and got.shape == tuple(h - lo for lo, h in zip(*want))
        assert occupied_bbox(occupancy_mipmap(jnp.asarray(volume))) == got  # JAX levels
        assert occupied_bbox([da.from_array(level, chunks=4) for level in levels]) == got  # dask: the host descent


def test_bbox_of_full_and_empty_volumes():
    assert occupied_bbox(pyramid(np.ones((5, 3, 9), bool))) == BoundingBox((0, 0, 0), (5, 3, 9))
    assert occupied_bbox(pyramid(np.zeros((5, 3, 9), bool))) is None


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 1, 2), (16, 5, 11), (33, 2, 17)])
def test_is_empty_matches_scan(shape):
    rng = np.random.default_rng(sum(shape))
    volume = sparse(shape, 3, sum(shape))
    levels = pyramid(volume)
    lo = rng.integers(-2, np.array(shape) + 1, (60, 3))
    hi = lo + rng.integers(-1, np.array(shape) + 2, (60, 3))
    empty, visited = empty_search(levels, lo, hi)
    want = np.array([reference.box_is_empty(volume, a, b) for a, b in zip(lo, hi)])
    np.testing.assert_array_equal(empty, want)
    np.testing.assert_array_equal(is_empty(levels, lo, hi), want)
    assert is_empty(levels, lo[0], hi[0]) is bool(want[0])
    for a, b, v in zip(lo[:15], hi[:15], visited[:15]):  # the search opens only occupied straddling cells
        assert v <= 1 + 8 * reference.straddling_occupied_cells(levels, a, b)


def test_is_empty_cost_does_not_grow_with_the_box():
    volume = np.zeros((128, 128, 128), bool)
    volume[3, 120, 64] = True
    levels = occupancy_mipmap(volume)
    sizes = np.array([8, 32, 64, 100, 120, 124])
    empty, visited = empty_search(levels, np.full((6, 3), 4), 4 + sizes[:, None] + np.zeros(3, int))
    assert empty.all()
    # one occupied voxel: at most one occupied cell per level straddles the box, so at most 1 + 8 * 8 visits,
    # for a box of 512 voxels as for one of 1.9 million
    assert visited.max() <= 1 + 8 * len(levels), visited
    everything, visited = empty_search(levels, (0, 0, 0), (128, 128, 128))
    assert not everything and visited == 1  # the top cell lies inside the box: answered at once


def test_is_empty_on_a_dense_volume_stops_at_once():
    levels = occupancy_mipmap(np.ones((40, 50, 60), bool))
    empty, visited = empty_search(levels, (5, 5, 5), (35, 45, 55))
    assert not empty and visited < 40


@pytest.mark.parametrize(
    ("shape", "chunks"),
    [
        ((20, 31, 8), (4, 8, 8)),
        ((20, 31, 8), (3, 7, 5)),
        ((20, 31, 8), ((5, 15), (31,), (1, 2, 0, 5))),
        ((33, 2, 17), (16, 1, 17)),
        ((1, 1, 1), (1, 1, 1)),
        ((64, 64, 64), (100, 100, 100)),
        ((64, 64, 64), (32, 16, 64)),
    ],
)
def test_chunks_match_scan(shape, chunks):
    for seed, count in enumerate([0, 1, 4, 30]):
        volume = sparse(shape, count, seed)
        levels = pyramid(volume)
        got = occupied_chunks(levels, chunks)
        if np.ndim(chunks[0]) == 0:
            bounds = [list(range(0, n, c)) + [n] for n, c in zip(shape, chunks)]
        else:
            bounds = [np.concatenate([[0], np.cumsum(c)]).tolist() for c in chunks]
        np.testing.assert_array_equal(got, reference.chunk_occupancy(volume, bounds))
        assert isinstance(got, np.ndarray) and got.dtype == np.bool_


def test_chunks_of_a_dask_volume():
    volume = sparse((40, 50, 30), 12, 7)
    lazy = da.from_array(volume, chunks=(13, 20, 30))
    levels = occupancy_mipmap(lazy)
    got = occupied_chunks(levels, lazy.chunks)
    bounds = [np.concatenate([[0], np.cumsum(c)]).tolist() for c in lazy.chunks]
    np.testing.assert_array_equal(got, reference.chunk_occupancy(volume, bounds))
    assert got.shape == lazy.numblocks


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda L: occupied_bbox(L[:-1]), ValueError, "must hold every level of a pyramid"),
        (lambda L: occupied_bbox([np.asarray(L[0], np.uint8)]), ValueError, r"levels\[0\] must be a bool"),
        (lambda L: occupied_bbox("levels"), TypeError, "levels must be a list of bool arrays"),
        (lambda L: occupied_bbox([np.zeros((2, 2, 2, 2), bool)]), ValueError, "one 3D volume"),
        (lambda L: is_empty(L, (0, 0), (1, 1)), ValueError, r"lo must have shape \(3,\) or \(n, 3\)"),
        (lambda L: is_empty(L, (0, 0, 0.5), (1, 1, 1)), ValueError, "lo must hold integer voxel indices"),
        (lambda L: is_empty(L, np.zeros((2, 3), int), (1, 1, 1)), ValueError, "lo and hi must have one shape"),
        (lambda L: occupied_chunks(L, (4, 4)), ValueError, "chunks must give the 3 spatial axes"),
        (lambda L: occupied_chunks(L, ((4,), (4, 4), (8,))), ValueError, r"chunks\[0\] must add up to the volume's 8"),
        (lambda L: occupied_chunks(L, (0, 4, 4)), ValueError, r"chunks\[0\] entries must be >= 1"),
    ],
)
def test_bad_input(call, error, match):
    levels = pyramid(sparse((8, 8, 8), 3, 0))
    with pytest.raises(error, match=match):
        call(levels)
