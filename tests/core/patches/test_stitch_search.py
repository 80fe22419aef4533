"""register_tiles on hard stage errors and repetitive texture: ``max_shift="auto"`` finds
overlaps a stage error has mostly eaten, and a pair whose peak is one of several near-equal repeats is flagged
ambiguous and resolved by the neighbours' consensus or left to the stage, never taken blindly."""

import jax.numpy as jnp
import numpy as np
import pytest

from napari_gridmip import register_tiles
from napari_gridmip._sample_data.mosaic import cut_mosaic, lattice_picture, texture
from napari_gridmip.core.patches import _stitch_numpy, pair_search, stitch

PERIOD = 18


def aligned_error(result, sample, tiles=None):
    """Each tile's distance from the truth, the common translation (the mean over ``tiles``) removed."""
    tiles = np.arange(len(sample.true_positions)) if tiles is None else tiles
    error = result.positions - sample.true_positions
    error = error - error[tiles].mean(axis=0)
    return np.linalg.norm(error, axis=1)


def true_shift(result, sample):
    i, j = result.pairs[:, 0], result.pairs[:, 1]
    truth, stage = sample.true_positions, sample.stage_positions
    return (truth[j] - truth[i]) - (stage[j] - stage[i])


@pytest.fixture(scope="module")
def large_errors():
    """3x3 tiles of 128 px, 40% overlap (51 px), the stage off by up to 16 px per tile: up to 32 px (a quarter of
    the tile) between neighbours. Tile 0 moved away from all three of its neighbours by 32 px along both axes: its
    overlaps keep 19 of 51 px, and no overlap of it keeps half, so no pair of it is found by the half-overlap rule."""
    errors = np.round(np.random.default_rng(5).uniform(-16, 16, (9, 2)))
    errors[0], errors[[1, 3, 4]] = -16, 16
    picture = texture((360, 360), seed=3)
    return cut_mosaic(picture, grid_shape=(3, 3), tile_shape=(128, 128), overlap=0.4, errors=errors, seed=1)


def test_auto_search_rule():
    def search(tile, overlap):
        stage = stitch.grid_positions((2, 2), (tile, tile), overlap)
        pairs, delta = pair_search.overlapping_pairs(stage, (tile, tile))
        geometry = pair_search.pair_geometry(pairs, delta, (tile, tile), 0, 0)
        return pair_search.auto_search(geometry, np.arange(len(pairs)))

    assert search(128, 0.4) == (38, 0.25)  # 51 px: three quarters of it
    assert search(512, 0.1) == (38, 0.25)
    assert search(192, 0.1) == (16, 0.5)  # 19 px: the integer default's search and rule
    assert search(512, 0.5) == (128, 0.25)  # capped at a quarter of the tile
    assert search(200, 0.5) == (64, 0.25)  # or 64 px


def test_large_stage_errors_auto(large_errors):
    sample = large_errors
    pairs, delta = pair_search.overlapping_pairs(sample.stage_positions, (128, 128))
    truth = sample.true_positions[pairs[:, 1]] - sample.true_positions[pairs[:, 0]]
    assert np.abs(truth - delta).max() >= 32  # the stage off by a quarter of the tile between neighbours
    r = register_tiles(sample.tiles, sample.stage_positions)  # max_shift="auto", the default
    assert r.max_shift == 38
    assert not r.placed_from_stage.any(), r.reasons
    error = aligned_error(r, sample)
    assert error.max() < 0.5, error
    # the former default searched 16 px: tile 0 (and tile 2) stay on the stage, tiles 10 to 40 px off
    old = register_tiles(sample.tiles, sample.stage_positions, max_shift=16)
    assert old.placed_from_stage[0] and aligned_error(old, sample).max() > 10


@pytest.fixture(scope="module")
def lattice():
    """3x3 tiles of 128 px, 30% overlap, the stage off by up to 12 px per tile (up to 24 px between neighbours,
    more than half the lattice's period of 18 px): the texture covers the upper left, the lattice alone the lower
    right, so the pairs there match every repeat near-equally (and the turned templates and far-apart regions of
    the significance test do not: they pass it)."""
    errors = np.round(np.random.default_rng(2).uniform(-12, 12, (9, 2)))
    picture = lattice_picture((400, 400), period=PERIOD, textured=0.45, seed=4)
    return cut_mosaic(picture, grid_shape=(3, 3), tile_shape=(128, 128), overlap=0.3, errors=errors, seed=1)


@pytest.fixture(scope="module")
def lattice_registered(lattice):
    return register_tiles(lattice.tiles, lattice.stage_positions)


