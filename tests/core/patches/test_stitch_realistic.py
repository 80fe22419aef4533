"""register_tiles on mosaics as cameras record them: uint16, cos^4 vignetting, uneven light, shot noise, narrow
overlaps, background-only tiles, and the kept peak fit where a refinement has no room."""

import numpy as np
import pytest

from napari_gridmip import register_tiles
from napari_gridmip._sample_data.mosaic import flat_field, make_mosaic, microscope_tiles
from napari_gridmip.core.patches import pair_search, stitch


def true_shifts(result, sample):
    i, j = result.pairs.T
    stage, true = sample.stage_positions, sample.true_positions
    return (true[j] - true[i]) - (stage[j] - stage[i])


def tile_rms(result, sample):
    keep = ~result.placed_from_stage
    error = result.positions[keep] - sample.true_positions[keep]
    error -= error.mean(axis=0)
    return float(np.sqrt((error**2).sum(axis=1).mean()))


def edge_pairs(result):
    """Pairs that share an edge (not a corner): their stage offset is zero along one axis."""
    delta = result.stage_positions[result.pairs[:, 1]] - result.stage_positions[result.pairs[:, 0]]
    return np.any(np.abs(delta) < 1, axis=1)


@pytest.fixture(scope="module")
def camera_mosaic():
    """4x4 tiles of 92x124 px with about 6% overlap (5 x 7 px: too narrow for the refinement's halo), vignetted,
    shot noise, a blank (background-only) corner, stage errors up to 3 px per tile (6 px between neighbours)."""
    sample = make_mosaic(grid_shape=(4, 4), tile_shape=(92, 124), overlap=0.11, stage_error=3, noise=0.0,
                         blank_corner=True, seed=11)  # fmt: skip
    return sample._replace(tiles=microscope_tiles(sample, photons=400, seed=11))


@pytest.fixture(scope="module")
def camera_registered(camera_mosaic):
    return register_tiles(camera_mosaic.tiles, camera_mosaic.stage_positions, max_shift=8)


def test_camera_tiles_are_what_a_camera_records(camera_mosaic):
    tiles = camera_mosaic.tiles
    assert tiles.dtype == np.uint16 and tiles.min() >= 100  # the camera's offset
    flat = flat_field(tiles.shape[1:])
    assert flat.max() <= 1 and flat.min() < 0.7  # vignetted corners
    assert np.unravel_index(np.argmax(flat), flat.shape) != (46, 62)  # the optical centre is off the tile's


def test_narrow_overlaps_keep_every_textured_tile(camera_mosaic, camera_registered):
    r = camera_registered
    # every tile with texture in its overlaps is registered; only the blank one comes from the stage
    assert r.placed_from_stage.tolist() == camera_mosaic.blank.tolist()
    # no significant edge pair is dropped for its refinement
    assert "refinement failed" not in r.reasons
    textured = edge_pairs(r) & ~np.any(r.pairs == len(r.positions) - 1, axis=1)
    assert r.accepted[textured].mean() >= 0.9
    error = np.linalg.norm(r.shift - true_shifts(r, camera_mosaic), axis=1)
    assert np.median(error[r.accepted]) < 0.3, np.median(error[r.accepted])
    assert tile_rms(r, camera_mosaic) < 0.3, tile_rms(r, camera_mosaic)


def test_refinement_is_recorded(camera_registered):
    r = camera_registered
    refinements = np.array(r.refinements)
    assert refinements.shape == (len(r.pairs),)
    assert set(refinements[r.accepted]) <= {"refined", "peak-fit"}
    assert np.all(refinements[~np.isfinite(r.ncc)] == "none")
    # the narrow overlaps (5 px across, the refinement needs its +-3 px reach and the filter's halo) are refined
    # up to the tiles' borders rather than dropped
    assert (refinements[r.accepted] == "refined").sum() >= 0.8 * r.accepted.sum()


def test_no_room_to_refine_keeps_the_peak_fit():
    """Overlaps of 4 px: too narrow for the refinement's box even at the tiles' borders; the peak fit is kept."""
    sample = make_mosaic(grid_shape=(2, 3), tile_shape=(80, 80), overlap=4 / 80, stage_error=0.5, noise=0.0,
                         seed=12)  # fmt: skip
    tiles = microscope_tiles(sample, photons=5000, vignetting=0.3, seed=12)
    r = register_tiles(tiles, sample.stage_positions, max_shift=3, min_overlap=4)
    edges = edge_pairs(r)
    assert r.accepted[edges].all(), r.reasons
    assert set(np.array(r.refinements)[edges]) == {"peak-fit"}
    assert not r.placed_from_stage.any()
    # the band-pass sees one-sided neighbourhoods across all of a 4 px overlap: about a pixel across it, at worst
    error = np.linalg.norm(r.shift - true_shifts(r, sample), axis=1)
    assert error[edges].max() < 1.5, error[edges]
    # the pairs' weights are the peak fit's: positive and isotropic
    assert np.all(np.isfinite(r.residual[edges])) and r.median_residual < 0.5


