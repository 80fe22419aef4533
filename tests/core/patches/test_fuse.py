"""fuse_tiles against a NumPy loop, sub-pixel placement, and the lazy dask mosaic."""

import dask.array as da
import numpy as np
import pytest

from napari_gridmip import fuse_tiles
from napari_gridmip._sample_data.mosaic import texture
from tests.core.patches.reference import fuse_reference
from tests.helpers import TaskCounter

BLENDS = ["linear", "mean", "max", "overwrite"]


def scattered(n=6, channels=2, shape=(21, 34), seed=0, dtype=np.float32):
    """Tiles at integer positions that overlap irregularly, some negative."""
    rng = np.random.default_rng(seed)
    tiles = (rng.random((n, channels, *shape)) * 1000).astype(dtype)
    positions = rng.integers(-15, 40, size=(n, len(shape))).astype(float)
    return tiles, positions


@pytest.mark.parametrize(
    ("blend", "interpolation"), [(b, "linear") for b in BLENDS] + [("linear", "cubic"), ("max", "nearest")]
)
def test_integer_positions_equal_the_loop(blend, interpolation):
    tiles, positions = scattered()
    mosaic = fuse_tiles(tiles, positions, blend=blend, interpolation=interpolation)
    expected, origin = fuse_reference(tiles, positions, blend)
    np.testing.assert_array_equal(mosaic.origin, origin)
    image = np.asarray(mosaic.image)
    assert image.shape == expected.shape and image.dtype == np.float32
    if blend in ("max", "overwrite"):
        np.testing.assert_array_equal(image, expected.astype(np.float32))  # values copied exactly
    else:
        np.testing.assert_allclose(image, expected, rtol=2e-6)


def test_3d_without_channels_and_integer_dtypes():
    rng = np.random.default_rng(1)
    tiles = rng.integers(0, 65535, size=(4, 9, 10, 11)).astype(np.uint16)
    positions = np.array([[0, 0, 0], [5, 3, -2], [-4, 7, 6], [2, -3, 9]], float)
    for blend in BLENDS:
        mosaic = fuse_tiles(tiles, positions, blend=blend)
        expected, origin = fuse_reference(tiles[:, None], positions, blend)
        image = np.asarray(mosaic.image)
        assert image.shape == expected.shape[1:]
        if blend in ("max", "overwrite"):
            assert image.dtype == np.uint16
            np.testing.assert_array_equal(image, expected[0].astype(np.uint16))
        else:
            assert image.dtype == np.float32
            np.testing.assert_allclose(image, expected[0], rtol=2e-6)


@pytest.mark.parametrize(("interpolation", "tolerance"), [("linear", 0.02), ("cubic", 0.004)])
def test_subpixel_placement_reproduces_the_picture(interpolation, tolerance):
    """Tiles sampled from a smooth picture at fractional origins fuse back into the picture."""
    from scipy import ndimage

    picture = texture((120, 140), seed=2).astype(np.float64)
    picture = ndimage.gaussian_filter(picture, 2)
    origins = np.array([[10.3, 12.6], [10.8, 70.25], [55.5, 11.9], [56.1, 69.4]])
    shape = (50, 60)
    grid = np.indices(shape).astype(float)
    tiles = np.stack(
        [ndimage.map_coordinates(picture, grid + o[:, None, None], order=5, mode="nearest") for o in origins]
    ).astype(np.float32)
    mosaic = fuse_tiles(tiles, origins, interpolation=interpolation)
    image = np.asarray(mosaic.image)
    covered = image != 0
    lo = mosaic.origin
    truth = picture[lo[0] : lo[0] + image.shape[0], lo[1] : lo[1] + image.shape[1]]
    assert covered.mean() > 0.9
    error = np.abs(image - truth)[covered]
    assert error.max() < tolerance * np.ptp(picture), (error.max(), np.ptp(picture))
    # what a tile covers at a fractional position: one pixel less at each end per axis for linear
    single = np.asarray(fuse_tiles(tiles[:1], origins[:1], interpolation=interpolation, fill=np.nan).image)
    trim = 1 if interpolation == "linear" else 2
    assert np.isnan(single[0]).all() and not np.isnan(single[trim : 50 - trim, trim : 60 - trim]).any()


