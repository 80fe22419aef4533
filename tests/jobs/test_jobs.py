"""The Qt-free job layer: requests in, layer-data tuples out, no viewer, no Qt, no OpenGL."""

import subprocess
import sys

import numpy as np
import pytest

from napari_gridmip._jobs import correlation as correlation_jobs
from napari_gridmip._jobs.correlation import CorrelationRequest, make_correlation_job
from napari_gridmip._jobs.mipmap import MipmapRequest, default_level, make_mipmap_job
from napari_gridmip._jobs.patches import MergeRequest, make_merge_job
from napari_gridmip._jobs.world import Frame
from napari_gridmip.core import extract_patches, find_displacement, windowed_pearson
from tests.helpers import two_balls


def plain_frame(ndim, scale=None, translate=None):
    return Frame(
        ndim=ndim,
        scale=np.ones(ndim) if scale is None else np.asarray(scale, float),
        translate=np.zeros(ndim) if translate is None else np.asarray(translate, float),
        rotate=np.eye(ndim),
        shear=np.zeros(ndim * (ndim - 1) // 2),
        affine=np.eye(ndim + 1),
    )


class Steps:
    """A progress callback that records (done, total) and can stop the job after ``stop_after`` calls."""

    def __init__(self, stop_after=None):
        self.seen = []
        self.stop_after = stop_after

    def __call__(self, done, total):
        if self.stop_after is not None and len(self.seen) >= self.stop_after:
            raise KeyboardInterrupt("cancelled by the test")
        self.seen.append((done, total))


def test_mipmap_job_shows_blocks_around_the_content():
    volume = two_balls()
    request = MipmapRequest("balls", volume, plain_frame(3, scale=(2, 1, 1)), threshold=0.5)
    steps = Steps()
    result = make_mipmap_job(request).run(steps)
    ((data, meta, kind),) = result.layers
    assert kind == "labels" and meta["name"] == "balls occupancy"
    level = meta["metadata"]["gridmip_level"]
    assert level == 1  # the finest level above the data with at most MAX_BLOCKS cells
    assert data.shape == (32, 32, 32) and data.dtype == np.uint8
    # two clusters of blocks in opposite corners, nothing in between
    assert data[:8, :8, :8].any() and data[-8:, -8:, -8:].any() and not data[8:-8, 8:-8, 8:-8].any()
    np.testing.assert_allclose(meta["scale"], [4, 2, 2])
    np.testing.assert_allclose(meta["translate"], [1, 0.5, 0.5])  # block centres: (2**k - 1) / 2 voxels in
    assert 0 < meta["opacity"] < 1  # translucent, so the data shows through
    # progress moves once per level, in order, and ends complete
    done = [d for d, _ in steps.seen]
    assert done == sorted(done) and len(steps.seen) >= 7 and steps.seen[-1][0] == steps.seen[-1][1]
    np.testing.assert_array_equal(volume, two_balls())  # the input is untouched


def test_default_level_prefers_few_visible_blocks():
    assert default_level([10**6, 10**5, 5000, 600, 80, 10, 1], max_blocks=4096) == 3
    assert default_level([5, 1], max_blocks=4096) == 1
    assert default_level([1]) == 0


def test_mipmap_job_stops_when_progress_raises():
    request = MipmapRequest("v", two_balls(32), plain_frame(3), threshold=0.5)
    with pytest.raises(KeyboardInterrupt):
        make_mipmap_job(request).run(Steps(stop_after=3))


def test_mipmap_job_refuses_other_shapes_before_running():
    with pytest.raises(ValueError, match=r"must be 3D.*\(8, 8\)"):
        make_mipmap_job(MipmapRequest("flat", np.zeros((8, 8)), plain_frame(2), threshold=0))


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_merge_job_keeps_colour(channels):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (channels, 40, 50)).astype(np.uint8)
    patches = np.asarray(extract_patches(image, (16, 16), (12, 12)))
    request = MergeRequest(
        "tiles", patches, image.shape, (12, 12), "mean", plain_frame(5, scale=(1, 1, 1, 0.5, 2)), (2, 3, 4)
    )
    ((data, meta, kind),) = make_merge_job(request).run(Steps()).layers
    if channels == 1:
        assert not meta.get("rgb") and data.shape == image.shape
        np.testing.assert_allclose(meta["scale"], [1, 0.5, 2])
    else:  # a picture: channels last, shown in colour, placed by its pixel axes
        assert meta["rgb"] and data.shape == (40, 50, channels)
        np.testing.assert_allclose(data, np.moveaxis(image, 0, -1), atol=1e-4)
        np.testing.assert_allclose(meta["scale"], [0.5, 2])
        assert meta["contrast_limits"] == (0.0, 255.0)


@pytest.fixture(scope="module")
def stacks():
    rng = np.random.default_rng(3)
    return rng.random((2, 5, 40, 36), dtype=np.float32)


