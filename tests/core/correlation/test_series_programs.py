"""correlate_series against the pair's affine IC-GN, and its compiled programs against the sequence's length.

A two-frame sequence is one pair: each point's warp must be the one ``find_displacement(shape="affine")`` finds.
A sequence is one set of programs of its frames' shape and grid: a longer one (points lost and found again,
neighbours' guesses, key frames moving) compiles nothing more.
"""

import numpy as np

import napari_gridmip as gm
from napari_gridmip._sample_data.dic import make_dic_pair
from napari_gridmip._sample_data.dic_series import make_dic_series
from napari_gridmip.core.correlation.series import Status
from tests.helpers import count_traces

SHAPE = (128, 128)
SUBSET, STEP, WINDOW = 21, 8, 15


def _rigid_field(angle_deg: float, shift: tuple[float, float]) -> dict[str, np.ndarray]:
    """A rotation about the centre and a shift, as a displacement field of ``SHAPE`` (no stretch: the pair's blur
    correction, which the series does not make, is then nothing)."""
    a = np.deg2rad(angle_deg)
    yy, xx = np.mgrid[: SHAPE[0], : SHAPE[1]].astype(np.float64)
    cy, cx = (SHAPE[0] - 1) / 2, (SHAPE[1] - 1) / 2
    y = cy + np.cos(a) * (yy - cy) + np.sin(a) * (xx - cx) + shift[0]
    x = cx - np.sin(a) * (yy - cy) + np.cos(a) * (xx - cx) + shift[1]
    return {"dy": y - yy, "dx": x - xx}


def test_a_two_frame_series_is_the_pairs_affine_match():
    reference, deformed, _ = make_dic_pair(SHAPE, field=_rigid_field(1.5, (0.35, -0.6)), seed=4)
    series = gm.correlate_series(np.stack([reference, deformed]), subset=SUBSET, step=STEP)
    # the pair's grid starts WINDOW // 2 further in: cropped by 1 px, its points are the series' from the second on
    pair = gm.find_displacement(deformed[None, 1:, 1:], reference[None, 1:, 1:], (WINDOW, WINDOW),
                                subset=(SUBSET, SUBSET), step=STEP, shape="affine", subpixel="refine")  # fmt: skip
    rows, cols = np.asarray(pair.dy).shape[-2:]
    np.testing.assert_array_equal(series.y[1 : rows + 1], 1 + WINDOW // 2 + SUBSET // 2 + STEP * np.arange(rows))
    ok = series.status[1, 1 : rows + 1, 1 : cols + 1] == Status.ok
    names = ("dy", "dx", "dy_y", "dy_x", "dx_y", "dx_x")
    got = {name: getattr(series, name)[1, 1 : rows + 1, 1 : cols + 1] for name in names}
    want = {name: np.asarray(getattr(pair, name)).reshape(rows, cols) for name in names}
    both = ok & np.isfinite(want["dy"]) & np.isfinite(want["dx"])
    assert both.mean() > 0.9
    for name in ("dy", "dx"):
        np.testing.assert_allclose(got[name][both], want[name][both], atol=1e-3, err_msg=name)
    # the gradients to what the series' tolerance leaves: 5e-4 px at a corner 10 px from the centre, 5e-5 a step
    for name in ("dy_y", "dy_x", "dx_y", "dx_x"):
        np.testing.assert_allclose(got[name][both], want[name][both], atol=3e-4, err_msg=name)


def test_a_longer_sequence_compiles_no_more_programs():
    shape = (112, 96)  # a shape of its own: the first call compiles its programs here
    frames, _ = make_dic_series("translation", frames=7, shape=shape)
    for reference in ("accumulated", "incremental"):
        with count_traces() as short:
            gm.correlate_series(frames[:2], subset=SUBSET, step=STEP, reference=reference)
        # frames that carry half the grid out of view and back: passes over every number of points, lost points
        # found again, neighbours' guesses, key frames that move
        with count_traces() as long:
            result = gm.correlate_series(frames, subset=SUBSET, step=STEP, reference=reference)
        assert (result.status[1:] == Status.out_of_view).any() and (result.status[1:] == Status.ok).any()
        assert long.count == 0, reference
    assert short.count == 0  # the second policy's short run reused the first's programs
