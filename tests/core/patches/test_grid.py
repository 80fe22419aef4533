"""extract_patches / merge_patches against plain NumPy loops."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napari_gridmip import extract_patches, merge_patches
from napari_gridmip.core.options import BLEND_MODES
from napari_gridmip.core.patches.grid import blend_window, patch_grid, patch_origins
from napari_gridmip.core.runtime.precision import precision_scope
from tests.helpers import count_traces, examples

ALL_BLENDS = list(BLEND_MODES)


def reference_origins(n, p, s):
    origins = list(range(0, n - p + 1, s))
    if origins[-1] + p < n:
        origins.append(n - p)
    return origins


def reference_extract(image, patch_size, stride):
    d = len(patch_size)
    lead = image.shape[: image.ndim - d]
    grids = [reference_origins(n, p, s) for n, p, s in zip(image.shape[-d:], patch_size, stride)]
    out = np.empty(tuple(map(len, grids)) + lead + tuple(patch_size), image.dtype)
    for index in itertools.product(*(range(len(g)) for g in grids)):
        window = tuple(slice(g[i], g[i] + p) for g, i, p in zip(grids, index, patch_size))
        out[index] = image[(Ellipsis, *window)]
    return out


def reference_merge(patches, image_shape, stride, blend, sigma_scale=0.125):
    """Loop over the patches in C order, accumulating into float64 arrays."""
    d = len(stride)
    patch_size = patches.shape[-d:]
    grids = [reference_origins(n, p, s) for n, p, s in zip(image_shape[-d:], patch_size, stride)]
    weight = np.ones(patch_size)
    if blend in ("gaussian", "hann"):
        weight = np.ones(())
        for p in patch_size:
            i = np.arange(p)
            if blend == "gaussian":
                w = np.exp(-0.5 * ((i - (p - 1) / 2) / (sigma_scale * p)) ** 2)
            else:
                w = np.sin(np.pi * (i + 0.5) / p) ** 2
            weight = np.multiply.outer(weight, np.maximum(w, 1e-6))
    total = np.zeros(image_shape)
    norm = np.zeros(image_shape[-d:])
    result = np.full(image_shape, -np.inf)
    for index in itertools.product(*(range(len(g)) for g in grids)):
        window = (Ellipsis, *(slice(g[i], g[i] + p) for g, i, p in zip(grids, index, patch_size)))
        patch = patches[index].astype(np.float64)
        if blend == "max":
            result[window] = np.maximum(result[window], patch)
        elif blend == "overwrite":
            result[window] = patch
        else:
            total[window] += patch * weight
            norm[window[1:]] += weight
    return result if blend in ("max", "overwrite") else total / norm


def test_question_layout_matches_a_loop_bit_for_bit():
    v, h, c, ph, pw = 3, 5, 2, 4, 6
    patches = np.random.default_rng(0).normal(size=(v, h, c, ph, pw)).astype(np.float32)
    loop = np.zeros((c, v * ph, h * pw), np.float32)
    for i in range(v):
        for j in range(h):
            loop[:, i * ph : (i + 1) * ph, j * pw : (j + 1) * pw] = patches[i, j]
    merged = np.asarray(merge_patches(patches, (c, v * ph, h * pw), (ph, pw)))
    assert merged.dtype == np.float32
    np.testing.assert_array_equal(merged, loop)
    # and the wrong answer's plain reshape is not what we do
    assert not np.array_equal(merged, patches.reshape(c, v * ph, h * pw))
    np.testing.assert_array_equal(np.asarray(extract_patches(loop, (ph, pw), (ph, pw))), patches)


def test_origins_rule():
    assert patch_origins(10, 4, 3).tolist() == [0, 3, 6]
    assert patch_origins(11, 4, 3).tolist() == [0, 3, 6, 7]
    assert patch_origins(4, 4, 1).tolist() == [0]
    assert patch_origins(5, 4, 4).tolist() == [0, 1]
    for n, p, s in itertools.product(range(1, 12), range(1, 12), range(1, 12)):
        if p <= n and s <= p:
            assert patch_origins(n, p, s).tolist() == reference_origins(n, p, s)


CASES = [
    # image shape, patch size, stride
    ((13,), (4,), (3,)),
    ((1,), (1,), (1,)),
    ((7, 9), (7, 9), (1, 1)),
    ((3, 13, 11), (4, 5), (3, 2)),
    ((3, 16, 16), (4, 4), (4, 4)),
    ((2, 17, 10), (6, 4), (6, 3)),
    ((3, 30, 31), (8, 8), (4, 4)),
    ((2, 9, 10, 7), (3, 4, 2), (2, 4, 1)),
    ((1, 11, 8, 9), (5, 8, 3), (5, 2, 2)),
    ((50, 50), (10, 10), (3, 7)),
    ((4, 2, 12, 12), (5, 5), (5, 2)),
]


@pytest.mark.parametrize(("shape", "patch_size", "stride"), CASES)
def test_extract_matches_loop(shape, patch_size, stride):
    image = np.random.default_rng(1).integers(0, 1000, shape).astype(np.int32)
    np.testing.assert_array_equal(
        np.asarray(extract_patches(image, patch_size, stride)), reference_extract(image, patch_size, stride)
    )


@pytest.mark.parametrize(("shape", "patch_size", "stride"), CASES)
@pytest.mark.parametrize("blend", ALL_BLENDS)
def test_merge_matches_loop_on_independent_patches(shape, patch_size, stride, blend):
    """Patches that disagree in the overlaps, so that every blend rule matters."""
    grid = patch_grid(shape, patch_size, stride)
    d = len(patch_size)
    patches = np.random.default_rng(2).normal(size=grid + shape[: len(shape) - d] + patch_size).astype(np.float32)
    expected = reference_merge(patches, shape, stride, blend)
    merged = np.asarray(merge_patches(patches, shape, stride, blend=blend))
    assert merged.shape == shape and merged.dtype == np.float32
    # float32 arithmetic against a float64 reference: a few ulps of values of order 1
    np.testing.assert_allclose(merged, expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize(("shape", "patch_size", "stride"), CASES)
@pytest.mark.parametrize("blend", ALL_BLENDS)
def test_round_trip_every_mode(shape, patch_size, stride, blend):
    image = np.random.default_rng(3).random(shape, dtype=np.float32)
    merged = np.asarray(merge_patches(extract_patches(image, patch_size, stride), shape, stride, blend=blend))
    if blend in ("max", "overwrite", "mean") and all(s == p for s, p in zip(stride, patch_size)):
        np.testing.assert_array_equal(merged, image)
    np.testing.assert_allclose(merged, image, rtol=3e-7, atol=0)


@pytest.mark.parametrize("stride", [1, 2, 3, 5, 8])
def test_round_trip_every_stride_up_to_the_patch(stride):
    image = np.random.default_rng(4).random((2, 21, 19), dtype=np.float32)
    patches = extract_patches(image, (8, 8), (stride, stride))
    for blend in ALL_BLENDS:
        merged = np.asarray(merge_patches(patches, image.shape, (stride, stride), blend=blend))
        np.testing.assert_allclose(merged, image, rtol=3e-7, atol=0, err_msg=blend)


def test_borders_are_exact_with_tapered_windows():
    """A border pixel seen by one patch only comes back (tiler's hann Merger loses it)."""
    image = np.random.default_rng(5).random((3, 64, 64), dtype=np.float32) + 1.0
    patches = extract_patches(image, (16, 16), (8, 8))
    for blend in ("gaussian", "hann"):
        merged = np.asarray(merge_patches(patches, image.shape, (8, 8), blend=blend))
        np.testing.assert_allclose(merged[:, 0, :], image[:, 0, :], rtol=3e-7)
        np.testing.assert_allclose(merged[:, :, -1], image[:, :, -1], rtol=3e-7)
    assert blend_window(256, "hann").min() > 0
    assert blend_window(64, "gaussian", sigma_scale=0.001).min() == 1e-6


def test_dtypes():
    image = np.random.default_rng(6).integers(0, 255, (3, 10, 9)).astype(np.uint8)
    patches = extract_patches(image, (4, 4), (3, 3))
    assert patches.dtype == jnp.uint8
    for blend in ("max", "overwrite"):
        merged = merge_patches(patches, image.shape, (3, 3), blend=blend)
        assert merged.dtype == jnp.uint8
        np.testing.assert_array_equal(np.asarray(merged), image)
    mean = merge_patches(patches, image.shape, (3, 3))
    assert mean.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(mean), image, rtol=1e-6)
    bools = image > 128
    np.testing.assert_array_equal(
        np.asarray(merge_patches(extract_patches(bools, (4, 4), (3, 3)), bools.shape, (3, 3), blend="max")), bools
    )


