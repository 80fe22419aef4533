"""correlate_series: a DIC sequence followed with no search window, against its known truth.

The sequences are small (128 x 128, a few frames) so that the file runs in well under a minute; the full-size
figures (256 x 256, every kind, every reference policy) are benchmarks/bench_series.py's.
"""

import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import napari_gridmip as gm
from napari_gridmip._sample_data.dic_series import make_dic_series, true_displacement
from napari_gridmip.core.correlation import series as series_module
from napari_gridmip.core.correlation._global_motion import estimate_motion
from napari_gridmip.core.correlation.series import Status

SHAPE = (128, 128)
OPTIONS = dict(subset=21, step=8)


def _errors(result, truth):
    tdy, tdx = true_displacement(truth["maps"], result.y, result.x)
    return np.hypot(result.dy - tdy, result.dx - tdx)


@pytest.fixture(scope="module")
def translation():
    frames, truth = make_dic_series("translation", frames=5, shape=SHAPE)
    return frames, truth, gm.correlate_series(frames, **OPTIONS)


def test_large_translations_are_found_and_lost_points_say_so(translation):
    frames, truth, result = translation
    error = _errors(result, truth)
    ok = result.status == Status.ok
    assert ok[0].all() and np.all(result.dy[0] == 0)
    # every kept value is right (subset 21 on 8-bit noise: a spread of about 0.01 px); none wrong and finite
    assert np.all(error[ok] < 0.1) and np.mean(error[ok] < 0.05) > 0.99
    assert np.all(np.isnan(result.dy[~ok])) and np.all(np.isnan(result.dx[~ok]))
    # the frames that carry half the grid out of view: those points are out of view, the rest found
    tdy, tdx = true_displacement(truth["maps"], result.y, result.x)
    gy, gx = np.meshgrid(result.y, result.x, indexing="ij")
    half = OPTIONS["subset"] // 2
    for t in range(1, len(frames)):
        py, px = gy + tdy[t], gx + tdx[t]
        in_view = (py >= half + 1) & (py <= SHAPE[0] - half - 2) & (px >= half + 1) & (px <= SHAPE[1] - half - 2)
        assert np.mean(ok[t][in_view]) >= 0.95
        assert np.all(result.status[t][~in_view & ~ok[t]] != Status.ok)
        far_out = (py < -half) | (py > SHAPE[0] + half) | (px < -half) | (px > SHAPE[1] + half)
        assert np.all(result.status[t][far_out] == Status.out_of_view)
    # frame 1 moves 0.45 of the frame along x and frame 2 brings points back: they are found again
    assert (~ok[1] & ok[2]).sum() > 10


def test_the_result_is_documented_shapes_and_dtypes(translation):
    frames, _, result = translation
    rows = len(range(10, SHAPE[0] - 10, 8))
    for name in ("dy", "dx", "zncc", "sigma_dy", "sigma_dx", "dy_y", "dy_x", "dx_y", "dx_x"):
        value = getattr(result, name)
        assert value.shape == (len(frames), rows, rows) and value.dtype == np.float32, name
    assert result.status.dtype == np.uint8 and result.key_frame.dtype == np.int32
    np.testing.assert_array_equal(result.y, np.arange(10, SHAPE[0] - 10, 8))
    assert result.motion.shape == (len(frames), 2, 3)
    ok = result.status == Status.ok
    assert np.all(np.isfinite(result.sigma_dx[ok])) and np.all(result.sigma_dx[ok] < 0.05)


def test_rotation_in_20_degree_steps_inside_a_mask():
    frames, truth = make_dic_series("rotation", frames=5, shape=SHAPE)
    result = gm.correlate_series(frames, roi=truth["roi"], **OPTIONS)
    error = _errors(result, truth)
    ok = result.status == Status.ok
    gy, gx = np.meshgrid(result.y, result.x, indexing="ij")
    in_roi = truth["roi"][gy.astype(int), gx.astype(int)]
    assert np.all(result.status[:, ~in_roi] == Status.outside_roi)
    for t in range(1, len(frames)):  # 20, 40, 60, 80 degrees; subset 21 (the targets' subset 31: bench_series.py)
        assert np.mean(ok[t][in_roi]) >= 0.6
        assert np.median(error[t][ok[t]]) <= 0.03
        assert np.percentile(error[t][ok[t]], 95) <= 0.15
    assert np.all(error[ok] < 1)


