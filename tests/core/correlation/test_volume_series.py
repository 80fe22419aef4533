"""correlate_volume_series: time-lapse DVC against known motion per volume (a growing translation, a growing
rotation), its three reference policies, the points that leave the volume and come back, and its checks.

Every case shares one volume shape and subset (40^3, subset 11, step 8: 64 points), so that the few programs
compile once for the file. The volumes are windows of a larger texture carried by the known map, so that what
comes into view is texture, not a border's mirror.
"""

import dask.array as da
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

import napari_gridmip as gm
from napari_gridmip._sample_data.dvc import micro_ct_texture
from napari_gridmip.core.correlation import volume_series
from napari_gridmip.core.correlation import volumes as volume_pair
from napari_gridmip.core.correlation.status import Status
from napari_gridmip.core.runtime import sharding

SIZE = 40
OPTIONS = dict(subset=11, step=8)
PAD = 12  # the texture's margin around the window


def _turn(degrees: float) -> np.ndarray:
    """A rotation about the z axis (in the y-x plane)."""
    a = np.deg2rad(degrees)
    return np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])


def _series(matrices, shifts, *, seed=0, noise=0.0):
    """``(T, SIZE, SIZE, SIZE)`` float32 volumes whose volume ``t`` holds at ``A_t (X - c) + c + s_t`` what volume 0
    holds at ``X``, and the truth."""
    big = micro_ct_texture((SIZE + 2 * PAD,) * 3, seed=seed)
    centre = (np.array(big.shape) - 1) / 2
    rng = np.random.default_rng(seed + 1)
    out = []
    for matrix, shift in zip(matrices, shifts):
        inverse = np.linalg.inv(matrix)
        offset = centre - inverse @ (centre + np.asarray(shift, np.float64))
        moved = ndimage.affine_transform(big, inverse, offset=offset, order=3, mode="mirror")
        window = moved[PAD : PAD + SIZE, PAD : PAD + SIZE, PAD : PAD + SIZE]
        out.append(window + noise * rng.standard_normal(window.shape).astype(np.float32))
    truth = dict(matrices=np.asarray(matrices, np.float64), shifts=np.asarray(shifts, np.float64), centre=centre - PAD)
    return np.stack(out).astype(np.float32), truth


def _truth(truth, result, t):
    """The known displacement ``(3, P, R, C)`` of volume ``t`` at the grid."""
    points = np.stack(np.meshgrid(result.z, result.y, result.x, indexing="ij"), -1)
    moved = np.einsum("ij,...j->...i", truth["matrices"][t] - np.eye(3), points - truth["centre"])
    return np.moveaxis(moved + truth["shifts"][t], -1, 0)


def _errors(result, truth, t):
    found = np.stack([result.dz[t], result.dy[t], result.dx[t]])
    return np.sqrt(np.sum((found - _truth(truth, result, t)) ** 2, 0))


@pytest.fixture(scope="module")
def translating():
    """A translation growing by (0.6, -0.3, 1.5) voxels a volume (4.5 voxels along x by the last), with noise."""
    shifts = [np.array([0.6, -0.3, 1.5]) * t for t in range(4)]
    return _series([np.eye(3)] * 4, shifts, noise=0.01)


@pytest.fixture(scope="module")
def turning():
    """A rotation growing by 1.5 degree a volume about z, and a small drift."""
    return _series([_turn(1.5 * t) for t in range(4)], [np.array([0.3, 0.4, -0.3]) * t for t in range(4)])


@pytest.fixture(scope="module")
def results(translating, turning):
    return {
        (case, policy): gm.correlate_volume_series(volumes, reference=policy, **OPTIONS)
        for case, (volumes, _) in (("translating", translating), ("turning", turning))
        for policy in ("accumulated", "incremental", "auto")
    }


