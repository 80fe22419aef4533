"""register_tiles and grid_positions on synthetic mosaics cut from known pictures, and the kernels against loops."""

from functools import partial

import dask.array as da
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napari_gridmip import grid_positions, register_tiles
from napari_gridmip._sample_data.mosaic import make_mosaic
from napari_gridmip.core.patches import pair_search, stitch
from tests.core.patches.reference import band_pass_reference, chain_positions, ncc_reference


def placement_error(result, sample, tiles=None):
    """Per-tile error (n, d) of the refined positions, the common translation removed.

    Registration fixes positions up to one translation (pairs measure offsets
    only); the least squares keep the stage's mean, which the stage errors move.
    """
    keep = ~result.placed_from_stage if tiles is None else tiles
    error = result.positions - sample.true_positions
    return error[keep] - error[keep].mean(axis=0)


def rms(error):
    return float(np.sqrt((error**2).sum(axis=1).mean()))


# -- grid_positions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("row-major", [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]),
        ("column-major", [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]),
        ("snake", [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]),
    ],
)
def test_grid_orders(order, expected):
    positions = grid_positions((2, 3), (100, 200), 0.1, order=order)
    np.testing.assert_allclose(positions, np.array(expected) * [90.0, 180.0])


def test_grid_3d_snake_and_per_axis_overlap():
    indices = stitch.grid_indices((2, 2, 2), "snake")
    # a boustrophedon: consecutive tiles are neighbours
    assert np.all(np.abs(np.diff(indices, axis=0)).sum(axis=1) == 1)
    assert sorted(map(tuple, indices)) == sorted(np.ndindex(2, 2, 2))
    positions = grid_positions((1, 2, 2), (10, 20, 40), (0.0, 0.5, 0.25))
    np.testing.assert_allclose(positions, [[0, 0, 0], [0, 0, 30], [0, 10, 0], [0, 10, 30]])


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (((2, 2), (10, 10), 1.0), {}, ValueError, "0 <= overlap < 1"),
        (((2, 2), (10, 10), -0.1), {}, ValueError, "0 <= overlap < 1"),
        (((2, 2), (10, 10), "0.1"), {}, TypeError, "overlap must be a real number"),
        (((2, 2), (10,), 0.1), {}, ValueError, "tile_shape must have 2 entries"),
        (((2, 2), (10, 10), 0.1), {"order": "spiral"}, ValueError, "order must be one of"),
        (((2, 2, 2, 2), (1, 1, 1, 1), 0.1), {}, ValueError, "1 to 3 axes"),
    ],
)
def test_grid_errors(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        grid_positions(*args, **kwargs)


# -- the kernels against loops ---------------------------------------------------------------


def test_band_pass_equals_normalised_convolution_loop():
    rng = np.random.default_rng(0)
    raw = rng.random((23, 30)).astype(np.float32)
    raw[:5, :] = np.nan  # beyond the tile
    raw[:, -3:] = np.nan
    sigma = 0.75
    halo = stitch.filter_halo(sigma)
    got = np.asarray(jax.jit(stitch._band_pass, static_argnums=1)(jnp.asarray(raw), sigma))
    expected = band_pass_reference(raw.astype(np.float64), sigma, halo)
    np.testing.assert_allclose(got, expected, atol=2e-6)


@pytest.mark.parametrize("shape", [(9, 31), (5, 6, 7)])
def test_pair_ncc_equals_the_loop(shape):
    """The integer peak and its NCC, with and without jit, against NCC by loops over every shift."""
    rng = np.random.default_rng(len(shape))
    max_shift = 2
    reach = max_shift + stitch.MARGIN
    search = rng.random(tuple(n + 2 * reach for n in shape)).astype(np.float32)
    true = (1, -1, 1)[: len(shape)]
    start = tuple(reach + s for s in true)
    template = search[tuple(slice(a, a + n) for a, n in zip(start, shape))] * 2 + 0.1
    template = template + 0.2 * rng.random(shape).astype(np.float32)
    mask = np.ones(shape, np.float32)
    expected = ncc_reference(template, search, reach)
    core = expected[tuple(slice(stitch.MARGIN, stitch.MARGIN + 2 * max_shift + 1) for _ in shape)]
    best = np.unravel_index(np.nanargmax(core), core.shape)
    kernel = partial(stitch._pair_kernel, max_shift=max_shift, subpixel="none", sigma=0.0)
    # without jit too in 2D (op by op is slow: the 3D kernel is checked jitted only)
    for run in (kernel, jax.jit(kernel)) if len(shape) == 2 else (jax.jit(kernel),):
        shift, peak, _, featureless, on_edge, *_ = run(jnp.asarray(search), jnp.asarray(template), jnp.asarray(mask))
        np.testing.assert_array_equal(np.asarray(shift), np.array(best) - max_shift)
        assert tuple(np.asarray(shift).astype(int)) == true
        np.testing.assert_allclose(float(peak), core[best], atol=2e-5)
        assert not featureless and not on_edge


def test_pair_kernel_flags_featureless_and_edge():
    shape, max_shift = (8, 20), 2
    reach = max_shift + stitch.MARGIN
    search = np.random.default_rng(1).random(tuple(n + 2 * reach for n in shape)).astype(np.float32)
    mask = np.ones(shape, np.float32)
    options = {"max_shift": max_shift, "subpixel": "quadratic", "sigma": 0.0}
    for subpixel in ("quadratic", "refine"):
        kernel = jax.jit(partial(stitch._pair_kernel, **{**options, "subpixel": subpixel}))
        flat = kernel(jnp.asarray(search), jnp.full(shape, 3.0), jnp.asarray(mask))
        assert bool(flat[3]) and np.isnan(float(flat[1])), subpixel
    # the match lies beyond max_shift: the peak sits on the search's edge
    template = search[reach + max_shift + 1 :, reach : reach + shape[1]][: shape[0]]
    padded = np.zeros(shape, np.float32)
    padded[: template.shape[0]] = template
    edge_mask = np.zeros(shape, np.float32)
    edge_mask[: template.shape[0]] = 1
    kernel = jax.jit(partial(stitch._pair_kernel, **options))
    out = kernel(jnp.asarray(search), jnp.asarray(padded), jnp.asarray(edge_mask))
    assert bool(out[4])


def test_spd_solve_and_gumbel():
    rng = np.random.default_rng(2)
    for n in (1, 2, 4, 5):
        a = rng.standard_normal((n, n))
        a = a @ a.T + n * np.eye(n)
        b = rng.standard_normal((n, 3))
        np.testing.assert_allclose(np.asarray(stitch._spd_solve(jnp.asarray(a), jnp.asarray(b))),
                                   np.linalg.solve(a, b), rtol=1e-4, atol=1e-5)  # fmt: skip
    # the fitted quantile of Gumbel samples is the true one
    samples = rng.gumbel(0.3, 0.05, 20000)
    expected = 0.3 - 0.05 * np.log(-np.log(0.99))
    assert abs(pair_search.gumbel_quantile(samples, 0.99) - expected) < 0.01
    assert pair_search.gumbel_quantile(np.array([0.1, np.nan]), 0.99) == 0.5  # too few: nothing passes by chance


# -- whole mosaics -------------------------------------------------------------------------


# One tile geometry for the 2D mosaics (160 px, 30% overlap, max_shift 12), so that they share compiled programs
GEOMETRY = {"tile_shape": (160, 160), "overlap": 0.3, "stage_error": 8.0}
MAX_SHIFT = 16


@pytest.fixture(scope="module")
def mosaic():
    """3x4 tiles, +-8 px stage errors (up to 16 px between neighbours), noise, and a blank corner."""
    return make_mosaic(grid_shape=(3, 4), **GEOMETRY, noise=0.01, blank_corner=True, seed=3)


@pytest.fixture(scope="module")
def registered(mosaic):
    return register_tiles(mosaic.tiles, mosaic.stage_positions, max_shift=MAX_SHIFT)


def test_positions_within_a_tenth_of_a_pixel(mosaic, registered):
    error = placement_error(registered, mosaic)
    assert rms(error) < 0.1, rms(error)
    assert registered.median_residual < 0.1
    # the stage was off by up to 8 px: the registration did something
    assert rms(placement_error(registered, mosaic._replace(true_positions=mosaic.stage_positions))) > 3


def test_blank_region_is_rejected_and_placed_from_the_stage(mosaic, registered):
    last = len(mosaic.tiles) - 1
    assert registered.placed_from_stage.tolist() == mosaic.blank.tolist()
    touching = np.any(registered.pairs == last, axis=1)
    assert not registered.accepted[touching].any()
    assert set(np.array(registered.reasons)[touching]) <= {"not significant", "featureless", "peak at max_shift"}
    assert registered.tile_confidence[last] == 0 and np.all(registered.tile_confidence[:last] > 0.5)
    # placed from the stage relative to its neighbours: moved by the mean of their corrections, so that its
    # stage offsets to them hold on average
    neighbours = registered.pairs[touching].ravel()
    neighbours = np.unique(neighbours[neighbours != last])
    correction = registered.positions - registered.stage_positions
    np.testing.assert_allclose(correction[last], correction[neighbours].mean(axis=0), atol=1e-3)


def test_noise_free_blank_is_featureless():
    sample = make_mosaic(grid_shape=(2, 2), **GEOMETRY, noise=0.0, blank_corner=True, seed=4)
    result = register_tiles(sample.tiles, sample.stage_positions, max_shift=MAX_SHIFT)
    touching = np.any(result.pairs == 3, axis=1)
    assert "featureless" in np.array(result.reasons)[touching]
    assert result.placed_from_stage.tolist() == [False, False, False, True]


def test_report_is_consistent(mosaic, registered):
    r = registered
    p = len(r.pairs)
    assert r.pairs.shape == (p, 2) and np.all(r.pairs[:, 0] < r.pairs[:, 1])
    assert r.shift.shape == (p, 2) and r.ncc.shape == r.threshold.shape == r.residual.shape == (p,)
    assert r.accepted.tolist() == [reason == "accepted" for reason in r.reasons]
    assert np.all(r.ncc[r.accepted] >= r.threshold[r.accepted])
    assert len(r.rejected_pairs) == p - r.accepted.sum()
    assert r.tiles_from_stage.tolist() == [len(mosaic.tiles) - 1]
    # the measured shifts of accepted pairs are the true ones
    i, j = r.pairs[r.accepted].T
    true = (mosaic.true_positions[j] - mosaic.true_positions[i]) - (
        mosaic.stage_positions[j] - mosaic.stage_positions[i]
    )
    assert np.abs(r.shift[r.accepted] - true).max() < 0.3


def test_least_squares_beats_chaining_along_a_tree():
    """A 2x4 grid: its loops let the least squares average pair errors that a spanning tree adds up."""
    sample = make_mosaic(grid_shape=(2, 4), **GEOMETRY, noise=0.02, seed=5)
    result = register_tiles(sample.tiles, sample.stage_positions, max_shift=MAX_SHIFT)
    assert result.accepted.sum() >= 10
    # chain along the snake: 0-1-2-3-7-6-5-4 (a spanning tree of the edges)
    order = [(0, 1), (1, 2), (2, 3), (3, 7), (7, 6), (6, 5), (5, 4)]
    offsets = result.shift + (result.stage_positions[result.pairs[:, 1]] - result.stage_positions[result.pairs[:, 0]])
    chained = chain_positions(result.pairs, offsets, 8, order)
    truth = sample.true_positions

    def tree_error(positions):
        e = positions - truth
        return rms(e - e.mean(0))

    assert tree_error(result.positions) < 0.8 * tree_error(chained), (tree_error(result.positions), tree_error(chained))


@pytest.mark.slow
def test_3d_tiles():
    sample = make_mosaic(grid_shape=(2, 2, 2), tile_shape=(40, 48, 48), overlap=0.4, stage_error=2, seed=6)
    result = register_tiles(sample.tiles, sample.stage_positions, max_shift=4)
    assert result.positions.shape == (8, 3)
    assert not result.placed_from_stage.any()
    assert rms(placement_error(result, sample)) < 0.1


def test_3d_tiles_quadratic():
    """The fast version: the quadratic fit only, a 2x2x1 grid (two pair shapes)."""
    sample = make_mosaic(grid_shape=(2, 2, 1), tile_shape=(40, 48, 32), overlap=0.4, stage_error=2, seed=6)
    result = register_tiles(sample.tiles, sample.stage_positions, max_shift=4, subpixel="quadratic")
    assert result.positions.shape == (4, 3) and result.accepted.sum() >= 4
    assert not result.placed_from_stage.any()
    assert rms(placement_error(result, sample)) < 0.3


def test_channels_and_dask(mosaic):
    sample = make_mosaic(grid_shape=(2, 3), **GEOMETRY, channels=2, seed=7)
    assert sample.tiles.shape == (6, 2, 160, 160)
    mean = register_tiles(sample.tiles, sample.stage_positions, max_shift=MAX_SHIFT)
    one = register_tiles(sample.tiles, sample.stage_positions, max_shift=MAX_SHIFT, channel=1)
    for result in (mean, one):
        assert rms(placement_error(result, sample)) < 0.1
    lazy = register_tiles(da.from_array(sample.tiles, chunks=(1, 1, 160, 160)), sample.stage_positions,
                          max_shift=MAX_SHIFT, channel=1)  # fmt: skip
    np.testing.assert_array_equal(lazy.positions, one.positions)
    np.testing.assert_array_equal(lazy.accepted, one.accepted)


def test_progress_and_cancel(mosaic, registered):
    calls = []
    tiles, stage = mosaic.tiles, mosaic.stage_positions  # the fixture's programs, compiled already
    register_tiles(tiles, stage, max_shift=MAX_SHIFT, progress=lambda done, total: calls.append((done, total)))
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1] and len(calls) > 2
    assert all(t == calls[0][1] for _, t in calls)

    def stop(done, total):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        register_tiles(tiles, stage, max_shift=MAX_SHIFT, progress=stop)


