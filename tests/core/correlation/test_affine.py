"""First-order (affine) subsets: IC-GN against the definition (scipy's spline, a NumPy criterion and a generic
minimiser), accuracy on a realistic stretched and rotated 8-bit pair, dask, errors, and strains of gradients."""

from __future__ import annotations

from functools import partial

import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage, optimize

from napari_gridmip import find_displacement, strain_field
from napari_gridmip._sample_data import dic as dic_module
from napari_gridmip._sample_data.dic import make_dic_pair
from napari_gridmip.core.correlation import affine as affine_module
from napari_gridmip.core.correlation import subsets as subsets_module
from napari_gridmip.core.correlation.prefilter import DEFAULT_SIGMA
from napari_gridmip.core.runtime import strategy
from tests.core.correlation.subset_reference import affine_spread
from tests.helpers import examples

SIZE = 160
ANGLE = np.deg2rad(2.0)
# the deformation gradient's displacement part, rows (y, x): a 3% stretch along x, then a 2 degree rotation
GRAD = np.array([[np.cos(ANGLE), -np.sin(ANGLE)], [np.sin(ANGLE), np.cos(ANGLE)]]) @ np.diag([1.0, 1.03]) - np.eye(2)


def _affine_field(size: int) -> dict[str, np.ndarray]:
    y, x = np.meshgrid(np.arange(size, dtype=float), np.arange(size, dtype=float), indexing="ij")
    c = (size - 1) / 2
    return {"dy": GRAD[0, 0] * (y - c) + GRAD[0, 1] * (x - c), "dx": GRAD[1, 0] * (y - c) + GRAD[1, 1] * (x - c)}


@pytest.fixture(scope="module")
def stretched():
    """A realistic 8-bit DIC pair (0.5% noise, quantised) under the affine field; img1 = deformed."""
    field = _affine_field(SIZE)
    reference, deformed, _ = make_dic_pair((SIZE, SIZE), field=field, seed=3, noise=0.005)
    return deformed[None], reference[None], field


def _grid(out_shape, step, window, subset):
    gy = np.arange(out_shape[0]) * step + window[0] // 2 + subset[0] // 2
    gx = np.arange(out_shape[1]) * step + window[1] // 2 + subset[1] // 2
    return gy, gx


def test_affine_subsets_meet_the_targets(stretched):
    """Subset 31: displacement RMS at most 0.01 px (translation-only: 0.1 px), the gradients' mean within 2e-4 of
    the truth (the systematic error) and each point's within 2e-3 at 0.5% noise (median about 2.5e-4: the
    noise's share)."""
    img1, img2, field = stretched
    window, subset, step = (15, 15), (31, 31), 6
    translation = find_displacement(img1, img2, window, subset=subset, step=step, subpixel="refine")
    affine = find_displacement(img1, img2, window, subset=subset, step=step, subpixel="refine", shape="affine")
    assert affine._fields == ("dy", "dx", "peak", "dy_y", "dy_x", "dx_y", "dx_x")
    gy, gx = _grid(affine.dy.shape, step, window, subset)
    truth = [field[name][np.ix_(gy, gx)] for name in ("dy", "dx")]

    def rms(result):
        return float(
            np.sqrt(np.nanmean((np.asarray(result.dy) - truth[0]) ** 2 + (np.asarray(result.dx) - truth[1]) ** 2))
        )

    assert rms(translation) > 0.05
    assert rms(affine) < 0.01
    assert np.isnan(np.asarray(affine.dy)).mean() < 0.02
    for name, expected in zip(("dy_y", "dy_x", "dx_y", "dx_x"), GRAD.ravel()):
        values = np.asarray(getattr(affine, name))
        assert abs(np.nanmean(values) - expected) < 2e-4, name
        assert np.nanmax(np.abs(values - expected)) < 2e-3, name
        assert np.nanmedian(np.abs(values - expected)) < 4e-4, name
    assert np.nanmedian(np.asarray(affine.peak)) > np.nanmedian(np.asarray(translation.peak))


def _warped(rng, n, subset, gradient, shape, centres=None):
    """Positions ``(n, sh sw)`` of ``n`` subsets' pixels under random affine warps (gradients of scale
    ``gradient``), centred at random pixels of an image of ``shape`` (or at ``centres``)."""
    sh, sw = subset
    eta, zeta = (a.ravel().astype(np.float32) for a in np.meshgrid(np.arange(sh) - sh // 2, np.arange(sw) - sw // 2,
                                                                   indexing="ij"))  # fmt: skip
    if centres is None:
        centres = (rng.integers(0, shape[0], n), rng.integers(0, shape[1], n))
    cy, cx = (np.asarray(c, np.float32)[:, None] for c in centres)
    p = rng.normal(scale=[2, gradient, gradient, 2, gradient, gradient], size=(n, 6)).astype(np.float32)
    py = cy + eta + p[:, :1] + p[:, 1:2] * eta + p[:, 2:3] * zeta
    px = cx + zeta + p[:, 3:4] + p[:, 4:5] * eta + p[:, 5:6] * zeta
    return py, px


