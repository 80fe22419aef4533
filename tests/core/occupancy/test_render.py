"""orthographic_rays and render_volume: against dense NumPy MIPs of the same rays, in memory and chunk by chunk."""

import dask.array as da
import ml_dtypes
import numpy as np
import pytest

from napari_gridmip import occupancy_mipmap, orthographic_rays, render_volume
from tests.core.occupancy import reference


def blob_volume(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    volume = rng.random(shape) * 0.5  # background below the threshold 0.5
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    for _ in range(3):
        centre = rng.uniform(0, shape)
        inside = np.sum((grid - centre) ** 2, axis=-1) < rng.uniform(1.5, 3.5) ** 2
        volume[inside] = 0.5 + rng.random(int(inside.sum()))
    if np.dtype(dtype).kind in "iu":
        return (volume * 100).astype(dtype)
    return volume.astype(dtype)


class CountingArray:
    """An array that records each chunk dask reads from it."""

    def __init__(self, array):
        self.array, self.shape, self.dtype, self.ndim = array, array.shape, array.dtype, array.ndim
        self.reads = []

    def __getitem__(self, key):
        part = self.array[key]
        if part.size:
            self.reads.append(tuple(k.start or 0 for k in key))
        return part


def test_orthographic_rays_geometry():
    rays = orthographic_rays((10, 20, 30), (2, 0, 0), (0, -5, 0), (3, 4), pixel_size=0.5)
    assert rays.origins.shape == rays.directions.shape == (3, 4, 3)
    np.testing.assert_allclose(rays.directions, np.broadcast_to([1, 0, 0], (3, 4, 3)))
    np.testing.assert_allclose(rays.origins.mean(axis=(0, 1)), [10, 20, 30])
    np.testing.assert_allclose(rays.origins[0, 1] - rays.origins[0, 0], [0, 0, 0.5])  # columns along +x
    np.testing.assert_allclose(rays.origins[1, 0] - rays.origins[0, 0], [0, 0.5, 0])  # rows along +y (up is -y)
    oblique = orthographic_rays((0, 0, 0), (1, 1, 0), (1, 0, 0), (5, 5))
    np.testing.assert_allclose(oblique.directions[0, 0], [2**-0.5, 2**-0.5, 0])
    np.testing.assert_allclose((oblique.origins @ oblique.directions[0, 0]), 0, atol=1e-12)  # on the plane


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (((0, 0), (1, 0, 0), (0, 1, 0), (2, 2)), "center must be 3 finite numbers"),
        (((0, 0, 0), (0, 0, 0), (0, 1, 0), (2, 2)), "view must not be the zero vector"),
        (((0, 0, 0), (1, 0, 0), (2, 0, 0), (2, 2)), "up must not be parallel to view"),
        (((0, 0, 0), (1, 0, 0), (0, 1, 0), (2, 0)), "image_shape entries must be >= 1"),
    ],
)
def test_orthographic_rays_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        orthographic_rays(*args)


def camera_rays(shape, seed):
    rng = np.random.default_rng(seed)
    view = rng.normal(size=3)
    return orthographic_rays(np.array(shape) / 2, view, rng.normal(size=3), (9, 11), pixel_size=max(shape) / 8)


@pytest.mark.parametrize(("shape", "dtype"), [((13, 17, 9), np.float32), ((8, 20, 11), np.uint8)])
def test_mip_matches_the_dense_mip(shape, dtype):
    volume = blob_volume(shape, dtype, seed=1)
    threshold = 0.5 if dtype == np.float32 else 49
    levels = occupancy_mipmap(volume, threshold=threshold)
    occupied = volume > threshold
    for seed in range(3):
        origins, directions = camera_rays(shape, seed)
        image = render_volume(volume, levels, origins, directions)
        lazy = render_volume(da.from_array(volume, chunks=(5, 7, 4)), levels, origins, directions)
        assert image.shape == (9, 11) and image.dtype == volume.dtype
        np.testing.assert_array_equal(image, lazy)
        hits = 0
        for index in np.ndindex(9, 11):
            touched = reference.ray_voxels(occupied, origins[index], directions[index], -np.inf)
            want = reference.dense_mip(volume, origins[index], directions[index])
            if touched:
                hits += 1
                assert image[index] == want, index
            elif dtype == np.float32:
                assert np.isnan(image[index])
            else:
                assert image[index] == np.iinfo(dtype).min
        assert hits > 5