def test_fine_geometry_reaches_the_borders_only_where_narrow():
    pairs = np.array([[0, 1], [0, 2]])
    delta = np.array([[0.0, 110.0], [0.0, 60.0]])  # 10 px and 60 px overlaps along x
    fine = pair_search._fine_geometry(pairs, delta, (50, 120), halo=4)
    reach = pair_search.FINE_SHIFT + stitch.MARGIN
    # the wide pair stays a halo inside both tiles; the narrow one reaches tile j's border (0) to keep 7 px
    assert fine.lo[1, 1] == 4
    assert fine.lo[0, 1] == 0 and fine.extent[0, 1] == 10 - reach
    assert fine.extent[1, 1] == 60 - reach - 2 * 4


def test_featureless_background_tiles_come_from_the_stage():
    """A whole row of background-only tiles (shot noise on a dark field): none of its pairs is accepted."""
    sample = make_mosaic(grid_shape=(3, 3), tile_shape=(80, 96), overlap=0.15, stage_error=3, noise=0.0, seed=13)
    image = sample.tiles.copy()
    image[6:] = 0  # the last row sees no specimen
    tiles = microscope_tiles(sample._replace(tiles=image), photons=400, seed=13)
    r = register_tiles(tiles, sample.stage_positions, max_shift=8)
    touching = np.all(r.pairs >= 6, axis=1)
    assert not r.accepted[touching].any()
    assert r.placed_from_stage[6:].all() and not r.placed_from_stage[:3].any()


def test_background_hole_stays_tied_to_the_stage():
    """A 2x2 block of background-only tiles inside a 5x5 mosaic: placed from the stage relative to the registered
    ring around it, so it neither drifts nor tears away (the weak stage ties and the prior bound it)."""
    base = make_mosaic(grid_shape=(5, 5), tile_shape=(64, 80), overlap=0.2, stage_error=3, noise=0.0, seed=14)
    picture = base.image.copy()
    lo = np.floor(base.true_positions[6] - 4).astype(int)  # tiles 6, 7, 11, 12: rows 1-2, columns 1-2
    hi = np.ceil(base.true_positions[12] + (64, 80) + 4).astype(int)
    picture[lo[0] : hi[0], lo[1] : hi[1]] = 0
    sample = make_mosaic(grid_shape=(5, 5), tile_shape=(64, 80), overlap=0.2, stage_error=3, noise=0.0,
                         picture=picture, seed=14)  # fmt: skip
    np.testing.assert_allclose(sample.true_positions, base.true_positions)
    tiles = microscope_tiles(sample, photons=400, seed=14)
    r = register_tiles(tiles, sample.stage_positions, max_shift=8)
    hole = np.zeros(25, bool)
    hole[[6, 7, 11, 12]] = True
    assert r.placed_from_stage.tolist() == hole.tolist()
    correction = r.positions - r.stage_positions
    ring = ~hole
    # bounded: the hole moves with its registered neighbours, within the stage's error of them
    assert np.abs(correction[hole] - correction[ring].mean(axis=0)).max() <= 2 * 3
    error = r.positions - sample.true_positions
    error -= error[ring].mean(axis=0)
    assert np.abs(error[ring]).max() < 1.0
    assert np.abs(error[hole]).max() <= 2 * 3 + 0.5  # no worse than the stage's own error, twice


def test_five_percent_overlap_camera_tiles():
    """5% of 160x200 tiles: 8 and 10 px overlaps, stage errors up to 2 px per tile, uint16 with vignetting."""
    sample = make_mosaic(grid_shape=(3, 3), tile_shape=(160, 200), overlap=0.05, stage_error=2, noise=0.0, seed=15)
    tiles = microscope_tiles(sample, photons=1000, seed=15)
    r = register_tiles(tiles, sample.stage_positions, max_shift=6)
    assert not r.placed_from_stage.any()
    edges = edge_pairs(r)
    assert r.accepted[edges].all(), np.array(r.reasons)[edges]
    error = np.linalg.norm(r.shift - true_shifts(r, sample), axis=1)
    assert np.median(error[r.accepted]) < 0.35, np.median(error[r.accepted])
    assert tile_rms(r, sample) < 0.35, tile_rms(r, sample)


def true_overlap(sample, pairs, shape):
    """Each pair's overlap at the true positions (px per axis) and whether the picture there holds texture."""
    width, textured = [], []
    for i, j in pairs:
        lo = np.maximum(sample.true_positions[i], sample.true_positions[j])
        hi = np.minimum(sample.true_positions[i], sample.true_positions[j]) + np.asarray(shape)
        width.append(hi - lo)
        box = tuple(slice(int(np.ceil(a)), int(np.floor(b))) for a, b in zip(lo, hi))
        region = sample.image[box]
        textured.append(region.size > 0 and float(np.mean(region == 0)) < 0.5)  # the blank region is exactly 0
    return np.array(width), np.array(textured)