@pytest.mark.parametrize(
    ("subset", "gradient", "where", "windows"),
    [
        ((31, 31), 0.02, "inside", True),
        ((31, 29), 0.0, "inside", True),
        ((5, 7), 0.05, "inside", True),
        ((1, 1), 0.0, "inside", True),
        ((31, 31), 0.02, "last rows and columns", True),  # the windows' margin past the end: the padding
        ((3, 3), 0.0, "off the image", False),  # clipped: the knots of a subset pile up at the edge
        ((31, 31), 0.3, "inside", False),  # past the margin
    ],
)
def test_windowed_interpolation_gives_the_gathers_values(subset, gradient, where, windows):
    """An accelerator's interpolation from one window per point (core.runtime.strategy.spline_windows) gives the 16
    gathers' values within float32 rounding (the same terms in the same order, plus selected zeros), K = 3
    frames: warps within its margin, subsets at the image's last rows and columns; where some point's subset
    is off the image or its warp past the margin, it serves no point (``windows``: it serves them)."""
    import jax

    rng = np.random.default_rng(sum(subset) + int(gradient * 100))
    image = (3, 90, 101)
    coefficients = rng.normal(size=(image[0], image[1] + 4, image[2] + 4)).astype(np.float32)
    hs, hw = subset[0] // 2, subset[1] // 2
    if where == "inside":
        centres = (rng.integers(hs + 8, image[1] - hs - 8, 9), rng.integers(hw + 8, image[2] - hw - 8, 9))
    elif where == "last rows and columns":
        centres = (np.full(9, image[1] - hs - 3), image[2] - hw - 3 - np.arange(9) % 2)
    else:  # over every edge and corner
        centres = (np.array([0, 89, 45, -3, 95, 0]), np.array([50, 50, 0, 100, -4, 104]))
    py, px = _warped(rng, len(centres[0]), subset, gradient, image[1:], centres)
    gathered = np.asarray(jax.jit(affine_module._interpolate)(coefficients, py, px))
    windowed, served = jax.jit(partial(affine_module._interpolate_windows, subset=subset))(coefficients, py, px)
    served = np.asarray(served)
    assert windowed.shape == gathered.shape == (image[0], *py.shape) and served.shape == (len(py),)
    fits = np.asarray(affine_module._windows_fit(py, px, coefficients.shape[1:], subset))
    assert bool(fits.all()) is windows and (where != "off the image" or fits.any())  # some fit there
    np.testing.assert_array_equal(served, np.full(len(py), windows))  # all or none
    if windows:
        np.testing.assert_allclose(np.asarray(windowed), gathered, rtol=0, atol=1e-6 * np.abs(gathered).max())


def test_windows_ignore_what_is_not_a_tap():
    """A NaN coefficient in a point's window but outside its pixels' taps changes nothing (the gathers never read
    it); a NaN inside the taps is NaN there, as the gathers give it; a point with a NaN position is NaN and
    does not send the others back to the gathers; an image smaller than a window takes the gathers."""
    import jax

    rng = np.random.default_rng(7)
    coefficients = rng.normal(size=(1, 44, 44)).astype(np.float32)
    subset = (5, 5)
    py, px = _warped(rng, 3, subset, 0.0, (40, 40), (np.array([10, 20, 30]), np.array([15, 20, 25])))
    py[:, :] = np.round(py) + 0.25  # every knot's taps known: rows round(py) - 1 + 1 ... + 4 of the padded image
    windowed_only = jax.jit(partial(affine_module._interpolate_windows, subset=subset))

    def interpolate(c, y, x):  # every point served here
        values, served = windowed_only(c, y, x)
        assert np.asarray(served).all()
        return values

    gathered = np.asarray(affine_module._interpolate(coefficients, py, px))
    assert np.isfinite(gathered).all()
    below = int(np.floor(py.max())) + 1 + 4  # the padded row just past the last point's taps
    poisoned = coefficients.copy()
    poisoned[:, below] = np.nan
    assert np.asarray(affine_module._windows_fit(py, px, poisoned.shape[1:], subset)).all()
    np.testing.assert_allclose(np.asarray(interpolate(poisoned, py, px)), gathered, rtol=0, atol=1e-6)
    poisoned[:, below - 1] = np.nan  # the last tap row of the lowest point's last pixels
    np.testing.assert_array_equal(np.isnan(np.asarray(interpolate(poisoned, py, px))),
                                  np.isnan(np.asarray(affine_module._interpolate(poisoned, py, px))))  # fmt: skip
    lost = py.copy()
    lost[1] = np.nan
    assert np.asarray(affine_module._windows_fit(lost, px, coefficients.shape[1:], subset)).all()
    windowed = np.asarray(interpolate(coefficients, lost, px))
    assert np.isnan(windowed[:, 1]).all()
    np.testing.assert_allclose(windowed[:, [0, 2]], gathered[:, [0, 2]], rtol=0, atol=1e-6)
    small = coefficients[:, :7, :7]  # 3 x 3 pixels: a window (5 + 7 rows) is larger even padded (7 + 4)
    near = (py - 8, px - 13)
    np.testing.assert_allclose(np.asarray(interpolate(small, *near)), affine_module._interpolate(small, *near),
                               rtol=0, atol=1e-6)  # fmt: skip


@settings(max_examples=examples(30), deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 5), step=st.integers(1, 6), sh=st.integers(1, 9),
       sw=st.integers(1, 9), frames=st.integers(1, 2), images=st.integers(1, 3),
       corner=st.tuples(st.integers(0, 3), st.integers(0, 3)))  # fmt: skip