@pytest.mark.parametrize("threshold", [None, 0.9])
def test_first_hit_matches_the_reference(threshold):
    shape = (15, 12, 18)
    volume = blob_volume(shape, seed=2)
    levels = occupancy_mipmap(volume, threshold=0.5)
    origins, directions = camera_rays(shape, 3)
    depth = render_volume(volume, levels, origins, directions, mode="first_hit", threshold=threshold)
    lazy = render_volume(da.from_array(volume, chunks=6), levels, origins, directions, mode="first_hit",
                         threshold=threshold)  # fmt: skip
    np.testing.assert_array_equal(depth, lazy)
    assert depth.dtype == np.float32
    above = volume > (0.5 if threshold is None else threshold)
    for index in np.ndindex(*depth.shape):
        touched = reference.ray_voxels(above, origins[index], directions[index], -np.inf)
        if touched:
            assert depth[index] == touched[0][1]
        else:
            assert np.isnan(depth[index])
    assert np.isfinite(depth).sum() > 5


def test_dask_reads_only_the_chunks_with_occupied_voxels_on_the_rays():
    shape = (40, 36, 30)
    volume = np.zeros(shape, np.float32)
    volume[5:8, 5:8, 5:8] = 1.0  # one blob in one corner chunk, another far away
    volume[30:33, 28:31, 22:25] = 2.0
    levels = occupancy_mipmap(volume)
    counting = CountingArray(volume)
    lazy = da.from_array(counting, chunks=(10, 12, 10))
    rays = orthographic_rays((20, 18, 15), (1, 0, 0), (0, -1, 0), (12, 12), pixel_size=1.0)  # sees neither blob
    render_volume(lazy, levels, *rays)
    assert counting.reads == []
    rays = orthographic_rays((20, 18, 15), (1, 0, 0), (0, -1, 0), (40, 40), pixel_size=1.0)  # sees both
    image = render_volume(lazy, levels, *rays)
    assert sorted(counting.reads) == [(0, 0, 0), (30, 24, 20)]  # 2 of 48 chunks
    np.testing.assert_array_equal(image, render_volume(volume, levels, *rays))
    counting.reads.clear()
    render_volume(lazy, levels, *rays, mode="first_hit")  # depth of the occupancy itself: no read at all
    assert counting.reads == []


def test_zarr_volume(tmp_path):
    import zarr

    volume = blob_volume((12, 14, 10), seed=4)
    stored = zarr.open_array(str(tmp_path / "v.zarr"), mode="w", shape=volume.shape, chunks=(5, 5, 5), dtype="f4")
    stored[:] = volume
    levels = occupancy_mipmap(volume, threshold=0.5)
    rays = camera_rays(volume.shape, 5)
    np.testing.assert_array_equal(render_volume(stored, levels, *rays), render_volume(volume, levels, *rays))


@pytest.mark.parametrize("dtype", [np.bool_, np.int16, np.float16, ml_dtypes.bfloat16, np.float64])
def test_dtypes(dtype):
    volume = blob_volume((9, 10, 11), np.float32, seed=6)
    if dtype == np.bool_:
        volume = volume > 0.5
    elif dtype == np.int16:
        volume = (volume * 1000).astype(np.int16)
    else:
        volume = volume.astype(dtype)
    levels = occupancy_mipmap(volume, threshold=0.5)
    rays = camera_rays(volume.shape, 7)
    image = render_volume(volume, levels, *rays)
    assert image.dtype == volume.dtype
    lazy = render_volume(da.from_array(volume, chunks=4), levels, *rays)
    np.testing.assert_array_equal(image.astype(np.float64), lazy.astype(np.float64))  # bfloat16 NaNs, widened
    found = image.astype(np.float64)
    assert np.all(np.isnan(found) | (found > 0.5) | (found == np.iinfo(np.int16).min) | ~found.astype(bool))


