"""correlate_series' reference policies over a long sequence of rigid motion with rotation, against its truth:
the incremental policy's drift, the auto policy's losses, and the rigid warp."""

import numpy as np
import pytest

import napari_gridmip as gm
from napari_gridmip._sample_data.dic import _dots, camera, render_speckle
from napari_gridmip._sample_data.dic_series import _inverse
from napari_gridmip.core.correlation.series import Status

SHAPE = (128, 128)
CENTRE = np.array([(SHAPE[0] - 1) / 2, (SHAPE[1] - 1) / 2])
FRAMES = 60
OPTIONS = dict(subset=31, step=10)


def _rigid(degrees, shift):
    a = np.deg2rad(degrees)
    c, s = np.cos(a), np.sin(a)

    def phi(y, x):
        dy, dx = y - CENTRE[0], x - CENTRE[1]
        return CENTRE[0] + shift[0] + c * dy - s * dx, CENTRE[1] + shift[1] + s * dy + c * dx

    return phi


def make_rigid_sequence(frames=FRAMES, seed=0, noise=0.01, angles=None):
    """A speckled disc turning to 20 degrees and back while it drifts (steps of 5 degrees and 3 px a frame), on
    black, with its ROI and maps; or a pure rotation by ``angles`` (degrees)."""
    rng = np.random.default_rng(seed)
    centres, amplitudes = _dots(SHAPE, rng, margin=8.0)
    qy, qx = np.meshgrid(np.arange(SHAPE[0], dtype=np.float64), np.arange(SHAPE[1], dtype=np.float64), indexing="ij")
    t = np.arange(frames)

    def zigzag(period):  # 0 to 1 and back, in steps of 2 / period
        phase = (t / period) % 1
        return 1 - np.abs(2 * phase - 1)

    if angles is None:
        angles = 20.0 * zigzag(8)  # steps of 5 degrees
        shifts = np.stack([6 * zigzag(4), 9 * zigzag(6)], 1)  # steps of 3 px
    else:  # a pure rotation
        shifts = np.zeros((len(angles), 2))
    maps = [_rigid(a, s) for a, s in zip(angles, shifts)]
    radius = 44.0
    out = []
    for phi in maps:
        py, px = _inverse(phi, qy, qx)
        landing = np.stack(phi(centres[:, 0], centres[:, 1]), axis=1)
        intensity = render_speckle(py, px, centres, amplitudes, landing)
        out.append(camera(np.where(np.hypot(py - CENTRE[0], px - CENTRE[1]) <= radius, intensity, 0.0), rng, noise))
    return np.stack(out), np.hypot(qy - CENTRE[0], qx - CENTRE[1]) <= radius, maps


@pytest.fixture(scope="module")
def rigid():
    frames, roi, maps = make_rigid_sequence()
    results = {ref: gm.correlate_series(frames, roi=roi, reference=ref, **OPTIONS)
               for ref in ("accumulated", "incremental", "auto")}  # fmt: skip
    # a refresh threshold the rotation's interpolation loss crosses: the keys move often
    for ref in ("auto", "incremental"):  # (the ZNCC here stays above 0.9995 at a good match)
        results[ref, "moving"] = gm.correlate_series(frames, roi=roi, reference=ref, refresh_zncc=0.9999, **OPTIONS)
    return frames, roi, maps, results


def _error(result, maps):
    gy, gx = np.meshgrid(result.y, result.x, indexing="ij")
    truth = np.stack([np.stack(phi(gy, gx)) for phi in maps]) - np.stack([gy, gx])
    return np.hypot(result.dy - truth[:, 0], result.dx - truth[:, 1])


def _rms(result, maps):
    error = _error(result, maps)[1:]
    return float(np.sqrt(np.nanmean(error[result.status[1:] == Status.ok] ** 2)))


def test_incremental_drifts_at_most_twice_accumulated(rigid):
    _, _, maps, results = rigid
    accumulated, incremental = _rms(results["accumulated"], maps), _rms(results["incremental"], maps)
    assert accumulated < 0.05
    assert incremental <= 2 * accumulated
    # with frame 0 out of reach (a threshold no match meets), the increments alone: composed through each point's
    # full affine warp, they still drift less than twice as much
    moving = results["incremental", "moving"]
    assert np.mean(moving.key_frame[2:] > 0) > 0.5
    assert _rms(moving, maps) <= 2 * accumulated
    ok = results["accumulated"].status == Status.ok
    assert (results["incremental"].status == Status.ok)[ok].mean() >= 0.99
    # its keys: the last frame each point was found in, or frame 0 where that still matched
    key = results["incremental"].key_frame[2:]
    assert np.all((key == 0) | (key == np.arange(1, FRAMES - 1)[:, None, None]) | (key == -1))


def test_auto_keeps_every_point_accumulated_keeps(rigid):
    _, _, maps, results = rigid
    ok = results["accumulated"].status == Status.ok
    for auto in (results["auto"], results["auto", "moving"]):
        assert np.all(auto.status[ok] == Status.ok)
        assert _rms(auto, maps) <= 2 * _rms(results["accumulated"], maps)
    assert np.mean(results["auto", "moving"].key_frame > 0) > 0.3  # its keys did move


def test_a_rigid_warp_recovers_a_pure_rotation_at_least_as_exactly_as_the_affine_one():
    frames, roi, turn = make_rigid_sequence(seed=1, angles=[0.0, 4.0, 8.0, 12.0, 16.0])
    affine = gm.correlate_series(frames, roi=roi, **OPTIONS)
    rigid = gm.correlate_series(frames, roi=roi, shape="rigid", **OPTIONS)
    ok = (affine.status == Status.ok) & (rigid.status == Status.ok)
    assert ok[1:].mean() > 0.9 * (affine.status[1:] == Status.ok).mean()
    e_affine, e_rigid = _error(affine, turn)[1:][ok[1:]], _error(rigid, turn)[1:][ok[1:]]
    assert np.sqrt(np.mean(e_rigid**2)) <= np.sqrt(np.mean(e_affine**2))
    # its gradients are a rotation's, exactly (an affine warp's fit a stretch and a shear to the noise too), of the
    # true angle within the subsets' precision
    found = rigid.status == Status.ok
    np.testing.assert_allclose(rigid.dx_y[found], -rigid.dy_x[found], atol=1e-6)
    np.testing.assert_allclose(rigid.dy_y[found], rigid.dx_x[found], atol=1e-6)
    np.testing.assert_allclose(np.hypot(1 + rigid.dy_y[found], rigid.dx_y[found]), 1, atol=1e-6)
    for t, angle in enumerate(np.deg2rad([4.0, 8.0, 12.0, 16.0]), start=1):
        np.testing.assert_allclose(rigid.dx_y[t][found[t]], np.sin(angle), atol=5e-3)