def test_repeats_are_flagged_and_resolved_by_consensus_or_left_to_the_stage(lattice, lattice_registered):
    r, sample = lattice_registered, lattice
    off = np.abs(r.shift - true_shift(r, sample)).max(axis=1)
    reasons = np.array(r.reasons)
    assert r.ambiguous.sum() >= 4
    assert (reasons[r.ambiguous] == "ambiguous").any() and r.accepted[r.ambiguous].any()
    # the flagged pairs' rivals are repeats: near-equal, a period or more away
    rival = np.abs(r.second_shift - r.shift)[r.ambiguous].max(axis=1)
    assert (rival >= PERIOD - 2).all(), rival
    assert (r.second_ncc[r.ambiguous] >= 0.9 * r.ncc[r.ambiguous]).all()
    # the consensus took the right repeat; every pair used is right
    assert (off[r.accepted] < 1).all(), off[r.accepted]
    # an unresolved pair keeps its best peak: a wrong repeat, significant, that it would have taken
    left = reasons == "ambiguous"
    assert (off[left] > PERIOD / 2).any() and (r.ncc[left] >= r.threshold[left]).all()
    # each tile is on the truth, or left on the stage guess (the tile whose every pair is ambiguous)
    placed = ~r.placed_from_stage
    assert 1 <= r.placed_from_stage.sum() <= 2
    assert aligned_error(r, sample, np.flatnonzero(placed))[placed].max() < 1.0
    for t in np.flatnonzero(r.placed_from_stage):
        assert set(reasons[(r.pairs == t).any(axis=1)]) <= {"ambiguous", "not significant"}


def test_without_the_rule_a_repeat_is_taken(lattice, lattice_registered, monkeypatch):
    monkeypatch.setattr(pair_search, "is_ambiguous", lambda peak, rival: False)
    blind = register_tiles(lattice.tiles, lattice.stage_positions)
    assert not blind.ambiguous.any()
    off = np.abs(blind.shift - true_shift(blind, lattice)).max(axis=1)
    assert (off[blind.accepted] > PERIOD / 2).any()  # wrong repeats used ...
    placed = ~blind.placed_from_stage
    error = aligned_error(blind, lattice, np.flatnonzero(placed & ~lattice_registered.placed_from_stage))
    assert error[placed].max() > PERIOD / 2  # ... and a tile placed a period off, not flagged


def test_auto_is_the_old_search_on_narrow_overlaps():
    """Overlaps under 23 px: "auto" is max_shift=16 with the half-overlap rule, the same result."""
    errors = np.round(np.random.default_rng(3).uniform(-4, 4, (6, 2)))
    sample = cut_mosaic(texture((300, 420), seed=2), grid_shape=(2, 3), tile_shape=(128, 128), overlap=0.15,
                        errors=errors, seed=2)  # fmt: skip
    auto = register_tiles(sample.tiles, sample.stage_positions)
    fixed = register_tiles(sample.tiles, sample.stage_positions, max_shift=16)
    assert auto.max_shift == 16
    np.testing.assert_array_equal(auto.positions, fixed.positions)
    np.testing.assert_array_equal(auto.reason, fixed.reason)


@pytest.mark.parametrize("min_fraction", [0.5, 0.25])
def test_rivals_numpy_equal_jax(min_fraction):
    """Both engines report the same rival peak (NCC and shift) on lattice regions, and the same candidates."""
    max_shift = 20
    reach = max_shift + stitch.MARGIN
    halo = stitch.filter_halo(1.0)
    picture = lattice_picture((200, 200), period=PERIOD, textured=0.0, seed=1)
    rng = np.random.default_rng(0)
    shape = (24, 64)
    searches, templates = [], []
    for k in range(4):
        y, x = 20 + 7 * k, 30 + 5 * k
        searches.append(picture[y - halo : y + shape[0] + 2 * reach + halo, x - halo : x + shape[1] + 2 * reach + halo])
        ty, tx = y + reach + k - 2, x + reach + 2 * k - 3
        templates.append(picture[ty - halo : ty + shape[0] + halo, tx - halo : tx + shape[1] + halo])
    search = (np.stack(searches) + 0.01 * rng.standard_normal((4, *searches[0].shape))).astype(np.float32)
    template = (np.stack(templates) + 0.01 * rng.standard_normal((4, *templates[0].shape))).astype(np.float32)
    search[1, :, : reach + 8] = np.nan  # the search's data end early: fewer candidates at 0.5 than at 0.25
    mask = np.ones((4, *shape), np.float32)
    options = {"max_shift": max_shift, "subpixel": "quadratic", "sigma": 1.0, "min_fraction": min_fraction}
    expected = [np.asarray(x) for x in stitch._register_batch(jnp.asarray(search), jnp.asarray(template),
                                                                jnp.asarray(mask), **options)]  # fmt: skip
    got = _stitch_numpy.register_batch(search, template, mask, **options)
    np.testing.assert_array_equal(got[0].round(), expected[0].round())  # the peaks
    np.testing.assert_allclose(got[1], expected[1], atol=2e-4)
    np.testing.assert_allclose(got[6], expected[6], atol=2e-4)  # the rivals' NCC
    np.testing.assert_array_equal(got[7], expected[7])  # and shifts
    assert np.isfinite(got[6]).all() and (got[6] > 0.8 * got[1]).all()  # repeats: near-equal rivals
    assert (np.abs(got[7] - got[0]).max(axis=1) > stitch.RIVAL_SEPARATION).all()