def test_fill_progress_and_batches():
    volume = blob_volume((10, 10, 10), seed=8)
    levels = occupancy_mipmap(volume, threshold=0.5)
    rays = orthographic_rays((5, 5, 5), (0, 0, 1), (0, 1, 0), (30, 30), pixel_size=1.0)
    calls = []
    image = render_volume(volume, levels, *rays, fill=-1.0, batch_size=256, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(256, 900), (512, 900), (768, 900), (900, 900)]
    assert np.all((image == -1) | (image > 0.5)) and np.any(image == -1)
    np.testing.assert_array_equal(image, render_volume(volume, levels, *rays, fill=-1.0))

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        render_volume(da.from_array(volume, chunks=5), levels, *rays, batch_size=256, progress=stop)


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_levels_from_level_1_give_the_whole_pyramids_picture(dtype):
    """A lazy volume's pyramid without level 0 (no chunk read to make it) and the threshold: the same MIP and
    depth as the whole pyramid, NumPy or dask levels, and only chunks with a voxel above the threshold are read
    (even chunks: a level-1 cell lies in one chunk)."""
    volume = blob_volume((22, 19, 25), dtype, seed=2)
    threshold = 0.5 if dtype == np.float32 else 49
    levels = occupancy_mipmap(volume, threshold=threshold)
    rays = camera_rays(volume.shape, 2)
    counting = CountingArray(volume)
    lazy = da.from_array(counting, chunks=(6, 4, 8))
    holding = {(z // 6, y // 4, x // 8) for z, y, x in np.argwhere(volume > threshold)}
    for mode in ("mip", "first_hit"):
        extra = {"threshold": threshold} if mode == "first_hit" else {}
        whole = render_volume(volume, levels, *rays, mode=mode, **extra)
        assert (~np.isnan(whole) if mode == "first_hit" else whole > threshold).sum() > 5
        for coarse in (levels[1:], occupancy_mipmap(da.from_array(volume, chunks=8), threshold=threshold)[1:]):
            counting.reads.clear()
            np.testing.assert_array_equal(render_volume(lazy, coarse, *rays, mode=mode, threshold=threshold), whole)
            read = {(z // 6, y // 4, x // 8) for z, y, x in counting.reads}
            assert read and read <= holding
        in_memory = render_volume(volume, levels[1:], *rays, mode=mode, threshold=threshold)
        np.testing.assert_array_equal(in_memory, whole)
    mip = render_volume(volume, levels, *rays)
    filled = render_volume(volume, levels[1:], *rays, threshold=threshold, fill=0)
    np.testing.assert_array_equal(filled, np.where(mip > threshold, mip, 0))


def test_levels_from_level_1_need_the_threshold():
    volume = blob_volume((8, 8, 8), seed=13)
    levels = occupancy_mipmap(volume, threshold=0.5)
    with pytest.raises(ValueError, match="threshold is required with levels from level 1"):
        render_volume(volume, levels[1:], np.zeros((2, 3)), np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"levels\[0\] is a dask array"):
        render_volume(volume, occupancy_mipmap(da.from_array(volume, chunks=4)), np.zeros((2, 3)), np.ones((2, 3)))
    nothing = render_volume(volume, levels[1:], *camera_rays(volume.shape, 1), threshold=np.finfo(np.float32).max)
    assert np.isnan(nothing).all() and nothing.dtype == np.float32


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"volume": np.zeros((4, 4))}, ValueError, "volume must be 3D"),
        ({"volume": np.zeros((4, 4, 5))}, ValueError, "levels must be the pyramid of volume"),
        ({"mode": "sum"}, ValueError, "mode must be one of 'mip', 'first_hit'"),
        ({"threshold": 0.5}, ValueError, "threshold is for mode='first_hit'"),
        ({"mode": "first_hit", "threshold": np.inf}, ValueError, "threshold must be finite"),
        ({"progress": 3}, TypeError, "progress must be callable"),
    ],
)
def test_bad_input(kwargs, error, match):
    arguments = {"volume": np.zeros((4, 4, 4))}
    arguments.update(kwargs)
    volume = arguments.pop("volume")
    levels = occupancy_mipmap(np.zeros((4, 4, 4)))
    with pytest.raises(error, match=match):
        render_volume(volume, levels, np.zeros((2, 3)), np.ones((2, 3)), **arguments)


def test_compacted_batches_give_the_same_image():
    volume = blob_volume((24, 20, 28), seed=9)
    levels = occupancy_mipmap(volume, threshold=0.5)
    rays = camera_rays(volume.shape, 10)
    rays = orthographic_rays(np.array(volume.shape) / 2, rays.directions[0, 0], (0, 1, 0), (50, 60), pixel_size=0.7)
    for mode in ("mip", "first_hit"):
        compacted = render_volume(volume, levels, *rays, mode=mode, batch_size=4096)
        plain = render_volume(volume, levels, *rays, mode=mode, batch_size=1000)
        np.testing.assert_array_equal(compacted, plain)
        assert np.isfinite(compacted).sum() > 100
