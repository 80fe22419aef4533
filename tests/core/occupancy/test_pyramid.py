"""occupancy_mipmap against a plain NumPy loop reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from napari_gridmip import mipmap_shapes, occupancy_mipmap
from napari_gridmip.core.occupancy.pyramid import halve_occupancy, occupancy_levels
from napari_gridmip.core.runtime.precision import precision_scope
from tests.helpers import count_traces, examples, reference_levels


def assert_levels_equal(actual, expected):
    assert len(actual) == len(expected)
    for k, (a, e) in enumerate(zip(actual, expected)):
        a = np.asarray(a)
        assert a.dtype == np.bool_, f"level {k} dtype {a.dtype}"
        assert a.shape == e.shape, f"level {k}: {a.shape} != {e.shape}"
        np.testing.assert_array_equal(a, e, err_msg=f"level {k}")


SHAPES = [
    (1, 1, 1),
    (1, 1, 2),
    (2, 1, 1),
    (3, 3, 3),
    (5, 2, 1),
    (7, 9, 3),
    (8, 8, 8),
    (16, 5, 11),
    (1, 17, 4),
    (33, 2, 9),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int16, np.int32, np.float16, np.float32, np.float64])
def test_matches_reference_numpy_input(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    if dtype == np.bool_:
        volume = rng.random(shape) > 0.8
    elif np.issubdtype(dtype, np.integer):
        volume = rng.integers(-3 if np.issubdtype(dtype, np.signedinteger) else 0, 4, shape).astype(dtype)
    else:
        volume = (rng.random(shape) - 0.7).astype(dtype)
    assert_levels_equal(occupancy_mipmap(volume), reference_levels(volume))


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference_jax_input(shape):
    volume = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    assert_levels_equal(occupancy_mipmap(jnp.asarray(volume), threshold=0.5), reference_levels(volume, 0.5))
    bools = volume > 1.0
    assert_levels_equal(occupancy_mipmap(jnp.asarray(bools)), reference_levels(bools))


@pytest.mark.parametrize("use_jit", [False, True])
def test_pure_levels_with_and_without_jit(use_jit):
    volume = np.random.default_rng(2).random((13, 6, 9)) > 0.9
    fn = jax.jit(occupancy_levels) if use_jit else occupancy_levels
    assert_levels_equal(fn(jnp.asarray(volume)), reference_levels(volume))
    halve = jax.jit(halve_occupancy) if use_jit else halve_occupancy
    np.testing.assert_array_equal(halve(jnp.asarray(volume)), reference_levels(volume)[1])


def test_level_counts_are_exact_for_powers_of_two():
    # A float log2 under float64 gives int(log2(64)) == 5 and drops the last level.
    for n in [1, 2, 4, 63, 64, 65, 128]:
        shapes = mipmap_shapes((n, n, n))
        assert shapes[-1] == (1, 1, 1)
        assert len(shapes) == (n - 1).bit_length() + 1
    with precision_scope(np.float64):  # x64 on, the way any JAX version spells it
        assert len(occupancy_mipmap(np.ones((64, 64, 64), bool))) == 7


def test_nan_counts_as_empty_and_thresholds():
    volume = np.full((3, 4, 5), np.nan, dtype=np.float32)
    volume[1, 2, 3] = 0.5
    volume[0, 0, 0] = -np.inf
    volume[2, 3, 4] = np.inf
    levels = occupancy_mipmap(volume, threshold=0.25)
    assert np.asarray(levels[0]).sum() == 2
    assert_levels_equal(levels, reference_levels(volume, 0.25))
    assert not np.asarray(occupancy_mipmap(volume, threshold=1e30)[0])[1, 2, 3]


@pytest.mark.parametrize("threshold", [-1e9, -1, -0.5, 0, 0.5, 1, 254.5, 255, 1e9])
def test_integer_and_bool_thresholds_are_exact(threshold):
    volume = np.array([0, 1, 2, 254, 255], dtype=np.uint8).reshape(5, 1, 1)
    assert_levels_equal(occupancy_mipmap(volume, threshold=threshold), reference_levels(volume, threshold))
    assert_levels_equal(occupancy_mipmap(jnp.asarray(volume), threshold=threshold), reference_levels(volume, threshold))
    bools = np.array([True, False, True]).reshape(1, 3, 1)
    assert_levels_equal(occupancy_mipmap(bools, threshold=threshold), reference_levels(bools, threshold))
    assert_levels_equal(occupancy_mipmap(jnp.asarray(bools), threshold=threshold), reference_levels(bools, threshold))


def test_large_integers_compare_exactly():
    volume = np.array([2**40, 2**40 + 1], dtype=np.int64).reshape(2, 1, 1)
    levels = occupancy_mipmap(volume, threshold=float(2**40))
    np.testing.assert_array_equal(np.asarray(levels[0]).ravel(), [False, True])


def test_input_is_not_modified():
    volume = np.random.default_rng(3).random((9, 8, 7)) > 0.5
    before = volume.copy()
    levels = occupancy_mipmap(volume)
    assert not np.shares_memory(np.asarray(levels[0]), volume)
    np.testing.assert_array_equal(volume, before)


@pytest.mark.parametrize(
    ("volume", "match"),
    [
        (np.zeros((4, 4)), r"volume must have at least 3 axes; got shape \(4, 4\)"),
        (np.zeros((2, 0, 2, 2)), r"zero-length axis; got shape \(2, 0, 2, 2\)"),
        (np.zeros((4, 0, 4)), r"zero-length axis; got shape \(4, 0, 4\)"),
        (np.zeros((2, 2, 2), complex), r"got dtype complex128"),
        (np.array([["a"]]).reshape(1, 1, 1), r"got dtype <U1"),
    ],
)
def test_bad_input_raises(volume, match):
    with pytest.raises(ValueError, match=match):
        occupancy_mipmap(volume)


@pytest.mark.parametrize(
    ("threshold", "error"), [(np.nan, ValueError), (np.inf, ValueError), ("high", TypeError), (None, TypeError)]
)
def test_bad_threshold_raises(threshold, error):
    with pytest.raises(error, match="threshold"):
        occupancy_mipmap(np.zeros((2, 2, 2)), threshold=threshold)


def test_one_compiled_program_per_shape():
    volume = np.random.default_rng(4).random((21, 10, 6)) > 0.5
    occupancy_mipmap(volume)
    with count_traces() as traces:
        for _ in range(3):
            occupancy_mipmap(volume)
            occupancy_mipmap(~volume)
    assert traces.count == 0
    with count_traces() as traces:  # the counter does see a new shape
        occupancy_mipmap(volume[:-1])
    assert traces.count >= 1


volumes = hnp.arrays(
    dtype=st.sampled_from([np.bool_, np.uint8, np.int32, np.float32]),
    shape=hnp.array_shapes(min_dims=3, max_dims=3, min_side=1, max_side=10),
    elements={"allow_nan": True, "allow_infinity": True},
)


@settings(max_examples=examples(60), deadline=None)
@given(volume=volumes, threshold=st.floats(-10, 10, allow_nan=False))
@example(volume=np.zeros((1, 1, 1), np.float32), threshold=-4.862175747466944e-306)  # rounds to -0.0 in float32
def test_property_matches_reference(volume, threshold):
    assert_levels_equal(occupancy_mipmap(volume, threshold=threshold), reference_levels(volume, threshold))


@settings(max_examples=examples(40), deadline=None)
@given(
    volume=hnp.arrays(np.float32, hnp.array_shapes(min_dims=3, max_dims=3, min_side=1, max_side=9)),
    t1=st.floats(-2, 2),
    t2=st.floats(-2, 2),
)
def test_property_monotone_and_consistent(volume, t1, t2):
    lo, hi = sorted((t1, t2))
    loose, strict = occupancy_mipmap(volume, threshold=lo), occupancy_mipmap(volume, threshold=hi)
    for a, b in zip(loose, strict):
        assert not np.any(np.asarray(b) & ~np.asarray(a))  # raising the threshold only empties voxels
    top = np.asarray(loose[-1])
    assert top.shape == (1, 1, 1)
    assert bool(top[0, 0, 0]) == bool(np.asarray(loose[0]).any())
    for fine, coarse in zip(loose, loose[1:]):
        assert np.asarray(fine).sum() >= np.asarray(coarse).sum()
