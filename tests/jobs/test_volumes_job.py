"""The digital volume correlation job without Qt: its plan, its layers' placement, the script it prints, and the
command line's arrays."""

import json
import subprocess
import sys

import numpy as np
import pytest

from napari_gridmip._jobs.plan import KEY
from napari_gridmip._jobs.volumes import FIELDS, VolumeRequest, make_volume_job, volume_plan
from napari_gridmip._jobs.world import Frame
from napari_gridmip._sample_data.dvc import make_dvc_pair, true_displacement

SHAPE, SUBSET, STEP = (48, 48, 48), 13, 8


@pytest.fixture(scope="module")
def pair():
    return make_dvc_pair(SHAPE)


def request_of(reference, deformed, **options):
    frame = Frame(3, np.array([2.0, 1.5, 1.0]), np.array([10.0, -4.0, 3.0]), np.eye(3), np.zeros(3), np.eye(4))
    options = {"subset": SUBSET, "step": STEP, **options}
    return VolumeRequest("ref", reference, frame, deformed_name="def", deformed_data=deformed, **options)


@pytest.fixture(scope="module")
def ran(pair):
    reference, deformed, _ = pair
    request = request_of(reference, deformed)
    steps = []
    result = make_volume_job(request).run(lambda done, total: steps.append((done, total)))
    return request, result, steps


def layers_by_role(result):
    return {meta["metadata"][KEY]["role"]: (data, meta, kind) for data, meta, kind in result.layers}


def test_the_job_finds_the_known_field_and_places_its_layers(pair, ran):
    reference, deformed, truth = pair
    request, result, steps = ran
    layers = layers_by_role(result)
    dz = layers["dz"][0]
    half = SUBSET // 2
    axes = [np.arange(half, n - half, STEP, dtype=float) for n in SHAPE]
    expected = true_displacement(truth, *axes)
    for k, role in enumerate(("dz", "dy", "dx")):
        assert np.nanmax(np.abs(layers[role][0] - expected[k])) < 0.05
    assert dz.shape == tuple(len(a) for a in axes)
    # every grid layer on the reference's voxels: element (p, r, c) at voxel (h + s p, h + s r, h + s c)
    for role in FIELDS:
        if role.startswith("sigma"):
            continue
        data, meta, kind = layers[role]
        assert kind == ("labels" if role == "status" else "image")
        np.testing.assert_allclose(meta["scale"], STEP * request.frame.scale)
        np.testing.assert_allclose(meta["translate"], request.frame.translate + half * request.frame.scale)
    # the arrows: napari's (N, 2, 3), positions in the reference's voxels, the found points' displacements
    vectors, meta, kind = layers["vectors"]
    assert kind == "vectors" and vectors.shape == (dz.size, 2, 3)
    first = [layers[role][0][0, 0, 0] for role in ("dz", "dy", "dx")]
    np.testing.assert_allclose(vectors[0], [[half, half, half], first], rtol=1e-6)
    np.testing.assert_allclose(meta["scale"], request.frame.scale)
    assert "100% found" in result.summary
    assert result.details["sigma"].shape == (*dz.shape, 3)
    # short names (napari's layer list elides a long name's middle): the tensor's, then the component
    names = {role: meta["name"] for role, (_, meta, _) in layers.items()}
    assert names["e_yx"] == "ref strain yx" and names["volumetric"] == "ref volumetric strain"
    assert steps[-1][0] == steps[-1][1] and len(steps) >= 4  # a step before and after each call


def test_the_printed_script_reproduces_the_layers(pair, ran, monkeypatch):
    """The plan's "Copy as Python" script, run against a viewer holding the input layers, gives every layer's array."""
    import types

    import napari

    reference, deformed, _ = pair
    request, result, _ = ran
    layers = {"ref": types.SimpleNamespace(data=reference), "def": types.SimpleNamespace(data=deformed)}
    monkeypatch.setattr(napari, "current_viewer", lambda: types.SimpleNamespace(layers=layers))
    namespace = {}
    exec(volume_plan(request).script(), namespace)  # noqa: S102 - the plan's own script
    for role, (data, _, _) in layers_by_role(result).items():
        # the layers hold float32 (the strains are computed in float64)
        np.testing.assert_array_equal(np.asarray(namespace["results"][role]).astype(data.dtype), data, err_msg=role)


def test_the_command_line_writes_the_jobs_arrays_and_the_job_needs_no_qt(pair, tmp_path):
    """The job in a new process (no Qt, napari or magicgui loaded) and ``correlate-volumes`` on the same volumes:
    the OME-Zarr channels are the job's arrays, array for array."""
    import zarr

    reference, deformed, _ = pair
    np.save(tmp_path / "ref.npy", reference)
    np.save(tmp_path / "def.npy", deformed)
    code = f"""
import sys
import numpy as np
from napari_gridmip._jobs.plan import KEY
from napari_gridmip._jobs.volumes import VolumeRequest, make_volume_job
from napari_gridmip._jobs.world import Frame
reference, deformed = np.load("ref.npy"), np.load("def.npy")
request = VolumeRequest("ref", reference, Frame.unit(3), deformed_name="def", deformed_data=deformed,
                        subset={SUBSET}, step={STEP})
result = make_volume_job(request).run(lambda done, total: None)
np.savez("job.npz", **{{meta["metadata"][KEY]["role"]: data for data, meta, _ in result.layers}})
gui = [m for m in sys.modules if m.split(".")[0] in ("qtpy", "PyQt5", "PyQt6", "PySide6", "napari", "magicgui")]
assert not gui, gui
"""
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=300)
    from napari_gridmip.cli import main

    paths = [str(tmp_path / name) for name in ("ref.npy", "def.npy", "out.ome.zarr")]
    main(["correlate-volumes", *paths, "--subset", str(SUBSET), "--step", str(STEP), "--quiet"])
    job = np.load(tmp_path / "job.npz")
    group = zarr.open_group(str(tmp_path / "out.ome.zarr"), mode="r")
    channels = np.asarray(group["s0"])
    names = group.attrs["napari_gridmip_dvc"]["channels"]
    assert names == list(FIELDS)
    for name, channel in zip(names, channels):
        if name in job:
            np.testing.assert_array_equal(channel, job[name].astype(np.float32), err_msg=name)
    record = group.attrs[KEY]
    functions = [call["function"] for call in record["calls"]]
    assert functions == ["napari_gridmip.correlate_volumes", "napari_gridmip.volume_strain"]
    assert json.dumps(record)  # plain JSON