def test_linear_blend_has_no_seam():
    """Two tiles of the same picture with different gains: the linear blend ramps across the overlap."""
    picture = np.ones((40, 100), np.float32)
    tiles = np.stack([picture[:, :60], 2 * picture[:, 40:]])
    positions = np.array([[0.0, 0.0], [0.0, 40.0]])
    row = np.asarray(fuse_tiles(tiles, positions).image)[20]
    assert np.all(np.diff(row[39:61]) > 0)  # rises steadily from 1 to 2 across the overlap
    assert np.abs(np.diff(row)).max() < 0.1
    mean = np.asarray(fuse_tiles(tiles, positions, blend="mean").image)[20]
    assert np.abs(np.diff(mean)).max() == pytest.approx(0.5)  # the mean jumps at the tile edges


@pytest.mark.parametrize(("blend", "chunk"), [("linear", 16), ("overwrite", 1024)])
def test_dask_is_lazy_and_equals_in_memory(blend, chunk):
    tiles, positions = scattered(seed=3)
    positions = positions + np.random.default_rng(4).random(positions.shape)  # fractional
    lazy_tiles = da.from_array(tiles, chunks=(2, 1, 21, 34))
    with TaskCounter() as counter:
        mosaic = fuse_tiles(lazy_tiles, positions, blend=blend, chunk=chunk)
    assert counter.count == 0 and isinstance(mosaic.image, da.Array)
    expected = fuse_tiles(tiles, positions, blend=blend)
    np.testing.assert_array_equal(mosaic.origin, expected.origin)
    np.testing.assert_array_equal(mosaic.image.compute(), np.asarray(expected.image))


def test_no_channel_axis_dask_and_fill():
    tiles, positions = scattered(n=3, channels=1, seed=5)
    tiles = tiles[:, 0]
    positions[2] = [200, 200]  # far away: a gap in between
    lazy = fuse_tiles(da.from_array(tiles, chunks=(1, 21, 34)), positions, fill=-1, chunk=64)
    image = lazy.image.compute()
    assert image.ndim == 2 and (image == -1).any()
    np.testing.assert_array_equal(image, np.asarray(fuse_tiles(tiles, positions, fill=-1).image))


def test_progress_and_cancel():
    tiles, positions = scattered(n=40, channels=1)
    calls = []
    fuse_tiles(tiles, positions, progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 3) and calls[-1] == (3, 3)

    def stop(done, total):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fuse_tiles(tiles, positions, progress=stop)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"blend": "gaussian"}, ValueError, "blend must be one of"),
        ({"interpolation": "sinc"}, ValueError, "interpolation must be one of"),
        ({"positions": np.zeros((3, 2))}, ValueError, "2 tiles but positions give 3"),
        ({"fill": "zero"}, TypeError, "fill must be a real number"),
    ],
)
def test_errors(kwargs, error, message):
    arguments = {"tiles": np.zeros((2, 8, 8)), "positions": np.zeros((2, 2)), **kwargs}
    tiles, positions = arguments.pop("tiles"), arguments.pop("positions")
    with pytest.raises(error, match=message):
        fuse_tiles(tiles, positions, **arguments)


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int32, np.float16, np.float64])
def test_dtypes(dtype):
    """Order-based blends keep the dtype and the values; the linear blend follows merge_patches' policy."""
    rng = np.random.default_rng(6)
    tiles = (rng.random((3, 1, 7, 9)) * (1 if dtype == np.bool_ else 100)).astype(dtype)
    positions = np.array([[0, 0], [3, 4], [-2, 6]], float)
    exact = fuse_tiles(tiles, positions, blend="overwrite")
    expected, _ = fuse_reference(tiles, positions, "overwrite")
    assert np.asarray(exact.image).dtype == dtype
    np.testing.assert_array_equal(np.asarray(exact.image), expected.astype(dtype))
    linear = np.asarray(fuse_tiles(tiles, positions).image)
    reference, _ = fuse_reference(tiles, positions, "linear")
    wide = np.dtype(dtype) in (np.dtype(np.int32), np.dtype(np.float64))
    assert linear.dtype == (np.float64 if wide else np.float16 if dtype == np.float16 else np.float32)
    np.testing.assert_allclose(linear.astype(np.float64), reference, rtol=1e-3 if dtype == np.float16 else 1e-6)
