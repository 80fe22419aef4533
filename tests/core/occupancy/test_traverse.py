"""traverse_occupied against the crossing-time reference (exactly) and against fine sampling (independently)."""

import jax
import numpy as np
import pytest

from napari_gridmip import occupancy_mipmap, traverse_occupied
from napari_gridmip.core.runtime import strategy
from tests.core.occupancy import reference


def sparse_volume(shape, fraction, seed, blobs=2):
    rng = np.random.default_rng(seed)
    volume = rng.random(shape) < fraction
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    for _ in range(blobs):
        centre = rng.uniform(0, shape)
        volume |= np.sum((grid - centre) ** 2, axis=-1) < rng.uniform(1, 3) ** 2
    return volume


def awkward_rays(shape, count, seed):
    """Axis-parallel, diagonal, face- and edge-grazing, inside-starting, missing and random rays."""
    rng = np.random.default_rng(seed)
    n = np.array(shape, float)
    origins, directions = [], []

    def add(o, d):
        origins.append(o)
        directions.append(d)

    for axis in range(3):
        for sign in (1.0, -1.0):
            d = np.zeros(3)
            d[axis] = sign
            o = rng.uniform(0, n)
            o[axis] = -1.0 if sign > 0 else n[axis] + 1
            add(o.copy(), d)  # axis-parallel through the middle of voxels
            o2 = o.copy()
            o2[(axis + 1) % 3] = float(rng.integers(0, shape[(axis + 1) % 3] + 1))  # on a face (or the box face)
            add(o2, d)
            o3 = o2.copy()
            o3[(axis + 2) % 3] = float(rng.integers(0, shape[(axis + 2) % 3] + 1))  # along an edge
            add(o3, d)
    add(np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0]))  # through every corner of the diagonal
    add(np.array([-2.0, -2.0, -2.0]), np.array([1.0, 1.0, 1.0]))
    add(n.copy(), np.array([-1.0, -1.0, -1.0]))
    add(np.array([0.0, 1.0, 0.0]), np.array([2.0, 0.0, 2.0]))  # diagonal in a face plane, through edges
    add(np.array([1.0, 1.0, 1.0]), np.array([0.0, 0.0, 0.0]))  # a point
    add(np.array([-5.0, -5.0, -5.0]), np.array([-1.0, 0.3, 0.2]))  # misses
    add(n + 3, np.array([0.0, 0.0, 1.0]))  # parallel, outside
    add(n / 2, rng.normal(size=3))  # starts inside
    add(np.array([0.5, 0.5, 0.5]) * n, np.array([0.0, 1e-30, 1.0]))  # a subnormal-free tiny component
    while len(origins) < count:
        centre = rng.uniform(-0.2, 1.2, 3) * n
        d = rng.normal(size=3)
        d[rng.random(3) < 0.2] = 0.0
        add(centre - 2 * n.max() * d, d)
    return np.array(origins), np.array(directions)


def assert_matches_reference(levels, origins, directions, hits, t_near=0.0, t_far=np.inf, dtype=np.float32):
    level0 = np.asarray(levels[0])
    near = np.broadcast_to(t_near, len(origins))
    far = np.broadcast_to(t_far, len(origins))
    for r in range(len(origins)):
        want = reference.ray_voxels(level0, origins[r], directions[r], near[r], far[r], dtype)
        mine = hits.ray_indices == r
        got = list(zip(map(tuple, hits.voxels[mine].tolist()), hits.t_starts[mine], hits.t_ends[mine]))
        assert [g[0] for g in got] == [w[0] for w in want], f"ray {r}: voxels differ"
        np.testing.assert_array_equal([g[1] for g in got], [w[1] for w in want], err_msg=f"ray {r}: t_starts")
        np.testing.assert_array_equal([g[2] for g in got], [w[2] for w in want], err_msg=f"ray {r}: t_ends")


