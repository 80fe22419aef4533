"""The DIC series' one plan: the widget's job is a direct correlate_series and strain_field, reports a step per
frame and stops between frames; the command line runs the same plan, and the scripts both record reproduce it."""

import csv

import numpy as np
import pytest

import napari_gridmip as gm
from napari_gridmip._jobs.correlation import SERIES_OUTPUTS, SeriesRequest, make_series_job, series_plan
from napari_gridmip._jobs.plan import KEY, Source
from napari_gridmip._sample_data.dic_series import make_dic_series, true_displacement
from napari_gridmip.cli import main as cli
from tests.jobs.test_jobs import Steps, plain_frame
from tests.jobs.test_plans import by_role, replay_file, replay_layers

FRAMES, SHAPE = 4, (128, 128)


@pytest.fixture(scope="module")
def rotation():
    frames, truth = make_dic_series("rotation", frames=FRAMES, shape=SHAPE)
    return frames, truth["roi"].astype(np.uint8), truth["maps"]


@pytest.fixture(scope="module")
def direct(rotation):
    frames, roi, _ = rotation
    series = gm.correlate_series(frames, subset=31, step=8, roi=roi)
    gradients = (series.dy_y, series.dy_x, series.dx_y, series.dx_x)
    strain = gm.strain_field(series.dy, series.dx, kind="green-lagrange", gradients=gradients)
    return {**{name: getattr(series, name) for name in SERIES_OUTPUTS[:6]},
            **{name: np.asarray(getattr(strain, name)) for name in ("exx", "eyy", "exy")}}  # fmt: skip


def request_of(frames, roi, **options):
    return SeriesRequest("frames", frames, plain_frame(3, translate=(0, 2, 3)), subset=(31, 31), step=8,
                         roi=Source("roi", layer="roi"), roi_data=roi, spacing=16, **options)  # fmt: skip


def test_the_job_is_the_direct_call_with_a_step_per_frame(rotation, direct, monkeypatch):
    frames, roi, maps = rotation
    steps = Steps()
    result = make_series_job(request_of(frames, roi)).run(steps)
    layers = by_role(result)
    assert sorted(layers) == sorted(["dy", "dx", "status", "exx", "eyy", "exy", "vectors"])
    for name in ("dy", "dx", "status", "exx", "eyy", "exy"):
        assert layers[name].shape == (FRAMES, 13, 13), name
        np.testing.assert_array_equal(layers[name], direct[name], err_msg=name)
    # one progress step per frame (the reference's first), one for the strain
    done = [d for d, total in steps.seen if total == FRAMES + 1]
    assert len(done) == len(steps.seen) and done == sorted(done) and {1, 2, 3, 4, 5} <= set(done)
    assert "4 frames, 127 points in the ROI: 100% found" in result.summary
    # on the frames' pixels, with the time axis: grid point (i, j) of frame t is the frames' pixel (8 i + 15, ...)
    for _, meta, _ in result.layers:
        np.testing.assert_array_equal(meta["scale"], (1, 8, 8))
        np.testing.assert_array_equal(meta["translate"], (0, 2 + 15, 3 + 15))
    kinds = {meta["metadata"][KEY]["role"]: kind for _, meta, kind in result.layers}
    assert kinds["status"] == "labels" and kinds["vectors"] == "vectors" and kinds["dy"] == "image"
    # the arrows: (n, 2, 3), t first, on every 2nd grid point (16 px), the true displacement at length 1 / step
    vectors = layers["vectors"]
    assert vectors.ndim == 3 and vectors.shape[1:] == (2, 3)
    assert set(vectors[:, 0, 0]) == set(range(FRAMES)) and np.all(vectors[:, 1, 0] == 0)
    t, i, j = (vectors[:, 0, k].astype(int) for k in range(3))
    assert np.all(i % 2 == 0) and np.all(j % 2 == 0)
    np.testing.assert_array_equal(vectors[:, 1, 1], direct["dy"][t, i, j])
    meta = next(meta for _, meta, kind in result.layers if kind == "vectors")
    assert meta["length"] == pytest.approx(1 / 8)  # a rotation: the arrows' heads on the points in the frame
    true_dy, _ = true_displacement(maps, 15 + 8 * np.arange(13.0), 15 + 8 * np.arange(13.0))
    assert np.nanmax(np.abs(layers["dy"] - true_dy)) < 0.1
    # Copy as Python, with the layers' data: every array again
    replayed = replay_layers(result, {"frames": frames, "roi": roi}, monkeypatch)
    for name, array in layers.items():
        np.testing.assert_array_equal(np.asarray(replayed[name]), array, err_msg=name)