@pytest.mark.parametrize("policy", ["accumulated", "incremental", "auto"])
@pytest.mark.parametrize("case", ["translating", "turning"])
def test_each_policy_recovers_the_imposed_motion_of_every_volume(results, request, case, policy):
    result = results[case, policy]
    volumes, truth = request.getfixturevalue(case)
    count = len(volumes)
    assert result.dz.shape == (count, 4, 4, 4) and result.gradient.shape == (count, 4, 4, 4, 3, 3)
    np.testing.assert_array_equal(result.z, [5, 13, 21, 29])
    for t in range(1, count):
        ok = result.status[t] == Status.ok
        # the points whose subset stays in the volume are found (the others leave it: out_of_view)
        assert ok.sum() >= 44, (t, np.bincount(result.status[t].ravel()))
        assert set(np.unique(result.status[t][~ok])) <= {Status.out_of_view}
        errors = _errors(result, truth, t)
        assert np.sqrt(np.mean(errors[ok] ** 2)) < 0.03 and errors[ok].max() < 0.1, (t, errors[ok].max())
        assert np.all(np.isnan(result.dz[t][~ok]))
        # the gradient against the imposed map's (a rotation of 4.5 degrees at most: 0.078 off the diagonal);
        # a subset of 11 voxels fits it to about 0.005
        gradient = result.gradient[t][ok] - (truth["matrices"][t] - np.eye(3))
        assert np.sqrt(np.mean(gradient**2)) < 0.006 and np.abs(gradient).max() < 0.04


def test_volume_0_is_zero_displacement_against_itself(results):
    result = results["turning", "incremental"]
    ok = result.status[0] == Status.ok
    assert ok.all()
    for name in ("dz", "dy", "dx"):
        assert np.all(getattr(result, name)[0] == 0)
    assert np.all(result.zncc[0] == 1) and np.all(result.key_frame[0] == 0)
    assert np.all(result.gradient[0] == 0)
    np.testing.assert_array_equal(result.motion[0], np.eye(3, 4))


def test_the_policies_keys(results):
    accumulated = results["turning", "accumulated"]
    assert np.all(accumulated.key_frame[accumulated.status == Status.ok] == 0)
    # incremental: a point found in a volume is matched against it in the next
    incremental = results["turning", "incremental"]
    for t in range(2, len(incremental.dz)):
        both = (incremental.status[t] == Status.ok) & (incremental.status[t - 1] == Status.ok)
        assert both.sum() > 40
        assert np.all(incremental.key_frame[t][both] == t - 1)
    # auto: the ZNCC with volume 0 stays high on these, so every point stays on volume 0 and auto is accumulated
    auto = results["turning", "auto"]
    assert np.all(auto.key_frame[auto.status == Status.ok] == 0)


@pytest.mark.parametrize("case", ["translating", "turning"])
def test_auto_keeps_every_point_accumulated_keeps(results, case):
    accumulated, auto = results[case, "accumulated"], results[case, "auto"]
    kept = accumulated.status == Status.ok
    assert np.all(auto.status[kept] == Status.ok)
    np.testing.assert_allclose(auto.dx[kept], accumulated.dx[kept], atol=1e-3)


def test_auto_moves_a_key_whose_zncc_falls_and_goes_back_to_volume_0_where_it_matches_again(turning):
    # with noise, the ZNCC with volume 0 is about 0.998: a refresh at 0.999 moves some keys and brings some back
    volumes, truth = turning
    noisy = volumes + 0.01 * np.random.default_rng(5).standard_normal(volumes.shape).astype(np.float32)
    accumulated = gm.correlate_volume_series(noisy, **OPTIONS)
    auto = gm.correlate_volume_series(noisy, reference="auto", refresh_zncc=0.999, **OPTIONS)
    ok = auto.status == Status.ok
    assert np.all(ok[accumulated.status == Status.ok])
    keys = [set(np.unique(auto.key_frame[t][ok[t]]).tolist()) for t in range(len(volumes))]
    assert keys[1] == {0} and keys[2] > {0} and keys[3] > {0}, keys  # moved, and some back on (or still on) 0
    assert {1, 2} & keys[3], keys
    for t in range(1, len(volumes)):
        errors = _errors(auto, truth, t)[ok[t]]
        assert np.sqrt(np.mean(errors**2)) < 0.03 and errors.max() < 0.1