def test_grid_subsets_are_the_windows_subsets(rows, cols, step, sh, sw, frames, images, corner):
    """The reference subsets of a grid of points read by blocks of rows and columns (``affine._grid_subsets``),
    several images at once, are those of one window per point (``_subset_windows``) of each, bit for bit: any
    spacing against the subset (step 1, steps larger than the subset, subsets not a multiple of the step), odd
    and even sides, the grid at the image's last row and column."""
    import jax

    rng = np.random.default_rng(rows * 1000 + cols * 100 + step * 10 + sh)
    extra = corner[0] + corner[1]
    shape = (frames, corner[0] + (rows - 1) * step + sh + extra % 2, corner[1] + (cols - 1) * step + sw + extra % 3)
    stack = tuple(rng.normal(size=shape).astype(np.float32) for _ in range(images))
    top = corner[0] + np.arange(rows)[:, None] * step + np.zeros(cols, int)[None, :]
    left = corner[1] + np.zeros(rows, int)[:, None] + np.arange(cols)[None, :] * step
    grid = jax.jit(partial(affine_module._grid_subsets, subset=(sh, sw), grid=(rows, cols, step)))(
        stack, np.int32(corner[0]), np.int32(corner[1])
    )
    assert len(grid) == images
    for image, read in zip(stack, grid, strict=True):
        windows = affine_module._subset_windows(image, top.ravel().astype(np.int32),
                                                left.ravel().astype(np.int32), (sh, sw))  # fmt: skip
        np.testing.assert_array_equal(np.asarray(read), np.asarray(windows))


@pytest.mark.parametrize("read", ["grid subsets", "tiles"])
def test_the_grid_reads_give_the_windows_field(stretched, monkeypatch, read):
    """An accelerator's IC-GN (forced on the CPU) with its reference subsets read by the grid's rows and columns,
    and (``tiles``) each step's windows picked out of tiles read once, gives the field of one window per point,
    in bands of rows together and row by row (the same subsets and windows, bit for bit, as tested below;
    another program, whose later sums may round otherwise: 7.1e-6 px row by row on the CPU). No point leaves
    its tile on this pair: the gathers' band never runs."""

    img1, img2, _ = stretched
    args = dict(subset=(31, 31), step=12, subpixel="refine", shape="affine")
    monkeypatch.setattr(strategy, "spline_windows", lambda: True)
    flag = "GRID_SUBSETS" if read == "grid subsets" else "TILE_WINDOWS"
    band = affine_module._band
    for together in (True, False):
        monkeypatch.setattr(strategy, "ic_gn_rows_together", lambda together=together: together)
        monkeypatch.setattr(affine_module, "GRID_SUBSETS", False)  # one window per point
        monkeypatch.setattr(affine_module, "TILE_WINDOWS", False)
        windows = find_displacement(img1, img2, (15, 15), **args)
        monkeypatch.setattr(affine_module, flag, True)
        calls = []
        monkeypatch.setattr(affine_module, "_band", lambda *a, calls=calls, **k: calls.append(k) or band(*a, **k))
        grid = find_displacement(img1, img2, (15, 15), **args)
        monkeypatch.setattr(affine_module, "_band", band)
        assert calls and all(k["windows"] and k["grid"] == (12, 15 // 2 + affine_module.TILE_SLACK
                                                            if read == "tiles" else 0) for k in calls)  # fmt: skip
        assert np.isfinite(np.asarray(grid.dy)).mean() > 0.95
        for name in windows._fields:
            np.testing.assert_allclose(np.asarray(getattr(grid, name)), np.asarray(getattr(windows, name)), rtol=0,
                                       atol=2e-5, equal_nan=True, err_msg=f"{name}, together {together}")  # fmt: skip


@settings(max_examples=examples(30), deadline=None)
@given(side=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       room=st.tuples(st.sampled_from([0, 1, 3, 7, 15]), st.sampled_from([0, 1, 3, 7, 15])),
       frames=st.integers(1, 2), seed=st.integers(0, 99))  # fmt: skip
def test_tile_windows_are_the_slices(side, room, frames, seed):
    """``affine._tile_windows`` picks each point's window out of its tile as a slice would, bit for bit (NaN in the
    tile outside the window included), for every offset pair the tile leaves room for (``2^m - 1`` per axis,
    each pair a point of its own)."""
    rng = np.random.default_rng(seed)
    oy, ox = (a.ravel() for a in np.meshgrid(np.arange(room[0] + 1), np.arange(room[1] + 1), indexing="ij"))
    n = len(oy)
    block = rng.normal(size=(frames, n, side[0] + room[0], side[1] + room[1])).astype(np.float32)
    block[rng.random(block.shape) < 0.1] = np.nan
    out = np.asarray(affine_module._tile_windows(block, oy, ox, side))
    assert out.shape == (frames, *side, n)
    for p in range(n):
        np.testing.assert_array_equal(out[..., p], block[:, p, oy[p] : oy[p] + side[0], ox[p] : ox[p] + side[1]])


def test_a_tiles_room_is_two_to_a_power_less_one():
    """A tile leaves room for ``2^m - 1`` offsets (``_tile_room``: at least twice the margin); another room is a
    ValueError naming the sides."""
    assert [affine_module._tile_room(m) for m in (0, 1, 2, 3, 4, 7, 8)] == [0, 3, 7, 7, 15, 15, 31]
    block = np.zeros((1, 2, 9, 10), np.float32)
    with pytest.raises(ValueError, match="side of 9 for a window of 7"):
        affine_module._tile_windows(block, np.zeros(2, int), np.zeros(2, int), (7, 7))


