"""windowed_pearson and find_displacement against float64 NumPy loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napari_gridmip import find_displacement, windowed_pearson
from napari_gridmip._sample_data import make_speckle_pair
from tests.helpers import examples


def pearson(u, v):
    u = u - u.mean()
    v = v - v.mean()
    den = np.sqrt((u * u).sum() * (v * v).sum())
    return (u * v).sum() / den if den > 0 else 0.0


def reference_map(img1, img2, window):
    """The definition, in float64, one pixel pair at a time."""
    img1, img2 = np.asarray(img1, np.float64), np.asarray(img2, np.float64)
    _, rows, cols = img1.shape
    wm, wn = window
    m, n = wm // 2, wn // 2
    out = np.zeros((rows - 2 * m, cols - 2 * n, wm, wn))
    for i in range(rows - 2 * m):
        for j in range(cols - 2 * n):
            for a in range(wm):
                for b in range(wn):
                    out[i, j, a, b] = pearson(img1[:, i + a, j + b], img2[:, i + m, j + n])
    return out


def reference_hessian(full_map):
    """The 3x3 Hessian (Newton) step on the integer peak of a float64 map, as speckle-tracking tools do it."""
    rows, cols, wm, wn = full_map.shape
    dy = np.full((rows, cols), np.nan)
    dx = np.full((rows, cols), np.nan)
    for i in range(rows):
        for j in range(cols):
            c = full_map[i, j]
            a, b = np.unravel_index(np.argmax(c), c.shape)
            if a in (0, wm - 1) or b in (0, wn - 1):
                continue
            h = c[a - 1 : a + 2, b - 1 : b + 2]
            gy, gx = (h[2, 1] - h[0, 1]) / 2, (h[1, 2] - h[1, 0]) / 2
            hyy, hxx = h[2, 1] - 2 * h[1, 1] + h[0, 1], h[1, 2] - 2 * h[1, 1] + h[1, 0]
            hxy = (h[2, 2] - h[2, 0] - h[0, 2] + h[0, 0]) / 4
            det = hyy * hxx - hxy * hxy
            sy = sx = None
            if det > 0 and hyy < 0:
                sy, sx = -(hxx * gy - hxy * gx) / det, -(hyy * gx - hxy * gy) / det
                if abs(sy) > 1 or abs(sx) > 1:
                    sy = sx = None
            if sy is None:
                sy = np.clip(-gy / hyy, -0.5, 0.5) if hyy < 0 else 0.0
                sx = np.clip(-gx / hxx, -0.5, 0.5) if hxx < 0 else 0.0
            dy[i, j], dx[i, j] = a - wm // 2 + sy, b - wn // 2 + sx
    return dy, dx


def well_conditioned(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random(shape), rng.random(shape)


CASES = [
    ((6, 23, 19), (5, 3)),
    ((2, 7, 9), (1, 1)),
    ((4, 5, 8), (5, 1)),
    ((3, 9, 9), (9, 9)),
    ((10, 17, 30), (7, 15)),
    ((37, 12, 11), (3, 5)),  # long stacks: frames in a loop over blocks of 16, plus a remainder of 5
    ((48, 9, 10), (3, 3)),  # no remainder
]


@pytest.fixture(params=["tiles", "sweeps"])
def offset_strategy(request, monkeypatch):
    """Both strategies of the dense maps' offset search (core.runtime.strategy.offset_sweeps) and of the refinement's
    bands (cache_sized_bands), forced whatever the backend: the CPU's and the accelerators' must each give
    the definition."""
    from napari_gridmip.core.runtime import strategy as _backend

    monkeypatch.setattr(_backend, "offset_sweeps", lambda: request.param == "sweeps")
    monkeypatch.setattr(_backend, "cache_sized_bands", lambda: request.param == "tiles")  # the refinement's bands
    return request.param


# the pixels-first map has one strategy; the offsets-first map one per backend family
PLANES_AND_STRATEGIES = pytest.mark.parametrize(
    ("planes", "offset_strategy"),
    [(False, "tiles"), (True, "tiles"), (True, "sweeps")],
    ids=["pixels_first", "offsets_first", "offsets_first-sweeps"],
    indirect=["offset_strategy"],
)


def offsets_first(full_map):
    """A pixels-first map ``(..., rows, cols, wm, wn)`` with its offsets first: ``(..., wm, wn, rows, cols)``."""
    return np.moveaxis(full_map, (-2, -1), (-4, -3))


@PLANES_AND_STRATEGIES
@pytest.mark.parametrize(("shape", "window"), CASES)
def test_float32_against_float64_loop(shape, window, planes, offset_strategy):
    img1, img2 = well_conditioned(shape)
    out = windowed_pearson(img1.astype(np.float32), img2.astype(np.float32), window, offsets_first=planes)
    assert out.dtype == jnp.float32
    expected = reference_map(img1, img2, window)
    expected = offsets_first(expected) if planes else expected
    assert out.shape == expected.shape
    np.testing.assert_allclose(np.asarray(out), expected, rtol=0, atol=1e-5)


@PLANES_AND_STRATEGIES
@pytest.mark.parametrize(("shape", "window"), CASES)
def test_float64_really_computes_in_float64(shape, window, planes, offset_strategy):
    img1, img2 = well_conditioned(shape, seed=1)
    out = windowed_pearson(img1, img2, window, dtype=np.float64, offsets_first=planes)
    assert out.dtype == jnp.float64
    expected = reference_map(img1, img2, window)
    expected = offsets_first(expected) if planes else expected
    np.testing.assert_allclose(np.asarray(out), expected, rtol=0, atol=1e-12)
    # the user's global setting is untouched
    assert jnp.zeros(1).dtype == jnp.float32
    assert not jax.config.jax_enable_x64


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.float16])
def test_integer_and_half_inputs(dtype):
    rng = np.random.default_rng(2)
    top = 250 if dtype == np.uint8 else 1000
    img1 = rng.integers(0, top, (8, 12, 11)).astype(dtype)
    img2 = rng.integers(0, top, (8, 12, 11)).astype(dtype)
    out = np.asarray(windowed_pearson(img1, img2, (3, 5)))
    np.testing.assert_allclose(out, reference_map(img1, img2, (3, 5)), rtol=0, atol=1e-5)


def test_zero_variance_gives_zero_never_nan():
    img1, img2 = well_conditioned((5, 9, 9), seed=3)
    img1[:, 4, 4] = 7.25  # a constant pixel of img1
    img2[:, 3, 3] = 1e6  # a constant pixel of img2, large
    img1[:, 0, :] = 0.0
    for dtype in (np.float32, np.float64):
        out = np.asarray(windowed_pearson(img1, img2, (3, 3), dtype=dtype))
        assert np.isfinite(out).all()
        assert (out[2, 2] == 0).all()  # img2's constant pixel (3, 3) is output pixel (2, 2)
        assert out[3, 3, 1, 1] == 0 and out[4, 4, 0, 0] == 0  # img1's constant pixel at offsets
        np.testing.assert_allclose(out, reference_map(img1, img2, (3, 3)), atol=1e-5 if dtype == np.float32 else 1e-12)
    constant = np.ones((4, 6, 6), np.uint16)
    assert not np.asarray(windowed_pearson(constant, constant, (3, 3))).any()


def test_nan_poisons_only_the_pairs_that_use_it(offset_strategy):
    img1, img2 = well_conditioned((5, 9, 9), seed=4)
    img1[2, 4, 4] = np.nan
    out = np.asarray(windowed_pearson(img1, img2, (3, 3)))
    nan = np.isnan(out)
    assert nan.sum() == 9  # img1 pixel (4, 4) sits in 9 windows, once each
    assert nan[3, 3, 1, 1] and nan[2, 2, 2, 2] and nan[4, 4, 0, 0]
    planes = np.asarray(windowed_pearson(img1, img2, (3, 3), offsets_first=True))
    np.testing.assert_array_equal(np.isnan(planes), np.isnan(offsets_first(out)))  # NaN in the same places
    np.testing.assert_allclose(planes, offsets_first(out), rtol=0, atol=1.2e-7)
    dy, dx, peak = (np.asarray(r) for r in find_displacement(img1, img2, (3, 3)))
    assert np.isfinite(peak).all()  # NaN offsets are skipped by the peak search


def test_self_correlation_is_one_at_the_centre():
    img, _ = well_conditioned((6, 11, 10), seed=5)
    out = np.asarray(windowed_pearson(img, img, (5, 5)))
    np.testing.assert_allclose(out[:, :, 2, 2], 1, atol=2e-6)
    assert out.max() <= 1 + 2e-6 and out.min() >= -1 - 2e-6


def test_batch_axes(offset_strategy):
    rng = np.random.default_rng(6)
    img1, img2 = rng.random((2, 3, 5, 10, 9)), rng.random((2, 3, 5, 10, 9))
    out = np.asarray(windowed_pearson(img1, img2, (3, 5)))
    planes = np.asarray(windowed_pearson(img1, img2, (3, 5), offsets_first=True))
    dy, dx, peak = (np.asarray(r) for r in find_displacement(img1, img2, (3, 5)))
    assert out.shape == (2, 3, 8, 5, 3, 5) and planes.shape == (2, 3, 3, 5, 8, 5) and dy.shape == (2, 3, 8, 5)
    for index in np.ndindex(2, 3):
        expected = reference_map(img1[index], img2[index], (3, 5))
        np.testing.assert_allclose(out[index], expected, atol=1e-5)
        np.testing.assert_allclose(planes[index], offsets_first(expected), atol=1e-5)
        one = [np.asarray(r) for r in find_displacement(img1[index], img2[index], (3, 5))]
        # the same computation compiled for another shape: equal to float32 rounding
        np.testing.assert_allclose(dy[index], one[0], atol=1e-6)
        np.testing.assert_allclose(peak[index], one[2], atol=1e-6)


@pytest.mark.parametrize("use_jit", [False, True])
def test_with_and_without_jit(use_jit, offset_strategy):
    img1, img2 = (x.astype(np.float32) for x in well_conditioned((5, 12, 13), seed=7))

    def both(a, b):
        planes = windowed_pearson(a, b, (3, 5), offsets_first=True)
        return windowed_pearson(a, b, (3, 5)), planes, find_displacement(a, b, (3, 5))

    fn = jax.jit(both) if use_jit else both
    full, planes, (dy, dx, peak) = fn(jnp.asarray(img1), jnp.asarray(img2))
    np.testing.assert_allclose(np.asarray(full), reference_map(img1, img2, (3, 5)), atol=1e-5)
    np.testing.assert_allclose(np.asarray(planes), offsets_first(reference_map(img1, img2, (3, 5))), atol=1e-5)
    np.testing.assert_allclose(np.asarray(peak), np.asarray(full).max(axis=(-2, -1)), atol=1e-6)


def test_peak_and_integer_offsets_match_the_full_map(offset_strategy):
    img1, img2 = well_conditioned((8, 40, 37), seed=8)
    full = reference_map(img1, img2, (7, 5))
    dy, dx, peak = (np.asarray(r) for r in find_displacement(img1, img2, (7, 5), subpixel="none", dtype=np.float64))
    flat = full.reshape(full.shape[:2] + (-1,))
    np.testing.assert_allclose(peak, flat.max(-1), atol=1e-12)
    a, b = np.unravel_index(flat.argmax(-1), (7, 5))
    edge = (a == 0) | (a == 6) | (b == 0) | (b == 4)
    np.testing.assert_array_equal(np.isnan(dy), edge)
    np.testing.assert_array_equal(dy[~edge], (a - 3)[~edge])
    np.testing.assert_array_equal(dx[~edge], (b - 2)[~edge])


@pytest.mark.parametrize("frames", [16, 17, 50])
def test_long_stacks_find_the_same_peaks(frames, offset_strategy):
    img1, img2 = well_conditioned((frames, 21, 19), seed=frames)
    full = reference_map(img1, img2, (5, 5))
    dy, dx, peak = (np.asarray(r) for r in find_displacement(img1, img2, (5, 5), subpixel="none", dtype=np.float64))
    np.testing.assert_allclose(peak, full.reshape(full.shape[:2] + (-1,)).max(-1), atol=1e-12)


def test_the_program_does_not_grow_with_the_stack():
    """Compile time flat in K: the traced search is the same size for 40 and 1000 frames."""
    from napari_gridmip.core.correlation import maps as correlation

    def program_size(frames):
        z = jax.ShapeDtypeStruct((1, frames, 48, 48), jnp.float32)
        zk = jax.ShapeDtypeStruct((1, 48, 48, frames), jnp.float32)
        row0 = jax.ShapeDtypeStruct((), jnp.int32)
        lowered = correlation._displacement_band.lower(
            z, zk, z, row0, window=(9, 9), tile=16, band=40, method="hessian"
        )
        swept = correlation._swept_displacement_band.lower(z, z, row0, window=(9, 9), band=40, method="hessian")
        return len(lowered.as_text()), len(swept.as_text())

    (small, swept_small), (large, swept_large) = program_size(40), program_size(1000)
    assert large < 1.05 * small, (small, large)
    assert program_size(10)[0] < small  # short stacks stay unrolled (the fast steady state)
    assert swept_large < 1.05 * swept_small, (swept_small, swept_large)  # the sweeps sum K in one reduce


def test_hessian_matches_a_float64_numpy_implementation(offset_strategy):
    img1, img2 = well_conditioned((8, 40, 37), seed=9)
    ref_dy, ref_dx = reference_hessian(reference_map(img1, img2, (7, 5)))
    dy, dx, _ = (np.asarray(r) for r in find_displacement(img1, img2, (7, 5), dtype=np.float64))
    np.testing.assert_array_equal(np.isnan(dy), np.isnan(ref_dy))
    np.testing.assert_allclose(dy, ref_dy, atol=1e-9)
    np.testing.assert_allclose(dx, ref_dx, atol=1e-9)


def test_convention_with_scipy_shift():
    from scipy import ndimage

    rng = np.random.default_rng(0)
    img2 = ndimage.gaussian_filter(rng.random((12, 64, 64)), (0, 1.5, 1.5))
    img1 = ndimage.shift(img2, (0, 1.3, -0.7), order=3)
    dy, dx, peak = (np.asarray(r)[8:-8, 8:-8] for r in find_displacement(img1, img2, (7, 7)))
    assert abs(np.nanmedian(dy) - 1.3) < 0.05 and abs(np.nanmedian(dx) + 0.7) < 0.05
    dy, dx, _ = (np.asarray(r)[8:-8, 8:-8] for r in find_displacement(img1, img2, (7, 7), subpixel="refine"))
    assert abs(np.nanmedian(dy) - 1.3) < 0.01 and abs(np.nanmedian(dx) + 0.7) < 0.01


def test_peak_on_the_window_edge_is_flagged_not_clipped(offset_strategy):
    from scipy import ndimage

    rng = np.random.default_rng(1)
    img2 = ndimage.gaussian_filter(rng.random((10, 40, 40)), (0, 1, 1))
    img1 = np.roll(img2, (4, 0), axis=(1, 2))  # a shift of 4 rows: beyond a 5x5 window's reach of 2
    dy, dx, peak = (np.asarray(r) for r in find_displacement(img1, img2, (5, 5)))
    inner = dy[5:-5, 5:-5]
    assert np.isnan(inner).mean() > 0.8  # the true peak lies outside: flagged
    assert not np.any(np.abs(inner[np.isfinite(inner)]) >= 2)  # and never reported as the clipped edge
    np.testing.assert_array_equal(np.isnan(dy), np.isnan(dx))
    assert np.isfinite(peak).all()


SPECKLE_WINDOW = (9, 9)


@pytest.fixture(scope="module")
def speckle_errors():
    """Median displacement error on the speckle sample: ours (each method) and float64 NumPy's Hessian."""
    sample, reference, (true_dy, true_dx) = make_speckle_pair(shape=(96, 96))
    m = SPECKLE_WINDOW[0] // 2
    truth_y, truth_x = true_dy[m:-m, m:-m], true_dx[m:-m, m:-m]
    inner = (slice(6, -6), slice(6, -6))

    def median_error(dy, dx):
        return float(np.nanmedian(np.hypot(dy - truth_y, dx - truth_x)[inner]))

    errors = {}
    for method in ("hessian", "paraboloid", "refine"):
        dy, dx, _ = find_displacement(sample, reference, SPECKLE_WINDOW, subpixel=method)
        errors[method] = median_error(np.asarray(dy), np.asarray(dx))
    errors["numpy float64 hessian"] = median_error(*reference_hessian(reference_map(sample, reference, SPECKLE_WINDOW)))
    return errors


