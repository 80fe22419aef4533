"""The dtype matrix: every public function x every NumPy dtype x NumPy and JAX inputs.

Each cell gives a result equal to a float64 (or exact Python-number) reference within the
stated tolerance, or our own clear error naming the argument and the dtype. NumPy and JAX
inputs give bit-for-bit equal results. Values include each dtype's limits.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from napari_gridmip import extract_patches, find_displacement, merge_patches, occupancy_mipmap, windowed_pearson
from napari_gridmip.core.runtime.precision import precision_scope

NUMERIC = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
]
COMPLEX = [np.complex64, np.complex128]
NOT_NUMBERS = [object, np.str_]
ALL = NUMERIC + COMPLEX + NOT_NUMBERS
WIDE = {np.dtype(t) for t in (np.int64, np.uint64, np.float64, np.complex128)}
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}  # correlation, against a float64 loop


def name(dtype):
    return np.dtype(dtype).name


def sample(dtype, shape, seed=0, *, limits=True):
    """Random values of ``dtype``, with its extreme values in the first elements when ``limits``."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        out = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        if limits:
            out.flat[:2] = [info.min, info.max]
        return out
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind in "OU":
        return np.full(shape, "a", dtype=dtype)
    out = (rng.standard_normal(shape) * 100).astype(dtype)
    if limits:
        info = ml_dtypes.finfo(dtype) if dtype.name == "bfloat16" else np.finfo(dtype)
        out.flat[:2] = [info.max, info.min]
    return out


def as_jax(array):
    """The same data as a JAX array; 64-bit dtypes are made with x64 on (as a user of x64 would have them)."""
    with precision_scope(array.dtype):  # x64 on for 64-bit dtypes only (any JAX version)
        return jnp.asarray(array)


def both(function, array, *args, **kwargs):
    """``function`` on the NumPy array and on its JAX twin; the two results must agree bit for bit."""
    results = [function(array, *args, **kwargs)]
    if array.dtype.kind not in "OU":
        results.append(function(as_jax(array), *args, **kwargs))
    return results


def assert_same(results):
    leaves = [jax.tree_util.tree_leaves(r) for r in results]
    for others in leaves[1:]:
        for a, b in zip(leaves[0], others):
            assert np.asarray(a).dtype == np.asarray(b).dtype
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # NaN == NaN here


# -- occupancy mipmap -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL, ids=name)
@pytest.mark.parametrize("threshold", [0.0, 0.1, 2.0**31, -1e300])
def test_mipmap(dtype, threshold):
    volume = sample(dtype, (5, 4, 3))
    if np.dtype(dtype).kind in "cOU":
        with pytest.raises(ValueError, match=rf"volume must have .* dtype.*got dtype {volume.dtype}"):
            occupancy_mipmap(volume, threshold=threshold)
        return
    if np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16":
        volume.flat[2] = np.nan
    results = both(occupancy_mipmap, volume, threshold=threshold)
    assert_same(results)
    # exact: Python compares ints and floats of any size exactly
    widened = volume.astype(np.float32) if volume.dtype.itemsize < 4 and volume.dtype.kind == "f" else volume
    if volume.dtype.name == "bfloat16":
        widened = volume.astype(np.float32)
    expected = np.vectorize(lambda v: v > threshold, otypes=[bool])(widened.astype(object))
    np.testing.assert_array_equal(np.asarray(results[0][0]), expected)


@pytest.mark.parametrize("threshold", ["0.5", True, None, np.bool_(False)])
def test_mipmap_threshold_must_be_a_number(threshold):
    with pytest.raises(TypeError, match="threshold must be a real number"):
        occupancy_mipmap(np.zeros((2, 2, 2)), threshold=threshold)


# -- patches --------------------------------------------------------------------------


def reference_patches(image, patch, stride):
    """A plain loop over the origins (the rule: 0, s, 2s, ... plus one flush with the edge)."""
    out = []
    for n, p, s in zip(image.shape, patch, stride):
        origins = list(range(0, n - p + 1, s))
        if origins[-1] + p < n:
            origins.append(n - p)
        out.append(origins)
    return np.array([[image[y : y + patch[0], x : x + patch[1]] for x in out[1]] for y in out[0]])


@pytest.mark.parametrize("dtype", ALL, ids=name)
def test_extract_keeps_dtype_and_values(dtype):
    image = sample(dtype, (9, 7))
    if np.dtype(dtype).kind in "OU":
        with pytest.raises(ValueError, match=rf"image must have .* dtype.*got dtype {image.dtype}"):
            extract_patches(image, (4, 3), (3, 2))
        return
    results = both(extract_patches, image, (4, 3), (3, 2))
    assert_same(results)
    out = np.asarray(results[0])
    assert out.dtype == image.dtype  # 64-bit kept
    np.testing.assert_array_equal(out, reference_patches(image, (4, 3), (3, 2)))


