"""render_view and camera_rays against a plain NumPy ray cast of the whole volume from the same camera."""

import dask.array as da
import numpy as np
import pytest
import zarr

from napari_gridmip import camera_rays, colorize_view, occupancy_mipmap, render_view
from napari_gridmip.core.occupancy.raycast import ChunkCache, RenderCancelled
from napari_gridmip.core.runtime import strategy

SHAPE = (24, 40, 56)  # non-cubic
SCALE = (2.0, 0.7, 1.0)  # anisotropic voxels
# float32 sample positions (the render's) against float64 (the reference's): about 1e-5 voxels apart at these
# coordinates, so a trilinear value differs by at most that times the largest step between neighbours (1200 here)
ATOL = 0.05


def sparse_volume(shape=SHAPE, seed=0):
    """uint16 zeros with a few lines, blobs and a dense block: the background is 0, occupancy is > 0."""
    rng = np.random.default_rng(seed)
    volume = np.zeros(shape, np.uint16)
    for _ in range(6):  # one-voxel lines
        a, b = rng.uniform(0, np.array(shape) - 1, (2, 3))
        p = np.floor(a + np.linspace(0, 1, 200)[:, None] * (b - a)).astype(int)
        volume[tuple(p.T)] = rng.integers(200, 900)
    for _ in range(4):  # blobs
        c = rng.integers(3, np.array(shape) - 3)
        volume[c[0] - 2 : c[0] + 2, c[1] - 2 : c[1] + 2, c[2] - 2 : c[2] + 2] = rng.integers(100, 1000, (4, 4, 4))
    volume[2:8, 30:38, 40:52] = rng.integers(1, 1200, (6, 8, 12))  # a dense cluster, zeros left in it
    volume[2:8, 30:38, 40:52][::3] = 0
    return volume


def trilinear(volume, p):
    """The volume at points ``p`` (n, 3), index coordinates (voxel ``i``'s value at ``i + 1/2``), trilinear with
    indices clamped at the faces (OpenGL's linear filter with clamp to edge, as napari's 3D view samples)."""
    q = p - 0.5
    low = np.floor(q)
    weight = q - low
    low = low.astype(int)
    last = np.array(volume.shape) - 1
    out = np.zeros(len(p))
    for corner in np.ndindex(2, 2, 2):
        v = np.clip(low + corner, 0, last)
        w = np.prod(np.where(np.array(corner) == 1, weight, 1 - weight), axis=1)
        out += w * volume[v[:, 0], v[:, 1], v[:, 2]]
    return out


def reference(volume, origins, directions, t_near, step, mode, iso=None, limits=None, attenuation=0.05):
    """Dense NumPy ray cast: every sample of every ray interpolates the whole-resolution volume (float64).

    Returns (values, depth, samples): ``samples[i]`` is ray ``i``'s (t, sample values) (None: it misses the box).
    """
    shape = np.array(volume.shape, float)
    volume = volume.astype(np.float64)
    o = origins.reshape(-1, 3)
    d = directions.reshape(-1, 3)
    d = d / np.linalg.norm(d, axis=1, keepdims=True)
    values = np.full(len(o), np.nan)
    depth = np.full(len(o), np.nan)
    samples = [None] * len(o)
    for i in range(len(o)):
        with np.errstate(divide="ignore", invalid="ignore"):
            a, b = -o[i] / d[i], (shape - o[i]) / d[i]
        inside = (o[i] >= 0) & (o[i] < shape)
        lo = np.where(d[i] != 0, np.minimum(a, b), np.where(inside, -np.inf, np.inf)).max()
        hi = np.where(d[i] != 0, np.maximum(a, b), np.where(inside, np.inf, -np.inf)).min()
        lo = max(lo, t_near)
        if not hi > lo:
            continue
        n = int(max(0, np.ceil((hi - lo) / step - 0.5)))
        if n == 0:
            continue
        t = lo + (np.arange(n) + 0.5) * step
        s = trilinear(volume, o[i] + t[:, None] * d[i])
        samples[i] = (t, s)
        if mode == "mip":
            k = np.argmax(s)
        elif mode == "minip":
            k = np.argmin(s)
        elif mode == "iso":
            above = np.flatnonzero(s > iso)
            if len(above) == 0:
                continue
            k = above[0]
        else:
            lo_c, hi_c = limits
            total = np.cumsum(step * np.clip((s - lo_c) / (hi_c - lo_c), 0, 1))
            s = scaled = s * np.exp(-attenuation * (total - 1))
            samples[i] = (t, scaled)
            k = np.argmax(scaled)
        values[i], depth[i] = s[k], t[k]
    shape2 = origins.shape[:-1]
    return values.reshape(shape2), depth.reshape(shape2), samples