def test_speckle_default_no_worse_than_numpy(speckle_errors, record_property):
    for name, value in speckle_errors.items():
        record_property(f"median error {name}", value)
    print("median displacement error on the speckle sample:", speckle_errors)
    assert speckle_errors["hessian"] <= speckle_errors["numpy float64 hessian"] + 1e-4
    assert speckle_errors["hessian"] < 0.25


def test_speckle_refine_at_least_halves_the_error(speckle_errors):
    assert speckle_errors["refine"] <= 0.5 * speckle_errors["hessian"]
    assert speckle_errors["refine"] <= 0.01  # median error at most 0.01 px


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: windowed_pearson(np.zeros((3, 8, 8)), np.zeros((3, 8, 9)), (3, 3)),
            r"same shape .* \(3, 8, 8\) and \(3, 8, 9\)",
        ),
        (lambda: windowed_pearson(np.zeros((3, 8, 8)), np.zeros((3, 8, 8)), (4, 3)), r"odd .* got \(4, 3\)"),
        (
            lambda: windowed_pearson(np.zeros((3, 8, 8)), np.zeros((3, 8, 8)), (9, 3)),
            r"window \(9, 3\) is larger .* \(8, 8\)",
        ),
        (
            lambda: windowed_pearson(np.zeros((1, 8, 8)), np.zeros((1, 8, 8)), (3, 3)),
            r"at least 2 frames .* \(1, 8, 8\)",
        ),
        (lambda: windowed_pearson(np.zeros((8, 8)), np.zeros((8, 8)), (3, 3)), r"at least 3 axes; got shape \(8, 8\)"),
        (lambda: windowed_pearson(np.zeros((3, 8, 8), complex), np.zeros((3, 8, 8)), (3, 3)), r"img1 .* complex128"),
        (lambda: windowed_pearson(np.zeros((3, 8, 8)), np.zeros((3, 8, 8)), (3,)), r"window must have 2 entries"),
        (
            lambda: windowed_pearson(np.zeros((3, 8, 8)), np.zeros((3, 8, 8)), (3, 3), dtype=np.int32),
            r"float32 or float64",
        ),
        (
            lambda: find_displacement(np.zeros((3, 8, 8)), np.zeros((3, 8, 8)), (3, 3), subpixel="spline"),
            r"subpixel must be one of",
        ),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_offsets_first_must_be_a_bool(flag):
    with pytest.raises(TypeError, match=r"offsets_first must be True or False; got"):
        windowed_pearson(np.zeros((3, 8, 8)), np.zeros((3, 8, 8)), (3, 3), offsets_first=flag)


