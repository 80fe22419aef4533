"""max_mipmap and threshold_mipmap: one max pyramid answers every threshold, exactly."""

import dask.array as da
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from napari_gridmip import max_mipmap, mipmap_shapes, occupancy_mipmap, threshold_mipmap
from napari_gridmip.core.occupancy.pyramid import ANY, halve, max_levels, max_reduction, pyramid_levels
from napari_gridmip.core.runtime.precision import precision_scope
from tests.core.occupancy import reference
from tests.helpers import TaskCounter, examples

DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.int64,
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
]
SLOW = pytest.mark.slow
SHAPES = [(1, 1, 1), (2, 1, 1), (5, 2, 1), (7, 9, 3), (16, 5, 11)]
SHAPES += [pytest.param(s, marks=SLOW) for s in [(1, 1, 2), (3, 3, 3), (8, 8, 8), (1, 17, 4)]]


def random_volume(shape, dtype, seed=0, nan_fraction=0.3):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.7
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        out = rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dtype)
        out.flat[: min(2, out.size)] = [info.min, info.max][: min(2, out.size)]
        return out
    out = (rng.standard_normal(shape) * 10).astype(dtype)
    out[rng.random(shape) < nan_fraction] = np.nan
    if out.size > 2:
        out.flat[:2] = [-np.inf, np.inf]
    return out