def test_a_point_out_of_view_is_nan_with_its_status_and_is_found_again_when_it_comes_back():
    # along x, 3 voxels, then 7 (the last column's subsets, x = 29 +- 5, leave the volume), then back to 2
    volumes, truth = _series([np.eye(3)] * 4, [(0, 0, 0), (0, 0, 3), (0, 0, 7), (0, 0, 2)])
    result = gm.correlate_volume_series(volumes, **OPTIONS)
    last = np.s_[:, :, -1]
    assert np.all(result.status[1][last] == Status.ok)
    assert np.all(result.status[2][last] == Status.out_of_view)
    assert np.all(np.isnan(result.dx[2][last])) and np.all(np.isnan(result.gradient[2][last]))
    assert np.all(result.status[2][:, :, :-1] == Status.ok)
    assert np.all(result.status[3] == Status.ok)  # the column back in view is found again
    assert np.max(_errors(result, truth, 3)) < 0.02


def _margin(truth, result, t, half):
    """How far (voxels) each point's subset, carried by the known map, stays inside the volume (< 0: it leaves)."""
    corners = half * (2 * np.array(list(np.ndindex(2, 2, 2)), np.float64) - 1)
    points = np.stack(np.meshgrid(result.z, result.y, result.x, indexing="ij"), -1)[..., None, :] + corners
    moved = np.einsum("ij,...j->...i", truth["matrices"][t], points - truth["centre"]) + truth["centre"]
    moved = moved + truth["shifts"][t]
    return np.minimum(moved + 0.5, SIZE - 0.5 - moved).min((-1, -2))


