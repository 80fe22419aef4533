"""The NumPy/SciPy pair kernel (small mosaics: nothing to compile) against the JAX one, batch by batch and on
whole mosaics: the same shifts, peaks, flags and decisions."""

import jax.numpy as jnp
import numpy as np
import pytest

from napari_gridmip import register_tiles
from napari_gridmip._sample_data.mosaic import make_mosaic, microscope_tiles, texture
from napari_gridmip.core.patches import _stitch_numpy, pair_search, stitch


def batch(shape, sigma, subpixel, max_shift=3, seed=0):
    """Five pairs cut from one picture at known shifts; one with data missing, one with a partial mask, one empty."""
    rng = np.random.default_rng(seed)
    reach = max_shift + stitch.MARGIN
    halo = stitch.filter_halo(sigma, subpixel == "refine")
    picture = texture(tuple(n + 2 * reach + 2 * halo + 4 for n in shape), seed=seed + 1)
    search = np.stack([picture[tuple(slice(0, n + 2 * reach + 2 * halo) for n in shape)]] * 5).astype(np.float32)
    search[1, :2] = np.nan  # beyond the tile
    template = np.stack([
        picture[tuple(slice(reach + k % 3 - 1, reach + k % 3 - 1 + n + 2 * halo) for n in shape)]
        + 0.01 * rng.standard_normal(tuple(n + 2 * halo for n in shape))
        for k in range(5)
    ]).astype(np.float32)  # fmt: skip
    mask = np.ones((5, *shape), np.float32)
    mask[2, ..., -3:] = 0
    mask[4] = 0  # padding
    return search, template, mask


@pytest.mark.parametrize(
    ("shape", "sigma", "subpixel"),
    [
        ((16, 40), 0.0, "none"),
        ((16, 40), 1.0, "quadratic"),
        ((16, 40), 1.0, "refine"),
        ((16, 40), 0.0, "refine"),
        ((8, 8, 12), 1.0, "quadratic"),
        ((8, 8, 12), 1.0, "refine"),
    ],
)
def test_numpy_kernel_equals_jax(shape, sigma, subpixel):
    search, template, mask = batch(shape, sigma, subpixel)
    options = {"max_shift": 3, "subpixel": subpixel, "sigma": sigma}
    expected = [np.asarray(x) for x in stitch._register_batch(jnp.asarray(search), jnp.asarray(template),
                                                                jnp.asarray(mask), **options)]  # fmt: skip
    got = _stitch_numpy.register_batch(search, template, mask, **options)
    names = ("shift", "peak", "information", "featureless", "on edge", "failed", "rival", "rival shift")
    for name, a, b in zip(names, expected, got):
        if name == "information":  # the empty pair's is NaN or garbage in both; the rest agree to float32
            np.testing.assert_allclose(b[:4], a[:4], rtol=2e-3, atol=1e-3, err_msg=name)
        elif a.dtype == bool:
            np.testing.assert_array_equal(b, a, err_msg=name)
        else:
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-4, err_msg=name)
    assert not np.asarray(got[3])[:4].any()


def test_filtered_tiles_equal_filtered_regions():
    """Filtering a tile once and cutting regions out equals filtering each region with its halo."""
    tiles = np.stack([texture((40, 50), seed=3)])
    for low_only in (False, True):
        halo = stitch.filter_halo(1.0, low_only)
        reader = pair_search.TileReader(tiles, None, False, halo)
        filtered = _stitch_numpy.FilteredTiles(pair_search.TileReader(tiles, None, False, 0), 1.0, low_only)
        for start, extent in (((0, 0), (10, 50)), ((-5, 30), (20, 30)), ((35, -3), (10, 12))):
            region = reader.region(0, start, extent)
            expected = _stitch_numpy.band_pass(region[None], 1.0, low_only, 2)[0]
            got = filtered.region(0, start, extent)
            inside = np.isfinite(got)
            np.testing.assert_allclose(got[inside], expected[inside], atol=1e-5)
            # beyond the tile: NaN in the cut region, as the kernel's "no data"
            assert np.array_equal(inside, np.isfinite(region[halo:-halo, halo:-halo]))


