"""local_correlation_image against a float64 loop over CaImAn's definition."""

import dask.array as da
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napari_gridmip import local_correlation_image
from tests.core.correlation import reference_fields as ref
from tests.helpers import TaskCounter, examples


def host(a):
    with jax.enable_x64(True):
        return np.asarray(a, np.float64)


def flickering(frames=37, shape=(9, 11), seed=0):
    """Noise, a 3x3 patch flickering together, a constant pixel and a constant row."""
    rng = np.random.default_rng(seed)
    movie = rng.normal(size=(frames, *shape))
    movie[:, 3:6, 3:6] += 2 * rng.normal(size=(frames, 1, 1))
    movie[:, 0, 0] = 5.0
    movie[:, -1, :] = -1.0
    return movie


SHAPE = (9, 11)  # most cases share this frame shape (and so their compiled programs)


@pytest.mark.parametrize("neighbours", [8, 4])
@pytest.mark.parametrize("chunk_frames", [None, 5])  # one chunk; chunks of 5 padded to 8, the last one short
def test_against_the_definition(neighbours, chunk_frames):
    movie = flickering()
    expected = ref.local_correlation_image(movie, neighbours)
    out = local_correlation_image(movie.astype(np.float32), neighbours=neighbours, chunk_frames=chunk_frames)
    assert out.shape == SHAPE and out.dtype == np.float32
    np.testing.assert_allclose(host(out), expected, rtol=0, atol=2e-6)
    out64 = local_correlation_image(movie, neighbours=neighbours, chunk_frames=chunk_frames, dtype=np.float64)
    np.testing.assert_allclose(host(out64), expected, rtol=0, atol=1e-13)


def test_equals_caiman_fft_formula_and_constant_pixels_count_as_zero():
    movie = flickering()
    for neighbours in (8, 4):
        np.testing.assert_allclose(
            host(local_correlation_image(movie, neighbours=neighbours, dtype=np.float64)),
            ref.caiman_fft_formula(movie, neighbours),
            atol=1e-13,
        )
    out = host(local_correlation_image(movie, dtype=np.float64))
    assert out[0, 0] == 0  # constant: every pair with it is 0
    # the constant row's pixels correlate 0 with each other and with the row above: 0 too
    np.testing.assert_array_equal(out[-1], 0)
    assert out[4, 4] > 0.7  # the flickering patch


@pytest.mark.parametrize("pair", [((2, 3), (3, 2)), ((2, 2), (3, 3))], ids=["anti-diagonal", "diagonal"])
def test_a_diagonal_pair_counts_for_its_own_two_pixels(pair):
    """Two diagonal neighbours sharing a signal (correlation 0.9 between them, noise elsewhere): each of the two,
    and no other pixel, gains 0.9 / 8. CaImAn's ``local_correlations`` credits two of its four diagonal pairs to
    a pixel outside the pair (benchmarks/probes/caiman_check.py, docs/timeseries.md)."""
    rng = np.random.default_rng(1)
    movie = rng.standard_normal((4000, 6, 6))
    shared = 3 * rng.standard_normal(4000)
    for y, x in pair:
        movie[:, y, x] += shared
    out = host(local_correlation_image(movie, dtype=np.float64))
    np.testing.assert_allclose(out, ref.local_correlation_image(movie, 8), rtol=0, atol=1e-12)
    credited = {tuple(map(int, p)) for p in zip(*np.nonzero(out > 0.06))}
    assert credited == set(pair)
    assert all(0.9 / 8 - 0.01 < out[p] < 0.9 / 8 + 0.02 for p in pair)