def test_float64_is_kept_under_x64():
    image = np.random.default_rng(7).random((11, 12))
    with precision_scope(np.float64):  # x64 on, the way any JAX version spells it
        merged = merge_patches(extract_patches(image, (4, 4), (3, 3)), image.shape, (3, 3), blend="gaussian")
        assert merged.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(merged), image, rtol=1e-14)


@pytest.mark.parametrize("use_jit", [False, True])
def test_with_and_without_jit(use_jit):
    image = np.random.default_rng(8).random((2, 14, 13), dtype=np.float32)

    def round_trip(x):
        return merge_patches(extract_patches(x, (5, 4), (2, 3)), (2, 14, 13), (2, 3), blend="hann")

    fn = jax.jit(round_trip) if use_jit else round_trip
    np.testing.assert_allclose(np.asarray(fn(jnp.asarray(image))), image, rtol=3e-7)


def test_input_is_not_modified():
    patches = np.random.default_rng(9).random((3, 3, 4, 4), dtype=np.float32)
    before = patches.copy()
    merge_patches(patches, (10, 10), (3, 3), blend="gaussian")
    np.testing.assert_array_equal(patches, before)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: extract_patches(np.zeros((5, 5)), (6, 2), (1, 1)), r"patch_size \(6, 2\) is larger .* \(5, 5\)"),
        (lambda: extract_patches(np.zeros((5, 5)), (2, 2), (0, 1)), r"stride entries must be >= 1; got \(0, 1\)"),
        (lambda: extract_patches(np.zeros((5, 5)), (2, 2), (3, 1)), r"stride \(3, 1\) must not exceed .* \(2, 2\)"),
        (lambda: extract_patches(np.zeros((5, 5)), (2, 2), (1,)), r"stride must have 2 entries; got \(1,\)"),
        (lambda: extract_patches(np.zeros((5,)), (2, 2), (1, 1)), r"image has shape \(5,\), fewer axes"),
        (lambda: extract_patches(np.zeros((5, 5, 5, 5)), (2, 2, 2, 2), (1, 1, 1, 1)), r"1 to 3 axes"),
        (lambda: extract_patches(np.zeros((0, 5)), (1, 1), (1, 1)), r"zero-length axis"),
        (lambda: merge_patches(np.zeros((2, 2, 3, 3)), (6, 6), (3, 3), blend="median"), r"blend must be one of"),
        (
            lambda: merge_patches(np.zeros((2, 2, 3, 3)), (7, 6), (3, 3)),
            r"patches have shape \(2, 2, 3, 3\); .* needs \(3, 2, 3, 3\)",
        ),
        (lambda: merge_patches(np.zeros((2, 2, 3, 3)), (6, 6), (4, 3)), r"stride \(4, 3\) must not exceed"),
        (lambda: merge_patches(np.zeros((2, 2, 3, 3)), (6, 6), (3,)), r"do not fit image_shape \(6, 6\)"),
        (lambda: merge_patches(np.zeros((2, 2, 3, 3)), (2, 6), (3, 3)), r"larger than the image_shape's"),
        (lambda: merge_patches(np.zeros((2, 2, 3, 3), complex), (6, 6), (3, 3)), r"got dtype complex128"),
        (lambda: merge_patches(np.zeros((2, 2, 3, 3)), (6, 6), (3, 3), sigma_scale=0), r"sigma_scale must be > 0"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_one_program_per_shape():
    image = np.random.default_rng(10).random((9, 9), dtype=np.float32)
    merge_patches(extract_patches(image, (4, 4), (3, 3)), image.shape, (3, 3))
    with count_traces() as traces:
        for _ in range(3):
            merge_patches(extract_patches(image + 1, (4, 4), (3, 3)), image.shape, (3, 3))
    assert traces.count == 0


@st.composite
def tilings(draw):
    d = draw(st.integers(1, 3))
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2 if d < 3 else 1)))
    tiled = tuple(draw(st.integers(1, 12 if d < 3 else 7)) for _ in range(d))
    patch = tuple(draw(st.integers(1, n)) for n in tiled)
    stride = tuple(draw(st.integers(1, p)) for p in patch)
    return lead + tiled, patch, stride


@settings(max_examples=examples(60), deadline=None)
@given(tiling=tilings(), blend=st.sampled_from(ALL_BLENDS), seed=st.integers(0, 2**16))
def test_property_round_trip_and_reference(tiling, blend, seed):
    shape, patch, stride = tiling
    rng = np.random.default_rng(seed)
    image = rng.normal(size=shape).astype(np.float32)
    patches = extract_patches(image, patch, stride)
    np.testing.assert_array_equal(np.asarray(patches), reference_extract(image, patch, stride))
    merged = np.asarray(merge_patches(patches, shape, stride, blend=blend))
    np.testing.assert_allclose(merged, image, rtol=1e-6, atol=1e-6)
    noisy = rng.normal(size=patches.shape).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(merge_patches(noisy, shape, stride, blend=blend)),
        reference_merge(noisy, shape, stride, blend),
        rtol=0,
        atol=3e-6,
    )