def expected_merge_dtype(dtype, blend):
    dtype = np.dtype(dtype)
    if blend in ("max", "overwrite"):
        return dtype
    if dtype == np.float64 or (dtype.kind in "iu" and dtype.itemsize >= 4):
        return np.dtype(np.float64)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return dtype
    return np.dtype(np.float32)


@pytest.mark.parametrize("dtype", ALL, ids=name)
@pytest.mark.parametrize("blend", ["mean", "gaussian", "max", "overwrite"])
def test_merge_round_trip(dtype, blend):
    image = sample(dtype, (9, 7))
    if np.dtype(dtype).kind in "cOU":
        patches = sample(dtype, (2, 2, 4, 3))
        with pytest.raises(ValueError, match=rf"patches must have .* dtype.*got dtype {patches.dtype}"):
            merge_patches(patches, (7, 5), (3, 2), blend=blend)
        return
    if np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16":
        image = sample(dtype, (9, 7), limits=False)  # sums of float limits overflow by definition
    patches = reference_patches(image, (4, 3), (3, 2))
    results = both(merge_patches, patches, image.shape, (3, 2), blend=blend)
    assert_same(results)
    out = np.asarray(results[0])
    assert out.dtype == expected_merge_dtype(dtype, blend)
    if blend in ("max", "overwrite"):
        np.testing.assert_array_equal(out, image)
        return
    # a weighted mean of equal values gives the value back, to the compute dtype's rounding
    reference = image.astype(np.float64)
    scale = np.abs(reference).max() or 1.0
    # the compute dtype's epsilon (float16 and bfloat16 results: their own, as they are rounded back)
    eps = float(ml_dtypes.finfo(out.dtype).eps) if out.dtype.name == "bfloat16" else float(np.finfo(out.dtype).eps)
    np.testing.assert_allclose(out.astype(np.float64), reference, rtol=0, atol=4 * eps * scale)


def test_float16_merge_does_not_overflow():
    x = np.full((64, 64), 20000, np.float16)
    for blend in ("mean", "gaussian", "hann"):
        out = np.asarray(merge_patches(extract_patches(x, (32, 32), (16, 16)), x.shape, (16, 16), blend=blend))
        assert out.dtype == np.float16 and np.isfinite(out).all()
        np.testing.assert_allclose(out.astype(np.float64), 20000, rtol=1e-3)


# -- correlation ----------------------------------------------------------------------


def reference_pearson(img1, img2, window):
    """The float64 loop: one Pearson coefficient per pixel and offset."""
    a, b = img1.astype(np.float64), img2.astype(np.float64)
    k, rows, cols = a.shape
    m, n = window[0] // 2, window[1] // 2
    out = np.zeros((rows - 2 * m, cols - 2 * n, *window))
    for i in range(rows - 2 * m):
        for j in range(cols - 2 * n):
            v2 = b[:, i + m, j + n] - b[:, i + m, j + n].mean()
            for p in range(window[0]):
                for q in range(window[1]):
                    v1 = a[:, i + p, j + q] - a[:, i + p, j + q].mean()
                    norm = np.sqrt((v1 @ v1) * (v2 @ v2))
                    out[i, j, p, q] = (v1 @ v2) / norm if norm > 0 else 0.0
    return out


