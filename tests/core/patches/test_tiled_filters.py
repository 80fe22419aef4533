"""The named filters for tiled runs: each one's tiled output equals its untiled output, with the halo it states."""

import subprocess
import sys

import dask.array as da
import numpy as np
import pytest

from napari_gridmip import apply_tiled
from napari_gridmip.core.patches.tiled_filters import (
    FILTER_MODES,
    TILED_FILTER_NAMES,
    TILED_FILTERS,
    gaussian_radius,
    load_callable,
)
from tests.core.patches.reference import same_partition

# non-default parameters that make each halo larger than the default's, and an even size
VARIANTS = {
    "gaussian": {"sigma": 1.3, "truncate": 3.0},
    "median": {"size": 4},
    "uniform": {"size": 5},
    "minimum": {"size": 4},
    "maximum": {"size": 2},
    "white_tophat": {"size": 4},
    "black_tophat": {"size": 5},
    "gaussian_gradient_magnitude": {"sigma": 1.2},
    "gaussian_laplace": {"sigma": 0.8},
    "difference_of_gaussians": {"sigma_low": 0.5, "sigma_high": 1.5, "truncate": 3.0},
    "connected_components": {"threshold": 0.55, "connectivity": "full"},
}

CASES = [((2, 61, 47), (24, 20)), ((27, 22, 25), (16, 14, 16))]


def test_every_filter_has_a_variant():
    assert set(VARIANTS) == set(TILED_FILTERS) == set(TILED_FILTER_NAMES)


@pytest.mark.parametrize(("shape", "tile"), CASES)
@pytest.mark.parametrize("values", ["defaults", "variant"])
@pytest.mark.parametrize("name", TILED_FILTER_NAMES)
def test_tiled_equals_untiled(name, values, shape, tile):
    spec = TILED_FILTERS[name]
    image = np.random.default_rng(0).random(shape).astype(np.float32)
    fn, options = spec.build(len(tile), **(VARIANTS[name] if values == "variant" else {}))
    tile = tuple(max(t, 2 * options["halo"] + 6) for t in tile)  # a default's large halo: a larger tile
    out = apply_tiled(fn, image, tile, **options)
    full = fn(image)
    if spec.labels:
        assert options == {"halo": options["halo"], "labels": True, "overlap": 1}
        assert same_partition(out, full)
    else:
        assert out.dtype == full.dtype
        np.testing.assert_array_equal(out, full)


@pytest.mark.parametrize("mode", FILTER_MODES)
@pytest.mark.parametrize("name", [n for n in TILED_FILTER_NAMES if "mode" in TILED_FILTERS[n].defaults()])
def test_every_boundary_mode_tiles_exactly(name, mode):
    image = np.random.default_rng(1).random((53, 41)).astype(np.float32)
    fn, options = TILED_FILTERS[name].build(2, **VARIANTS[name], mode=mode)
    np.testing.assert_array_equal(apply_tiled(fn, image, (22, 19), **options), fn(image))


def test_the_halos_are_needed():
    """One pixel less than the stated halo changes the result (so the rule is not just generous)."""
    image = np.random.default_rng(2).random((60, 60)).astype(np.float32)
    for name in ("gaussian", "median", "white_tophat", "black_tophat", "difference_of_gaussians"):
        fn, options = TILED_FILTERS[name].build(2, **VARIANTS[name])
        options["halo"] -= 1
        assert not np.array_equal(apply_tiled(fn, image, (24, 24), **options), fn(image)), name


def test_a_filter_on_dask_is_lazy_and_exact():
    image = np.random.default_rng(3).random((3, 70, 66)).astype(np.float32)
    fn, options = TILED_FILTERS["white_tophat"].build(2, size=5)
    out = apply_tiled(fn, da.from_array(image, chunks=(1, 30, 30)), (25, 25), **options)
    assert isinstance(out, da.Array)
    np.testing.assert_array_equal(out.compute(), fn(image))


def test_gaussian_radius_is_scipy_s():
    from scipy import ndimage

    for sigma, truncate in [(1.0, 4.0), (1.3, 3.0), (2.5, 4.0), (0.3, 4.0)]:
        impulse = np.zeros(101)
        impulse[50] = 1
        reach = np.flatnonzero(ndimage.gaussian_filter1d(impulse, sigma, truncate=truncate, mode="constant"))
        assert reach[-1] - 50 == gaussian_radius(sigma, truncate)


def test_parameters_are_checked():
    spec = TILED_FILTERS["median"]
    with pytest.raises(ValueError, match="size must be finite and >= 1"):
        spec.build(2, size=0)
    with pytest.raises(ValueError, match="size must be a whole number"):
        spec.build(2, size=2.5)
    with pytest.raises(TypeError, match="size must be a number"):
        spec.build(2, size="3")
    with pytest.raises(ValueError, match="mode must be one of"):
        spec.build(2, mode="wrap")
    with pytest.raises(ValueError, match="has no parameter sigma"):
        spec.build(2, sigma=1.0)
    with pytest.raises(ValueError, match="d .* must be 1, 2 or 3"):
        spec.build(4)


def test_load_callable():
    from scipy import ndimage

    assert load_callable("scipy.ndimage:median_filter") is ndimage.median_filter
    assert load_callable("scipy.ndimage.median_filter") is ndimage.median_filter
    assert load_callable("numpy:linalg.norm") is np.linalg.norm
    for path, match in [
        ("", "an import path"),
        ("median_filter", "not module:function"),
        ("no_such_module_xyz:f", "cannot import"),
        ("scipy.ndimage:no_such", "has no 'no_such'"),
        ("numpy:pi", "not a function"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_callable(path)


def test_the_registry_does_not_import_jax():
    code = (
        "import sys; import napari_gridmip.core.patches.tiled_filters as f; "
        "f.TILED_FILTERS['gaussian'].build(2); assert 'jax' not in sys.modules, 'jax imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_filter_tiled_is_the_untiled_filter():
    from scipy import ndimage

    from napari_gridmip import filter_tiled

    rng = np.random.default_rng(4)
    image = rng.random((2, 97, 61)).astype(np.float32)
    before = image.copy()
    out = filter_tiled(image, (40, 32), name="gaussian", sigma=2.5, mode="nearest")
    np.testing.assert_array_equal(out, ndimage.gaussian_filter(image, (0, 2.5, 2.5), mode="nearest"))
    top = filter_tiled(image, (40, 32), name="white_tophat", size=5)
    np.testing.assert_array_equal(top, ndimage.white_tophat(image, size=(1, 5, 5)))
    labels = filter_tiled(image[0], (40, 32), name="connected_components", threshold=0.7)
    expected, _ = ndimage.label(image[0] > 0.7)
    assert same_partition(labels, expected)
    np.testing.assert_array_equal(image, before)


def test_filter_tiled_refuses_unknown_names_and_parameters():
    from napari_gridmip import filter_tiled

    image = np.zeros((20, 20))
    with pytest.raises(ValueError, match="name must be one of"):
        filter_tiled(image, (8, 8), name="sharpen")
    with pytest.raises(ValueError, match="has no parameter"):
        filter_tiled(image, (8, 8), name="gaussian", size=3)
    with pytest.raises(TypeError, match="must be a number"):
        filter_tiled(image, (8, 8), name="gaussian", sigma="2")
