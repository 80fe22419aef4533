"""pack_occupancy / unpack_occupancy: layouts against loop references, exact round trips for every shape."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from napari_gridmip import occupancy_mipmap, pack_occupancy, unpack_occupancy
from napari_gridmip.core.occupancy.packing import morton_permutation
from tests.core.occupancy import reference
from tests.helpers import examples

SHAPES = [(1, 1, 1), (1, 1, 2), (2, 2, 2), (3, 5, 7), (5, 3, 9), (8, 8, 8), (2, 9, 1), (16, 4, 2), (7, 1, 33)]


@pytest.mark.parametrize("shape", SHAPES)
def test_layouts_match_the_references(shape):
    level = np.random.default_rng(sum(shape)).random(shape) > 0.6
    morton = np.asarray(pack_occupancy(level))
    np.testing.assert_array_equal(morton, reference.morton_pack(level))
    c = np.asarray(pack_occupancy(level, order="c"))
    np.testing.assert_array_equal(c, reference.c_pack(level))
    np.testing.assert_array_equal(c, np.packbits(level.ravel(), bitorder="little"))
    assert morton.dtype == c.dtype == np.uint8
    assert morton.size == np.prod([(n + 1) // 2 for n in shape])  # 1/8 of the level padded to even sizes
    assert c.size == -(-level.size // 8)


def test_cubic_grids_are_instant_ngp_bitfields():
    level = np.random.default_rng(0).random((32, 32, 32)) > 0.8
    bits = np.asarray(pack_occupancy(level))
    z, y, x = np.nonzero(np.ones_like(level))
    codes = np.array([reference.morton3d(int(a), int(b), int(c)) for a, b, c in zip(x, y, z)])
    np.testing.assert_array_equal((bits[codes // 8] >> (codes % 8)) & 1, level[z, y, x])


@pytest.mark.parametrize("order", ["c", "morton"])
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip(shape, order):
    level = np.random.default_rng(1).random(shape) > 0.5
    packed = pack_occupancy(jnp.asarray(level), order=order)
    back = unpack_occupancy(packed, shape, order=order)
    assert back.dtype == jnp.bool_ and back.shape == shape
    np.testing.assert_array_equal(np.asarray(back), level)
    np.testing.assert_array_equal(np.asarray(unpack_occupancy(np.asarray(packed), list(shape), order=order)), level)


def test_every_level_of_a_pyramid_round_trips():
    volume = np.random.default_rng(2).random((37, 20, 13)) > 0.97
    for level in occupancy_mipmap(volume):
        for order in ("c", "morton"):
            back = unpack_occupancy(pack_occupancy(level, order=order), level.shape, order=order)
            np.testing.assert_array_equal(np.asarray(back), np.asarray(level))


def test_permutation_is_the_sorted_morton_order():
    for blocks in [(1, 1, 1), (3, 5, 2), (4, 4, 4), (1, 7, 3), (9, 2, 6)]:
        table = morton_permutation(blocks)
        index = np.arange(np.prod(blocks)).reshape(blocks)
        codes = {int(index[z, y, x]): reference.morton3d(x, y, z) for z, y, x in np.ndindex(*blocks)}
        np.testing.assert_array_equal(table, sorted(codes, key=codes.get))


@settings(max_examples=examples(15), deadline=None)
@given(
    level=hnp.arrays(np.bool_, hnp.array_shapes(min_dims=3, max_dims=3, min_side=1, max_side=12)),
    order=st.sampled_from(["c", "morton"]),
)
def test_property_round_trip(level, order):
    back = unpack_occupancy(pack_occupancy(level, order=order), level.shape, order=order)
    np.testing.assert_array_equal(np.asarray(back), level)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: pack_occupancy(np.zeros((2, 2), bool)), r"level must be 3D \(D, H, W\); got shape \(2, 2\)"),
        (lambda: pack_occupancy(np.zeros((2, 2, 2), np.uint8)), "must be a bool occupancy level; got dtype uint8"),
        (lambda: pack_occupancy(np.zeros((2, 0, 2), bool)), "zero-length axis"),
        (lambda: pack_occupancy(np.zeros((2, 2, 2), bool), order="hilbert"), "order must be one of 'c', 'morton'"),
        (lambda: unpack_occupancy(np.zeros(2, np.uint8), (2, 2, 2)), r"of 1 bytes for shape \(2, 2, 2\)"),
        (lambda: unpack_occupancy(np.zeros(1, np.int8), (2, 2, 2)), "got dtype int8"),
        (lambda: unpack_occupancy(np.zeros(1, np.uint8), (2, 2)), "shape must have 3 entries"),
        (lambda: unpack_occupancy(np.zeros(1, np.uint8), (2, 0, 2)), "shape entries must be >= 1"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