@pytest.mark.parametrize(
    ("shape", "fraction"),
    [((1, 1, 1), 1.0), ((7, 5, 3), 0.3), ((16, 16, 16), 0.05), ((33, 9, 20), 0.05), ((3, 40, 2), 0.3)],
)
def test_matches_the_crossing_time_reference(shape, fraction):
    volume = sparse_volume(shape, fraction, seed=sum(shape))
    levels = occupancy_mipmap(volume)
    origins, directions = awkward_rays(shape, 60, seed=1)
    hits = traverse_occupied(levels, origins, directions)
    assert_matches_reference(levels, origins, directions, hits)
    assert np.all(np.diff(hits.ray_indices) >= 0)  # sorted by ray, then t
    same = np.diff(hits.ray_indices) == 0
    assert np.all(hits.t_starts[1:][same] >= hits.t_ends[:-1][same])
    assert np.all(hits.t_ends > hits.t_starts)


def test_intervals_agree_with_fine_sampling():
    """An independent check in float64: inside an interval exactly where floor(o + t d) is occupied."""
    shape = (21, 13, 30)
    volume = sparse_volume(shape, 0.03, seed=5)
    levels = occupancy_mipmap(volume)
    origins, directions = awkward_rays(shape, 40, seed=6)
    hits = traverse_occupied(levels, origins, directions)
    for r in range(len(origins)):
        o, d = origins[r], directions[r]
        ts = np.linspace(-1, 4 * max(shape) + 10, 20001)
        ts = ts[ts >= 0]
        # leave out samples within 1e-4 of a plane crossing, where float rounding decides the side
        crossings = [(b - o[a]) / d[a] for a in range(3) if d[a] != 0 for b in range(shape[a] + 1)]
        if crossings:
            gap = np.min(np.abs(ts[:, None] - np.array(crossings)[None, :]), axis=1)
            ts = ts[gap > 1e-4]
        mine = hits.ray_indices == r
        covered = np.any((ts[:, None] >= hits.t_starts[mine]) & (ts[:, None] < hits.t_ends[mine]), axis=1)
        np.testing.assert_array_equal(covered, reference.sampled_occupancy(volume, o, d, ts), err_msg=f"ray {r}")


def test_clipping_by_t_near_and_t_far():
    shape = (12, 10, 14)
    volume = sparse_volume(shape, 0.05, seed=7)
    levels = occupancy_mipmap(volume)
    origins, directions = awkward_rays(shape, 30, seed=8)
    rng = np.random.default_rng(9)
    near = rng.uniform(-5, 30, len(origins))
    far = near + rng.uniform(0, 30, len(origins))
    near[:3] = [2.0, 3.0, 4.0]  # on voxel boundaries of the axis-parallel rays
    hits = traverse_occupied(levels, origins, directions, t_near=near, t_far=far)
    assert_matches_reference(levels, origins, directions, hits, near, far)
    assert np.all(hits.t_starts >= near[hits.ray_indices]) and np.all(hits.t_ends <= far[hits.ray_indices])
    everything = traverse_occupied(levels, origins, directions, t_near=-np.inf)
    assert_matches_reference(levels, origins, directions, everything, -np.inf)


def test_overflow_continues_and_batches_agree():
    """A tiny capacity forces many passes and a tiny batch many programs: the same voxels, none dropped."""
    shape = (20, 20, 20)
    volume = sparse_volume(shape, 0.3, seed=10)
    levels = occupancy_mipmap(volume)
    origins, directions = awkward_rays(shape, 50, seed=11)
    wide = traverse_occupied(levels, origins, directions)
    narrow = traverse_occupied(levels, origins, directions, capacity=1, batch_size=16)
    for a, b in zip(wide[:4], narrow[:4]):
        np.testing.assert_array_equal(a, b)
    assert np.all(narrow.lookups >= wide.lookups)  # a resumed ray looks its voxel up again
    assert_matches_reference(levels, origins, directions, narrow)