@pytest.fixture(scope="module")
def widget_camera_mosaic():
    """The Stitch tiles widget's camera case (docs/screenshots.py --flat-field): 3x4 tiles of 192^2, 10% overlap
    (19 px), +-8 px stage errors (up to 16 px between neighbours: some overlaps shrink to 5 px), 2000 photons,
    uint16, vignetting, a blank corner."""
    sample = make_mosaic(grid_shape=(3, 4), tile_shape=(192, 192), overlap=0.1, noise=0.0, blank_corner=True)
    tiles = microscope_tiles(sample, photons=2000, dark=100)
    return sample, register_tiles(tiles, sample.stage_positions, max_shift=16)


def test_pairs_that_the_stage_error_narrowed_are_found(widget_camera_mosaic):
    """Pairs whose true overlap is less than half the nominal one (5 and 7 px of 19: pass 1's search cannot reach
    them) and corners between diagonal neighbours (too small for pass 1's threshold over +-16 px) are searched
    again around where their neighbours place them, and used: every textured pair with a right peak."""
    sample, r = widget_camera_mosaic
    width, textured = true_overlap(sample, r.pairs, (192, 192))
    error = np.linalg.norm(r.shift - true_shifts(r, sample), axis=1)
    edges = edge_pairs(r)
    narrow = edges & textured & (width.min(axis=1) < 0.5 * 19.2)
    assert narrow.sum() >= 2  # the case this test is about
    # every textured edge pair, however narrow (down to 4 px), is used, and right
    wanted = edges & textured & (width.min(axis=1) >= 4)
    assert r.accepted[wanted].all(), np.array(r.reasons)[wanted]
    assert error[wanted].max() < 1.0, error[wanted]
    # diagonal neighbours whose corner holds at least 8x8 textured px are used too
    corners = ~edges & textured & (width.min(axis=1) >= 8)
    assert corners.sum() >= 5 and r.accepted[corners].all(), np.array(r.reasons)[corners]
    # nothing wrong is used and nothing blank
    assert error[r.accepted].max() < 1.5, error[r.accepted]
    assert not r.accepted[~textured].any()
    assert r.accepted.sum() >= 24  # of 29 (the blank tile's 3 pairs and a blank corner cannot be)
    assert r.placed_from_stage.tolist() == sample.blank.tolist()
    assert tile_rms(r, sample) < 0.25, tile_rms(r, sample)


def test_peak_at_the_edge_of_the_overlap_is_not_trusted():
    """The mosaic sample: a pair whose stage error leaves 5 px of a nominal 29 px overlap peaks, in pass 1, where
    the search stops (a shift that keeps half the overlap), 1.8 px from the truth; that peak is on the search's
    edge, and the guided search finds the right one."""
    sample = make_mosaic(blank_corner=True)
    r = register_tiles(sample.tiles, sample.stage_positions, max_shift=16)
    error = np.linalg.norm(r.shift - true_shifts(r, sample), axis=1)
    assert error[r.accepted].max() < 1.0, error[r.accepted]
    assert tile_rms(r, sample) < 0.1, tile_rms(r, sample)


def test_a_pair_the_first_placement_doubts_is_decided_by_refinement_and_placement(monkeypatch):
    """A pair that pass 1 accepted, that the provisional placement of the guided search flags (its shift one pixel
    off), and that the guided search does not find again keeps pass 1's verdict: it is refined and the final
    placement decides it (here: refined back onto the truth and used), not rejected as "residual" before."""
    sample = make_mosaic(grid_shape=(3, 3), tile_shape=(96, 96), overlap=0.2, stage_error=3, noise=0.01, seed=5)
    options = {"max_shift": 8, "max_residual": 0.5}
    clean = register_tiles(sample.tiles, sample.stage_positions, **options)
    original, quantile = pair_search.guided_pass, pair_search.gumbel_quantile
    chosen = {}

    def guided(found, *rest, **options):
        k = int(np.flatnonzero(found.reason == stitch.REASONS.index("accepted"))[0])
        chosen["k"] = k
        found.shift[k] += (1.0, 0.0)  # pass 1 a pixel off: the first placement flags it (residual > max_residual)
        monkeypatch.setattr(pair_search, "gumbel_quantile", lambda samples, q: float("inf"))  # guided: nothing found
        try:
            return original(found, *rest, **options)
        finally:
            monkeypatch.setattr(pair_search, "gumbel_quantile", quantile)

    monkeypatch.setattr(pair_search, "guided_pass", guided)
    r = register_tiles(sample.tiles, sample.stage_positions, **options)
    k = chosen["k"]
    assert clean.accepted[k]
    assert r.reasons[k] == "accepted" and r.refinements[k] == "refined"
    np.testing.assert_allclose(r.shift[k], clean.shift[k], atol=0.05)
    assert r.accepted.sum() == clean.accepted.sum()