def views(volume_shape):
    """An orthographic and a perspective napari camera looking at the volume (world = data * SCALE)."""
    world_center = (np.array(volume_shape) - 1) / 2 * SCALE
    view = np.array([-0.62, 0.45, 0.64])
    up = np.array([0.3, -0.9, 0.2])
    ortho = camera_rays(world_center, view, up, (36, 44), zoom=0.6, scale=SCALE)
    persp = camera_rays(world_center, view, up, (36, 44), zoom=0.6, perspective=40, scale=SCALE)
    return {"orthographic": ortho, "perspective": persp}


def compare(volume, rays, mode, **options):
    cells = np.asarray(occupancy_mipmap(np.asarray(volume), threshold=0)[2])
    got = render_view(volume, cells, rays.origins, rays.directions, t_near=rays.t_near, mode=mode, **options)
    iso = options.get("iso_threshold")
    limits = options.get("contrast_limits")
    want, want_depth, samples = reference(
        np.asarray(volume), rays.origins, rays.directions, rays.t_near, 0.5, mode, iso, limits,
        options.get("attenuation", 0.05),
    )  # fmt: skip
    values, depth = got.values.ravel(), got.depth.ravel()
    if mode == "iso":  # a ray whose samples pass within ATOL of the threshold may hit or miss in float32
        clear = np.array([s is None or not np.any(np.abs(s[1] - iso) < ATOL) for s in samples])
    else:
        clear = np.ones(len(samples), bool)
    assert clear.mean() > 0.98  # the comparison covers nearly every pixel
    assert np.array_equal(np.isnan(values[clear]), np.isnan(want.ravel()[clear]))
    hit = clear & ~np.isnan(want.ravel())
    assert hit.sum() > (0.01 if mode == "iso" else 0.3) * hit.size  # the camera sees the volume (and a surface)
    np.testing.assert_allclose(values[hit], want.ravel()[hit], rtol=2e-4 if mode == "attenuated_mip" else 0, atol=ATOL)
    # the depth is where the ray takes that value: its first sample within ATOL of the best (ties in float32 may
    # pick any of several samples of about the same value, so the check is on values, not on t alone)
    for i in np.flatnonzero(hit):
        t, s = samples[i]
        k = int(round((depth[i] - t[0]) / 0.5))
        assert 0 <= k < len(t) and abs(t[k] - depth[i]) < 2e-3, (i, depth[i])
        assert (
            abs(s[k] - want.ravel()[i]) <= (2e-4 * abs(want.ravel()[i]) if mode == "attenuated_mip" else 0) + 2 * ATOL
        )
        if mode == "iso":
            assert k == 0 or s[k - 1] <= iso + ATOL  # the first hit
    return got


MODES = {
    "mip": {},
    "minip": {},
    "attenuated_mip": {"contrast_limits": (0, 1200), "attenuation": 0.2},
    "iso": {"iso_threshold": 450},
}


@pytest.mark.parametrize("camera", ["orthographic", "perspective"])
@pytest.mark.parametrize("mode", list(MODES))
def test_equals_a_dense_numpy_ray_cast(camera, mode):
    volume = sparse_volume()
    rays = views(volume.shape)[camera]
    got = compare(volume, rays, mode, **MODES[mode])
    assert got.samples < got.samples_dense  # empty space was skipped