def test_float64_and_a_single_ray_shape():
    volume = sparse_volume((9, 8, 7), 0.1, seed=12)
    levels = occupancy_mipmap(volume)
    hits = traverse_occupied(levels, np.array([-1.0, 3.3, 2.7]), np.array([1.0, 0.1, 0.05]), dtype=np.float64)
    assert hits.t_starts.dtype == np.float64 and hits.lookups.shape == (1,)
    assert_matches_reference(levels, np.array([[-1.0, 3.3, 2.7]]), np.array([[1.0, 0.1, 0.05]]), hits,
                             dtype=np.float64)  # fmt: skip


def test_empty_space_is_skipped():
    """Rays are clipped to the occupied bounding box; inside it, a lone voxel far along a long ray costs a few
    dozen lookups, not one per voxel."""
    levels = occupancy_mipmap(np.zeros((256, 40, 512), bool))
    origins = np.array([[128.5, 20.5, -1.0], [-1.0, -1.0, -1.0], [500.0, 0.0, 0.0]])
    directions = np.array([[0.0, 0.0, 1.0], [1.0, 0.1, 1.3], [1.0, 0.0, 0.0]])
    hits = traverse_occupied(levels, origins, directions)
    assert len(hits.t_starts) == 0 and hits.lookups.tolist() == [0, 0, 0]  # an empty volume has no box to enter
    volume = np.zeros((256, 40, 512), bool)
    volume[128, 20, 480] = True
    volume[0, 0, 0] = True  # the box is the whole volume
    hits = traverse_occupied(occupancy_mipmap(volume), origins[:1], directions[:1])
    assert hits.voxels.tolist() == [[128, 20, 480]]
    assert hits.lookups[0] < 60


@pytest.mark.slow
def test_without_jit_too():
    volume = sparse_volume((6, 5, 7), 0.2, seed=13)
    levels = [np.asarray(level) for level in occupancy_mipmap(volume)]
    origins, directions = awkward_rays((6, 5, 7), 3, seed=14)
    jitted = traverse_occupied(levels, origins[:3], directions[:3])
    with jax.disable_jit():
        eager = traverse_occupied(levels, origins[:3], directions[:3])
    for a, b in zip(jitted, eager):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"origins": np.zeros((2, 2))}, ValueError, r"origins must have shape \(\.\.\., 3\)"),
        ({"directions": np.zeros((3, 3))}, ValueError, "origins and directions must have one shape"),
        ({"origins": np.full((2, 3), np.nan)}, ValueError, "must be finite"),
        ({"origins": np.zeros((2, 3), complex)}, ValueError, "origins must hold real numbers"),
        ({"t_near": np.nan}, ValueError, "t_near must not be NaN"),
        ({"t_far": np.zeros(5)}, ValueError, r"t_far must be a number or have the rays' shape \(2,\)"),
        ({"t_near": "0"}, TypeError, "t_near must be a number"),
        ({"dtype": np.float16}, ValueError, "dtype must be float32 or float64"),
        ({"capacity": 0}, ValueError, "capacity entries must be >= 1"),
        ({"levels": [np.zeros((2, 2, 2))]}, ValueError, r"levels\[0\] must be a bool occupancy level"),
    ],
)
def test_bad_input(kwargs, error, match):
    arguments = {
        "levels": occupancy_mipmap(np.zeros((2, 2, 2), bool)),
        "origins": np.zeros((2, 3)),
        "directions": np.ones((2, 3)),
    }
    arguments.update(kwargs)
    levels, origins, directions = arguments.pop("levels"), arguments.pop("origins"), arguments.pop("directions")
    with pytest.raises(error, match=match):
        traverse_occupied(levels, origins, directions, **arguments)