def test_pixels_outside_the_roi_never_enter_a_match():
    frames, truth = make_dic_series("hole", frames=3, shape=SHAPE)
    roi = truth["roi"]
    other = frames.copy()
    rng = np.random.default_rng(5)
    # a different background in the reference's hole, where the ROI (less its edge band) excludes it
    other[0][~roi] = rng.integers(0, 256, (~roi).sum())
    a = gm.correlate_series(frames, roi=roi, **OPTIONS)
    b = gm.correlate_series(other, roi=roi, **OPTIONS)
    np.testing.assert_array_equal(a.status, b.status)
    ok = a.status == Status.ok
    # what still reaches in: the spline's recursive prefilter decays as 0.27 per px beyond its taps
    np.testing.assert_allclose(a.dx[ok], b.dx[ok], atol=1e-3)
    np.testing.assert_allclose(a.dy[ok], b.dy[ok], atol=1e-3)


@pytest.mark.parametrize("reference", ["incremental", "auto"])
def test_reference_policies_agree_on_a_growing_stretch(reference):
    frames, truth = make_dic_series("strain", frames=4, shape=SHAPE)
    result = gm.correlate_series(frames, reference=reference, **OPTIONS)
    ok = result.status == Status.ok
    error = _errors(result, truth)
    assert np.all(error[ok] < 0.1)
    assert ok[-1].sum() > 0.5 * ok[0].sum()
    if reference == "incremental":  # each point against the last frame it was found in, or frame 0 where it matches
        assert np.all(np.isin(result.key_frame[2][ok[1] & ok[2]], (0, 1)))
        moving = gm.correlate_series(frames, reference=reference, refresh_zncc=1.0, **OPTIONS)
        both = (moving.status[1] == Status.ok) & (moving.status[2] == Status.ok)
        assert both.any() and np.all(moving.key_frame[2][both] == 1)
    # the stretch's gradient: d dx / dx = 0.25 t / 3
    np.testing.assert_allclose(np.nanmedian(result.dx_x[3]), 0.25, atol=2e-3)


def test_an_unrelated_frame_gives_no_number():
    frames, _ = make_dic_series("translation", frames=2, shape=SHAPE)
    noise = np.random.default_rng(3).integers(0, 256, SHAPE, dtype=np.uint8)
    result = gm.correlate_series(np.stack([frames[0], noise, frames[0]]), **OPTIONS)
    assert not np.any(result.status[1] == Status.ok)
    assert np.all(np.isnan(result.dx[1]))
    assert np.isin(result.status[1], [Status.not_significant, Status.no_guess, Status.out_of_view,
                                      Status.ambiguous]).all()  # fmt: skip
    # the third frame is the reference again: every point found, at zero
    ok = result.status[2] == Status.ok
    assert ok.mean() > 0.95 and np.all(np.abs(result.dx[2][ok]) < 0.01)


def test_dask_and_float_frames_give_numpy_uint8s_answer_and_inputs_are_kept(translation):
    frames, _, expected = translation
    copy = frames.copy()
    lazy = da.from_array(frames.astype(np.float32), chunks=(1, 64, 128))
    result = gm.correlate_series(lazy, **OPTIONS)
    np.testing.assert_array_equal(frames, copy)
    np.testing.assert_array_equal(result.status, expected.status)
    np.testing.assert_allclose(result.dx, expected.dx, atol=1e-5, equal_nan=True)