def test_the_host_render_of_a_tpu_gives_the_same_image(monkeypatch):
    """A TPU renders on the host CPU (core.runtime.strategy.render_on_host): the scope, forced on the CPU, changes
    nothing (the same device), and a CPU keeps the render where it is."""
    import jax

    from napari_gridmip.core.runtime import strategy

    assert strategy.render_on_host() is (jax.default_backend() == "tpu")
    volume = sparse_volume()
    rays = views(volume.shape)["perspective"]
    cells = np.asarray(occupancy_mipmap(volume)[2])
    here = render_view(volume, cells, rays.origins, rays.directions, t_near=0.0)
    calls = []
    monkeypatch.setattr(strategy, "render_on_host", lambda: calls.append(1) or True)
    moved = render_view(volume, cells, rays.origins, rays.directions, t_near=0.0)
    assert calls
    np.testing.assert_array_equal(moved.values, here.values)
    np.testing.assert_array_equal(moved.depth, here.depth)
    assert moved.samples == here.samples


@pytest.mark.parametrize("kind", ["dask", "zarr"])
def test_chunked_volumes_read_only_chunks_with_occupied_cells_on_the_rays(kind):
    volume = sparse_volume()
    lazy = da.from_array(volume, chunks=8) if kind == "dask" else zarr.array(volume, chunks=(8, 8, 8))
    rays = views(volume.shape)["perspective"]
    got = compare(lazy, rays, "mip")
    assert got.chunks_total == 3 * 5 * 7
    # never a chunk without an occupied voxel
    occupied = {int(i) for i in np.flatnonzero(volume.reshape(3, 8, 5, 8, 7, 8).max(axis=(1, 3, 5)).ravel())}
    cache = ChunkCache(lazy, capacity=1 << 20)
    cells = np.asarray(occupancy_mipmap(volume)[2])
    again = render_view(lazy, cells, rays.origins, rays.directions, t_near=0.0, cache=cache)
    assert set(cache.blocks) <= occupied
    assert again.chunks_read == got.chunks_read == got.chunks_used <= len(occupied)
    # a second render from the same cache reads nothing
    assert render_view(lazy, cells, rays.origins, rays.directions, t_near=0.0, cache=cache).chunks_read == 0


@pytest.mark.parametrize("mode", list(MODES))
def test_a_small_cache_renders_in_bands_with_the_same_image(mode):
    volume = sparse_volume()
    lazy = da.from_array(volume, chunks=8)
    rays = views(volume.shape)["orthographic"]
    cells = np.asarray(occupancy_mipmap(volume)[2])
    # eight chunks' bytes: a segment's trilinear samples read at most 2 chunks per axis (each band's chunks
    # overwrite the last band's in the pool: attenuated_mip reads every band twice)
    small = ChunkCache(lazy, capacity=8 * 8**3 * 2)
    banded = render_view(lazy, cells, rays.origins, rays.directions, cache=small, mode=mode, **MODES[mode])
    whole = render_view(volume, cells, rays.origins, rays.directions, mode=mode, **MODES[mode])
    np.testing.assert_array_equal(banded.values, whole.values)
    np.testing.assert_array_equal(banded.depth, whole.depth)
    assert len(small.blocks) <= small.slots < banded.chunks_used  # it rendered in bands
    assert small.nbytes <= small.capacity


@pytest.mark.parametrize("mode", ["mip", "attenuated_mip"])
def test_a_pool_kept_on_the_device_gives_the_same_image(monkeypatch, mode):
    """Off the CPU the pool is a device copy that each band brings up to date with the bricks written since
    (core.runtime.strategy.host_pool_aliased): forced here, with a cache small enough that bands evict and reuse bricks
    and slots, and kept across renders, the images are the host pool's."""

    volume = sparse_volume()
    lazy = da.from_array(volume, chunks=8)
    rays = views(volume.shape)["orthographic"]
    cells = np.asarray(occupancy_mipmap(volume)[2])
    host = ChunkCache(lazy, capacity=8 * 8**3 * 2)
    want = [render_view(lazy, cells, rays.origins, rays.directions, cache=host, mode=mode, **MODES[mode])
            for _ in range(2)]  # fmt: skip
    monkeypatch.setattr(strategy, "host_pool_aliased", lambda: False)
    kept = ChunkCache(lazy, capacity=8 * 8**3 * 2)
    for view in want:  # the second render starts from the first one's pool, on the device and on the host
        got = render_view(lazy, cells, rays.origins, rays.directions, cache=kept, mode=mode, **MODES[mode])
        np.testing.assert_array_equal(got.values, view.values)
        np.testing.assert_array_equal(got.depth, view.depth)
        atlas, tables = kept.device_arrays()
        assert not np.shares_memory(np.asarray(atlas), kept.atlas)  # a copy, brought up to date
        held = np.concatenate([kept.bricks_of[c] for c in kept.blocks])
        np.testing.assert_array_equal(np.asarray(atlas)[held], kept.atlas[held])
        slots = [kept.slot_of[c] for c in kept.blocks]
        np.testing.assert_array_equal(np.asarray(tables)[slots], kept.tables[slots])
    assert len(kept.blocks) <= kept.slots < got.chunks_used  # it rendered in bands