def test_inputs_are_not_modified_and_single_tiles_pass(mosaic):
    tiles, stage = mosaic.tiles[:1].copy(), mosaic.stage_positions[:1].copy()
    result = register_tiles(tiles, stage)
    np.testing.assert_array_equal(result.positions, stage)
    assert result.placed_from_stage.tolist() == [True] and len(result.pairs) == 0
    np.testing.assert_array_equal(tiles, mosaic.tiles[:1])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"tiles": np.zeros((2, 8, 8)), "positions": np.zeros((3, 2))}, ValueError, "2 tiles but positions give 3"),
        ({"tiles": np.zeros((2, 8)), "positions": np.zeros((2, 2))}, ValueError, "tiles must be"),
        ({"tiles": np.zeros((2, 8, 8)), "positions": np.zeros((2, 4))}, ValueError, "d = 2 or 3"),
        ({"tiles": np.zeros((2, 8, 8)), "positions": [[0, 0], [np.nan, 1]]}, ValueError, "finite"),
        ({"max_shift": 0}, ValueError, "max_shift"),
        ({"channel": 0}, ValueError, "no channel axis"),
        ({"false_positive_rate": 0.7}, ValueError, "false_positive_rate"),
        ({"subpixel": "fancy"}, ValueError, "subpixel must be one of"),
        ({"filter_sigma": -1}, ValueError, "filter_sigma"),
        ({"tiles": "tiles"}, TypeError, "tiles must be an array"),
    ],
)
def test_errors(kwargs, error, message):
    arguments = {"tiles": np.zeros((2, 8, 8)), "positions": [[0, 0], [0, 6]], **kwargs}
    tiles, positions = arguments.pop("tiles"), arguments.pop("positions")
    with pytest.raises(error, match=message):
        register_tiles(tiles, positions, **arguments)


def test_sample_tiles_are_cut_where_the_truth_says():
    # scikit-image's bundled pictures come with napari: absent where only the core is installed (the accelerator
    # machine of docs/accelerator.md)
    data = pytest.importorskip("skimage.data")

    picture = data.camera()
    sample = make_mosaic(grid_shape=(2, 2), tile_shape=(100, 120), overlap=0.2, noise=0.0, picture=picture,
                         subpixel=False, seed=8)  # fmt: skip
    assert sample.tiles.shape == (4, 100, 120)
    np.testing.assert_array_equal(sample.true_positions, np.round(sample.true_positions))
    for tile, origin in zip(sample.tiles, sample.true_positions.astype(int)):
        np.testing.assert_allclose(tile, sample.image[origin[0] : origin[0] + 100, origin[1] : origin[1] + 120])
    stage_error = np.abs(sample.true_positions - sample.stage_positions)
    assert stage_error.max() <= 8.5 and stage_error.max() > 1
    with pytest.raises(ValueError, match="smaller than the mosaic needs"):
        make_mosaic(grid_shape=(9, 9), tile_shape=(100, 100), picture=picture)