def test_a_reference_image_before_the_frames(rotation, direct, monkeypatch):
    frames, roi, _ = rotation
    request = request_of(frames[1:], roi, reference_name="reference", reference_data=frames[0])
    assert request.count == FRAMES
    result = make_series_job(request).run(Steps())
    layers = by_role(result)
    for name in ("dy", "dx", "status", "exx"):
        np.testing.assert_array_equal(layers[name], direct[name], err_msg=name)
    script = series_plan(request).script()
    assert "frames = np.concatenate([reference[None], stack])" in script
    replayed = replay_layers(result, {"reference": frames[0], "frames": frames[1:], "roi": roi}, monkeypatch)
    np.testing.assert_array_equal(np.asarray(replayed["dy"]), direct["dy"])


def test_the_shape_and_thresholds_are_the_calls(rotation, monkeypatch):
    """The rigid warp, max_sigma and refresh_zncc reach correlate_series as the request gives them, and the script
    says them (the defaults too: it reproduces the run whatever a later version's defaults)."""
    from napari_gridmip._jobs.correlation import SERIES_MAX_SIGMA, SERIES_REFRESH_ZNCC, SERIES_SHAPES
    from napari_gridmip.core.correlation import series as core

    # the request's defaults are the function's (the job module imports no JAX, so it keeps its own copies)
    assert SERIES_SHAPES == core.SHAPES and SERIES_MAX_SIGMA == core.MAX_SIGMA
    assert SERIES_REFRESH_ZNCC == core.correlate_series.__kwdefaults__["refresh_zncc"]
    default = series_plan(request_of(*rotation[:2])).script()
    assert "shape='affine'" in default and "max_sigma=0.1" in default and "refresh_zncc=0.95" in default
    frames, roi, _ = rotation
    options = {"reference": "auto", "shape": "rigid", "max_sigma": 0.05, "refresh_zncc": 0.9}
    request = request_of(frames, roi, **options)
    script = series_plan(request).script()
    assert "reference='auto', shape='rigid', max_sigma=0.05, refresh_zncc=0.9" in script
    result = make_series_job(request).run(Steps())
    layers = by_role(result)
    expected = gm.correlate_series(frames, subset=31, step=8, roi=roi, **options)
    for name in ("dy", "dx", "status"):
        np.testing.assert_array_equal(layers[name], getattr(expected, name), err_msg=name)
    # a rotation's gradients: no strain (Green-Lagrange), to rounding
    assert np.nanmax(np.abs(layers["exx"])) < 1e-5
    replayed = replay_layers(result, {"frames": frames, "roi": roi}, monkeypatch)
    np.testing.assert_array_equal(np.asarray(replayed["dy"]), layers["dy"])


def test_cancel_stops_between_frames(rotation):
    frames, roi, _ = rotation
    steps = Steps(stop_after=2)  # the reference frame's report, then one frame: the second frame's report raises
    with pytest.raises(KeyboardInterrupt):
        make_series_job(request_of(frames, roi)).run(steps)
    assert max(done for done, _ in steps.seen) <= 2


def read_csv(path):
    with open(path) as f:
        rows = [line for line in f if not line.startswith("#")]
    header, *body = list(csv.reader(rows))
    return {name: [row[k] for row in body] for k, name in enumerate(header)}


def as_float(values):
    return np.array([float(v) if v else np.nan for v in values])


def test_the_command_line_runs_the_same_plan(rotation, direct, tmp_path):
    frames, roi, _ = rotation
    np.save(tmp_path / "frames.npy", frames)
    np.save(tmp_path / "roi.npy", roi)
    out = tmp_path / "dic"
    cli(["correlate-series", str(tmp_path / "frames.npy"), "--roi", str(tmp_path / "roi.npy"), "--subset", "31",
         "--step", "8", "--out", str(out), "--quiet"])  # fmt: skip
    files = sorted(out.iterdir())
    assert [f.name for f in files] == [f"DICe_solution_{t:04d}.txt" for t in range(FRAMES)]
    for t, path in enumerate(files):
        table = read_csv(path)
        np.testing.assert_allclose(as_float(table["DISPLACEMENT_Y"]), direct["dy"][t].ravel(), atol=1e-6)
        np.testing.assert_allclose(as_float(table["DISPLACEMENT_X"]), direct["dx"][t].ravel(), atol=1e-6)
        np.testing.assert_allclose(as_float(table["STRAIN_XX"]), direct["exx"][t].ravel(), atol=1e-6)
        flags = np.array(table["STATUS_FLAG"], int)
        np.testing.assert_array_equal(flags, direct["status"][t].ravel())
    # the provenance in each header: the calls, the input paths and a script that reproduces the arrays
    import json

    line = next(line for line in open(files[0]) if line.startswith(f"# {KEY}: "))
    record = json.loads(line.removeprefix(f"# {KEY}: "))
    functions = [call["function"].removeprefix("napari_gridmip.") for call in record["calls"]]
    assert functions == ["correlate_series", "strain_field"]
    replayed = replay_file(record)
    for name in ("dy", "status", "exy"):
        np.testing.assert_array_equal(np.asarray(replayed[name]), direct[name], err_msg=name)
