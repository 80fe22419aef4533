"""``napari-gridmip correlate-volumes``: the fields as OME-Zarr channels on the reference's grid, the VTK file beside
them, and bad input as one line with nothing written."""

import numpy as np
import pytest

from napari_gridmip._jobs.volumes import FIELDS
from napari_gridmip._sample_data.dvc import make_dvc_pair, true_displacement
from tests.helpers import assert_one_line_error_and_nothing_written, run_cli

SHAPE = (48, 48, 48)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    reference, deformed, truth = make_dvc_pair(SHAPE)
    np.save(folder / "ref.npy", reference)
    np.save(folder / "def.npy", deformed)
    np.save(folder / "small.npy", reference[:40])
    roi = np.zeros(SHAPE, np.uint8)
    roi[:, :, :30] = 1
    np.save(folder / "roi.npy", roi)
    return folder, truth


def test_fields_as_ome_zarr_and_vtk(inputs, tmp_path):
    import xml.etree.ElementTree as ET

    import zarr

    folder, truth = inputs
    done = run_cli("correlate-volumes", str(folder / "ref.npy"), str(folder / "def.npy"), "dvc.ome.zarr", "--subset",
                   "13", "--step", "8", "--roi", str(folder / "roi.npy"), "--voxel-size", "0.5", "--vtk", "dvc.vti",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "points found; wrote" in done.stderr
    group = zarr.open_group(str(tmp_path / "dvc.ome.zarr"), mode="r")
    fields = group.attrs["napari_gridmip_dvc"]
    channels = dict(zip(fields["channels"], np.asarray(group["s0"])))
    assert list(channels) == list(FIELDS)
    # the grid in the reference's voxels, and its place in micrometres: step x voxel size, the first point
    z, y, x = (np.asarray(fields[a]) for a in "zyx")
    np.testing.assert_array_equal(z, np.arange(6, 42, 8))
    ngff = group.attrs.get("ome", group.attrs)  # NGFF 0.5 nests the metadata under "ome", 0.4 does not
    transforms = ngff["multiscales"][0]["datasets"][0]["coordinateTransformations"]
    assert transforms[0]["scale"] == [1.0, 4.0, 4.0, 4.0]
    assert transforms[1]["translation"] == [0.0, 3.0, 3.0, 3.0]
    # the ROI's points are found and right; the others are outside it
    status = channels["status"]
    inside = x[None, None, :] + 6 < 30 - 6  # the subset within the ROI, less the prefilter's band
    expected = true_displacement(truth, z, y, x)
    found = status == 0
    assert found[..., inside[0, 0]].all() and not found[..., x > 30].any()
    assert np.nanmax(np.abs(channels["dz"][found] - expected[0][found])) < 0.05
    assert np.isnan(channels["dz"][~found]).all()
    record = group.attrs["napari_gridmip"]
    assert "gm.correlate_volumes(reference, deformed, subset=13, step=8, shape='affine', roi=roi)" in record["python"]
    # the VTK file: the same grid, in micrometres and VTK's (x, y, z) order, every field and the displacement
    root = ET.fromstring((tmp_path / "dvc.vti").read_bytes().split(b"<AppendedData")[0] + b"</VTKFile>")
    image = root.find("ImageData")
    assert image.get("WholeExtent").split() == ["0", "4", "0", "4", "0", "4"]
    assert [float(v) for v in image.get("Origin").split()] == [3.0, 3.0, 3.0]
    assert [float(v) for v in image.get("Spacing").split()] == [4.0, 4.0, 4.0]
    names = [array.get("Name") for array in image.iter("DataArray")]
    assert names == [*FIELDS, "displacement"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dvc.ome.zarr", "dvc.vti"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["small.npy"], "of one shape"),
        (["def.npy", "--subset", "12"], "must be odd"),
        (["def.npy", "--vtk", "dvc.vtk"], "ends in .vti"),
        (["def.npy", "--roi", "small.npy"], "roi must be a mask"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(inputs, tmp_path, args, message):
    folder, _ = inputs
    paths = [str(folder / "ref.npy"), *(str(folder / a) if a.endswith(".npy") else a for a in args[:1]), "dvc.ome.zarr"]
    rest = [str(folder / a) if a.endswith(".npy") else a for a in args[1:]]
    done = run_cli("correlate-volumes", *paths, *rest, cwd=tmp_path)
    assert_one_line_error_and_nothing_written(done, message, tmp_path)


@pytest.mark.slow  # the client waits out its 10 s timeout
def test_an_unreachable_scheduler_is_one_line_and_writes_nothing(inputs, tmp_path):
    pytest.importorskip("distributed")
    folder, _ = inputs
    done = run_cli("correlate-volumes", str(folder / "ref.npy"), str(folder / "def.npy"), "dvc.ome.zarr",
                   "--scheduler", "tcp://127.0.0.1:1", cwd=tmp_path)  # fmt: skip
    assert_one_line_error_and_nothing_written(done, "cannot reach the scheduler at 'tcp://127.0.0.1:1'", tmp_path)


@pytest.mark.slow
def test_a_scheduler_runs_the_slabs_on_its_cluster(inputs, tmp_path):
    """The volumes read lazily and run in slabs on the cluster's workers (other processes): the fields of the run in
    this process, the provenance's call the same."""
    import zarr

    distributed = pytest.importorskip("distributed")
    folder, _ = inputs
    args = [str(folder / "ref.npy"), str(folder / "def.npy")]
    options = ["--subset", "13", "--step", "8", "--quiet"]
    done = run_cli("correlate-volumes", *args, "here.ome.zarr", *options, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        done = run_cli("correlate-volumes", *args, "far.ome.zarr", *options, "--scheduler", cluster.scheduler_address,
                       cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    here, far = (zarr.open_group(str(tmp_path / name), mode="r") for name in ("here.ome.zarr", "far.ome.zarr"))
    # lazy volumes take the whole translation from a copy binned by 2 (the in-memory run's): the same fields
    np.testing.assert_allclose(np.asarray(far["s0"]), np.asarray(here["s0"]), atol=1e-5, equal_nan=True)
    assert far.attrs["napari_gridmip"]["python"] == here.attrs["napari_gridmip"]["python"]