def test_a_window_out_of_its_tile_is_not_served():
    """With tiles, a point whose window starts outside its tile (a warp that carried it past the tile's margin)
    makes the call serve no point; inside, the tiles give the windows' values."""
    import jax

    rng = np.random.default_rng(11)
    subset, margin = (7, 7), 3
    coefficients = rng.normal(size=(1, 64, 64)).astype(np.float32)
    py, px = _warped(rng, 4, subset, 0.0, (60, 60), (np.array([20, 25, 30, 35]), np.array([30, 30, 30, 30])))
    taps, room = 2 * affine_module.SPLINE_MARGIN + 4, affine_module._tile_room(margin)
    side = (subset[0] + taps - 1 + room, subset[1] + taps - 1 + room)
    wide = np.pad(coefficients, ((0, 0), (margin, room - margin + 4), (margin, room - margin + 4)))
    _, ((_, _, top), (_, _, left)) = affine_module._window_knots(py, px, coefficients.shape[1:], subset)
    top, left = np.asarray(top), np.asarray(left)
    interpolate = jax.jit(partial(affine_module._interpolate_windows, subset=subset))
    plain, served = interpolate(coefficients, py, px)
    assert np.asarray(served).all()
    for offset in (0, margin, room):  # the window at the tile's first row, at the margin, at its last room
        corner_y, corner_x = top - offset, left - offset
        block = np.stack([wide[:, y + margin : y + margin + side[0], x + margin : x + margin + side[1]]
                          for y, x in zip(corner_y, corner_x)], 1)  # fmt: skip
        tiled, served = interpolate(coefficients, py, px, tiles=(block, corner_y, corner_x))
        assert np.asarray(served).all()
        np.testing.assert_array_equal(np.asarray(tiled), np.asarray(plain))
    corner_y, corner_x = top - margin, left - margin
    block = np.stack([wide[:, y + margin : y + margin + side[0], x + margin : x + margin + side[1]]
                      for y, x in zip(corner_y, corner_x)], 1)  # fmt: skip
    for shift in (-(room - margin) - 1, margin + 1):  # its window starts one row past the tile's room, or before it
        moved = corner_y.copy()
        moved[2] += shift
        _, served = interpolate(coefficients, py, px, tiles=(block, moved, corner_x))
        assert not np.asarray(served).any()
        active = np.ones(len(py), bool)
        active[2] = False  # a point whose values do not count does not stop the others being served
        _, served = interpolate(coefficients, py, px, tiles=(block, moved, corner_x), active=active)
        assert np.asarray(served).all()


def test_the_gathers_band_replaces_only_the_points_not_served():
    """``affine._gathers_where_unserved`` takes the gathers' band's outputs at the points not served and keeps
    the others, eagerly (the gathers' band only where some are not served) and under jit."""
    import jax

    rng = np.random.default_rng(3)
    out = tuple(rng.normal(size=(1, 3, 4)).astype(np.float32) for _ in range(7))
    gathered = tuple(rng.normal(size=(1, 3, 4)).astype(np.float32) for _ in range(7))
    unserved = rng.random((1, 3, 4)) < 0.4
    unserved[0, 0, 0], unserved[0, 0, 1] = True, False
    runs = []

    def gathers():
        runs.append(1)
        return gathered, np.zeros_like(unserved)

    merge = affine_module._gathers_where_unserved
    for result in (merge(out, unserved, gathers),
                   jax.jit(lambda o, u: merge(o, u, lambda: (gathered, u)))(out, unserved)):  # fmt: skip
        for o, g, r in zip(out, gathered, result):
            np.testing.assert_array_equal(np.asarray(r), np.where(unserved, g, o))
    assert runs == [1]
    assert merge(out, np.zeros_like(unserved), gathers) is out and runs == [1]


def test_a_warp_beyond_the_windows_margin_is_not_served(monkeypatch):
    """Where a subset's pixels spread past the window (``SPLINE_MARGIN``), the windows say they serve no point:
    with the margin at 0, a warp with gradients."""
    import jax

    rng = np.random.default_rng(5)
    coefficients = rng.normal(size=(1, 64, 64)).astype(np.float32)
    py, px = _warped(rng, 4, (15, 15), 0.2, (60, 60), (np.full(4, 30), np.full(4, 30)))
    monkeypatch.setattr(affine_module, "SPLINE_MARGIN", 0)
    gathered = np.asarray(affine_module._interpolate(coefficients, py, px))
    windowed, served = jax.jit(partial(affine_module._interpolate_windows, subset=(15, 15)))(coefficients, py, px)
    assert not np.asarray(served).any()
    assert np.abs(gathered).max() > 0 and windowed.shape == gathered.shape
    py, px = _warped(rng, 4, (15, 15), 0.0, (60, 60), (np.full(4, 30), np.full(4, 30)))  # a translation
    windowed, served = jax.jit(partial(affine_module._interpolate_windows, subset=(15, 15)))(coefficients, py, px)
    assert np.asarray(served).all()
    np.testing.assert_allclose(np.asarray(windowed), affine_module._interpolate(coefficients, py, px), atol=1e-5)