@pytest.mark.parametrize(
    ("shape", "neighbours"),
    [((1, 1, 1), 8), ((1, 3, 4), 8), ((2, 1, 7), 8), ((5, 6, 1), 4)],
)
def test_awkward_shapes(shape, neighbours):
    movie = np.random.default_rng(sum(shape)).normal(size=shape)
    out = host(local_correlation_image(movie, neighbours=neighbours, dtype=np.float64))
    np.testing.assert_allclose(out, ref.local_correlation_image(movie, neighbours), atol=1e-13, equal_nan=True)
    assert np.isnan(out).all() == (shape[1:] == (1, 1))  # only a one-pixel image has no neighbours
    if shape[0] == 1:  # one frame: no variance anywhere
        assert (np.nan_to_num(out) == 0).all()


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.int64, np.float16, np.bool_, np.float64])
def test_input_dtypes(dtype):
    rng = np.random.default_rng(1)
    if dtype == np.bool_:
        movie = rng.random((20, *SHAPE)) > 0.5
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        movie = rng.integers(max(info.min, -1000), min(info.max, 1000), (20, *SHAPE)).astype(dtype)
        if dtype == np.int64:
            movie += 2**40  # beyond float32's exact range: the reference subtraction keeps the variations
    else:
        movie = rng.normal(size=(20, *SHAPE)).astype(dtype)
    expected = ref.local_correlation_image(movie.astype(np.float64) - (2**40 if dtype == np.int64 else 0))
    np.testing.assert_allclose(host(local_correlation_image(movie, chunk_frames=8)), expected, atol=2e-6)


def test_an_offset_movie_in_float32_keeps_float64_accuracy():
    """1e4 plus unit noise, 3000 frames, in float32: the first frame is subtracted in float32 (exact), each
    chunk centred on its mean, the chunks merged in float64."""
    rng = np.random.default_rng(2)
    frames = 3000
    movie = 1e4 + rng.normal(size=(frames, *SHAPE))
    movie[:, 2:5, 2:5] += 0.5 * rng.normal(size=(frames, 1, 1))
    movie[0] += 50.0  # a bad first frame: the reference is far from the data
    movie = movie.astype(np.float32)
    expected = ref.local_correlation_image(movie)
    out = host(local_correlation_image(movie, chunk_frames=256))
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-6)


def test_numpy_jax_dask_and_memory_mapped_movies_agree(tmp_path):
    movie = flickering(frames=40).astype(np.float32)
    expected = host(local_correlation_image(movie, chunk_frames=8))
    np.testing.assert_allclose(host(local_correlation_image(jnp.asarray(movie), chunk_frames=8)), expected, atol=1e-7)
    np.save(tmp_path / "m.npy", movie)
    mapped = np.load(tmp_path / "m.npy", mmap_mode="r")
    np.testing.assert_allclose(host(local_correlation_image(mapped, chunk_frames=8)), expected, atol=1e-7)
    # 16 x 16 float32 frames: whole chunks of a memory-mapped .npy are 64-byte aligned and go to JAX as they are
    square = np.random.default_rng(9).normal(size=(24, 16, 16)).astype(np.float32)
    np.save(tmp_path / "s.npy", square)
    mapped = np.load(tmp_path / "s.npy", mmap_mode="r")
    assert mapped[8:16].ctypes.data % 64 == 0
    np.testing.assert_allclose(
        host(local_correlation_image(mapped, chunk_frames=8)), ref.local_correlation_image(square), atol=2e-6
    )
    with TaskCounter() as counter:
        lazy = local_correlation_image(da.from_array(movie, chunks=(8, 4, 11)))
    assert counter.count == 0 and isinstance(lazy, da.Array) and lazy.shape == SHAPE and lazy.dtype == np.float32
    np.testing.assert_allclose(lazy.compute(), expected, atol=1e-7)
    uneven = local_correlation_image(da.from_array(movie, chunks=((15, 17, 8), 9, 11)), neighbours=4)
    np.testing.assert_allclose(uneven.compute(), host(local_correlation_image(movie, neighbours=4)), atol=1e-6)


def test_batch_axes():
    movies = np.stack([flickering(seed=s) for s in range(4)]).reshape(2, 2, 37, *SHAPE)
    out = host(local_correlation_image(movies, chunk_frames=8))
    assert out.shape == (2, 2, *SHAPE)
    lazy = local_correlation_image(da.from_array(movies, chunks=(1, 2, 10, 9, 11)), chunk_frames=8).compute()
    for index in np.ndindex(2, 2):
        np.testing.assert_allclose(out[index], ref.local_correlation_image(movies[index]), atol=2e-6)
        np.testing.assert_allclose(lazy[index], out[index], atol=1e-7)


