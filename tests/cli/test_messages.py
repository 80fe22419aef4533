"""What the command line says: a file that is not what its name says, an output that exists, two mosaics in one
folder, the stitch progress beside its summary, and a correlation of two single images. Each run is a new process,
as a user runs it; a refused run exits 2 with one line and writes nothing."""

import re

import numpy as np
import pytest

from tests.helpers import assert_one_line_error_and_nothing_written, run_cli


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    import tifffile

    from napari_gridmip._sample_data import make_speckle_pair

    folder = tmp_path_factory.mktemp("inputs")
    (folder / "notes.tif").write_text("hello, not a picture")
    (folder / "notes.npy").write_text("hello, not an array")
    volume = np.zeros((8, 8, 8), np.uint8)
    volume[2:4, 3:6, 1:2] = 1
    np.save(folder / "vol.npy", volume)
    picture = np.random.default_rng(0).random((96, 96)).astype(np.float32)
    tiles = np.stack([picture[r : r + 64, c : c + 64] for r in (0, 32) for c in (0, 32)])  # 2x2, 50% overlap
    np.save(folder / "tiles.npy", tiles)
    sample, reference, _ = make_speckle_pair(shape=(64, 64))
    tifffile.imwrite(folder / "sample.tif", sample[0])  # one image each, as a user has them
    tifffile.imwrite(folder / "reference.tif", reference[0])
    return folder


@pytest.mark.parametrize(
    ("command", "name", "expected"),
    [("mipmap", "notes.tif", "expected a TIFF image"), ("mipmap", "notes.npy", "expected a NumPy array file")],
)
def test_a_file_that_is_not_what_its_name_says_is_named(inputs, tmp_path, command, name, expected):
    done = run_cli(command, str(inputs / name), "o.ome.zarr", cwd=tmp_path)
    assert_one_line_error_and_nothing_written(done, expected, tmp_path)
    assert repr(str(inputs / name)) in done.stderr  # the file, by its whole path


def test_an_existing_output_names_the_flag(inputs, tmp_path):
    (tmp_path / "o.ome.zarr").mkdir()
    (tmp_path / "o.ome.zarr" / "mine").write_text("kept")
    done = run_cli("mipmap", str(inputs / "vol.npy"), "o.ome.zarr", cwd=tmp_path)
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if "error" in line]
    assert line.endswith(f"{str(tmp_path / 'o.ome.zarr')!r} already exists; pass --overwrite to replace it")
    assert "overwrite=True" not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["o.ome.zarr"] and (tmp_path / "o.ome.zarr" / "mine").exists()


def test_two_mosaics_in_one_folder_and_the_progress_counts_what_the_summary_does(inputs, tmp_path):
    """mosaic.ome.zarr then mosaic.tif: each has its own positions file; the progress is a share of the work (a
    count of batches beside a count of pairs read as two different numbers of pairs)."""
    args = ["--grid", "2", "2", "--overlap", "0.5"]
    first = run_cli("stitch", str(inputs / "tiles.npy"), "mosaic.ome.zarr", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = run_cli("stitch", str(inputs / "tiles.npy"), "mosaic.tif", *args, "--quiet", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mosaic.ome.zarr", "mosaic.ome.zarr.positions.csv", "mosaic.tif", "mosaic.tif.positions.csv"
    ]  # fmt: skip
    progress = [part for part in re.split(r"[\r\n]", first.stderr) if part.startswith("registering tile pairs")]
    assert progress and progress[-1] == "registering tile pairs: 100%", first.stderr
    assert not any(re.search(r"\d+/\d+", part) for part in progress)  # no second count of pairs
    summary = re.search(r"(\d+) of (\d+) overlapping tile pairs used", first.stderr)
    assert summary and int(summary[2]) == 6  # a 2x2 grid: 4 side and 2 diagonal neighbours overlap


def test_positions_file_name_is_in_help(tmp_path):
    done = run_cli("stitch", "--help", cwd=tmp_path)
    assert "OUT.positions.csv" in " ".join(done.stdout.split())


def test_correlate_two_single_images(inputs, tmp_path):
    """Two 2D images with the --help's own example options: the field of the widget's pair mode (a 21 x 21
    subset, as find_displacement of the images as stacks of one frame)."""
    import tifffile
    import zarr

    from napari_gridmip import find_displacement

    done = run_cli("correlate", str(inputs / "sample.tif"), str(inputs / "reference.tif"), "field.zarr", "--window",
                   "15", "15", "--quiet", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    field = zarr.open_group(str(tmp_path / "field.zarr"), mode="r")
    sample, reference = tifffile.imread(inputs / "sample.tif"), tifffile.imread(inputs / "reference.tif")
    expected = find_displacement(sample[None], reference[None], (15, 15), subset=(21, 21))
    assert field["dy"].shape == expected.dy.shape == (64 - 15 - 21 + 2, 64 - 15 - 21 + 2)
    np.testing.assert_allclose(field["dy"][:], np.asarray(expected.dy), atol=1e-5)
    assert np.isfinite(field["dy"][:]).mean() > 0.9  # a field, not NaNs
    help_text = " ".join(run_cli("correlate", "--help", cwd=tmp_path).stdout.split())
    assert "or one image (M, N)" in help_text and "21 21 for two single images" in help_text