def test_the_cache_keeps_only_the_occupied_cells_of_the_chunks_it_reads():
    volume = sparse_volume()
    cells = np.asarray(occupancy_mipmap(volume)[2])  # cells of 4
    rays = views(volume.shape)["perspective"]
    cache = ChunkCache(zarr.array(volume, chunks=(8, 8, 8)), capacity=1 << 20)
    got = render_view(cache.volume, cells, rays.origins, rays.directions, t_near=0.0, cache=cache)
    assert cache.bricked and cache.brick == (4, 4, 4)
    # the bricks held are the occupied cells of the chunks read, nothing else
    per_chunk = np.zeros((3, 2, 5, 2, 7, 2), bool)
    per_chunk.reshape(6, 10, 14)[: cells.shape[0], : cells.shape[1], : cells.shape[2]] = cells
    occupied_in = per_chunk.sum(axis=(1, 3, 5)).ravel()
    assert cache.nbytes == occupied_in[cache.blocks].sum() * 4**3 * 2 < got.chunks_read * 8**3 * 2
    # chunks not whole cells (6 is not a multiple of 4): whole chunks, the same image
    whole = ChunkCache(zarr.array(volume, chunks=(6, 8, 8)), capacity=1 << 20)
    again = render_view(whole.volume, cells, rays.origins, rays.directions, t_near=0.0, cache=whole)
    assert not whole.bricked and whole.nbytes == len(whole.blocks) * 6 * 8 * 8 * 2
    np.testing.assert_array_equal(again.values, got.values)
    # another occupancy grid (cells of 8) empties the pool and lays it out again
    coarse = np.asarray(occupancy_mipmap(volume)[3])
    third = render_view(cache.volume, coarse, rays.origins, rays.directions, t_near=0.0, cache=cache)
    assert cache.brick == (8, 8, 8) and third.chunks_read == third.chunks_used
    np.testing.assert_array_equal(third.values, got.values)


def test_cancel_stops_the_render():
    volume = sparse_volume()
    rays = views(volume.shape)["orthographic"]
    cells = np.asarray(occupancy_mipmap(volume)[2])
    with pytest.raises(RenderCancelled):
        render_view(volume, cells, rays.origins, rays.directions, cancel=lambda: True)


def test_bad_arguments():
    volume = sparse_volume()
    cells = np.asarray(occupancy_mipmap(volume)[2])
    o, d = np.zeros((1, 3)), np.ones((1, 3))
    with pytest.raises(ValueError, match="cells"):
        render_view(volume, cells[:-1], o, d)
    with pytest.raises(ValueError, match="iso_threshold"):
        render_view(volume, cells, o, d, mode="iso")
    with pytest.raises(ValueError, match="step"):
        render_view(volume, cells, o, d, step=2.0)
    with pytest.raises(ValueError, match="mode"):
        render_view(volume, cells, o, d, mode="average")
    with pytest.raises(ValueError, match="zoom"):
        camera_rays((0, 0, 0), (1, 0, 0), (0, 1, 0), (4, 4), zoom=0)
    with pytest.raises(ValueError, match="parallel"):
        camera_rays((0, 0, 0), (1, 0, 0), (2, 0, 0), (4, 4), zoom=1)


