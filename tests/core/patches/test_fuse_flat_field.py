"""fuse_tiles(..., flat_field=...): vignetting estimated from the tiles themselves and divided out, so the seams
that uneven illumination draws across a mosaic vanish."""

import dask.array as da
import numpy as np
import pytest

from napari_gridmip import fuse_tiles
from napari_gridmip._sample_data.mosaic import flat_field, make_mosaic, microscope_tiles
from napari_gridmip.core.patches.fuse import estimate_flat_field


@pytest.fixture(scope="module")
def vignetted():
    """4x4 tiles of 96x128 px, 15% overlap, strongly vignetted (about 40% in the corners), nearly noise-free."""
    sample = make_mosaic(grid_shape=(4, 4), tile_shape=(96, 128), overlap=0.15, stage_error=2, noise=0.0, seed=31)
    tiles = microscope_tiles(sample, photons=20000, dark=0, vignetting=0.9, seed=31)
    return sample, tiles


def illumination_ripple(mosaic, sample):
    """How much the mosaic's ratio to the true picture varies: the seams and vignetting a user sees (relative std)."""
    image, origin = np.asarray(mosaic.image, np.float64), mosaic.origin
    truth = 0.05 + sample.image[origin[0] : origin[0] + image.shape[0], origin[1] : origin[1] + image.shape[1]]
    ratio = image / truth
    inner = ratio[10:-10, 10:-10]
    return float(inner.std() / inner.mean())


def test_flat_field_is_found_from_the_tiles(vignetted):
    sample, tiles = vignetted
    flat = estimate_flat_field(tiles, has_channels=False, d=2)
    assert flat.shape == (96, 128) and flat.dtype == np.float32
    assert abs(float(flat.mean()) - 1) < 1e-5
    expected = flat_field((96, 128), vignetting=0.9)
    expected = expected / expected.mean()
    assert np.abs(flat - expected).max() < 0.15, np.abs(flat - expected).max()  # 16 textured tiles: a rough median
    assert np.corrcoef(flat.ravel(), expected.ravel())[0, 1] > 0.97


def test_seams_fade_with_the_flat_field(vignetted):
    sample, tiles = vignetted
    positions = sample.true_positions
    plain = fuse_tiles(tiles, positions)
    corrected = fuse_tiles(tiles, positions, flat_field=True)
    given = fuse_tiles(tiles, positions, flat_field=flat_field((96, 128), vignetting=0.9))
    before, after, ideal = (illumination_ripple(m, sample) for m in (plain, corrected, given))
    assert after < 0.15 * before, (before, after)  # measured: 0.28 -> 0.03
    assert ideal < 0.1 * before, (before, ideal)
    np.testing.assert_array_equal(plain.origin, corrected.origin)
    assert corrected.image.dtype == np.float32


def test_flat_field_lazy_equals_in_memory_and_inputs_untouched(vignetted):
    sample, tiles = vignetted
    before = tiles.copy()
    eager = fuse_tiles(tiles, sample.true_positions, flat_field=True)
    lazy = fuse_tiles(da.from_array(tiles, chunks=(1, 96, 128)), sample.true_positions, flat_field=True, chunk=256)
    np.testing.assert_allclose(np.asarray(lazy.image), np.asarray(eager.image), rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(tiles, before)


@pytest.mark.parametrize(
    ("flat", "message"),
    [(np.ones((5, 5)), "flat_field must have shape"), (np.zeros((96, 128)), "finite and positive")],
)
def test_flat_field_errors(vignetted, flat, message):
    sample, tiles = vignetted
    with pytest.raises(ValueError, match=message):
        fuse_tiles(tiles[:2], sample.true_positions[:2], flat_field=flat)