def test_progress_is_per_frame_and_may_stop_the_run(translation):
    frames, _, _ = translation
    seen = []

    def progress(done, total):
        seen.append((done, total))
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gm.correlate_series(frames, progress=progress, **OPTIONS)
    assert seen == [(1, 5), (2, 5)]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(frames=np.zeros((2, 64))), ValueError, "3 dimensions|ndim|3D"),
        (dict(frames=np.zeros((2, 64, 64), complex)), ValueError, "real"),
        (dict(subset=20), ValueError, "odd"),
        (dict(subset=101), ValueError, "larger"),
        (dict(reference="first"), ValueError, "reference"),
        (dict(roi=np.ones((10, 10), bool)), ValueError, "roi"),
        (dict(roi=np.ones((64, 64), np.float32)), TypeError, "roi"),
        (dict(min_zncc=1.5), ValueError, "min_zncc"),
        (dict(max_disagreement=0), ValueError, "max_disagreement"),
        (dict(prefilter="yes"), ValueError, "prefilter"),
    ],
)
def test_bad_input_is_named(kwargs, error, match):
    kwargs = {"frames": np.zeros((2, 64, 64), np.uint8), **kwargs}
    with pytest.raises(error, match=match):
        gm.correlate_series(kwargs.pop("frames"), **kwargs)


def test_non_finite_pixels_are_refused():
    frames = np.random.default_rng(0).random((2, 64, 64)).astype(np.float32)
    frames[1, 3, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        gm.correlate_series(frames, subset=21)


# -- the pieces, against plain NumPy -------------------------------------------------------------------------


def _numpy_spline(coefficients, y, x):
    """The cubic B-spline through padded coefficients at (y, x), evaluated tap by tap (the textbook sum)."""

    def b(t):
        t = abs(t)
        return np.where(t < 1, 2 / 3 - t**2 + t**3 / 2, np.where(t < 2, (2 - t) ** 3 / 6, 0.0))

    y0, x0 = int(np.floor(y)), int(np.floor(x))
    total = 0.0
    for a in range(-1, 3):
        for c in range(-1, 3):
            total += b(y - (y0 + a)) * b(x - (x0 + c)) * coefficients[y0 + a + 2, x0 + c + 2]
    return total


@settings(max_examples=25, deadline=None)
@given(st.floats(0, 30.999), st.floats(0, 22.999), st.integers(0, 2**31 - 1))
def test_spline_samples_match_the_textbook_sum_and_interpolate(y, x, seed):
    frame = np.random.default_rng(seed).random((32, 24)).astype(np.float32) * 255
    padded = np.asarray(series_module._prepared_frame(frame, sigma=0.0), np.float64)
    value, gy, gx = (np.asarray(v) for v in series_module._sample(padded.astype(np.float32), np.array([y]),
                                                                   np.array([x]), gradient=True))  # fmt: skip
    np.testing.assert_allclose(value[0], _numpy_spline(padded, y, x), rtol=1e-5, atol=1e-3)
    h = 1e-4
    slope_y = (_numpy_spline(padded, min(y + h, 31), x) - _numpy_spline(padded, max(y - h, 0), x)) / (
        min(y + h, 31) - max(y - h, 0)
    )
    np.testing.assert_allclose(gy[0], slope_y, rtol=1e-3, atol=2e-2)
    # at whole pixels the spline is the frame
    iy, ix = int(y), int(x)
    at = series_module._sample(padded.astype(np.float32), np.array([float(iy)]), np.array([float(ix)]),
                               gradient=False)  # fmt: skip
    np.testing.assert_allclose(np.asarray(at)[0], frame[iy, ix], rtol=1e-5, atol=2e-3)


@pytest.mark.parametrize(("angle", "shift"), [(0, (0, 0)), (0, (30, -60)), (0, (5, 64)), (25, (3, -4)), (160, (0, 0))])
def test_the_whole_image_motion_is_found(angle, shift):
    frames, _ = make_dic_series("rotation", frames=1, shape=SHAPE)
    from scipy import ndimage

    a = np.deg2rad(angle)
    linear = np.array([[np.cos(a), np.sin(a)], [-np.sin(a), np.cos(a)]])
    centre = (np.array(SHAPE) - 1) / 2
    true = np.concatenate([linear, (centre - linear @ centre + shift)[:, None]], 1)
    inverse = np.linalg.inv(np.vstack([true, [0, 0, 1]]))[:2]
    moved = ndimage.affine_transform(frames[0].astype(float), inverse[:, :2], offset=inverse[:, 2], order=3)
    found = estimate_motion(frames[0], moved)
    corners = np.array([[20, 20, 1], [20, 107, 1], [107, 20, 1], [107, 107, 1]], float).T
    assert np.abs(found.matrix @ corners - true @ corners).max() < 1.0
    assert found.score > 0.8