def test_colorize_applies_limits_gamma_and_colormap():
    # napari's colormaps: absent where only the core is installed (the accelerator machine of docs/accelerator.md)
    ensure_colormap = pytest.importorskip("napari.utils.colormaps").ensure_colormap

    gray = ensure_colormap("gray")
    values = np.array([[0.0, 50.0, 100.0, np.nan]])
    rgba = colorize_view(values, colormap=gray, contrast_limits=(0, 100), gamma=2.0)
    np.testing.assert_allclose(rgba[0, :3, 0], [0, 0.25, 1], atol=1e-6)
    assert rgba[0, 3, 3] == 0  # nothing there: transparent
    with pytest.raises(ValueError, match="contrast_limits"):
        colorize_view(values, colormap=gray, contrast_limits=(1, 1))


def test_samples_next_to_an_occupied_cell_are_interpolated_not_skipped():
    # one voxel at the first index of its cell (cells of 4): the cells before it are empty, yet a sample there,
    # within a voxel of its centre, interpolates it; skipping those cells would lose the value
    volume = np.zeros((16, 16, 16), np.uint16)
    volume[8, 8, 8] = 1000
    cells = np.asarray(occupancy_mipmap(volume)[2])
    assert cells[2, 2, 2] and not cells[2, 2, 1] and not cells[1, 1, 1]
    offsets = np.array([0.1, 0.3, 0.45, 0.6, 0.9])  # from the voxel's lower face (index 8) into the empty cell
    origins = np.stack([np.full(5, -1.0), np.full(5, 8.5), 8.0 - offsets], axis=1)  # rays along z through y = 8.5
    directions = np.tile([1.0, 0.0, 0.0], (5, 1))
    got = render_view(volume, cells, origins, directions).values
    want, _, _ = reference(volume, origins, directions, -np.inf, 0.5, "mip")
    np.testing.assert_allclose(got, want, atol=ATOL)
    assert np.all(got[:3] > 0) and np.all(got[3:] == 0)  # x within a voxel of the centre 8.5 reads it, beyond not
    # a diagonal ray grazing the voxel's corner through the empty cells before it
    o = np.array([[-1.0, -1.0 - 0.5, -1.0 - 0.5]])
    d = np.array([[1.0, 1.0, 1.0]])
    got = render_view(volume, cells, o, d).values
    np.testing.assert_allclose(got, reference(volume, o, d, -np.inf, 0.5, "mip")[0], atol=ATOL)
    assert got[0] > 0


def test_a_new_camera_state_compiles_nothing():
    from tests.helpers import count_traces

    volume = sparse_volume()
    cells = np.asarray(occupancy_mipmap(volume)[2])
    cache = ChunkCache(da.from_array(volume, chunks=8), capacity=1 << 22)
    first, second = views(volume.shape).values()
    other = camera_rays(np.array(SHAPE) / 3, (0.2, -0.9, 0.3), (1, 0, 0), (20, 30), zoom=1.5, perspective=60)
    for mode, options in MODES.items():
        render_view(cache.volume, cells, first.origins, first.directions, mode=mode, cache=cache, **options)
        with count_traces() as traces:
            for rays in (second, other):
                render_view(cache.volume, cells, rays.origins, rays.directions, t_near=rays.t_near, mode=mode,
                            cache=cache, **options)  # fmt: skip
        assert traces.count == 0, mode


@pytest.mark.parametrize("chunks", [(6, 5, 7), 3])  # chunks not whole cells (of 4), and chunks smaller than a cell
def test_any_chunking_renders_the_same_image(chunks):
    volume = sparse_volume()
    rays = views(volume.shape)["perspective"]
    cells = np.asarray(occupancy_mipmap(volume)[2])
    lazy = render_view(da.from_array(volume, chunks=chunks), cells, rays.origins, rays.directions, t_near=0.0)
    whole = render_view(volume, cells, rays.origins, rays.directions, t_near=0.0)
    np.testing.assert_array_equal(lazy.values, whole.values)
    assert lazy.chunks_read < lazy.chunks_total