def test_large_accumulated_motion_is_followed_volume_by_volume():
    # by volume 5 the content moved (11.5, -5.5, 23) voxels and turned 5 degrees: far beyond the search's 4 voxels
    shifts = [np.array([2.3, -1.1, 4.6]) * t for t in range(6)]
    volumes, truth = _series([_turn(1.0 * t) for t in range(6)], shifts, noise=0.01)
    result = gm.correlate_volume_series(volumes, **OPTIONS)
    for t in range(1, 6):
        margin = _margin(truth, result, t, OPTIONS["subset"] // 2)
        ok = result.status[t] == Status.ok
        assert np.all(ok[margin > 0.3]) and not np.any(ok[margin < -0.3]), t
        assert np.all(result.status[t][margin < -0.3] == Status.out_of_view)
        assert ok.sum() >= 9 and _errors(result, truth, t)[ok].max() < 0.05


def test_the_first_volume_pair_is_correlate_volumes_answer(turning):
    volumes, _ = turning
    pair = gm.correlate_volumes(volumes[0], volumes[1], **OPTIONS)
    series = gm.correlate_volume_series(volumes[:2], **OPTIONS)
    np.testing.assert_array_equal(series.status[1], pair.status)
    for name in ("dz", "dy", "dx"):  # started elsewhere, both stop within the tolerance
        np.testing.assert_allclose(getattr(series, name)[1], getattr(pair, name), atol=2e-3)


def test_dask_volumes_read_a_time_point_at_a_time_give_the_same_answer(translating):
    volumes, _ = translating
    lazy = da.from_array(volumes, chunks=(1, 20, SIZE, SIZE))
    a = gm.correlate_volume_series(volumes[:3], shape="translation", **OPTIONS)
    b = gm.correlate_volume_series(lazy[:3], shape="translation", **OPTIONS)
    np.testing.assert_array_equal(a.status, b.status)
    np.testing.assert_array_equal(a.dx, b.dx)
    assert np.all(np.isnan(a.gradient))  # no gradient from a translation


def test_roi_points_outside_stay_outside_and_the_input_is_not_modified(translating):
    volumes, truth = translating
    before = volumes.copy()
    roi = np.zeros((SIZE,) * 3, bool)
    roi[:, :, :30] = True
    calls = []

    def progress(done, total):
        calls.append((done, total))

    result = gm.correlate_volume_series(volumes[:3], roi=roi, reference="incremental", prefilter="auto",
                                        progress=progress, **OPTIONS)  # fmt: skip
    np.testing.assert_array_equal(volumes, before)
    # after each volume, and between the chunks of points with the volumes done so far
    assert calls[-1] == (3, 3) and sorted(set(calls)) == [(0, 3), (1, 3), (2, 3), (3, 3)] and calls == sorted(calls)
    outside = result.status[0] == Status.outside_roi
    assert outside.sum() == 32 and np.all(outside == (result.status[0] != Status.ok))  # x = 21, 29: too little in
    for t in range(3):
        assert np.all(result.status[t][outside] == Status.outside_roi)
        assert np.all(result.key_frame[t][outside] == -1)
        ok = result.status[t] == Status.ok
        assert np.array_equal(ok, ~outside) and _errors(result, truth, t)[ok].max() < 0.05


def test_a_raising_progress_stops_the_run_within_a_volume(translating):
    """Cancel: a progress that raises between the chunks of volume 1's points ends the run there, before volume 1
    is reported done."""
    volumes, _ = translating
    calls = []

    class Stop(Exception):
        pass

    def progress(done, total):
        calls.append(done)
        if done == 1 and len(calls) > 1:  # a call inside volume 1, after volume 0's
            raise Stop

    with pytest.raises(Stop):
        gm.correlate_volume_series(volumes[:3], progress=progress, **OPTIONS)
    assert calls[-1] == 1 and 2 not in calls


def test_bad_input_names_what_was_given():
    volume = np.zeros((SIZE,) * 3, np.float32)
    with pytest.raises(ValueError, match=r"volumes must be 4D; got shape \(40, 40, 40\)"):
        gm.correlate_volume_series(volume)
    with pytest.raises(ValueError, match=r"at least 2 time points.*got shape \(1, 40, 40, 40\)"):
        gm.correlate_volume_series(volume[None])
    series = np.zeros((2, *volume.shape), np.float32)
    with pytest.raises(ValueError, match=r"reference must be one of .*'accumulated'.*got 'previous'"):
        gm.correlate_volume_series(series, reference="previous")
    with pytest.raises(TypeError, match=r"reference must be one of .*got 0 \(int\)"):
        gm.correlate_volume_series(series, reference=0)
    with pytest.raises(ValueError, match=r"subset must be odd.*got 12"):
        gm.correlate_volume_series(series, subset=12)
    with pytest.raises(ValueError, match=r"subset 41 is larger"):
        gm.correlate_volume_series(series, subset=41)
    with pytest.raises(ValueError, match=r"refresh_zncc must be in \[0, 1\]; got 1.5"):
        gm.correlate_volume_series(series, refresh_zncc=1.5)
    with pytest.raises(ValueError, match=r"volumes must have a bool, integer or real floating dtype.*complex64"):
        gm.correlate_volume_series(series.astype(np.complex64))
    with pytest.raises(ValueError, match=r"roi must be a mask of the reference's shape"):
        gm.correlate_volume_series(series, roi=np.ones((3, 3, 3), bool))
    with pytest.raises(TypeError, match=r"progress must be callable"):
        gm.correlate_volume_series(series, progress="yes")
    bad = series.copy()
    bad[1, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"volumes\[1\] has non-finite voxels"):
        gm.correlate_volume_series(bad)


@pytest.mark.skipif(jax.device_count() < 2, reason="needs several devices (CI: 8 host devices)")
@pytest.mark.parametrize("policy", ["incremental", "auto"])
def test_every_device_gives_one_devices_answers(monkeypatch, turning, policy):
    # the key frames' IC-GN is correlate_volumes' solver: its chunks (8 subsets here) dealt to every device, each
    # key frame's subsets prepared there once, each volume's coefficients put there once; with noise, "auto" too
    # moves keys (as in the test of its refresh)
    volumes, _ = turning
    volumes = volumes + 0.01 * np.random.default_rng(5).standard_normal(volumes.shape).astype(np.float32)
    options = dict(OPTIONS, reference=policy, refresh_zncc=0.999)
    monkeypatch.setattr(volume_pair, "CHUNK_VOXELS", 8 * OPTIONS["subset"] ** 3)
    monkeypatch.setenv(sharding.VARIABLE, "0")
    one = gm.correlate_volume_series(volumes, **options)
    monkeypatch.delenv(sharding.VARIABLE)
    used = set()
    original = volume_pair._chunked

    def noting(program, shared, index, per_point, chunk, *args, spread=None, **kwargs):
        if spread is not None and spread.many and len(index) > chunk:
            used.update(spread.devices[: -(-len(index) // chunk)])
        return original(program, shared, index, per_point, chunk, *args, spread=spread, **kwargs)

    monkeypatch.setattr(volume_pair, "_chunked", noting)
    many = gm.correlate_volume_series(volumes, **options)
    assert len(used) > 1  # the chunks ran on several devices at once
    assert len(np.unique(one.key_frame)) > 2  # several key frames
    for name in ("dz", "dy", "dx", "zncc", "status", "key_frame", "gradient", "motion"):
        np.testing.assert_array_equal(getattr(many, name), getattr(one, name), err_msg=name)


_finite = st.floats(-3, 3, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(_finite, min_size=3, max_size=3),
    st.lists(st.floats(-0.2, 0.2, allow_nan=False), min_size=9, max_size=9),
    st.lists(st.floats(-0.2, 0.2, allow_nan=False), min_size=9, max_size=9),
    st.lists(st.floats(-0.5, 0.5, allow_nan=False), min_size=3, max_size=3),
)
def test_a_key_frames_warp_and_the_total_map_are_inverse(position, jacobian, key_jacobian, offset):
    """The point's position and gradient from volume 0 -> its key frame's warp -> back: the same (the composition
    through the point itself)."""
    position = np.array([position]) + 20
    jacobian = np.eye(3) + np.reshape(jacobian, (1, 3, 3))
    key_jacobian = np.eye(3) + np.reshape(key_jacobian, (1, 3, 3))
    offset = np.array([offset])
    centre = np.array([[18.0, 21.0, 19.0]])
    warp = volume_series._local(position, jacobian, centre, offset, key_jacobian, True)
    back_position, back_jacobian = volume_series._total(warp, centre, offset, key_jacobian)
    np.testing.assert_allclose(back_position, position, atol=1e-9)
    np.testing.assert_allclose(back_jacobian, jacobian, atol=1e-9)


def test_the_strain_of_a_time_lapse_is_each_volumes_strain_from_volume_0(results, turning):
    result = results["turning", "accumulated"]
    _, truth = turning
    for method, tolerance in (("subsets", 0.01), ("smoothed", 0.01)):
        strain = gm.volume_strain(result, method=method)
        assert strain.green_lagrange.shape == (*result.dz.shape, 6) and strain.gradient.shape == result.gradient.shape
        for t in range(len(result.dz)):
            # a rotation strains nothing: Green-Lagrange 0 wherever the point was found (volume 0 itself too)
            ok = result.status[t] == Status.ok
            assert np.abs(strain.green_lagrange[t][ok]).max() < tolerance, (method, t)
            assert np.all(np.isnan(strain.volumetric[t][~ok]))
        # the smoothed field's gradient is each volume's own: the rotation's, growing with t
        if method == "smoothed":
            inner = strain.gradient[3][1:-1, 1:-1, 1:-1]
            assert np.nanmedian(inner[..., 1, 2]) == pytest.approx((truth["matrices"][3] - np.eye(3))[1, 2], abs=0.01)