def assert_same_levels(actual, expected, dtype):
    assert len(actual) == len(expected)
    for k, (a, e) in enumerate(zip(actual, expected)):
        a = np.asarray(a)
        assert a.dtype == np.dtype(dtype), f"level {k}: dtype {a.dtype}"
        assert a.shape == e.shape, f"level {k}: {a.shape} != {e.shape}"
        if reference.is_float(a.dtype):  # bfloat16 NaNs compare equal only once widened
            a, e = a.astype(np.float64), e.astype(np.float64)
        np.testing.assert_array_equal(a, e, err_msg=f"level {k}")  # NaN == NaN here


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference_over_shapes(shape):
    for dtype in (np.float32, np.int16):
        volume = random_volume(shape, dtype, seed=sum(shape))
        levels = max_mipmap(volume)
        assert_same_levels(levels, reference.max_levels(volume), dtype)
        assert [tuple(level.shape) for level in levels] == mipmap_shapes(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_matches_reference_over_dtypes(dtype):
    for shape in [(1, 1, 1), (7, 9, 3)]:
        volume = random_volume(shape, dtype, seed=sum(shape))
        assert_same_levels(max_mipmap(volume), reference.max_levels(volume), dtype)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_nan_is_empty(dtype):
    volume = np.full((4, 4, 3), np.nan, dtype=dtype)
    volume[0, 0, 0] = -np.inf  # a block of NaN and -inf has maximum -inf
    volume[3, 3, 2] = 1.5
    levels = [np.asarray(level).astype(np.float64) for level in max_mipmap(volume)]
    assert levels[1][0, 0, 0] == -np.inf
    assert np.isnan(levels[1][0, 1, 0]) and np.isnan(levels[1][1, 0, 1])  # only NaN: stays NaN
    assert levels[1][1, 1, 1] == 1.5
    assert levels[-1][0, 0, 0] == 1.5


def test_jax_input_and_jit():
    volume = random_volume((13, 6, 9), np.float32, seed=1)
    levels = max_mipmap(jnp.asarray(volume))
    assert_same_levels(levels, reference.max_levels(volume), np.float32)
    jitted = jax.jit(max_levels)(jnp.asarray(volume))
    assert_same_levels(jitted, reference.max_levels(volume), np.float32)
    ints = volume.astype(np.int16)
    reduction = max_reduction(np.dtype(np.int16))
    assert_same_levels(jax.jit(lambda v: pyramid_levels(v, reduction))(ints), reference.max_levels(ints), np.int16)
    assert max_reduction(np.dtype(bool)) is ANY
    np.testing.assert_array_equal(halve(jnp.asarray(volume > 0)), reference.reference_levels(volume > 0)[1])


def test_leading_axes_are_one_pyramid_each():
    series = random_volume((2, 3, 5, 6, 7), np.int16, seed=2)
    levels = max_mipmap(series)
    for t in range(2):
        for c in range(3):
            single = [np.asarray(level)[t, c] for level in levels]
            assert_same_levels(single, reference.max_levels(series[t, c]), np.int16)


@pytest.mark.parametrize(
    ("shape", "chunks", "dtype"),
    [
        ((20, 140, 9), (7, 77, 9), np.float32),
        ((2, 5, 140, 6), (1, 5, 100, 3), np.float16),
        ((1, 1, 1), (1, 1, 1), ml_dtypes.bfloat16),
    ],
)
def test_dask_is_lazy_and_equal(shape, chunks, dtype):
    volume = random_volume(shape, dtype, seed=3)
    lazy = da.from_array(volume, chunks=chunks)
    with TaskCounter() as counter:
        levels = max_mipmap(lazy)
        bools = threshold_mipmap(levels, threshold=0.5)
    assert counter.count == 0
    assert all(isinstance(level, da.Array) for level in levels + bools)
    assert_same_levels([level.compute() for level in levels], [np.asarray(e) for e in max_mipmap(volume)], dtype)
    for level, e in zip(bools, occupancy_mipmap(volume, threshold=0.5)):
        np.testing.assert_array_equal(level.compute(), np.asarray(e))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("as_jax", [True, pytest.param(False, marks=SLOW)])
def test_threshold_equals_occupancy_mipmap(dtype, as_jax):
    volume = random_volume((9, 7, 12), dtype, seed=4)
    levels = max_mipmap(volume)
    if not as_jax:
        levels = [np.asarray(level) for level in levels]
    values = np.unique(np.asarray(volume).astype(np.float64))
    # the values themselves, the float16-rounding trap (a threshold just below a value), both sides of every limit
    thresholds = [-1e300, -1.0, 0.0, 0.5, 1e300] + [float(v) for v in values[np.isfinite(values)][:6]]
    thresholds += [float(np.nextafter(t, -np.inf)) for t in thresholds[5:]]
    for t in thresholds:
        got = threshold_mipmap(levels, threshold=t)
        want = occupancy_mipmap(volume, threshold=t)
        for k, (g, w) in enumerate(zip(got, want)):
            assert np.asarray(g).dtype == np.bool_
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"t={t!r}, level {k}")


def test_threshold_is_exact_where_numpy_rounds():
    volume = np.array([1.0], dtype=np.float16).reshape(1, 1, 1)
    t = 0.99999  # NumPy compares 1.0 > np.float16(0.99999) == 1.0: False
    assert not (volume > t).any()
    assert bool(np.asarray(threshold_mipmap(max_mipmap(volume), threshold=t)[0]).all())
    assert bool(np.asarray(threshold_mipmap([np.asarray(volume)], threshold=t)[0]).all())


def test_one_level_alone():
    volume = random_volume((16, 16, 16), np.float32, seed=5)
    levels = max_mipmap(volume)
    (only,) = threshold_mipmap([levels[2]], threshold=1.0)
    np.testing.assert_array_equal(np.asarray(only), np.asarray(occupancy_mipmap(volume, threshold=1.0)[2]))


@pytest.mark.parametrize(
    ("levels", "error", "match"),
    [
        ("abc", TypeError, "max_levels must be a list of arrays"),
        ([], ValueError, "at least one level"),
        ([np.zeros(3), np.zeros(3, np.float16)], ValueError, "one dtype; got float16, float64"),
        ([np.zeros(3, complex)], ValueError, r"max_levels\[0\] must have a bool, integer or real"),
        ([None], TypeError, r"max_levels\[0\] must be an array"),
    ],
)
def test_bad_levels(levels, error, match):
    with pytest.raises(error, match=match):
        threshold_mipmap(levels, threshold=0.0)