def test_engines_agree_on_the_lattice(lattice, lattice_registered, monkeypatch):
    """The JAX engine (large mosaics) makes the same decisions: the same search, rivals and ambiguous pairs."""
    monkeypatch.setattr(stitch, "FORCE_ENGINE", "jax")
    b = register_tiles(lattice.tiles, lattice.stage_positions)
    a = lattice_registered  # (NumPy: a small mosaic)
    assert a.max_shift == b.max_shift and a.reasons == b.reasons
    np.testing.assert_array_equal(a.ambiguous, b.ambiguous)
    np.testing.assert_allclose(a.second_ncc, b.second_ncc, atol=2e-4)
    np.testing.assert_allclose(a.positions, b.positions, atol=2e-3)


# -- the broad band: noisy tiles whose structure is coarse (camera images, low magnification) ----------------------


@pytest.fixture(scope="module")
def noisy_blobs():
    """2x4 tiles of 160 px, 30% overlap, +-8 px stage errors: smooth blobs (6 px) under white noise of the same
    standard deviation, so that the octave band (1 and 2 px) holds mostly noise."""
    from scipy import ndimage

    rng = np.random.default_rng(0)
    blobs = ndimage.gaussian_filter(rng.standard_normal((420, 600)), 6)
    blobs /= blobs.std()
    sample = cut_mosaic(blobs, grid_shape=(2, 4), tile_shape=(160, 160), overlap=0.3,
                        errors=np.round(rng.uniform(-8, 8, (8, 2))), noise=0, seed=1)  # fmt: skip
    noise = np.random.default_rng(2).standard_normal(sample.tiles.shape).astype(np.float32)
    return sample, sample.tiles + noise


@pytest.mark.parametrize("engine", ["numpy", "jax"])
def test_weak_pairs_are_found_in_the_broad_band(noisy_blobs, engine, monkeypatch):
    monkeypatch.setattr(stitch, "FORCE_ENGINE", engine)
    sample, tiles = noisy_blobs
    result = register_tiles(tiles, sample.stage_positions, max_shift=16)
    grid = sample.stage_positions
    i, j = result.pairs[:, 0], result.pairs[:, 1]
    edges = np.sum(np.abs(grid[j] - grid[i]) > 1, axis=1) == 1  # neighbours along one axis (not corners)
    assert edges.sum() == 10
    assert result.accepted[edges].all(), result.reasons
    assert result.broad_band[edges].all()  # each from the broad band: the octave band found them weak
    assert not result.broad_band[~result.accepted].any()
    assert aligned_error(result, sample).max() < 0.5


def test_without_the_broad_band_the_noisy_pairs_are_lost(noisy_blobs, monkeypatch):
    monkeypatch.setattr(pair_search, "broad_pass", lambda *args, done, **options: done)  # (returns the progress count)
    sample, tiles = noisy_blobs
    result = register_tiles(tiles, sample.stage_positions, max_shift=16)
    assert not result.broad_band.any()
    assert result.accepted.sum() <= 6  # of the 10 edge pairs


def test_clean_tiles_keep_the_octave_band(large_errors):
    result = register_tiles(large_errors.tiles, large_errors.stage_positions)
    assert result.accepted.all()
    assert not result.broad_band.any()


def test_learned_reach_from_the_accepted_pairs():
    accepted, rejected = stitch.REASONS.index("accepted"), stitch.REASONS.index("not significant")
    shift = np.array([[1.0, 60.6], [-3.0, -20.0], [2.0, 5.0], [0.0, 140.0]])
    assert pair_search.learned_reach(shift, np.array([accepted] * 3 + [rejected])) == 80  # ceil(1.25 x 60.6) + 4
    assert pair_search.learned_reach(shift, np.array([accepted] * 2 + [rejected] * 2)) is None  # too few to learn from
    small = np.zeros((3, 2))
    assert pair_search.learned_reach(small, np.array([accepted] * 3)) == pair_search.AUTO_SHIFT


def test_a_lattice_with_unique_spots_is_placed_whole():
    """A lattice of 18 px with 60 unique spots: the octave band finds most pairs ambiguous (near-equal repeats); the
    broad band sees the spots and the repeats apart, so every tile is placed, none from the stage."""
    picture = lattice_picture((400, 400), period=PERIOD, textured=0.0, features=60, seed=4)
    errors = np.round(np.random.default_rng(2).uniform(-12, 12, (9, 2)))
    sample = cut_mosaic(picture, grid_shape=(3, 3), tile_shape=(128, 128), overlap=0.3, errors=errors, seed=1)
    result = register_tiles(sample.tiles, sample.stage_positions)
    assert not result.placed_from_stage.any()
    assert result.broad_band.any()
    assert aligned_error(result, sample).max() < 0.05