def test_mip_skips_only_segments_that_cannot_reach_the_maximum():
    # one ray along z through voxel centres (y, x) = (6, 6): its samples read voxels (z, 6, 6) only (the weights of
    # y = 7 and x = 7 are 0), but each segment's bound is the largest voxel of its cells, which includes them. With
    # cells of 4 a segment is 4 samples (2 voxels), so each voxel below lies in a segment of its own.
    volume = np.zeros((40, 12, 12), np.uint16)
    volume[3, 7, 7], volume[3, 6, 6] = 1000, 600  # bound 1000, but its samples reach 0.75 * 600 = 450 at most
    volume[9, 6, 6] = 700  # bound 700: the true maximum, 525, in a segment of a lower bound than the first
    volume[17, 6, 6] = 400  # bound 400 < 450 found first: skipped
    volume[25, 7, 7], volume[26, 6, 6] = 500, 100  # bound 500 > 450: read, and beats nothing
    volume[33, 6, 6] = 700  # the maximum again, later along the ray: the depth stays the first
    cells = np.asarray(occupancy_mipmap(volume)[2])
    o, d = np.array([[-1.0, 6.5, 6.5]]), np.array([[1.0, 0.0, 0.0]])
    got = render_view(volume, cells, o, d, skip_by_maxima=True)
    want, want_depth, samples = reference(volume, o, d, -np.inf, 0.5, "mip")
    assert got.values[0] == want[0] == 525 and got.depth[0] == want_depth[0] == samples[0][0][18]
    # every occupied segment is 19 of the 20 (a segment's box reaches the occupied cells around it); skipping by
    # maxima left out the 4 whose box lies in the bound-400 cell and the empty ones beside it
    every = render_view(volume, cells, o, d).samples  # by default mip reads them all too
    assert every == 19 * 4 and got.samples == every - 4 * 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mip_skipping_gives_the_image_of_every_segment_read(seed):
    # the same image (values and depths, to the bit) as a render that reads every occupied segment (the default);
    # plateaus of equal maxima make the depth's ties count
    volume = sparse_volume(seed=seed)
    volume[10:14, 20:24, 10:30] = 900
    volume[16:20, 5:9, 10:30] = 900
    cells = np.asarray(occupancy_mipmap(volume)[2])
    for camera, rays in views(volume.shape).items():
        skipped = render_view(volume, cells, rays.origins, rays.directions, t_near=rays.t_near, skip_by_maxima=True)
        every = render_view(volume, cells, rays.origins, rays.directions, t_near=rays.t_near)
        np.testing.assert_array_equal(skipped.values, every.values, err_msg=camera)
        np.testing.assert_array_equal(skipped.depth, every.depth, err_msg=camera)
        assert skipped.samples < every.samples, camera
        # whole chunks as bricks (chunks not whole cells): their maxima bound the same way
        whole = render_view(da.from_array(volume, chunks=(6, 5, 7)), cells, rays.origins, rays.directions,
                            t_near=rays.t_near, skip_by_maxima=True)  # fmt: skip
        np.testing.assert_array_equal(whole.values, every.values, err_msg=camera)
        np.testing.assert_array_equal(whole.depth, every.depth, err_msg=camera)


@pytest.mark.parametrize("changed", ["in place", "a copy changed"])
def test_a_cache_sees_an_occupancy_grid_changed_in_place(changed):
    """The cache keeps its own copy of the grid it was laid out for: a caller's grid changed in place (or a copy
    of it, changed) is a new layout, never the old bricks."""
    volume = np.zeros((32, 32, 32), np.float32)
    volume[20, 8, 8] = 9
    cells = np.zeros((4, 4, 4), bool)  # cells of 8: nothing occupied yet
    cache = ChunkCache(volume, capacity=1 << 20)
    origins, directions = np.array([[0.0, 8.5, 8.5]]), np.array([[1.0, 0.0, 0.0]])
    assert float(render_view(volume, cells, origins, directions, step=1.0, cache=cache).values[0]) == 0
    if changed == "in place":
        cells[2, 1, 1] = True
    else:
        cells = cells.copy()
        cells[2, 1, 1] = True
    fresh = float(render_view(volume, cells, origins, directions, step=1.0).values[0])
    assert fresh > 0
    assert float(render_view(volume, cells, origins, directions, step=1.0, cache=cache).values[0]) == fresh