def test_progress_per_chunk_and_cancel():
    movie = flickering(frames=37)
    calls = []
    local_correlation_image(movie, chunk_frames=8, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(k, 5) for k in range(1, 6)]

    class Stop(Exception):
        pass

    def stop(done, total):
        if done == 2:
            raise Stop

    with pytest.raises(Stop):
        local_correlation_image(movie, chunk_frames=8, progress=stop)
    calls = []
    lazy = local_correlation_image(da.from_array(movie, chunks=(10, 9, 11)), progress=lambda d, t: calls.append((d, t)))
    assert calls == []  # nothing runs before compute
    lazy.compute(scheduler="threads")
    assert sorted(calls) == [(k, 4) for k in range(1, 5)]
    with pytest.raises(Stop):
        local_correlation_image(da.from_array(movie, chunks=(10, 9, 11)), progress=stop).compute()


def test_at_most_two_chunks_are_in_flight(monkeypatch):
    """The loop over chunks waits for each merge before it reads the next chunk: when chunk i is read, chunk
    i - 2 has been computed (on the CPU: off it, one more chunk is read ahead, in a thread). Without the wait it
    ran ahead of the (asynchronous) computation, each queued chunk's buffer alive until its turn (898 MiB for a
    2000 x 512^2 movie; a Zarr movie could queue all of itself). Here each chunk's computation is slowed by a
    host callback, so that running ahead would show."""
    if jax.default_backend() != "cpu":
        # on the TPU (JAX 0.10.2, twice) the callback's thread sat in the callback and the main thread
        # in the next merge's dispatch, neither moving for minutes (docs/accelerator.md, thirteenth session). The
        # library has no host callbacks; its loop and wait run on the chip in this file's other tests
        pytest.skip("the slowing host callback deadlocks the TPU runtime against the donated merge's dispatch")
    import threading
    import time

    from napari_gridmip.core.correlation import timeseries

    real = timeseries.sent_chunk
    slow = jax.jit(lambda m: jax.pure_callback(lambda x: (time.sleep(0.05), x)[1], m, m))
    dispatched, late = [], []

    caller = threading.get_ident()

    def counted(*args, **kwargs):
        program, arguments = real(*args, **kwargs)
        if threading.get_ident() != caller:  # a dask task left running by an earlier test's cancelled compute
            return program, arguments
        i = len(dispatched)
        late.extend(j for j in range(i - 1) if not all(leaf.is_ready() for leaf in dispatched[j]))

        def slowed(*a):
            moments = program(*a)
            moments = (slow(moments[0]), *moments[1:])  # the merge needs the slowed centre
            dispatched.append(moments)
            return moments

        return slowed, arguments

    monkeypatch.setattr(timeseries, "sent_chunk", counted)
    monkeypatch.setenv("NAPARI_GRIDMIP_SHARD_BANDS", "0")  # one device's loop (several split each chunk instead)
    movie = flickering(frames=64)
    out = local_correlation_image(movie.astype(np.float32), chunk_frames=8)
    assert len(dispatched) == 8 and late == []
    np.testing.assert_allclose(host(out), ref.local_correlation_image(movie, 8), rtol=0, atol=2e-6)


@given(st.sampled_from([8, 4]), st.integers(0, 2**16))
@settings(max_examples=examples(10), deadline=None)
def test_transposing_the_frames_transposes_the_image(neighbours, seed):
    movie = np.random.default_rng(seed).normal(size=(12, *SHAPE))
    out = host(local_correlation_image(movie, neighbours=neighbours, dtype=np.float64))
    swapped = host(local_correlation_image(movie.swapaxes(-1, -2), neighbours=neighbours, dtype=np.float64))
    np.testing.assert_allclose(swapped, out.T, atol=1e-12)
    assert (np.abs(out) <= 1).all()