@pytest.mark.parametrize(("ring", "capacity"), [(1, 64), (3, 1), (3, 2), (32, 5), (32, 64)])
def test_a_ring_of_records_gives_the_scatters_records(monkeypatch, ring, capacity):
    """The accelerators' records (a ring of steps sorted into the slots, strategy.step_record_ring) against the
    CPU's scatters: the same voxels and times, slot for slot, with rings shorter and longer than the capacity,
    across overflowing passes and compacted batches."""
    shape = (24, 18, 28)
    volume = sparse_volume(shape, 0.25, seed=21)
    levels = occupancy_mipmap(volume)
    origins, directions = awkward_rays(shape, 1500, seed=22)
    monkeypatch.setattr(strategy, "step_record_ring", lambda: 0)
    scattered = traverse_occupied(levels, origins, directions, capacity=capacity, batch_size=2048)
    monkeypatch.setattr(strategy, "step_record_ring", lambda: ring)
    ringed = traverse_occupied(levels, origins, directions, capacity=capacity, batch_size=2048)
    for a, b in zip(ringed, scattered):
        np.testing.assert_array_equal(a, b)
    assert len(ringed.t_starts) > 3 * len(origins)
    assert_matches_reference(levels, origins[::50], directions[::50],
                             traverse_occupied(levels, origins[::50], directions[::50], capacity=capacity))  # fmt: skip


def test_compaction_gives_the_same_voxels():
    """Batches above 1024 rays stop when 3/4 of their rays are done and go on with the rest in a smaller batch."""
    shape = (30, 26, 34)
    volume = sparse_volume(shape, 0.02, seed=15, blobs=6)
    levels = occupancy_mipmap(volume)
    origins, directions = awkward_rays(shape, 3000, seed=16)
    compacted = traverse_occupied(levels, origins, directions, batch_size=4096)
    plain = traverse_occupied(levels, origins, directions, batch_size=1000)  # batches of 1024 run to the end
    for a, b in zip(compacted, plain):
        np.testing.assert_array_equal(a, b)
    assert len(compacted.t_starts) > 1000
    pick = np.isin(compacted.ray_indices, np.arange(0, 3000, 97))
    subset = traverse_occupied(levels, origins[::97], directions[::97])
    np.testing.assert_array_equal(subset.voxels, compacted.voxels[pick])
    assert_matches_reference(levels, origins[::97], directions[::97], subset)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ulps", [-2, -1, 0, 1, 2])
def test_the_reciprocal_is_correctly_rounded_from_an_estimate_ulps_off(dtype, ulps):
    """A TPU's float32 ``1 / d`` can be an ulp off (and every crossing time with it): the Newton step with
    Dekker's exact residual must give NumPy's correctly rounded ``1 / d`` from an estimate up to 2 ulps off, over
    the whole range of normal directions (huge reciprocals included), on any backend."""
    from napari_gridmip.core.occupancy.traverse import reciprocal, rounded_reciprocal
    from napari_gridmip.core.runtime.precision import precision_scope

    rng = np.random.default_rng(7)
    low = np.log10(np.finfo(dtype).tiny) + 0.7
    d = (rng.choice([-1, 1], 20000) * 10.0 ** rng.uniform(low, 30, 20000)).astype(dtype)
    d = np.concatenate([d, np.array([1, -1, 3, 0.1, 1e30, -1e-30, np.finfo(dtype).tiny * 2], dtype)])
    exact = dtype(1) / d
    estimate = exact.copy()
    for _ in range(abs(ulps)):
        estimate = np.nextafter(estimate, dtype(np.inf) if ulps > 0 else dtype(-np.inf))
    with precision_scope(dtype):  # float64 as the library runs it: on the host where the device is a TPU
        got = np.asarray(jax.jit(rounded_reciprocal)(d, estimate))
        np.testing.assert_array_equal(got, exact)
        zero = np.asarray(jax.jit(reciprocal)(np.array([0.0, 2.0], dtype)))
    np.testing.assert_array_equal(zero, np.array([0.0, 0.5], dtype))
