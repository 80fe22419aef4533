"""apply_tiled: halos bit for bit, blending against a loop, channels, one JAX program, labels, dask, errors."""

import dask.array as da
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

from napari_gridmip import apply_tiled
from tests.core.patches.reference import blobs, reference_tiled, same_partition
from tests.helpers import TaskCounter, count_traces, examples

MODES = ["reflect", "nearest", "mirror", "constant"]
EPS32 = float(np.finfo(np.float32).eps)


def per_axis(t, d, lead, value):
    return (lead,) * (t.ndim - d) + (value,) * d


def gaussian(sigma, mode, d):
    return lambda t: ndimage.gaussian_filter(t, per_axis(t, d, 0, sigma), mode=mode)


def median(size, mode, d):
    return lambda t: ndimage.median_filter(t, size=per_axis(t, d, 1, size), mode=mode)


def uniform(size, mode, d):
    return lambda t: ndimage.uniform_filter(t, size=per_axis(t, d, 1, size), mode=mode)


def tile_dependent(t):
    """An output that differs from tile to tile (as a network's does), so that blending matters."""
    return t - t.mean() + 0.1 * np.cos(t.sum())


# -- halo: bit for bit ---------------------------------------------------------------

# (image shape, tile): odd, non-square, size-1 axes, axes shorter than their tile, a tile equal to the image;
# every tile that does not span its axis is at least 10 long (2 x the Gaussian's radius 4, plus an overlap of 1, plus 1)
SHAPES = [
    ((97, 83), (40, 30)),
    ((2, 61, 130), (33, 47)),
    ((3, 1, 50), (8, 21)),
    ((1, 64, 17), (25, 25)),
    ((45, 45), (45, 45)),
    ((2, 19, 23, 29), (12, 14, 15)),
    ((9, 40, 7), (9, 19, 7)),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("shape", "tile"), SHAPES)
def test_halo_gives_the_untiled_filter_bit_for_bit(shape, tile, mode):
    image = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    d = len(tile)
    for fn, halo in [(gaussian(1.0, mode, d), 4), (median(5, mode, d), 2), (uniform(3, mode, d), 1)]:  # radius 4
        full = fn(image)
        out = apply_tiled(fn, image, tile, halo=halo)
        assert out.dtype == full.dtype
        np.testing.assert_array_equal(out, full)
    # kept parts that overlap, each pixel from its owner: still exact
    np.testing.assert_array_equal(apply_tiled(fn, image, tile, halo=halo, overlap=1, blend="crop"), full)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float64])
def test_halo_exact_for_other_dtypes(dtype):
    image = (np.random.default_rng(1).random((2, 70, 51)) * 200).astype(dtype)
    for fn, halo in [(gaussian(2.0, "reflect", 2), 8), (median(4, "mirror", 2), 2)]:
        np.testing.assert_array_equal(apply_tiled(fn, image, (30, 23), halo=halo), fn(image))


def test_uniform_on_float64_is_within_ulps():
    """SciPy's uniform filter is a running sum from each line's start, so a tile's float64 sums round differently."""
    image = np.random.default_rng(2).random((70, 51))
    fn = uniform(5, "reflect", 2)
    np.testing.assert_allclose(apply_tiled(fn, image, (30, 23), halo=2), fn(image), rtol=0, atol=8e-16)


def test_a_halo_too_small_is_not_exact():
    image = np.random.default_rng(3).random((90, 90)).astype(np.float32)
    fn = gaussian(2.0, "reflect", 2)  # radius 8
    assert not np.array_equal(apply_tiled(fn, image, (40, 40), halo=4), fn(image))


def test_wrap_mode_is_only_exact_where_a_tile_spans_the_axis():
    image = np.random.default_rng(4).random((60, 50)).astype(np.float32)
    fn = gaussian(1.0, "wrap", 2)
    out = apply_tiled(fn, image, (30, 50), halo=4)  # axis 1 is one tile: it wraps there as untiled
    full = fn(image)
    np.testing.assert_array_equal(out[4:-4], full[4:-4])
    assert not np.array_equal(out, full)  # the first and last rows would need the opposite border