def test_correlation_job_layers_read_together(stacks):
    a, b = stacks
    request = CorrelationRequest("a", "b", a, b, plain_frame(3), (5, 7), spacing=4, full_map=True)
    steps = Steps()
    result = make_correlation_job(request).run(steps)
    names = [meta["name"] for _, meta, _ in result.layers]
    assert names == ["b peak", "b dx", "b dy", "b correlation map", "b displacement"]  # bottom to top
    by_name = {meta["name"]: (data, meta) for data, meta, _ in result.layers}
    assert by_name["b peak"][1]["visible"] is False and by_name["b dx"][1]["visible"] is False
    low, high = by_name["b dy"][1]["contrast_limits"]
    assert low == -high > -np.inf and by_name["b dy"][1]["colormap"] == "coolwarm"
    dy, dx, _ = (np.asarray(r) for r in find_displacement(a, b, (5, 7)))
    np.testing.assert_array_equal(by_name["b dy"][0], dy)
    full = np.moveaxis(np.asarray(windowed_pearson(a, b, (5, 7))), (-2, -1), (0, 1))[:, :, None]
    np.testing.assert_allclose(by_name["b correlation map"][0], full, atol=1e-6)
    assert "median |d|" in result.summary
    assert steps.seen[-1][0] == steps.seen[-1][1] and len(steps.seen) > 4


def test_large_full_map_is_written_in_the_worker(stacks, monkeypatch, tmp_path):
    """A map over the eager limit goes to a Zarr store band by band: napari only reads the file later."""
    a, b = stacks
    monkeypatch.setattr(correlation_jobs, "EAGER_MAP_BYTES", 1000)
    monkeypatch.setattr(correlation_jobs, "MAP_BAND_ROWS", 8)
    request = CorrelationRequest("a", "b", a, b, plain_frame(3), (5, 3), full_map=True, map_dir=str(tmp_path))
    result = make_correlation_job(request).run(Steps())
    lazy = next(data for data, meta, _ in result.layers if meta["name"] == "b correlation map")
    assert type(lazy).__module__.startswith("dask")
    assert (tmp_path / "map.zarr").exists()
    graph_layers = set(lazy.dask.layers)
    # reads, and the views that put the offsets first (no computation is left for napari's thread)
    views = ("from-zarr", "original", "transpose", "getitem")
    assert all(name.startswith(views) for name in graph_layers), graph_layers
    full = np.moveaxis(np.asarray(windowed_pearson(a, b, (5, 3))), (-2, -1), (0, 1))[:, :, None]
    np.testing.assert_allclose(np.asarray(lazy), full, atol=1e-6)


def test_frame_of_the_last_axes():
    frame = plain_frame(4, scale=(5, 1, 2, 3), translate=(9, 1, 2, 3))
    last = frame.last_axes(3)
    assert last.ndim == 3
    np.testing.assert_allclose(last.scale, [1, 2, 3])
    np.testing.assert_allclose(last.translate, [1, 2, 3])
    assert last.affine.shape == (4, 4) and last.shear.shape == (3,)