def test_points_the_windows_do_not_serve_take_the_gathers_band(stretched, monkeypatch):
    """An accelerator's IC-GN (forced on the CPU, bands of 3 rows together) with the windows' margin at 0: the
    points of the stretched pair whose warps take their pixels out of their windows get the band's IC-GN by
    gathers, which runs only for the bands that have some, and the field is the gathers' IC-GN's, eagerly and
    under jit (a lax.cond there)."""
    import jax

    img1, img2, _ = stretched
    args = dict(subset=(31, 31), step=12, subpixel="refine", shape="affine")
    monkeypatch.setattr(strategy, "ic_gn_rows_together", lambda: True)
    cols = find_displacement(img1, img2, (15, 15), **args).dy.shape[1]
    monkeypatch.setattr(affine_module, "TOGETHER_BAND_VALUES", 3 * cols * 31 * 31)
    monkeypatch.setattr(strategy, "spline_windows", lambda: False)  # an accelerator's default is on
    gathered = find_displacement(img1, img2, (15, 15), **args)  # the gathers' IC-GN (windows off)
    monkeypatch.setattr(strategy, "spline_windows", lambda: True)
    band = affine_module._band
    band.clear_cache()  # programs traced with the margin of 2
    monkeypatch.setattr(affine_module, "SPLINE_MARGIN", 0)
    calls = []

    def spy(*a, **k):
        calls.append(k["windows"])
        return band(*a, **k)

    monkeypatch.setattr(affine_module, "_band", spy)
    try:
        windowed = find_displacement(img1, img2, (15, 15), **args)
        jitted = jax.jit(lambda a, b: find_displacement(a, b, (15, 15), **args))(img1.astype(np.float32),
                                                                                   img2.astype(np.float32))  # fmt: skip
    finally:
        band.clear_cache()  # nothing traced with the margin at 0 stays
    bands = len(affine_module.affine_plan(gathered.dy.shape, (31, 31), 1)[1])
    assert calls[: 2 * bands] == [True, False] * bands  # every band of this pair has some
    assert np.isfinite(np.asarray(gathered.dy)).mean() > 0.95
    for name in gathered._fields:  # the same program (under jit another, whose sums may round otherwise)
        for out, atol in ((windowed, 1e-6), (jitted, 2e-5)):
            np.testing.assert_allclose(np.asarray(getattr(out, name)), np.asarray(getattr(gathered, name)),
                                       rtol=0, atol=atol, equal_nan=True, err_msg=name)  # fmt: skip


def test_the_accelerators_ic_gn_gives_the_cpus_field(stretched, monkeypatch):
    """An accelerator's IC-GN (core.runtime.strategy.spline_windows, ic_gn_rows_together), forced on the CPU, gives the
    CPU's field within 1e-4 px and 1e-5 in the gradients (measured 1.2e-5 px, 1.9e-6: the rows together start
    from their own translations, not from the row above), and under jit (traced inputs) the same program. On
    a TPU, the chip's against the host's."""
    import jax

    from napari_gridmip.core.runtime import strategy

    img1, img2, _ = stretched
    args = dict(subset=(31, 31), step=12, subpixel="refine", shape="affine")
    with strategy.on_host():
        cpu = find_displacement(img1, img2, (15, 15), **args)
    for name in ("spline_windows", "ic_gn_rows_together"):
        monkeypatch.setattr(strategy, name, lambda: True)
    assert affine_module.affine_plan(cpu.dy.shape, (31, 31), 1)[0] == cpu.dy.shape[0]  # one band: rows together
    accelerated = find_displacement(img1, img2, (15, 15), **args)
    per_row = cpu.dy.shape[1] * 31 * 31
    monkeypatch.setattr(affine_module, "TOGETHER_BAND_VALUES", 3 * per_row)  # bands of 3 rows, the last overlapping
    assert len(affine_module.affine_plan(cpu.dy.shape, (31, 31), 1)[1]) == 4
    banded = find_displacement(img1, img2, (15, 15), **args)
    assert np.isfinite(np.asarray(accelerated.dy)).mean() > 0.95
    for name in cpu._fields:
        np.testing.assert_allclose(np.asarray(getattr(accelerated, name)), np.asarray(getattr(cpu, name)),
                                   atol=1e-4 if name in ("dy", "dx") else 1e-5, err_msg=name)  # fmt: skip
    for name in cpu._fields:  # the same steps for every point, however the rows are cut into bands; a band of
        # another size is another program, whose sums round otherwise (7.5e-6 px on the CPU, 1.6e-6 on a TPU;
        # a point stops once its step moves a corner by under TOLERANCE, 1e-4 px)
        np.testing.assert_allclose(np.asarray(getattr(banded, name)), np.asarray(getattr(accelerated, name)),
                                   atol=2e-5, err_msg=name)  # fmt: skip
    jitted = jax.jit(lambda a, b: find_displacement(a, b, (15, 15), **args).dy)(
        img1.astype(np.float32), img2.astype(np.float32)
    )
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(cpu.dy), atol=1e-4)


def test_only_accelerators_take_windows_and_rows_together():
    import jax

    from napari_gridmip.core.runtime import strategy

    assert strategy.spline_windows() is (jax.default_backend() == "tpu")
    assert strategy.ic_gn_rows_together() is (jax.default_backend() != "cpu")
    assert strategy.ic_gn_compile_ahead() is (jax.default_backend() != "cpu")
    with strategy.on_host():
        assert not strategy.spline_windows() and not strategy.ic_gn_rows_together()
        assert not strategy.ic_gn_compile_ahead()


GRADIENTS = ("dy_y", "dy_x", "dx_y", "dx_x")
PARAMETERS = ("dy", "dy_y", "dy_x", "dx", "dx_y", "dx_x")  # IC-GN's order