def test_bad_volume_and_threshold():
    with pytest.raises(ValueError, match=r"volume must have at least 3 axes; got shape \(4, 4\)"):
        max_mipmap(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="got dtype complex128"):
        max_mipmap(np.zeros((2, 2, 2), complex))
    with pytest.raises(ValueError, match="threshold must be finite"):
        threshold_mipmap([np.zeros((2, 2, 2))], threshold=np.nan)
    with pytest.raises(TypeError, match="threshold must be a real number"):
        threshold_mipmap([np.zeros((2, 2, 2))], threshold="1")


def test_input_is_not_modified():
    volume = random_volume((9, 8, 7), np.float32, seed=6)
    before = volume.copy()
    levels = max_mipmap(volume)
    assert not np.shares_memory(np.asarray(levels[0]), volume)
    np.testing.assert_array_equal(volume, before)


volumes = hnp.arrays(
    dtype=st.sampled_from([np.bool_, np.uint8, np.int16, np.int32, np.float16, np.float32, np.float64]),
    shape=hnp.array_shapes(min_dims=3, max_dims=3, min_side=1, max_side=9),
    elements={"allow_nan": True, "allow_infinity": True},
)


def check_threshold_of_max_is_occupancy(volume, thresholds):
    levels = max_mipmap(volume)
    assert_same_levels(levels, reference.max_levels(volume), volume.dtype)
    for t in thresholds:
        got = threshold_mipmap(levels, threshold=t)
        for k, (g, w) in enumerate(zip(got, occupancy_mipmap(volume, threshold=t))):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"t={t!r}, level {k}")
        np.testing.assert_array_equal(np.asarray(got[0]), reference.occupied(volume, t))


thresholds = st.lists(st.floats(-300, 300, allow_nan=False), min_size=1, max_size=3)


# each new shape and dtype compiles: a few dozen examples by default
@settings(max_examples=examples(20), deadline=None)
@given(volume=volumes, thresholds=thresholds)
@example(volume=np.full((1, 1, 1), 1.0, np.float16), thresholds=[0.99999])
@example(volume=np.zeros((1, 1, 1), np.float32), thresholds=[-4.862175747466944e-306])
def test_property_threshold_of_max_is_occupancy(volume, thresholds):
    check_threshold_of_max_is_occupancy(volume, thresholds)


@SLOW
@settings(max_examples=examples(300), deadline=None)
@given(volume=volumes, thresholds=thresholds)
def test_property_threshold_of_max_is_occupancy_at_length(volume, thresholds):
    check_threshold_of_max_is_occupancy(volume, thresholds)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_subnormals_are_exact(dtype):
    """XLA flushes subnormals to zero in float compares and maxima; the order keys do not."""
    tiny = np.finfo(dtype).smallest_subnormal
    volume = np.array([tiny, 0.0, -tiny, np.nan, 0.0, -0.0, np.nan, -tiny], dtype=dtype).reshape(2, 2, 2)
    levels = max_mipmap(volume)
    assert np.asarray(levels[1]).item() == tiny
    with precision_scope(dtype):  # a float64 JAX array needs x64 (JAX narrows it to float32 otherwise)
        device = jnp.asarray(volume)
    for t in [0.0, -0.0, float(-tiny), float(tiny) / 2, -4.862175747466944e-306]:
        want = reference.occupied(volume, t)
        np.testing.assert_array_equal(np.asarray(threshold_mipmap(levels, threshold=t)[0]), want, err_msg=repr(t))
        np.testing.assert_array_equal(np.asarray(occupancy_mipmap(device, threshold=t)[0]), want)
        assert bool(np.asarray(threshold_mipmap(levels, threshold=t)[1]).item()) == bool(want.any())
