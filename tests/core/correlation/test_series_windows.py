"""The accelerator's interpolation of the DIC series (one window of coefficients per point, a matrix product of
the B-spline's weights, :func:`series._windowed_spline`) against the textbook sum and against the gathers the CPU
takes: forced on the CPU, a whole sequence gives the gathers' answers."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import napari_gridmip as gm
from napari_gridmip._sample_data.dic_series import make_dic_series
from napari_gridmip.core.correlation import series as series_module
from napari_gridmip.core.runtime import strategy
from tests.core.correlation.test_series import _numpy_spline


@settings(max_examples=25, deadline=None)
@given(st.floats(-3, 42), st.floats(-3, 30), st.floats(-np.pi, np.pi), st.integers(0, 2**31 - 1),
       st.sampled_from([None, 0, 1]))  # fmt: skip
def test_window_values_are_the_textbook_spline(y, x, angle, seed, along):
    frame = np.random.default_rng(seed).random((40, 28)).astype(np.float32) * 255
    padded = series_module._prepared_frame(frame, sigma=0.0)
    eta, zeta = (np.asarray(a) for a in series_module.warp.subset_offsets((9, 7), np.float32))
    py = (y + np.cos(angle) * eta - np.sin(angle) * zeta)[None].astype(np.float32)
    px = (x + np.sin(angle) * eta + np.cos(angle) * zeta)[None].astype(np.float32)
    side = 24
    got, served = series_module._windowed_spline(padded, jnp.asarray(py), jnp.asarray(px), along, side=side)
    want = np.asarray(series_module._spline(padded, jnp.asarray(py), jnp.asarray(px), along))
    assert bool(served[0])  # a 9 x 7 subset turned by any angle fits a window of 24
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=2e-3)
    if along is None:  # and the textbook sum, in float64, at clipped positions as the gathers clip
        cy, cx = np.clip(py[0], 0, 39), np.clip(px[0], 0, 27)
        reference = [_numpy_spline(np.asarray(padded, np.float64), a, b) for a, b in zip(cy[:5], cx[:5])]
        np.testing.assert_allclose(np.asarray(got)[0, :5], reference, rtol=1e-5, atol=2e-3)


def test_points_that_spread_past_their_window_are_not_served_and_nan_pixels_stay_nan():
    padded = series_module._prepared_frame(np.random.default_rng(1).random((60, 60)).astype(np.float32), sigma=0.0)
    py = np.array([[10.0, 10.5, 40.0], [10.0, np.nan, 12.0], [np.nan, np.nan, np.nan]], np.float32)
    px = np.array([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0], [5.0, 5.0, 5.0]], np.float32)
    got, served = series_module._windowed_spline(padded, jnp.asarray(py), jnp.asarray(px), side=16)
    np.testing.assert_array_equal(np.asarray(served), [False, True, True])  # 30 rows apart > 16 - 4
    got = np.asarray(got)
    assert np.isnan(got[1, 1]) and np.all(np.isfinite(got[1, [0, 2]])) and np.all(np.isnan(got[2]))
    want = np.asarray(series_module._spline(padded, jnp.asarray(py), jnp.asarray(px)))
    np.testing.assert_allclose(got[1, [0, 2]], want[1, [0, 2]], rtol=1e-5, atol=1e-4)


@pytest.mark.slow  # two sequences twice, each compiling its programs (about 10 s); the pieces above are the quick check
@pytest.mark.parametrize(("kind", "reference"), [("rotation", "accumulated"), ("translation", "auto")])
def test_a_sequence_read_through_windows_gives_the_gathers_answers(monkeypatch, kind, reference):
    frames, truth = make_dic_series(kind, frames=4, shape=(96, 96))
    roi = truth.get("roi")
    options = dict(subset=21, step=8, roi=roi, reference=reference)
    gathered = gm.correlate_series(frames, **options)
    monkeypatch.setattr(strategy, "spline_windows", lambda: True)
    assert series_module._window_side((21, 21), (96, 96)) == 40
    windowed = gm.correlate_series(frames, **options)
    np.testing.assert_array_equal(windowed.status, gathered.status)
    ok = gathered.status == gm.Status.ok
    assert ok[1:].sum() > 20
    for name in ("dy", "dx", "dy_x", "dx_y"):
        np.testing.assert_allclose(getattr(windowed, name)[ok], getattr(gathered, name)[ok], atol=1e-3, err_msg=name)