def test_noise_free_gradients_are_exact_per_point(monkeypatch):
    """On the pair without noise or quantisation (float images), every point's gradients are within 2e-4 of the
    truth (median 1e-5) with the default prefilter: the reference subsets are blurred as the warp blurs img1
    (a stretch does not commute with the Gaussian; uncorrected, the gradients erred by up to 2.7e-4, median
    3.6e-5)."""
    monkeypatch.setattr(dic_module, "camera", lambda intensity, rng, noise=None: 10 + 235 * intensity)
    field = _affine_field(SIZE)
    reference, deformed, _ = dic_module.make_dic_pair((SIZE, SIZE), field=field, seed=3)
    assert reference.dtype == np.float64
    out = find_displacement(deformed[None], reference[None], (15, 15), subset=(31, 31), step=6, subpixel="refine",
                            shape="affine")  # fmt: skip
    for name, expected in zip(GRADIENTS, GRAD.ravel()):
        error = np.abs(np.asarray(getattr(out, name)) - expected)
        assert np.isfinite(error).all()
        assert error.max() < 2e-4, (name, error.max())
        assert np.median(error) < 2e-5, (name, np.median(error))


def test_gradient_spread_is_the_predicted_noise(stretched):
    """At 0.5% noise the per-point gradient errors are the noise's: unbiased (mean within 5e-5), with the spread
    that least squares predicts from each subset's Gauss-Newton Hessian and residual (``affine_spread``: about
    3.3e-4 at subset 31, so a median error of 0.67 of that), within a factor 1.5 for all six parameters."""
    img1, img2, field = stretched
    window, subset, step = (15, 15), (31, 31), 6
    out = find_displacement(img1, img2, window, subset=subset, step=step, subpixel="refine", shape="affine")
    gy, gx = _grid(out.dy.shape, step, window, subset)
    params = np.stack([np.asarray(getattr(out, n), np.float64) for n in PARAMETERS], -1)
    predicted = np.nanmedian(affine_spread(img1[0], img2[0], params, gy, gx, subset, DEFAULT_SIGMA), axis=(0, 1))
    truth = [field["dy"][np.ix_(gy, gx)], GRAD[0, 0], GRAD[0, 1], field["dx"][np.ix_(gy, gx)], GRAD[1, 0], GRAD[1, 1]]
    for k, name in enumerate(PARAMETERS):
        error = params[..., k] - truth[k]
        ratio = np.nanstd(error) / predicted[k]
        assert 1 / 1.5 < ratio < 1.5, (name, ratio)
        if name in GRADIENTS:
            assert 2e-4 < predicted[k] < 5e-4, (name, predicted[k])
            assert abs(np.nanmean(error)) < 5e-5, name


def _znssd(img1, reference_subset, centre, subset, p):
    """The criterion by definition: img1's cubic spline (scipy) at the warped positions against the subset."""
    hs, hw = subset[0] // 2, subset[1] // 2
    eta, zeta = np.meshgrid(np.arange(-hs, hs + 1.0), np.arange(-hw, hw + 1.0), indexing="ij")
    v, vy, vx, u, uy, ux = p
    py = centre[0] + eta + v + vy * eta + vx * zeta
    px = centre[1] + zeta + u + uy * eta + ux * zeta
    g = ndimage.map_coordinates(img1, [py.ravel(), px.ravel()], order=3, mode="nearest")
    f = reference_subset.ravel()
    f, g = f - f.mean(), g - g.mean()
    return float(np.sum((f / np.linalg.norm(f) - g / np.linalg.norm(g)) ** 2))


def _ic_increment(img1, img2, centre, subset, p):
    """The IC-GN increment at ``p``, by definition in NumPy: the reference's steepest-descent images ``J``
    (img2's spline gradient, by central differences of scipy's interpolation, times the warp's Jacobian),
    ``H = J'J``, the residual of the normalised subsets with img1 at the warped positions (scipy's spline), and
    ``dp = -inv(H) J' r``. Zero at IC-GN's solution."""
    hs, hw = subset[0] // 2, subset[1] // 2
    eta, zeta = (a.ravel() for a in np.meshgrid(np.arange(-hs, hs + 1.0), np.arange(-hw, hw + 1.0), indexing="ij"))
    ry, rx = centre[0] + eta, centre[1] + zeta

    def at(img, y, x):
        return ndimage.map_coordinates(img, [y, x], order=3, mode="nearest")

    h = 1e-3
    f = at(img2, ry, rx)
    fy = (at(img2, ry + h, rx) - at(img2, ry - h, rx)) / (2 * h)
    fx = (at(img2, ry, rx + h) - at(img2, ry, rx - h)) / (2 * h)
    jac = np.stack([fy, fy * eta, fy * zeta, fx, fx * eta, fx * zeta], -1)
    v, vy, vx, u, uy, ux = p
    g = at(img1, centre[0] + eta + v + vy * eta + vx * zeta, centre[1] + zeta + u + uy * eta + ux * zeta)
    f, g = f - f.mean(), g - g.mean()
    residual = f - np.linalg.norm(f) / np.linalg.norm(g) * g
    return -np.linalg.solve(jac.T @ jac, jac.T @ residual)