def test_jobs_run_without_qt():
    code = (
        "import sys, numpy as np\n"
        "from napari_gridmip._jobs.mipmap import MipmapRequest, make_mipmap_job\n"
        "from napari_gridmip._jobs.world import Frame\n"
        "f = Frame(3, np.ones(3), np.zeros(3), np.eye(3), np.zeros(3), np.eye(4))\n"
        "make_mipmap_job(MipmapRequest('v', np.ones((4, 4, 4)), f, 0.5)).run(lambda d, t: None)\n"
        "gui = ('qtpy', 'PyQt5', 'PyQt6', 'PySide2', 'PySide6', 'vispy', 'napari')\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in gui]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazy_mipmap_job_reads_block_by_block():
    import dask.array as da

    volume = two_balls(96)
    lazy = da.from_array(volume, chunks=(32, 48, 96))
    steps = Steps()
    result = make_mipmap_job(MipmapRequest("balls", lazy, plain_frame(3), threshold=0.5)).run(steps)
    levels = result.details["pyramid"].levels(0.5)  # the max pyramid, thresholded on the GUI thread's side
    assert type(levels[0]).__module__.startswith("dask")  # level 0 stays lazy (NumPy-only threshold)
    assert all(isinstance(level, np.ndarray) for level in levels[1:])
    from napari_gridmip import occupancy_mipmap

    expected = occupancy_mipmap(volume, threshold=0.5)
    for level, reference in zip(levels, expected):
        np.testing.assert_array_equal(np.asarray(level), np.asarray(reference))
    assert result.details["counts"] == [int(np.count_nonzero(np.asarray(r))) for r in expected]
    assert len(steps.seen) > 8 and steps.seen[-1][0] == steps.seen[-1][1]  # one step per task
    with pytest.raises(KeyboardInterrupt):  # cancel stops between tasks
        make_mipmap_job(MipmapRequest("balls", lazy, plain_frame(3), threshold=0.5)).run(Steps(stop_after=4))


def test_lazy_merge_and_correlation_jobs(stacks, tmp_path):
    import dask.array as da

    rng = np.random.default_rng(1)
    image = rng.random((3, 70, 60), dtype=np.float32)
    patches = np.asarray(extract_patches(image, (16, 16), (12, 12)))
    request = MergeRequest("t", da.from_array(patches), image.shape, (12, 12), "max", plain_frame(5), (2, 3, 4))
    ((data, meta, _),) = make_merge_job(request).run(Steps()).layers
    np.testing.assert_array_equal(data, np.moveaxis(image, 0, -1))

    a, b = stacks
    lazy_a = da.from_array(a, chunks=(5, 13, 36))
    request = CorrelationRequest("a", "b", lazy_a, b, plain_frame(3), (5, 7), full_map=True, map_dir=str(tmp_path))
    result = make_correlation_job(request).run(Steps())
    by_name = {meta["name"]: data for data, meta, _ in result.layers}
    dy, _, _ = find_displacement(a, b, (5, 7))
    np.testing.assert_allclose(by_name["b dy"], np.asarray(dy), atol=1e-5)
    full = np.moveaxis(np.asarray(windowed_pearson(a, b, (5, 7))), (-2, -1), (0, 1))[:, :, None]
    np.testing.assert_allclose(np.asarray(by_name["b correlation map"]), full, atol=1e-6)


def _repeat_traces(make_job):
    """How many programs JAX traces or compiles when the same job runs a second time."""
    import jax

    events = []

    def listen(event, duration, **_):
        if event in ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/backend_compile_duration"):
            events.append(event)

    make_job().run(Steps())
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        make_job().run(Steps())
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return events


def _repeatable_jobs():
    from napari_gridmip._jobs.stitch import StitchRequest, make_stitch_job
    from napari_gridmip._jobs.tiled import TiledRequest, make_tiled_job
    from napari_gridmip._sample_data.mosaic import make_mosaic

    rng = np.random.default_rng(5)
    a, b = rng.random((2, 4, 32, 30), dtype=np.float32)
    mosaic = make_mosaic(grid_shape=(2, 2), tile_shape=(48, 48), overlap=0.25, stage_error=2, seed=1)
    tiles = np.asarray(mosaic.tiles)
    image = rng.random((70, 66), dtype=np.float32)
    patches = np.asarray(extract_patches(rng.random((40, 44), dtype=np.float32), (16, 16), (12, 12)))
    return {
        "mipmap": lambda: make_mipmap_job(MipmapRequest("v", two_balls(), plain_frame(3), threshold=0.5)),
        "merge": lambda: make_merge_job(MergeRequest("p", patches, (40, 44), (12, 12), "hann", plain_frame(4), (2, 3))),
        "correlation stacks": lambda: make_correlation_job(
            CorrelationRequest("a", "b", a, b, plain_frame(3), (5, 5), spacing=4, subpixel="refine")
        ),
        "correlation subsets": lambda: make_correlation_job(
            CorrelationRequest("a", "b", a[0], b[0], plain_frame(2), (5, 5), subset=(5, 5), step=2, index="[None]")
        ),
        "stitch": lambda: make_stitch_job(StitchRequest("t", tiles, plain_frame(3), (2, 2), 0.25, max_shift=4)),
        "tiled": lambda: make_tiled_job(TiledRequest("i", image, plain_frame(2), "gaussian", (32, 32), {"sigma": 2.0})),
    }


@pytest.mark.parametrize("kind", ["mipmap", "merge", "correlation stacks", "correlation subsets", "stitch", "tiled"])
def test_a_repeated_job_traces_and_compiles_nothing(kind):
    """JAX keeps each compiled program for the session (about 12 MB each for find_displacement on CPU), so a run
    that retraced would grow memory, and time, with every run: the same job again must find all of them cached."""
    assert _repeat_traces(_repeatable_jobs()[kind]) == []


def test_copy_as_python_remakes_layers_of_different_runs(monkeypatch):
    """One script for layers whose provenance differs (two thresholds): each keeps its own call, where a script
    built from the first layer's calls alone gave both the first threshold."""
    import types

    import napari

    from napari_gridmip._jobs.plan import script_from_layers

    volume = two_balls() * np.linspace(0, 1, 64, dtype=np.float32)[:, None, None]  # brighter with depth
    layers = []
    for threshold in (0.05, 0.6):
        result = make_mipmap_job(MipmapRequest("v", volume, plain_frame(3), threshold=threshold)).run(Steps())
        for data, meta, _ in result.layers:
            name = f"{meta['name']} {threshold}"
            layers.append(types.SimpleNamespace(name=name, metadata=meta["metadata"], data=data))
    text = script_from_layers(layers)
    viewer = types.SimpleNamespace(layers={"v": types.SimpleNamespace(data=volume)})
    monkeypatch.setattr(napari, "current_viewer", lambda: viewer)
    namespace = {}
    exec(compile(text, "<copied>", "exec"), namespace)
    assert sorted(namespace["results"]) == sorted(layer.name for layer in layers), text
    for layer in layers:
        np.testing.assert_array_equal(np.asarray(namespace["results"][layer.name]), layer.data, err_msg=text)
    assert not np.array_equal(layers[0].data, layers[1].data)  # the thresholds do differ