def test_inputs_are_not_modified():
    img1, img2 = well_conditioned((4, 10, 10), seed=10)
    before = img1.copy(), img2.copy()
    find_displacement(img1, img2, (3, 3), subpixel="refine")
    windowed_pearson(img1, img2, (3, 3))
    np.testing.assert_array_equal(img1, before[0])
    np.testing.assert_array_equal(img2, before[1])


@st.composite
def stacks(draw):
    k = draw(st.integers(2, 6))
    rows, cols = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    wm = draw(st.sampled_from([w for w in (1, 3, 5, 7, 9) if w <= rows]))
    wn = draw(st.sampled_from([w for w in (1, 3, 5, 7, 9) if w <= cols]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    img1, img2 = rng.normal(size=(2, k, rows, cols))
    if draw(st.booleans()):  # some constant pixels
        img1[:, rng.integers(rows), rng.integers(cols)] = 3.0
    return img1, img2, (wm, wn)


@settings(max_examples=examples(15), deadline=None)  # each new shape compiles; the slow run repeats it at length
@given(case=stacks())
def test_property_float64_matches_definition(case):
    check_float64_matches_definition(case)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # most examples compile a new shape: minutes on a loaded 2-core machine
@settings(max_examples=examples(60), deadline=None)
@given(case=stacks())
def test_property_float64_matches_definition_at_length(case):
    check_float64_matches_definition(case)


def check_float64_matches_definition(case):
    img1, img2, window = case
    out = np.asarray(windowed_pearson(img1, img2, window, dtype=np.float64))
    np.testing.assert_allclose(out, reference_map(img1, img2, window), rtol=0, atol=1e-12)
    # the offsets-first layout holds the same values: the same sums in the same order, by two programs
    # whose machine code differs (XLA's CPU backend may fuse a multiply and an add differently): 1 ulp
    planes = np.asarray(windowed_pearson(img1, img2, window, dtype=np.float64, offsets_first=True))
    np.testing.assert_allclose(planes, offsets_first(out), rtol=0, atol=2.3e-16)
    dy, dx, peak = (np.asarray(r) for r in find_displacement(img1, img2, window, dtype=np.float64))
    np.testing.assert_allclose(peak, out.max(axis=(-2, -1)), atol=1e-12)
    assert dy.shape == out.shape[:2]


# -- precision and dtypes ------------------------------------------------------------------------


@pytest.mark.parametrize("planes", [False, True], ids=["pixels_first", "offsets_first"])
def test_offset_data_keeps_its_variations_in_float32(planes):
    """1e4 plus noise of 1e-2 (float64 data): float32 computes the float64 answer to 1e-4.

    Rounding the data to float32 first would leave steps of 1e-3 against noise of 1e-2: off by 0.34.
    """
    rng = np.random.default_rng(3)
    img1 = 1e4 + 1e-2 * rng.standard_normal((8, 20, 22))
    img2 = 1e4 + 1e-2 * rng.standard_normal((8, 20, 22))
    img2[:, 5:15, 5:15] = img1[:, 4:14, 6:16]  # a shifted copy: correlations near 1 there too
    before = img1.copy()
    exact = np.asarray(windowed_pearson(img1, img2, (5, 5), dtype=np.float64, offsets_first=planes))
    fast = np.asarray(windowed_pearson(img1, img2, (5, 5), offsets_first=planes))
    assert fast.dtype == np.float32
    np.testing.assert_allclose(fast, exact, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(img1, before)  # the subtraction never writes into the input
    field32, field64 = find_displacement(img1, img2, (5, 5)), find_displacement(img1, img2, (5, 5), dtype=np.float64)
    np.testing.assert_allclose(np.asarray(field32.peak), np.asarray(field64.peak), atol=1e-4, rtol=0)
    # JAX float64 arrays (made under x64) take the same route
    with jax.enable_x64(True):
        jax1, jax2 = jnp.asarray(img1), jnp.asarray(img2)
    np.testing.assert_allclose(
        np.asarray(windowed_pearson(jax1, jax2, (5, 5), offsets_first=planes)), exact, atol=1e-4, rtol=0
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("subpixel", ["hessian", "paraboloid", "refine", "none"])
def test_every_subpixel_method_in_every_precision(subpixel, dtype, offset_strategy):
    """Each pair runs and returns the precision asked for (refine in float64 once raised a TypeError)."""
    from scipy import ndimage

    img2 = ndimage.gaussian_filter(np.random.default_rng(0).random((6, 24, 26)), (0, 1.5, 1.5))  # smooth peaks
    img1 = np.roll(img2, (0, 1, -1), axis=(0, 1, 2))
    field = find_displacement(img1, img2, (5, 5), subpixel=subpixel, dtype=dtype)
    assert field._fields == ("dy", "dx", "peak")
    for part in field:
        assert part.dtype == dtype and part.shape == (20, 22)
    inner = (slice(2, -2), slice(2, -2))  # away from the rows and columns that np.roll wrapped
    assert abs(np.nanmedian(np.asarray(field.dy)[inner]) - 1) < 0.02
    assert abs(np.nanmedian(np.asarray(field.dx)[inner]) + 1) < 0.02


def test_the_refinements_block_table_gives_the_slices_answer(monkeypatch):
    """The accelerators' refinement looks each pixel's 4x4 blocks up in a table of the band's blocks, the CPU's
    slices them (core.runtime.strategy.cache_sized_bands): the same numbers, band edges and batch items included, with
    peaks as far out as the window allows (the table's rows are sized from that reach)."""
    from scipy import ndimage

    from napari_gridmip.core.correlation import refine
    from napari_gridmip.core.runtime import strategy as _backend

    rng = np.random.default_rng(3)
    img2 = ndimage.gaussian_filter(rng.random((2, 6, 90, 70)), (0, 0, 1.2, 1.2)).astype(np.float32)
    yy, xx = np.mgrid[:90, :70]
    shift = (yy + 2.7 * np.sin(xx / 9), xx - 2.7 * np.cos(yy / 8))  # up to the 7x7 window's edge
    img1 = np.stack([[ndimage.map_coordinates(f, shift, order=3, mode="nearest") for f in item] for item in img2])
    found = {}
    for table in (False, True):
        monkeypatch.setattr(_backend, "cache_sized_bands", lambda table=table: not table)
        monkeypatch.setattr(refine, "DEVICE_BAND_BYTES", 2**16)  # several bands, the last one flush
        found[table] = [np.asarray(a) for a in find_displacement(img1, img2, (7, 7), subpixel="refine")]
    assert len(refine.refine_plan(found[True][0].shape[-2:], 6, np.float32)[1]) > 2
    dy = found[False][0]
    assert np.isfinite(dy).mean() > 0.5 and np.nanmax(np.abs(dy)) > 2.5  # most refined, some near the reach
    for sliced, looked_up in zip(found[False], found[True]):
        # the bands differ in size, so do the programs and their float32 rounding, which the Newton steps carry
        # (7.6e-5 px at most here on the CPU). A pixel whose Hessian is near singular, or whose step is near the
        # clip, can take the other branch of _newton_step under another rounding: on the TPU 1 of 10,752 pixels
        # did (1.03e-3 px); at most 0.1% may, the rest stay within 2e-4 px
        np.testing.assert_array_equal(np.isnan(sliced), np.isnan(looked_up))
        finite = np.isfinite(sliced)
        apart = np.abs(sliced[finite] - looked_up[finite]) > 2e-4
        assert apart.mean() <= 1e-3, (apart.sum(), np.abs(sliced[finite] - looked_up[finite]).max())