def test_affine_is_the_ic_gn_solution_and_near_the_znssd_minimum(stretched):
    """At interior points (float64, no prefilter), the six parameters are IC-GN's fixed point by the NumPy
    definition above (increment below 1e-6 px), and within 1e-3 px (3e-4 in the gradients) of the ZNSSD's
    minimiser with scipy's spline found by Nelder-Mead: the inverse-compositional fixed point differs from the
    forward one by a term of the noise's order (up to 6e-4 px and 1.8e-4 here, within the random error)."""
    img1, img2, _ = stretched
    window, subset, step = (9, 9), (21, 21), 8
    out = find_displacement(img1, img2, window, subset=subset, step=step, subpixel="refine", shape="affine",
                            prefilter=None, dtype=np.float64)  # fmt: skip
    gy, gx = _grid(out.dy.shape, step, window, subset)
    a, b = img1[0].astype(np.float64), img2[0].astype(np.float64)
    hs, hw = subset[0] // 2, subset[1] // 2
    for i, j in [(4, 4), (6, 9), (10, 7)]:
        centre = (gy[i], gx[j])
        ours = np.array(
            [float(np.asarray(getattr(out, n))[i, j]) for n in ("dy", "dy_y", "dy_x", "dx", "dx_y", "dx_x")]
        )
        step_left = _ic_increment(a, b, centre, subset, ours)
        assert np.abs(step_left[[0, 3]]).max() < 1e-6 and np.abs(step_left[[1, 2, 4, 5]]).max() < 1e-7
        ref = b[centre[0] - hs : centre[0] + hs + 1, centre[1] - hw : centre[1] + hw + 1]
        start = ours + np.array([0.02, 1e-3, -1e-3, -0.02, 1e-3, 1e-3])
        options = {"xatol": 1e-9, "fatol": 1e-16, "maxiter": 20000, "maxfev": 40000}
        best = optimize.minimize(lambda p, c=centre, r=ref: _znssd(a, r, c, subset, p), start, method="Nelder-Mead",
                                 options=options)  # fmt: skip
        np.testing.assert_allclose(ours[[0, 3]], best.x[[0, 3]], atol=1e-3)
        np.testing.assert_allclose(ours[[1, 2, 4, 5]], best.x[[1, 2, 4, 5]], atol=3e-4)


def test_dask_stacks_give_the_in_memory_result(stretched):
    img1, img2, _ = stretched
    options = {"subset": (21, 21), "step": 5, "subpixel": "refine", "shape": "affine", "dtype": np.float64}
    expected = find_displacement(img1, img2, (7, 7), **options)
    got = find_displacement(*(da.from_array(x, chunks=(-1, 40, -1)) for x in (img1, img2)), (7, 7), **options)
    assert type(got).__name__ == "AffineDisplacement"
    for a, b in zip(got, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-8, equal_nan=True)


def test_progress_covers_the_affine_bands_and_stops_between_them(stretched, monkeypatch):
    """progress(done, total) counts the search's bands, then the IC-GN's (every band of every batch item), from
    0 to (total, total) in order; a callback that raises between the IC-GN's bands stops the call with its
    exception. Cutting the IC-GN into bands leaves each point's result as it was."""
    img1, img2, _ = stretched
    options = {"subset": (21, 21), "step": 8, "subpixel": "refine"}
    pair = np.stack([img1, img1]), np.stack([img2, img2])  # two batch items
    searched = []
    find_displacement(*pair, (7, 7), **options, progress=lambda done, total: searched.append((done, total)))
    search_bands = searched[-1][1]
    assert searched == [(done, search_bands) for done in range(search_bands + 1)]
    whole = find_displacement(img1, img2, (7, 7), **options, shape="affine")
    per_row = whole.dy.shape[1] * 21 * 21  # one row of points' interpolated values (1 frame)
    for name in ("BAND_VALUES", "TOGETHER_BAND_VALUES"):  # bands of 5 rows whichever an IC-GN takes here
        monkeypatch.setattr(affine_module, name, 5 * per_row)
    bands = len(affine_module.affine_plan(whole.dy.shape, (21, 21), 1)[1])
    assert bands > 1

    calls = []
    out = find_displacement(*pair, (7, 7), **options, shape="affine", progress=lambda d, t: calls.append((d, t)))
    total = search_bands + 2 * bands
    assert calls == [(done, total) for done in range(total + 1)]
    for item in range(2):
        for a, b in zip(out, whole):
            np.testing.assert_allclose(np.asarray(a)[item], np.asarray(b), rtol=0, atol=1e-5, equal_nan=True)

    class Stop(Exception):
        pass

    seen = []

    def stop(done, total):
        seen.append(done)
        if done == search_bands + 1:  # after the search and the first IC-GN band
            raise Stop

    with pytest.raises(Stop):
        find_displacement(*pair, (7, 7), **options, shape="affine", progress=stop)
    assert seen == list(range(search_bands + 2))


def test_affine_option_errors(stretched):
    img1, img2, _ = stretched
    with pytest.raises(ValueError, match="'quadratic'"):
        find_displacement(img1, img2, (5, 5), subset=(11, 11), subpixel="refine", shape="quadratic")
    with pytest.raises(TypeError, match="int"):
        find_displacement(img1, img2, (5, 5), subset=(11, 11), subpixel="refine", shape=1)
    with pytest.raises(ValueError, match="subset larger than"):
        find_displacement(img1, img2, (5, 5), subpixel="refine", shape="affine")
    with pytest.raises(ValueError, match="'hessian'"):
        find_displacement(img1, img2, (5, 5), subset=(11, 11), shape="affine")