def exact_in(dtype, compute):
    """Whether every value of the integer ``dtype`` is exact in the float ``compute``."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu":
        return True
    info = np.iinfo(dtype)
    return max(-int(info.min), int(info.max)) <= 2 ** (np.finfo(compute).nmant + 1)


@pytest.mark.parametrize("dtype", ALL, ids=name)
@pytest.mark.parametrize("compute", [np.float32, np.float64], ids=name)
def test_correlation(dtype, compute):
    img1, img2 = sample(dtype, (6, 7, 8), seed=1), sample(dtype, (6, 7, 8), seed=2)
    kind = np.dtype(dtype).kind
    if kind in "cOU":
        with pytest.raises(ValueError, match=rf"img1 must have .* dtype.*got dtype {img1.dtype}"):
            windowed_pearson(img1, img2, (3, 3), dtype=compute)
        return
    if not exact_in(dtype, compute):
        with pytest.raises(ValueError, match=rf"img1 holds integers .* beyond {name(compute)}'s exact range"):
            windowed_pearson(img1, img2, (3, 3), dtype=compute)
        # within the exact range the same dtype works
        img1, img2 = ((img % 1000).astype(dtype) for img in (img1, img2))
    elif kind == "f" or np.dtype(dtype).name == "bfloat16":
        img1, img2 = sample(dtype, (6, 7, 8), seed=1, limits=False), sample(dtype, (6, 7, 8), seed=2, limits=False)
    results = both(windowed_pearson, img1, img2, (3, 3), dtype=compute)
    assert_same(results)
    out = np.asarray(results[0])
    assert out.dtype == compute
    np.testing.assert_allclose(out, reference_pearson(img1, img2, (3, 3)), rtol=0, atol=TOLERANCE[compute])
    shifts = both(lambda a, b: find_displacement(a, b, (3, 3), dtype=compute), img1, img2)
    assert_same(shifts)


def test_wide_integers_are_refused_or_exact():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**40, (8, 12, 12))
    b = a + rng.integers(0, 2**36, a.shape)
    with pytest.raises(ValueError, match=r"pass dtype=np.float64"):
        windowed_pearson(a, b, (3, 3))
    out = np.asarray(windowed_pearson(a, b, (3, 3), dtype=np.float64))[5, 5, 1, 1]
    expected = np.corrcoef(a[:, 6, 6].astype(np.float64), b[:, 6, 6].astype(np.float64))[0, 1]
    np.testing.assert_allclose(out, expected, atol=1e-12)
    x = np.full((4, 4), 2**32 + 7, np.int64)
    patch = np.asarray(extract_patches(x, (2, 2), (2, 2)))
    assert patch.dtype == np.int64 and patch[0, 0, 0, 0] == 2**32 + 7


@pytest.mark.parametrize(
    "call",
    [
        lambda: windowed_pearson(np.zeros((0, 3, 8, 8)), np.zeros((0, 3, 8, 8)), (3, 3)),
        lambda: find_displacement(np.zeros((2, 0, 3, 8, 8)), np.zeros((2, 0, 3, 8, 8)), (3, 3)),
        lambda: occupancy_mipmap(np.zeros((0, 3, 3))),
        lambda: extract_patches(np.zeros((0, 8, 8)), (2, 2), (2, 2)),
    ],
)
def test_empty_axes_are_refused_consistently(call):
    with pytest.raises(ValueError, match="zero-length axis"):
        call()


# -- array-likes: one rule for every public function (core.validate.as_array) ----------------------


def _volume_list():
    volume = np.zeros((4, 5, 3), np.float32)
    volume[1, 2, 0] = 1
    return volume


LIST_CALLS = {
    "occupancy_mipmap": (lambda x: occupancy_mipmap(x, threshold=0.5), lambda: _volume_list()),
    "extract_patches": (lambda x: extract_patches(x, (2, 2), (1, 1)), lambda: np.arange(20.0).reshape(4, 5)),
    "merge_patches": (
        lambda x: merge_patches(x, (4, 4), (2, 2)),
        lambda: np.arange(16.0).reshape(2, 2, 2, 2),
    ),
    "windowed_pearson": (
        lambda x: windowed_pearson(x, x, (3, 3)),
        lambda: np.random.default_rng(0).random((3, 5, 6)),
    ),
    "find_displacement": (
        lambda x: find_displacement(x, x, (3, 3)),
        lambda: np.random.default_rng(0).random((3, 5, 6)),
    ),
}


def _leaves(result):
    if isinstance(result, (list, tuple)):
        return [leaf for item in result for leaf in _leaves(item)]
    return [np.asarray(result)]


@pytest.mark.parametrize("function", sorted(LIST_CALLS))
@pytest.mark.parametrize("kind", ["list", "tuple"])
def test_nested_sequences_are_accepted_like_arrays(function, kind):
    call, make = LIST_CALLS[function]
    array = make()
    nested = array.tolist() if kind == "list" else _as_tuples(array.tolist())
    expected, got = _leaves(call(array)), _leaves(call(nested))
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)


def _as_tuples(nested):
    return tuple(_as_tuples(item) for item in nested) if isinstance(nested, list) else nested


@pytest.mark.parametrize("function", sorted(LIST_CALLS))
@pytest.mark.parametrize("bad", ["abc", None, {"a": 1}, {1, 2}, object()], ids=["str", "None", "dict", "set", "object"])
def test_non_arrays_are_a_type_error_naming_the_argument(function, bad):
    call, _ = LIST_CALLS[function]
    with pytest.raises(TypeError, match=r"must be an array .* got (str|NoneType|dict|set|object)"):
        call(bad)


@pytest.mark.parametrize("function", sorted(LIST_CALLS))
def test_ragged_lists_are_a_value_error(function):
    call, _ = LIST_CALLS[function]
    with pytest.raises(ValueError, match="rectangular nested list"):
        call([[[1.0, 2.0], [3.0]], [[1.0, 2.0], [3.0, 4.0]]])
