"""The batch command line: progress, one-line errors, non-zero exits, no partial output."""

import subprocess
import sys

import numpy as np
import pytest

from napari_gridmip import (
    find_displacement,
    local_correlation_image,
    merge_patches,
    occupancy_mipmap,
    occupied_bbox,
    read_array,
    unpack_occupancy,
)
from tests.helpers import assert_one_line_error_and_nothing_written


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
    np.save(folder / "series.npy", (rng.random((2, 13, 9, 20)) > 0.995).astype(np.float32))
    from napari_gridmip._sample_data.calcium import make_calcium_movie

    tifffile.imwrite(folder / "movie.tif", make_calcium_movie(frames=60, shape=(40, 48), cells=6).movie)
    np.save(folder / "image.npy", np.zeros((40, 48), np.float32))
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
        (["mipmap", "{inputs}/vol.npy", "o.zarr", "--packed", "--packed-order", "hilbert"], "invalid choice"),
        (["merge", "{inputs}/tiles.npy", "o.npy", "--stride", "100", "100", "--blend", "nope"], "blend must be one of"),
        (["merge", "{inputs}/tiles.npy", "o.txt", "--stride", "100", "100"], "must end in .npy, .tif, .tiff or .zarr"),
        (["correlate", "{inputs}/a.tif", "{inputs}/b.tif", "o.zarr", "--window", "8", "9"], "odd"),
        (["corrimage", "{inputs}/image.npy", "o.npy"], "movie must have at least 3 axes"),
        (["corrimage", "{inputs}/movie.tif", "o.npy", "--neighbours", "6"], "invalid choice"),
        (["corrimage", "{inputs}/movie.tif", "o.png"], "must end in .npy, .tif, .tiff or .zarr"),
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
    assert_one_line_error_and_nothing_written(done, message, tmp_path)


def test_existing_output_is_kept(inputs, tmp_path):
    (tmp_path / "o.ome.zarr").mkdir()
    done = run("mipmap", str(inputs / "vol.npy"), "o.ome.zarr", cwd=tmp_path)
    assert done.returncode == 2 and "already exists" in done.stderr
    done = run("mipmap", str(inputs / "vol.npy"), "o.ome.zarr", "--overwrite", "--quiet", cwd=tmp_path)
    assert done.returncode == 0 and read_array(tmp_path / "o.ome.zarr").shape == (30, 40, 50)


@pytest.mark.parametrize("command", ["mipmap", "merge", "correlate", "stitch", "corrimage"])
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


def _replay(record):
    """Run the script a file's provenance carries; return its namespace."""
    namespace = {}
    exec(compile(record["python"], "<provenance>", "exec"), namespace)
    return namespace