def test_a_series_is_the_time_lapse_call(pair, ran, monkeypatch):
    """A 4D layer: correlate_volume_series with the request's reference policy, then the subsets' strain of every time
    point; the layers are (T, P, R, C), time point t on element t (0: the reference, no motion), the arrows
    (N, 2, 4) with their time first, and the script remakes them."""
    import types

    import napari

    reference, deformed, truth = pair
    series = np.stack([reference, deformed, deformed])
    request = VolumeRequest("s", series, Frame.unit(4), subset=SUBSET, step=STEP, reference="incremental")
    plan = volume_plan(request)
    assert [c.function for c in plan.calls] == ["correlate_volume_series", "volume_strain"]
    assert plan.calls[0].kwargs["reference"] == "incremental"
    result = make_volume_job(request).run(lambda done, total: None)
    layers = layers_by_role(result)
    assert not any(role.startswith("sigma") for role in layers) and result.details["sigma"] is None
    dz, meta, _ = layers["dz"]
    np.testing.assert_allclose(meta["translate"], [0, SUBSET // 2, SUBSET // 2, SUBSET // 2])
    np.testing.assert_allclose(meta["scale"], [1, STEP, STEP, STEP])
    assert np.all(dz[0] == 0)  # the reference against itself
    half = SUBSET // 2
    true_dz = true_displacement(truth, *(np.arange(half, n - half, STEP, dtype=float) for n in SHAPE))[0]
    assert np.nanmax(np.abs(dz[1] - true_dz)) < 0.05
    assert np.nanmax(np.abs(dz[2] - dz[1])) < 0.02  # the same volume twice: no more motion
    assert layers["e_zz"][0].shape == dz.shape and np.all(layers["e_zz"][0][0] == 0)
    vectors = layers["vectors"][0]
    assert vectors.shape[1:] == (2, 4) and set(np.unique(vectors[:, 0, 0])) == {0.0, 1.0, 2.0}
    assert np.all(vectors[:, 1, 0] == 0)
    # the arrows' length from the time points that moved: as long as the pair's (time point 0 is all zeros)
    pair_length = layers_by_role(ran[1])["vectors"][1]["length"]
    assert layers["vectors"][1]["length"] == pytest.approx(pair_length, rel=0.05)
    assert result.summary.startswith("3 time points; the last: 125 points, 100% found")
    # Copy as Python: the direct calls give every layer again
    viewer = types.SimpleNamespace(layers={"s": types.SimpleNamespace(data=series)})
    monkeypatch.setattr(napari, "current_viewer", lambda: viewer)
    namespace = {}
    exec(plan.script(), namespace)  # noqa: S102 - the plan's own script
    for role, (data, _, _) in layers.items():
        np.testing.assert_array_equal(np.asarray(namespace["results"][role]).astype(data.dtype), data, err_msg=role)


def test_a_series_refuses_an_unknown_policy_and_takes_the_smoothed_strain(pair):
    reference, deformed, _ = pair
    series = np.stack([reference, deformed])
    with pytest.raises(ValueError, match="a series' reference must be one of"):
        make_volume_job(VolumeRequest("s", series, Frame.unit(4), subset=SUBSET, reference="first"))
    smoothed = VolumeRequest("s", series, Frame.unit(4), subset=SUBSET, strain_method="smoothed", smoothing=1.5)
    calls = volume_plan(smoothed).calls
    assert calls[1].function == "volume_strain" and calls[1].kwargs == {"method": "smoothed", "smoothing": 1.5}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subset": 12}, "odd"),
        ({"subset": 49}, "larger than"),
        ({"shape": "translation"}, "needs affine subsets"),
        ({"strain_kind": "engineering"}, "strain method"),
    ],
)
def test_bad_requests_are_refused_before_any_work(pair, options, message):
    reference, deformed, _ = pair
    with pytest.raises(ValueError, match=message):
        make_volume_job(request_of(reference, deformed, **options))


def test_volumes_of_two_shapes_are_refused(pair):
    reference, _, _ = pair
    with pytest.raises(ValueError, match="one shape"):
        make_volume_job(request_of(reference, reference[:-1]))


def test_the_correlations_progress_moves_the_bar_and_a_cancel_stops_the_job(pair, ran):
    reference, deformed, _ = pair
    request, _, steps = ran
    done, total = np.array(steps).T
    assert np.all(np.diff(done) >= 0) and done[-1] == total[-1]
    # correlate_volumes is the plan's first call and holds 20 of its steps: its own reports land within them
    within = {d for d in done if 0 < d < 20}
    assert len(within) > 3

    class Stop(Exception):
        pass

    def cancel(done, total):
        if 0 < done < 20:  # Cancel pressed while the volumes correlate
            raise Stop

    with pytest.raises(Stop):
        make_volume_job(request).run(cancel)