def test_strain_of_the_subsets_gradients(stretched):
    """strain_field(gradients=...) is the tensor of the gradients themselves (no fit), small and Green-Lagrange;
    dask gradients give the same lazily; wrong inputs are named."""
    img1, img2, _ = stretched
    out = find_displacement(img1, img2, (7, 7), subset=(21, 21), step=8, subpixel="refine", shape="affine")
    vy, vx, uy, ux = (np.asarray(getattr(out, n)) for n in ("dy_y", "dy_x", "dx_y", "dx_x"))
    small = strain_field(out.dy, out.dx, gradients=(out.dy_y, out.dy_x, out.dx_y, out.dx_x))
    np.testing.assert_allclose(np.asarray(small.exx), ux, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(small.exy), (uy + vx) / 2, rtol=1e-5, atol=1e-9)
    assert abs(np.nanmean(np.asarray(small.exx)) - GRAD[1, 1]) < 2e-4
    large = strain_field(out.dy, out.dx, kind="green-lagrange", gradients=(vy, vx, uy, ux))
    np.testing.assert_allclose(np.asarray(large.eyy), vy + (uy * uy + vy * vy) / 2, rtol=1e-5, atol=1e-9)
    lazy = strain_field(out.dy, out.dx, gradients=[da.from_array(g, chunks=4) for g in (vy, vx, uy, ux)])
    np.testing.assert_allclose(lazy.exx.compute(), ux, rtol=1e-6)
    with pytest.raises(TypeError, match="four arrays"):
        strain_field(out.dy, out.dx, gradients=(vy, vx))
    with pytest.raises(ValueError, match="dy's shape"):
        strain_field(out.dy, out.dx, gradients=(vy, vx, uy, ux[:-1]))


def test_one_ic_gn_program_serves_every_prefilter_width():
    """The prefilter's width is a traced argument of the IC-GN band: a second width runs the program compiled for
    the first (a static float compiled one per width), and gives its own result."""
    reference, deformed, _ = make_dic_pair((96, 96), field=_affine_field(96), seed=5, noise=0.005)
    options = {"subset": (15, 15), "step": 8, "subpixel": "refine", "shape": "affine"}
    first = find_displacement(deformed[None], reference[None], (7, 7), prefilter=0.8, **options)
    band = affine_module._band.jitted  # a kept program (core.runtime.executables); the suite runs it through its jit
    compiled = band._cache_size()
    second = find_displacement(deformed[None], reference[None], (7, 7), prefilter=1.3, **options)
    assert band._cache_size() == compiled
    assert np.isfinite(np.asarray(second.dx)).all()
    assert not np.allclose(np.asarray(first.dx_x), np.asarray(second.dx_x), rtol=0, atol=1e-7)


@pytest.mark.parametrize("accelerator", [False, True])
def test_the_ic_gn_programs_compile_ahead_and_once(monkeypatch, caplog, accelerator):
    """With ``affine.COMPILE_AHEAD`` on, the IC-GN's programs compile in a thread beside the translation search
    (``affine.compile_ahead``) for exactly the shapes and options the calls then use: the calls compile neither
    (JAX's compile log, on in the calling thread only), the fields are right, and nothing starts ahead on the
    next call; also with an accelerator's options (windows, rows together, the grid's reads)."""
    import logging

    import jax

    if accelerator:
        monkeypatch.setattr(strategy, "spline_windows", lambda: True)
        monkeypatch.setattr(strategy, "ic_gn_rows_together", lambda: True)
        monkeypatch.setattr(affine_module, "TILE_WINDOWS", True)
    started = []
    real = affine_module.compile_ahead
    # the search's module holds its own name of it (imported at its top)
    monkeypatch.setattr(subsets_module, "compile_ahead", lambda *a, **k: started.append(real(*a, **k)) or started[-1])
    rng = np.random.default_rng(4)
    side = 83 + 5 * accelerator  # shapes no other test (nor the other case) uses
    img = ndimage.gaussian_filter(rng.random((1, side, 77)), 1.5).astype(np.float32)
    moved = np.roll(img, (1, 2), axis=(-2, -1))
    args = dict(subset=(15, 15), step=6, subpixel="refine", shape="affine")

    def ic_gn_compiles():
        caplog.clear()
        with caplog.at_level(logging.WARNING), jax.log_compiles(True):
            out = find_displacement(moved, img, (7, 7), **args)
        messages = [r.getMessage() for r in caplog.records]
        return sum(("Compiling jit(_item_images)" in m) or ("Compiling jit(_band)" in m) for m in messages), out

    monkeypatch.setattr(affine_module, "COMPILE_AHEAD", False)  # None: on wherever the backend is not the CPU
    plain, plain_fields = ic_gn_compiles()
    assert not started[-1] and plain == 2  # off: nothing ahead; the calls compile the IC-GN's two programs
    img, moved = img[:, :-2], moved[:, :-2]  # new shapes: every program new again
    monkeypatch.setattr(affine_module, "COMPILE_AHEAD", True)
    ahead, fields = ic_gn_compiles()
    assert started[-1] is not None and ahead == 0
    again, repeated = ic_gn_compiles()
    assert started[-1] is None and again == 0
    np.testing.assert_array_equal(np.asarray(repeated.dy), np.asarray(fields.dy))
    img64, moved64 = img[:, :-1].astype(np.float64), moved[:, :-1].astype(np.float64)
    find_displacement(moved64, img64, (7, 7), **args, dtype=np.float64)
    assert started[-1] is None  # 64-bit: nothing ahead (its scope is the caller's thread's)
    jax.jit(lambda a, b: find_displacement(a, b, (7, 7), **args).dy)(moved[:, :-3], img[:, :-3])
    assert started[-1] is None  # traced: nothing ahead
    for out in (plain_fields, fields):  # img1 is img2 moved by (1, 2): the fields (1, 2) in the middle
        np.testing.assert_allclose(np.asarray(out.dy)[2:-2, 2:-2], 1, atol=0.05)
        np.testing.assert_allclose(np.asarray(out.dx)[2:-2, 2:-2], 2, atol=0.05)