def test_outputs_carry_their_provenance(inputs, tmp_path):
    import json

    import tifffile
    import zarr

    done = run("mipmap", str(inputs / "vol.npy"), "p.ome.zarr", "--threshold", "100", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = zarr.open_group(str(tmp_path / "p.ome.zarr"), mode="r").attrs["napari_gridmip"]
    assert record["calls"][0]["function"] == "napari_gridmip.write_mipmap"
    assert record["calls"][0]["kwargs"]["threshold"] == 100 and record["jax"] and record["time"]
    assert record["sources"] == [{"variable": "volume", "path": str(inputs / "vol.npy")}]

    args = ["--stride", "100", "100", "--image-shape", "3", "512", "512", "--blend", "hann", "--quiet"]
    for name in ("m.tif", "m.zarr"):
        done = run("merge", str(inputs / "tiles.npy"), name, *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    described = json.loads(tifffile.TiffFile(tmp_path / "m.tif").pages[0].description)["napari_gridmip"]
    stored = zarr.open_array(str(tmp_path / "m.zarr"), mode="r").attrs["napari_gridmip"]
    assert described["calls"] == stored["calls"] and stored["calls"][0]["kwargs"] == {"blend": "hann"}
    np.testing.assert_array_equal(np.asarray(_replay(stored)["results"]["merged"]), tifffile.imread(tmp_path / "m.tif"))

    done = run("correlate", str(inputs / "a.tif"), str(inputs / "b.tif"), "f.zarr", "--window", "7", "7", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    field = zarr.open_group(str(tmp_path / "f.zarr"), mode="r")
    results = _replay(field.attrs["napari_gridmip"])["results"]
    for part in ("dy", "dx", "peak"):
        np.testing.assert_array_equal(np.asarray(results[part]), field[part][:])


# -- stitch ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mosaic_folder(tmp_path_factory):
    """A 2x3 mosaic (160 px tiles, 30% overlap, +-6 px stage errors) as TIFF files and as one .npy stack."""
    import tifffile

    from napari_gridmip._sample_data.mosaic import make_mosaic

    folder = tmp_path_factory.mktemp("mosaic")
    sample = make_mosaic(grid_shape=(2, 3), tile_shape=(160, 160), overlap=0.3, stage_error=6, seed=11)
    tiles = (sample.tiles * 60000).clip(0, 65535).astype(np.uint16)
    for t, (r, c) in enumerate(np.ndindex(2, 3)):
        tifffile.imwrite(folder / f"tile_{r}_{c}.tif", tiles[t])
    np.save(folder / "stack.npy", tiles)
    return folder, sample, tiles


def test_stitch_folder_to_ome_zarr_with_positions(mosaic_folder, tmp_path):
    import csv

    from napari_gridmip import fuse_tiles, grid_positions, register_tiles

    folder, sample, tiles = mosaic_folder
    args = ["--pattern", "tile_{row}_{col}.tif", "--overlap", "0.3", "--max-shift", "12"]
    done = run("stitch", str(folder), "m.ome.zarr", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "registering tile pairs: 100%" in done.stderr and "of 11 overlapping tile pairs used" in done.stderr
    stage = grid_positions((2, 3), (160, 160), 0.3)
    result = register_tiles(tiles, stage, max_shift=12)
    expected = fuse_tiles(tiles, result.positions)
    image = read_array(tmp_path / "m.ome.zarr").compute()
    np.testing.assert_allclose(image, np.asarray(expected.image), atol=1e-3)
    with open(tmp_path / "m.ome.zarr.positions.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["file"] for r in rows] == [f"tile_{r}_{c}.tif" for r in range(2) for c in range(3)]
    assert rows[4]["grid_row"] == "1" and rows[4]["grid_col"] == "1" and rows[4]["placed_from_stage"] == "0"
    refined = np.array([[float(r["refined_y"]), float(r["refined_x"])] for r in rows])
    np.testing.assert_allclose(refined, result.positions - expected.origin, atol=1e-3)
    # the OME-Zarr translation puts the mosaic where the positions say
    import zarr

    attrs = zarr.open_group(str(tmp_path / "m.ome.zarr"), mode="r").attrs.asdict()
    multiscales = attrs.get("ome", attrs)["multiscales"][0]
    translation = multiscales["datasets"][0]["coordinateTransformations"][1]["translation"]
    assert translation == [float(o) for o in expected.origin]


@pytest.mark.slow  # another process compiling the registration: the folder test above covers the same path
def test_stitch_array_file_to_tiff(mosaic_folder, tmp_path):
    import tifffile

    folder, _, tiles = mosaic_folder
    done = run("stitch", str(folder / "stack.npy"), "m.tif", "--grid", "2", "3", "--overlap", "0.3",
               "--max-shift", "12", "--blend", "max", "--quiet", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    image = tifffile.imread(tmp_path / "m.tif")
    assert image.dtype == np.float32 and image.shape[0] > 270 and (tmp_path / "m.tif.positions.csv").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{folder}", "o.ome.zarr", "--overlap", "0.1"], "give --pattern"),
        (["{folder}/stack.npy", "o.ome.zarr", "--overlap", "0.1"], "--grid is required"),
        (["{folder}/stack.npy", "o.ome.zarr", "--overlap", "0.1", "--grid", "2", "2"], "needs 4 tiles; found 6"),
        (["{folder}/stack.npy", "o.png", "--overlap", "0.1", "--grid", "2", "3"], "must end in .ome.zarr, .tif"),
        (["{folder}", "o.tif", "--overlap", "0.1", "--pattern", "tile_{{row}}.tif"], "needs both {row} and {col}"),
        (["{folder}", "o.tif", "--overlap", "0.1", "--pattern", "x_{{row}}_{{col}}.tif"], "no file"),
        (["{folder}", "o.tif", "--overlap", "0.1", "--pattern", "tile_{{row}}_{{col}}.tif", "--grid", "3", "3"],
         "disagrees with the files' (2, 3) grid"),
        (["{folder}/stack.npy", "o.tif", "--overlap", "1.5", "--grid", "2", "3"], "0 <= overlap < 1"),
        (["{folder}/stack.npy", "o.tif", "--overlap", "0.1", "--grid", "2", "3", "--order", "zigzag"],
         "order must be one of"),
    ],
)  # fmt: skip
def test_stitch_bad_input_is_one_line(mosaic_folder, tmp_path, args, message):
    folder = mosaic_folder[0]
    done = run("stitch", *(a.format(folder=folder) for a in args), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []


def test_stitch_keeps_an_existing_positions_file(mosaic_folder, tmp_path):
    (tmp_path / "m.tif.positions.csv").write_text("mine")
    done = run("stitch", str(mosaic_folder[0] / "stack.npy"), "m.tif", "--grid", "2", "3", "--overlap", "0.3",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "already exists" in done.stderr
    assert (tmp_path / "m.tif.positions.csv").read_text() == "mine" and not (tmp_path / "m.tif").exists()


@pytest.mark.parametrize("order", ["morton", "c"])
def test_mipmap_packed_and_bbox(inputs, tmp_path, order):
    import zarr

    args = ["mipmap", str(inputs / "vol.npy"), "p.ome.zarr", "--threshold", "100", "--packed", "--packed-order", order]
    done = run(*args, "--bbox", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    levels = occupancy_mipmap(np.load(inputs / "vol.npy"), threshold=100)
    box = occupied_bbox(levels)
    want = f"occupied bounding box (z, y, x): lo={box.lo} hi={box.hi} (half-open), shape {box.shape}"
    assert done.stdout.strip() == want
    group = zarr.open_group(str(tmp_path / "p.ome.zarr"), mode="r")
    assert group["packed"].attrs["order"] == order and group["packed"].attrs["levels"] == len(levels)
    for k, level in enumerate(levels):
        stored = group[f"packed/s{k}"]
        assert stored.dtype == np.uint8 and list(stored.attrs["shape"]) == list(level.shape)
        back = unpack_occupancy(stored[...], tuple(stored.attrs["shape"]), order=stored.attrs["order"])
        np.testing.assert_array_equal(np.asarray(back), np.asarray(level))
    np.testing.assert_array_equal(read_array(tmp_path / "p.ome.zarr").compute(), np.asarray(levels[0]))  # still OME


def test_mipmap_packed_with_leading_axes(inputs, tmp_path):
    import zarr

    done = run("mipmap", str(inputs / "series.npy"), "s.ome.zarr", "--packed", "--packed-order", "c", "--bbox",
               "--quiet", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    series = np.load(inputs / "series.npy")
    union = occupied_bbox(occupancy_mipmap(series.any(axis=0)))
    assert f"lo={union.lo} hi={union.hi}" in done.stdout
    group = zarr.open_group(str(tmp_path / "s.ome.zarr"), mode="r")
    levels = occupancy_mipmap(series)
    for k, level in enumerate(levels):
        stored = group[f"packed/s{k}"]
        for t in range(2):
            back = unpack_occupancy(stored[t], level.shape[1:], order="c")
            np.testing.assert_array_equal(np.asarray(back), np.asarray(level)[t])


def test_mipmap_bbox_of_nothing(tmp_path):
    np.save(tmp_path / "zeros.npy", np.zeros((5, 6, 7), np.uint8))
    done = run("mipmap", "zeros.npy", "z.ome.zarr", "--bbox", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "occupied bounding box (z, y, x): none (no voxel above the threshold)"


def test_corrimage(inputs, tmp_path):
    import tifffile

    movie = tifffile.imread(inputs / "movie.tif")
    done = run("corrimage", str(inputs / "movie.tif"), "cn.zarr", "--neighbours", "4", "--chunk-frames", "16",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "100% Completed" in done.stderr  # the progress bar
    expected = np.asarray(local_correlation_image(movie, neighbours=4))
    np.testing.assert_allclose(read_array(tmp_path / "cn.zarr").compute(), expected, atol=1e-6)
    done = run("corrimage", str(inputs / "movie.tif"), "cn.zarr", cwd=tmp_path)
    assert done.returncode == 2 and "already exists" in done.stderr


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