def test_pad_mode_pads_short_axes_up_to_the_tile():
    image = np.random.default_rng(5).random((50, 20)).astype(np.float32)
    seen = []

    def fn(t):
        seen.append(t.shape)
        return ndimage.gaussian_filter(t, 1.0, mode="reflect")

    out = apply_tiled(fn, image, (32, 32), halo=4, pad_mode="symmetric")  # np.pad's symmetric = scipy's reflect
    assert set(seen) == {(32, 32)}
    np.testing.assert_array_equal(out, fn(image))
    seen.clear()
    apply_tiled(fn, image, (32, 32), halo=4)  # no pad_mode: the tile spans the short axis instead
    assert set(seen) == {(32, 20)}


# -- overlap: blended with merge_patches' windows --------------------------------------


@pytest.mark.parametrize("blend", ["gaussian", "mean", "hann", "crop"])
@pytest.mark.parametrize(
    ("shape", "tile", "halo", "overlap"),
    [
        ((41, 37), (16, 12), (0, 0), (5, 3)),
        ((2, 33, 40), (20, 17), (2, 3), (4, 6)),
        ((1, 23), (1, 9), (0, 1), (0, 2)),
        ((13, 15, 11), (7, 8, 11), (1, 1, 0), (2, 3, 0)),
    ],
)
def test_overlap_blends_like_a_loop_with_the_same_weights(shape, tile, halo, overlap, blend):
    image = np.random.default_rng(6).random(shape).astype(np.float32)
    out = apply_tiled(tile_dependent, image, tile, halo=halo, overlap=overlap, blend=blend)
    expected = reference_tiled(tile_dependent, image, tile, halo, overlap, blend)
    assert out.dtype == np.float32
    if blend == "crop":
        np.testing.assert_array_equal(out, expected)
    else:
        np.testing.assert_allclose(out, expected, rtol=4 * EPS32, atol=4 * EPS32)