@pytest.mark.parametrize(
    ("grid", "tile", "overlap", "kwargs"),
    [
        ((2, 3), (80, 96), 0.2, {"max_shift": 6, "subpixel": "none"}),
        pytest.param((3, 3), (92, 124), 0.11, {"max_shift": 8}, marks=pytest.mark.slow),
        pytest.param((2, 2, 1), (40, 48, 32), 0.4, {"max_shift": 4, "subpixel": "quadratic"}, marks=pytest.mark.slow),
    ],
)
def test_engines_agree_on_whole_mosaics(monkeypatch, grid, tile, overlap, kwargs):
    sample = make_mosaic(grid_shape=grid, tile_shape=tile, overlap=overlap, stage_error=3 if len(grid) == 2 else 2,
                         noise=0.0, seed=21)  # fmt: skip
    tiles = microscope_tiles(sample, photons=1000, seed=21) if len(grid) == 2 else sample.tiles
    results = {}
    for engine in ("numpy", "jax"):
        monkeypatch.setattr(stitch, "FORCE_ENGINE", engine)
        results[engine] = register_tiles(tiles, sample.stage_positions, **kwargs)
    a, b = results["numpy"], results["jax"]
    assert a.reasons == b.reasons and a.refinements == b.refinements
    np.testing.assert_allclose(a.ncc, b.ncc, atol=2e-4)
    np.testing.assert_allclose(a.threshold, b.threshold, atol=2e-4)
    np.testing.assert_allclose(a.positions, b.positions, atol=2e-3)
    assert a.accepted.sum() >= 3


def test_small_mosaics_take_numpy_large_ones_jax(monkeypatch):
    plan = pair_search.Plan((16, 256), 32, 4, [])
    assert stitch._engine([plan], 16) == "numpy"
    monkeypatch.setattr(stitch, "NUMPY_MAX_WORK", 1000)
    assert stitch._engine([plan], 16) == "jax"


@pytest.mark.parametrize("axis", [1, 2, 3])
def test_per_pair_gather_picks_each_pairs_indices(axis):
    """``_along`` (block indexing, the gathered axis next to the batch's) against an explicit loop over pairs."""
    rng = np.random.default_rng(3)
    values = rng.standard_normal((4, 3, 7, 5))
    index = rng.integers(0, values.shape[axis], (4, 6))
    got = _stitch_numpy._along(values, index, axis)
    expected = np.stack([np.take(values[b], index[b], axis=axis - 1) for b in range(4)])
    assert got.shape == expected.shape == tuple(6 if a == axis else n for a, n in enumerate(values.shape))
    np.testing.assert_array_equal(got, expected)


def test_box_and_sliding_sums_against_explicit_sums():
    """The masked NCC's box sums (per box bounds) and sliding sums (windows from the origin) against sums of
    the boxes taken one by one."""
    rng = np.random.default_rng(4)
    values = rng.standard_normal((3, 2, 9, 8))
    lo = [rng.integers(0, 4, (3, 5)), rng.integers(0, 4, (3, 4))]
    hi = [lo[0] + rng.integers(0, 6, (3, 5)), lo[1] + rng.integers(0, 5, (3, 4))]
    got = _stitch_numpy._box_sums(values, lo, hi, 2)
    for b in range(3):
        for i in range(5):
            for j in range(4):
                box = values[b, :, lo[0][b, i] : hi[0][b, i], lo[1][b, j] : hi[1][b, j]].sum(axis=(1, 2))
                np.testing.assert_allclose(got[b, :, i, j], box, atol=1e-12)
    extent = [np.array([[3], [5], [2]]), np.array([[4], [1], [6]])]
    slid = _stitch_numpy._sliding_sums(values, extent, 3, 2)
    for b in range(3):
        for i in range(3):
            for j in range(3):
                box = values[b, :, i : i + extent[0][b, 0], j : j + extent[1][b, 0]].sum(axis=(1, 2))
                np.testing.assert_allclose(slid[b, :, i, j], box, atol=1e-12)