def test_nan_spreads_to_the_neighbours_only():
    movie = flickering()
    movie[3, 4, 6] = np.nan
    out = host(local_correlation_image(movie))
    nan = np.zeros(SHAPE, bool)
    nan[3:6, 5:8] = True
    np.testing.assert_array_equal(np.isnan(out), nan)


@pytest.mark.parametrize(
    ("movie", "kwargs", "error", "message"),
    [
        (np.zeros((4, 5)), {}, ValueError, "at least 3 axes"),
        (np.zeros((0, 4, 5)), {}, ValueError, "zero-length"),
        (np.zeros((3, 4, 5), complex), {}, ValueError, "movie must have a bool, integer"),
        ("movie.tif", {}, TypeError, "movie must be an array"),
        (np.zeros((3, 4, 5)), {"neighbours": 6}, ValueError, "neighbours must be 8 or 4"),
        (np.zeros((3, 4, 5)), {"neighbours": True}, ValueError, "neighbours must be 8 or 4"),
        (np.zeros((3, 4, 5)), {"chunk_frames": 0}, ValueError, "chunk_frames entries must be >= 1"),
        (np.zeros((3, 4, 5)), {"dtype": np.float16}, ValueError, "dtype must be float32 or float64"),
    ],
)
def test_bad_input(movie, kwargs, error, message):
    with pytest.raises(error, match=message):
        local_correlation_image(movie, **kwargs)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16, np.bool_, np.float16])
def test_narrow_movies_sent_as_held_give_the_hosts_image(monkeypatch, dtype):
    """Off the CPU a movie of at most 2 bytes a pixel crosses as held and is widened on the device
    (timeseries.sent_as_held); forced here on the CPU, its image equals the host-widened one's."""
    from napari_gridmip.core.correlation import timeseries

    rng = np.random.default_rng(3)
    movie = flickering(frames=45, shape=(12, 10))
    if dtype == np.bool_:
        movie = movie > np.median(movie)
    else:
        info = np.finfo(dtype) if dtype == np.float16 else np.iinfo(dtype)
        span = min(float(info.max), 3000.0)
        low = max(float(info.min), -span)
        movie = (low + (movie - movie.min()) / np.ptp(movie) * (span - low)).astype(dtype)
        movie[rng.random(movie.shape) < 0.01] = info.max  # edge values
    widened = np.asarray(local_correlation_image(movie, chunk_frames=16))
    monkeypatch.setattr(timeseries, "sent_as_held", lambda source: np.dtype(source).itemsize <= 2)
    held = np.asarray(local_correlation_image(movie, chunk_frames=16))
    np.testing.assert_allclose(held, widened, rtol=0, atol=1e-6)
    np.testing.assert_allclose(held, ref.local_correlation_image(movie.astype(np.float64), 8), rtol=0, atol=2e-5)


def test_chunks_read_ahead_in_a_thread_give_the_same_image(monkeypatch):
    """Off the CPU the chunk loop reads, prepares and sends chunk i+1 in a thread while chunk i's moments are merged
    (timeseries._prefetched); forced here on the CPU, with NumPy and a Zarr-like movie, the image is the same."""
    from napari_gridmip.core.correlation import timeseries

    monkeypatch.setenv("NAPARI_GRIDMIP_SHARD_BANDS", "0")  # one device's path (several: test_sharding's)
    movie = flickering(frames=70).astype(np.float32)
    in_turn = np.asarray(local_correlation_image(movie, chunk_frames=16))
    threads = set()
    real = timeseries.sent_chunk

    def noting(*args, **kwargs):
        import threading

        threads.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(timeseries, "sent_chunk", noting)
    monkeypatch.setattr(timeseries.strategy, "on_cpu", lambda: False)
    monkeypatch.setattr(timeseries, "sent_as_held", lambda source: False)  # the widening path: float32 here
    ahead = np.asarray(local_correlation_image(movie, chunk_frames=16))
    np.testing.assert_array_equal(ahead, in_turn)
    assert any(name.startswith("napari-gridmip chunk read") for name in threads)
    stops = []

    def stop(done, total):
        stops.append(done)
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        local_correlation_image(movie, chunk_frames=16, progress=stop)
    assert stops == [1, 2]