def test_box_bits_say_whether_each_box_of_cells_is_occupied():
    from napari_gridmip.core.occupancy.raycast import _box_bits

    cells = np.random.default_rng(3).random((5, 6, 7)) < 0.08
    bits = _box_bits(cells)
    assert bits.dtype == np.uint8 and bits.shape == cells.shape
    for c in np.ndindex(cells.shape):
        for e in np.ndindex(2, 2, 2):  # the box from cell c to e cells past it (cut at the grid's end)
            box = cells[tuple(slice(i, i + k + 1) for i, k in zip(c, e))]
            assert bool(bits[c] >> (4 * e[0] + 2 * e[1] + e[2]) & 1) == bool(box.any()), (c, e)


def test_the_segments_read_are_exactly_those_whose_samples_read_an_occupied_cell():
    # rays along x through a long volume (samples at voxel centres, exact in float32): the coarsest segments span
    # 64 samples, scanned in blocks of 8, so a ray of 1200 samples needs 3 blocks; its occupied voxels lie in all of
    # them. The segments read (4 samples each for cells of 4 and step 1) are counted against a brute-force search.
    rng = np.random.default_rng(4)
    volume = np.zeros((6, 10, 1200), np.uint16)
    for x in (3, 300, 511, 512, 700, 1023, 1024, 1100, 1198):
        volume[rng.integers(0, 6), rng.integers(0, 10), x] = rng.integers(100, 1000)
    volume[2, 5, 1150] = 2000  # the largest, in the last block
    cells = np.asarray(occupancy_mipmap(volume)[2])
    zy = np.array(list(np.ndindex(6, 10)), float) + [0.5, 0.25]
    origins = np.column_stack([zy, np.full(len(zy), -2.0)])
    directions = np.tile([0.0, 0.0, 1.0], (len(zy), 1))
    got = render_view(volume, cells, origins, directions, step=1.0)
    want, want_depth, samples = reference(volume, origins, directions, -np.inf, 1.0, "mip")
    np.testing.assert_array_equal(got.values, want.astype(np.float32))
    np.testing.assert_array_equal(got.depth, want_depth.astype(np.float32))
    assert np.nanmax(got.values) == 2000 * 0.75  # y = 5.25: 3/4 of the voxel at y = 5 (centre 5.5)
    occupied = 0
    for (t, _), o in zip(samples, origins):
        p = o + t[:, None] * [0.0, 0.0, 1.0]
        base = np.floor(p - 0.5).astype(int)
        for k in range(0, len(t), 4):  # the voxels a segment's samples read, their cells, any occupied
            lo = np.clip(base[k : k + 4].min(axis=0), 0, np.array(volume.shape) - 1) // 4
            hi = np.clip(base[k : k + 4].max(axis=0) + 1, 0, np.array(volume.shape) - 1) // 4
            occupied += bool(cells[lo[0] : hi[0] + 1, lo[1] : hi[1] + 1, lo[2] : hi[2] + 1].any())
    assert got.samples == occupied * 4 and 0 < occupied < len(origins) * 1200 // 4 // 10


@pytest.mark.parametrize("mode", list(MODES))
def test_the_per_ray_reduction_of_sorted_segments_equals_the_sorting_one(mode):
    from napari_gridmip.core.occupancy.raycast import _per_ray, _per_ray_sorted

    # segments by ray, then along it (t increasing within a ray); values with ties (the earliest t must win),
    # segments without a valid sample (-inf) and, for iso, without a hit (t = inf, value -inf)
    rng = np.random.default_rng(5)
    rays = np.sort(rng.integers(0, 300, 3000)).astype(np.int32)
    t = (rays * 1000 + np.arange(3000) + rng.uniform(0, 0.5, 3000)).astype(np.float32)
    v = rng.integers(0, 6, 3000).astype(np.float32)
    v[rng.random(3000) < 0.1] = -np.inf
    if mode == "iso":
        t[rng.random(3000) < 0.5] = np.inf
        v[np.isinf(t)] = -np.inf
    want = _per_ray(mode, rays, v, t)
    got = _per_ray_sorted(mode, rays, v, t)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert len(np.unique(want[0])) == len(want[0]) == len(np.unique(rays))