@settings(max_examples=examples(25), deadline=None)
@given(
    data=st.data(),
    shape=st.tuples(st.integers(1, 3), st.integers(3, 40), st.integers(3, 40)),
    blend=st.sampled_from(["gaussian", "mean", "hann", "crop"]),
)
def test_any_geometry_blends_like_the_loop_in_memory_and_on_dask(data, shape, blend):
    """Random tiles, halos and overlaps (up to heavy overlap, where three tiles share pixels), and dask chunks."""
    tile, halo, overlap = [], [], []
    for n in shape[1:]:
        t = data.draw(st.integers(3, n + 3))
        h = data.draw(st.integers(0, (t - 1) // 2))
        o = data.draw(st.integers(0, max(t - 2 * h - 1, 0)))
        tile.append(t), halo.append(h), overlap.append(o)
    image = np.random.default_rng(shape[1] * 41 + shape[2]).random(shape).astype(np.float32)
    out = apply_tiled(tile_dependent, image, tile, halo=halo, overlap=overlap, blend=blend)
    exact = blend == "crop" or not any(overlap)  # no overlap anywhere: each pixel from its owner, whatever blend
    expected = reference_tiled(tile_dependent, image, tile, halo, overlap, "crop" if exact else blend)
    chunks = (shape[0], *(data.draw(st.integers(max(1, n // 4), n)) for n in shape[1:]))
    lazy = apply_tiled(
        tile_dependent, da.from_array(image, chunks=chunks), tile, halo=halo, overlap=overlap, blend=blend
    )
    if exact:
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(lazy.compute(), out)
    else:
        np.testing.assert_allclose(out, expected, rtol=8 * EPS32, atol=8 * EPS32)
        np.testing.assert_allclose(lazy.compute(), out, rtol=4 * EPS32, atol=4 * EPS32)


def test_sigma_scale_reaches_the_weights():
    image = np.random.default_rng(7).random((50, 50)).astype(np.float32)
    out = apply_tiled(tile_dependent, image, (20, 20), overlap=8, sigma_scale=0.3)
    expected = reference_tiled(tile_dependent, image, (20, 20), (0, 0), (8, 8), "gaussian", sigma_scale=0.3)
    np.testing.assert_allclose(out, expected, rtol=4 * EPS32, atol=4 * EPS32)
    assert not np.allclose(out, apply_tiled(tile_dependent, image, (20, 20), overlap=8), rtol=1e-4)


def test_overlap_as_a_fraction_is_monai_s_step():
    image = np.random.default_rng(8).random((300, 290)).astype(np.float32)
    # tile 64, halo 2: core 60, step int(60 * 0.75) = 45, so 15 pixels overlap
    a = apply_tiled(tile_dependent, image, (64, 64), halo=2, overlap=0.25)
    b = apply_tiled(tile_dependent, image, (64, 64), halo=2, overlap=15)
    np.testing.assert_array_equal(a, b)


def test_pixels_one_tile_sees_are_its_output_exactly():
    image = np.random.default_rng(9).random((100, 100)).astype(np.float32)
    out = apply_tiled(lambda t: t * 3, image, (40, 40), overlap=8)  # windows 0, 32, 60: alone on 0-32, 40-60, 72-100
    alone = np.r_[0:32, 40:60, 72:100]
    np.testing.assert_array_equal(out[np.ix_(alone, alone)], (image * 3)[np.ix_(alone, alone)])
    np.testing.assert_allclose(out, image * 3, rtol=2 * EPS32)


@pytest.mark.parametrize(
    ("dtype", "blend", "expected"),
    [
        (np.int16, "crop", np.int16),
        (np.uint8, "gaussian", np.float32),
        (np.float16, "gaussian", np.float16),
        (np.float64, "mean", np.float64),
        (np.int32, "hann", np.float64),
        (np.bool_, "gaussian", np.float32),
    ],
)
def test_output_dtype_follows_fn(dtype, blend, expected):
    image = (np.random.default_rng(10).random((2, 30, 40)) * 100).astype(dtype)
    out = apply_tiled(lambda t: t, image, (16, 16), overlap=3, blend=blend)
    assert out.dtype == expected
    tolerance = 1e-3 if expected == np.float16 else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), image.astype(np.float64), rtol=tolerance, atol=tolerance)


# -- channels ---------------------------------------------------------------------------


@pytest.mark.parametrize("blend", ["crop", "gaussian"])
@pytest.mark.parametrize(
    ("shape", "fn"),
    [
        ((3, 37, 45), lambda t: np.stack([t.sum(0), t[0] - t[1]])),  # 3 channels in, 2 out
        ((3, 37, 45), lambda t: t.mean(0)),  # channels dropped
        ((37, 45), lambda t: np.stack([t, -t, t * t])),  # channels made
        ((2, 3, 37, 45), lambda t: t.reshape(6, *t.shape[2:])),  # two leading axes into one
    ],
)
def test_fn_may_change_the_channels(shape, fn, blend):
    image = np.random.default_rng(11).random(shape).astype(np.float32)
    out = apply_tiled(lambda t: fn(tile_dependent(t)), image, (20, 16), overlap=(3, 2), blend=blend)
    expected = reference_tiled(lambda t: fn(tile_dependent(t)), image, (20, 16), (0, 0), (3, 2), blend)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=8 * EPS32, atol=8 * EPS32)


# -- JAX: one program ----------------------------------------------------------------


def test_a_jax_fn_is_traced_once_for_edge_tiles_and_a_short_last_batch():
    image = np.random.default_rng(12).random((3, 100, 77)).astype(np.float32)
    seen = []

    def fn(t):
        seen.append(t.shape)  # runs only while JAX traces
        # exact in float32 on every backend (a TPU's tanh is an approximation, 8e-5 off NumPy's)
        return jnp.abs(t - 0.5) * 2

    # axis 100: windows 0, 28, 56 and 68 flush; axis 77: 0, 28 and 45 flush; 12 tiles in batches of 5, 5, 2
    with count_traces() as traces:
        out = apply_tiled(fn, image, (32, 32), overlap=4, batch_size=5)
    assert seen == [(3, 32, 32)]  # vmapped: fn sees one tile
    assert traces.count == 1
    expected = apply_tiled(lambda t: np.abs(t - 0.5) * 2, image, (32, 32), overlap=4, backend="numpy")
    np.testing.assert_allclose(out, expected, rtol=4 * EPS32, atol=4 * EPS32)


def test_a_batched_jax_fn_gets_the_batch():
    image = np.random.default_rng(13).random((50, 41)).astype(np.float32)
    seen = []

    def fn(batch):
        seen.append(batch.shape)
        return batch - batch.mean(axis=(1, 2), keepdims=True)

    out = apply_tiled(fn, image, (20, 20), overlap=4, batch_size=3, batched=True, backend="jax")
    assert seen == [(3, 20, 20)]
    expected = reference_tiled(lambda t: t - t.mean(), image, (20, 20), (0, 0), (4, 4), "gaussian")
    np.testing.assert_allclose(out, expected, rtol=4 * EPS32, atol=4 * EPS32)


def test_jax_keeps_float64_in_its_own_scope():
    image = np.random.default_rng(14).random((40, 30))
    out = apply_tiled(lambda t: t * 2.0, image, (16, 16), halo=1, backend="jax")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, image * 2.0)
    assert not jax.config.read("jax_enable_x64")


def test_auto_backend_falls_back_to_numpy_for_scipy():
    image = np.random.default_rng(15).random((40, 30)).astype(np.float32)
    fn = gaussian(1.0, "nearest", 2)
    np.testing.assert_array_equal(apply_tiled(fn, image, (16, 16), halo=4), fn(image))
    with pytest.raises(jax.errors.TracerArrayConversionError):
        apply_tiled(fn, image, (16, 16), halo=4, backend="jax")


def test_a_batched_numpy_fn_gets_short_last_batches():
    image = np.random.default_rng(16).random((3, 100, 77)).astype(np.float32)
    sizes = []

    def fn(batch):
        sizes.append(batch.shape)
        return batch * 2

    out = apply_tiled(fn, image, (32, 32), overlap=4, batch_size=5, batched=True, backend="numpy")
    assert sizes == [(5, 3, 32, 32), (5, 3, 32, 32), (2, 3, 32, 32)]
    np.testing.assert_allclose(out, image * 2, rtol=2 * EPS32)


def test_the_image_is_never_modified():
    image = np.random.default_rng(17).random((40, 30)).astype(np.float32)
    before = image.copy()

    def writes(t):
        t += 1
        return t

    with pytest.raises(ValueError, match="read-only"):
        apply_tiled(writes, image, (16, 16), backend="numpy")
    apply_tiled(lambda t: t.at[0].set(7.0), image, (16, 16), backend="jax")
    np.testing.assert_array_equal(image, before)


# -- progress --------------------------------------------------------------------------


def test_progress_is_reported_per_batch_and_may_stop_the_run():
    image = np.random.default_rng(18).random((100, 77)).astype(np.float32)
    reports = []
    apply_tiled(lambda t: t, image, (32, 32), overlap=4, batch_size=5, progress=lambda *a: reports.append(a))
    assert reports == [(5, 12), (10, 12), (12, 12)]

    calls = []

    def fn(t):
        calls.append(1)
        return t

    def stop(done, total):
        raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt, match="cancelled"):
        apply_tiled(fn, image, (32, 32), overlap=4, batch_size=5, progress=stop, backend="numpy")
    assert len(calls) == 5


# -- labels ----------------------------------------------------------------------------


def label(structure=None):
    return lambda t: ndimage.label(t, structure)[0]


@settings(max_examples=examples(30), deadline=None)
@given(
    shape=st.tuples(st.integers(5, 60), st.integers(5, 60)),
    tile=st.tuples(st.integers(5, 30), st.integers(5, 30)),
    overlap=st.integers(1, 3),
    density=st.floats(0.15, 0.65),
    smooth=st.floats(0.6, 3.0),
    full=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_tiled_labels_are_the_untiled_partition(shape, tile, overlap, density, smooth, full, seed):
    image = blobs(shape, density, smooth, seed)
    fn = label(ndimage.generate_binary_structure(2, 2 if full else 1))
    out = apply_tiled(fn, image, tile, overlap=overlap, labels=True)
    assert same_partition(out, fn(image))
    assert out.dtype == np.int32
    assert set(np.unique(out)) == set(range(int(out.max()) + 1))  # renumbered 1..K


@pytest.mark.parametrize(
    ("shape", "tile"), [((30, 41, 37), (11, 12, 10)), ((9, 60, 8), (4, 13, 8)), ((1, 1, 80), (1, 1, 9))]
)
def test_labels_3d(shape, tile):
    image = blobs(shape, 0.3, 1.5, 0)
    fn = label()
    assert same_partition(apply_tiled(fn, image, tile, overlap=1, labels=True), fn(image))


def test_labels_after_a_filter_in_two_tiled_runs():
    """Smooth with its halo, then label with none: the untiled partition (one run could link through its halo)."""
    image = np.random.default_rng(19).random((27, 22, 25)).astype(np.float32)
    smooth = gaussian(1.0, "reflect", 3)
    structure = ndimage.generate_binary_structure(3, 3)
    fn = label(structure)
    smoothed = apply_tiled(smooth, image, (16, 14, 16), halo=4)
    out = apply_tiled(lambda t: fn(t > 0.55), smoothed, (16, 14, 16), overlap=1, labels=True)
    assert same_partition(out, fn(smooth(image) > 0.55))


def test_labels_per_channel_do_not_link_across_channels():
    image = np.stack([blobs((50, 60), 0.4, 1.5, s) for s in range(3)])
    structure = np.zeros((3, 3, 3), bool)
    structure[1] = ndimage.generate_binary_structure(2, 1)
    fn = label(structure)
    out = apply_tiled(fn, image, (17, 23), overlap=2, labels=True)
    assert same_partition(out, fn(image))


def test_one_huge_object_across_every_tile_is_one_label():
    image = np.ones((64, 64), bool)
    image[::8] = False  # combs: connected through column 0 only... and every tile meets it
    image[:, 0] = True
    out = apply_tiled(label(), image, (10, 10), overlap=1, labels=True)
    assert same_partition(out, ndimage.label(image)[0])
    assert out.max() == 1


# -- dask ------------------------------------------------------------------------------


@pytest.mark.parametrize("chunks", [(2, 40, 30), (1, 97, 83), (2, 17, 64)])
def test_dask_is_lazy_and_equals_in_memory(chunks):
    image = np.random.default_rng(20).random((2, 97, 83)).astype(np.float32)
    lazy = da.from_array(image, chunks=chunks)
    fn = gaussian(1.5, "reflect", 2)
    with TaskCounter() as counter:
        crop = apply_tiled(fn, lazy, (30, 24), halo=6)
        blended = apply_tiled(tile_dependent, lazy, (30, 24), halo=1, overlap=(5, 4))
        doubled = apply_tiled(lambda t: t * 2, lazy, (30, 24), overlap=3, backend="jax")
    assert counter.count == 0
    assert all(isinstance(x, da.Array) for x in (crop, blended, doubled))
    np.testing.assert_array_equal(crop.compute(), fn(image))
    expected = apply_tiled(tile_dependent, image, (30, 24), halo=1, overlap=(5, 4))
    assert blended.dtype == expected.dtype
    np.testing.assert_allclose(blended.compute(), expected, rtol=2 * EPS32, atol=2 * EPS32)  # sums grouped by block
    np.testing.assert_allclose(doubled.compute(), image * 2, rtol=2 * EPS32)


@pytest.mark.parametrize("chunks", [(20, 20), (64, 13), (200, 200)])
def test_dask_labels_are_the_untiled_partition(chunks):
    image = blobs((90, 77), 0.45, 1.8, 1)
    fn = label()
    with TaskCounter() as counter:
        out = apply_tiled(fn, da.from_array(image, chunks=chunks), (16, 12), overlap=2, labels=True)
    assert counter.count == 0
    got = out.compute()
    assert same_partition(got, fn(image))
    assert set(np.unique(got)) == set(range(int(got.max()) + 1))


def test_dask_channel_change_and_pad_mode():
    image = np.random.default_rng(21).random((3, 20, 90)).astype(np.float32)
    lazy = da.from_array(image, chunks=(3, 20, 25))

    def fn(t):
        return np.stack([t.sum(0), t.max(0)])

    out = apply_tiled(fn, lazy, (32, 32), overlap=4, blend="crop", pad_mode="edge")
    assert out.shape == (2, 20, 90)
    np.testing.assert_array_equal(out.compute(), fn(image))


# -- errors ----------------------------------------------------------------------------

IMAGE = np.zeros((40, 30), np.float32)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: apply_tiled("gauss", IMAGE, (8, 8)), TypeError, "fn must be callable"),
        (lambda: apply_tiled(abs, "text", (8, 8)), TypeError, "image must be an array"),
        (lambda: apply_tiled(abs, IMAGE, ()), ValueError, "tile must tile 1 to 3"),
        (lambda: apply_tiled(abs, IMAGE, (8, 8, 8)), ValueError, "fewer axes than tile"),
        (lambda: apply_tiled(abs, IMAGE, (2, 2, 2, 2)), ValueError, "tile must tile 1 to 3"),
        (lambda: apply_tiled(abs, IMAGE, (8, 0)), ValueError, "tile entries must be >= 1"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), halo=5), ValueError, "leaves no stride along tiled axis 0"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), overlap=(2, 10)), ValueError, "leaves no stride along tiled axis 1"),
        (
            lambda: apply_tiled(abs, IMAGE, (10, 10), overlap=1.0),
            ValueError,
            r"fraction of the tile must be in \[0, 1\)",
        ),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), overlap=-1), ValueError, "must be >= 0"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), overlap="a"), ValueError, "overlap must be pixels"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), halo=-1), ValueError, "halo entries must be >= 0"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), blend="max"), ValueError, "blend must be one of"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), backend="torch"), ValueError, "backend must be one of"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), pad_mode="zeros"), ValueError, "pad_mode must be one of"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), batch_size=0), ValueError, "batch_size entries must be >= 1"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), sigma_scale=0), ValueError, "sigma_scale must be > 0"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), labels=1), TypeError, "labels must be True or False"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), progress=3), TypeError, "progress must be callable"),
        (lambda: apply_tiled(label(), IMAGE, (10, 10), labels=True), ValueError, "give overlap >= 1"),
        (lambda: apply_tiled(abs, IMAGE, (10, 10), overlap=1, labels=True), ValueError, "integer labels"),
        (lambda: apply_tiled(lambda t: t - 5, IMAGE.astype(int), (10, 10), overlap=1, labels=True), ValueError, ">= 0"),
        (lambda: apply_tiled(lambda t: t[::2], IMAGE, (10, 10)), ValueError, "must keep the tile's last 2 axes"),
        (lambda: apply_tiled(lambda t: (t, t), IMAGE, (10, 10), backend="numpy"), TypeError, "return one array"),
        (lambda: apply_tiled(lambda t: (t, t), IMAGE, (10, 10), backend="jax"), TypeError, "return one array"),
        (lambda: apply_tiled(lambda t: t + 1j, IMAGE, (10, 10), overlap=2), ValueError, "cannot average"),
        (
            lambda: apply_tiled(abs, da.zeros((40, 30)), (10, 10), progress=print),
            ValueError,
            "progress is for in-memory images",
        ),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_different_output_shapes_for_different_tiles():
    calls = []

    def fn(t):
        calls.append(1)
        return np.stack([t] * len(calls))

    with pytest.raises(ValueError, match="for one tile and"):
        apply_tiled(fn, IMAGE, (10, 10), backend="numpy")


@pytest.mark.slow
def test_distributed_workers_give_the_local_results():
    """Worker processes: the JAX runner is rebuilt on each worker; NumPy fns and labels travel as they are."""
    import dask
    import distributed

    image = np.random.default_rng(22).random((2, 90, 70)).astype(np.float32)
    lazy = da.from_array(image, chunks=(2, 30, 30))
    graphs = {
        "jax": apply_tiled(lambda t: jnp.tanh(t), lazy, (24, 24), overlap=4),
        "numpy": apply_tiled(gaussian(1.0, "reflect", 2), lazy, (24, 24), halo=4),
        "labels": apply_tiled(
            label(), da.from_array(blobs((90, 70), 0.4, 1.5, 3), chunks=30), (20, 20), overlap=1, labels=True
        ),
    }
    with dask.config.set(scheduler="sync"):
        local = dask.compute(graphs)[0]
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        remote = client.compute(graphs, sync=True)
    for name in graphs:
        np.testing.assert_array_equal(np.asarray(remote[name]), np.asarray(local[name]))
