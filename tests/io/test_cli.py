"""The batch command line: progress, one-line errors, non-zero exits, no partial output."""

import subprocess
import sys

import numpy as np
import pytest

from napari_gridmip import find_displacement, merge_patches, occupancy_mipmap, read_array


def run(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "napari_gridmip", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    import tifffile

    from napari_gridmip._sample_data import make_image_tiles, make_speckle_pair

    folder = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    np.save(folder / "vol.npy", (rng.random((30, 40, 50)) > 0.99).astype(np.uint8) * 200)
    patches, _ = make_image_tiles()
    np.save(folder / "tiles.npy", patches)
    a, b, _ = make_speckle_pair(shape=(64, 64))
    tifffile.imwrite(folder / "a.tif", a)
    tifffile.imwrite(folder / "b.tif", b)
    np.save(folder / "huge.npy", np.full((4, 12, 12), 2**40, np.int64) + np.arange(4)[:, None, None])
    from napari_gridmip._sample_data.dic import make_dic_pair

    reference, deformed, _ = make_dic_pair((72, 80), seed=1)
    tifffile.imwrite(folder / "dic_ref.tif", reference)
    tifffile.imwrite(folder / "dic_def.tif", deformed)
    return folder


def test_mipmap(inputs, tmp_path):
    done = run("mipmap", str(inputs / "vol.npy"), "out.ome.zarr", "--threshold", "100", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "100% Completed" in done.stderr  # the progress bar
    levels = occupancy_mipmap(np.load(inputs / "vol.npy"), threshold=100)
    np.testing.assert_array_equal(read_array(tmp_path / "out.ome.zarr").compute(), np.asarray(levels[0]))


def test_merge_and_correlate(inputs, tmp_path):
    shape = ["--image-shape", "3", "512", "512"]
    done = run(
        "merge", str(inputs / "tiles.npy"), "m.npy", "--stride", "100", "100", *shape, "--blend", "max", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    expected = np.asarray(merge_patches(np.load(inputs / "tiles.npy"), (3, 512, 512), (100, 100), blend="max"))
    np.testing.assert_array_equal(np.load(tmp_path / "m.npy"), expected)

    done = run("correlate", str(inputs / "a.tif"), str(inputs / "b.tif"), "f.zarr", "--window", "9", "9", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    import tifffile
    import zarr

    field = zarr.open_group(str(tmp_path / "f.zarr"), mode="r")
    dy, _, peak = find_displacement(tifffile.imread(inputs / "a.tif"), tifffile.imread(inputs / "b.tif"), (9, 9))
    np.testing.assert_allclose(field["dy"][:], np.asarray(dy), atol=1e-5)
    np.testing.assert_allclose(field["peak"][:], np.asarray(peak), atol=1e-6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["mipmap", "missing.npy", "o.zarr"], "does not exist"),
        (["mipmap"], "the following arguments are required"),
        (["merge", "{inputs}/tiles.npy", "o.npy", "--stride", "100", "100", "--blend", "nope"], "blend must be one of"),
        (["merge", "{inputs}/tiles.npy", "o.txt", "--stride", "100", "100"], "must end in .npy, .tif, .tiff or .zarr"),
        (["correlate", "{inputs}/a.tif", "{inputs}/b.tif", "o.zarr", "--window", "8", "9"], "odd"),
        (
            ["correlate", "{inputs}/a.tif", "{inputs}/b.tif", "o.zarr", "--window", "9", "9", "--subset", "4", "5"],
            "subset sizes must be odd",
        ),
        (
            ["correlate", "{inputs}/a.tif", "{inputs}/b.tif", "o.zarr", "--window", "9", "9", "--outputs", "nope"],
            "unknown output 'nope'",
        ),
        (
            ["correlate", "{inputs}/a.tif", "{inputs}/b.tif", "o.zarr", "--window", "9", "9", "--step", "0"],
            "step must be a positive integer",
        ),
        # found only while computing, half-way: still one line, and no partial output
        (["correlate", "{inputs}/huge.npy", "{inputs}/huge.npy", "o.zarr", "--window", "3", "3"], "dtype=np.float64"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(inputs, tmp_path, args, message):
    done = run(*(a.format(inputs=inputs) for a in args), cwd=tmp_path)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_kept(inputs, tmp_path):
    (tmp_path / "o.ome.zarr").mkdir()
    done = run("mipmap", str(inputs / "vol.npy"), "o.ome.zarr", cwd=tmp_path)
    assert done.returncode == 2 and "already exists" in done.stderr
    done = run("mipmap", str(inputs / "vol.npy"), "o.ome.zarr", "--overwrite", "--quiet", cwd=tmp_path)
    assert done.returncode == 0 and read_array(tmp_path / "o.ome.zarr").shape == (30, 40, 50)


@pytest.mark.parametrize("command", ["mipmap", "merge", "correlate"])
def test_help_has_an_example(command, tmp_path):
    done = run(command, "--help", cwd=tmp_path)
    assert done.returncode == 0 and "example:" in done.stdout and f"napari-gridmip {command} " in done.stdout


def test_scheduler_address_runs_on_a_cluster(inputs, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        done = run("mipmap", str(inputs / "vol.npy"), "c.ome.zarr", "--scheduler", cluster.scheduler_address,
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    levels = occupancy_mipmap(np.load(inputs / "vol.npy"))
    np.testing.assert_array_equal(read_array(tmp_path / "c.ome.zarr").compute(), np.asarray(levels[0]))
    done = run("mipmap", str(inputs / "vol.npy"), "d.ome.zarr", "--scheduler", "tcp://127.0.0.1:1", cwd=tmp_path)
    assert done.returncode == 2 and "cannot reach the scheduler" in done.stderr


def test_merge_infers_the_image_shape(tmp_path):
    from napari_gridmip import extract_patches

    image = np.random.default_rng(1).random((2, 60, 44), dtype=np.float32)
    np.save(tmp_path / "p.npy", np.asarray(extract_patches(image, (20, 11), (20, 11))))
    done = run("merge", "p.npy", "m.npy", "--stride", "20", "11", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "m.npy"), image)


def test_correlate_subset_step_and_tracking_outputs(inputs, tmp_path):
    """A DIC pair of two 2D images (K = 1), subset and step; then the tracking outputs of a speckle pair."""
    import tifffile
    import zarr

    from napari_gridmip import track_speckles

    args = ["--window", "7", "7", "--subset", "15", "15", "--step", "4", "--subpixel", "refine", "--quiet"]
    done = run("correlate", str(inputs / "dic_def.tif"), str(inputs / "dic_ref.tif"), "d.zarr", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    field = zarr.open_group(str(tmp_path / "d.zarr"), mode="r")
    deformed, reference = tifffile.imread(inputs / "dic_def.tif"), tifffile.imread(inputs / "dic_ref.tif")
    expected = find_displacement(deformed[None], reference[None], (7, 7), subset=(15, 15), step=4, subpixel="refine")
    assert field["dy"].shape == expected.dy.shape == (13, 15)
    np.testing.assert_allclose(field["dy"][:], np.asarray(expected.dy), atol=1e-4)

    outputs = ["--outputs", "transmission,dark-field,uncertainty"]
    done = run("correlate", str(inputs / "a.tif"), str(inputs / "b.tif"), "t.zarr", "--window", "9", "9",
               "--subset", "3", "3", *outputs, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "100% Completed" in done.stderr
    tracked = zarr.open_group(str(tmp_path / "t.zarr"), mode="r")
    assert sorted(tracked.array_keys()) == sorted(
        ["dy", "dx", "peak", "transmission", "dark_field", "sigma_dy", "sigma_dx"]
    )
    expected = track_speckles(tifffile.imread(inputs / "a.tif"), tifffile.imread(inputs / "b.tif"), (9, 9),
                              subset=(3, 3), subpixel="hessian")  # fmt: skip
    np.testing.assert_allclose(tracked["transmission"][:], np.asarray(expected.transmission), atol=1e-4)
    np.testing.assert_allclose(tracked["dy"][:], np.asarray(expected.dy), atol=1e-4)


def test_correlate_outputs_this_version_lacks(inputs, tmp_path):
    import napari_gridmip

    if "integrate_gradient" in napari_gridmip.__all__:
        pytest.skip("integrate_gradient exists: --outputs phase is wired")
    done = run("correlate", str(inputs / "a.tif"), str(inputs / "b.tif"), "o.zarr", "--window", "9", "9",
               "--outputs", "phase", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "needs napari_gridmip.integrate_gradient" in done.stderr
    assert list(tmp_path.iterdir()) == []
