"""``napari-gridmip correlate-series``: one DICe CSV file per frame, a progress line per frame, and on bad input one
line, a non-zero exit and nothing written."""

import numpy as np
import pytest

from napari_gridmip._sample_data.dic_series import make_dic_series
from tests.helpers import assert_one_line_error_and_nothing_written, run_cli


def run(*args, cwd):
    return run_cli("correlate-series", *args, cwd=cwd)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    import tifffile

    folder = tmp_path_factory.mktemp("series")
    frames, truth = make_dic_series("translation", frames=3, shape=(96, 96))
    tifffile.imwrite(folder / "frames.tif", frames, photometric="minisblack")
    np.save(folder / "roi.npy", truth["roi"])
    np.save(folder / "image.npy", frames[0])
    np.save(folder / "small_roi.npy", np.ones((40, 40), bool))
    return folder


def test_one_csv_per_frame(inputs, tmp_path):
    done = run(str(inputs / "frames.tif"), "--roi", str(inputs / "roi.npy"), "--subset", "21", "--step", "10",
               "--reference", "incremental", "--out", "dic", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "frame 3/3" in done.stderr and "wrote 3 files" in done.stderr
    files = sorted((tmp_path / "dic").iterdir())
    assert [f.name for f in files] == ["DICe_solution_0000.txt", "DICe_solution_0001.txt", "DICe_solution_0002.txt"]
    text = files[1].read_text().splitlines()
    header = next(line for line in text if not line.startswith("#"))
    assert header.startswith("SUBSET_ID,COORDINATE_X,COORDINATE_Y,DISPLACEMENT_X,DISPLACEMENT_Y")
    assert any("'reference': 'incremental'" in line or '"reference": "incremental"' in line for line in text)
    rows = [line for line in text if line[0].isdigit()]
    assert len(rows) == 8 * 8  # (96 - 20) / 10 + 1 points along each axis
    assert list(tmp_path.iterdir()) == [tmp_path / "dic"]  # no temporary folder left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{inputs}/image.npy", "--out", "o"], "FRAMES must be a sequence (T, Y, X)"),
        (["{inputs}/missing.npy", "--out", "o"], "does not exist"),
        (["{inputs}/frames.tif", "--subset", "20", "--out", "o"], "subset"),
        (["{inputs}/frames.tif", "--roi", "{inputs}/small_roi.npy", "--out", "o"], "roi must be a mask"),
        (["{inputs}/frames.tif", "--reference", "later", "--out", "o"], "invalid choice: 'later'"),
        (["{inputs}/frames.tif", "--out", "nowhere/o"], "does not exist"),
        (["{inputs}/frames.tif", "--shape", "quadratic", "--out", "o"], "invalid choice: 'quadratic'"),
        (["{inputs}/frames.tif", "--max-sigma", "0", "--out", "o"], "--max-sigma must be a positive number of px"),
        (["{inputs}/frames.tif", "--max-sigma", "nan", "--out", "o"], "--max-sigma must be a positive number of px"),
        (["{inputs}/frames.tif", "--refresh-zncc", "1.5", "--out", "o"], "--refresh-zncc must be a ZNCC in [0, 1]"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(inputs, tmp_path, args, message):
    done = run(*(a.format(inputs=inputs) for a in args), cwd=tmp_path)
    assert_one_line_error_and_nothing_written(done, message, tmp_path)


def test_the_shape_and_thresholds_reach_the_call(inputs, tmp_path):
    """--shape rigid, --max-sigma and --refresh-zncc are correlate_series' options, recorded in the provenance."""
    import json

    from napari_gridmip._jobs.plan import KEY

    done = run(str(inputs / "frames.tif"), "--roi", str(inputs / "roi.npy"), "--subset", "21", "--step", "10",
               "--reference", "auto", "--shape", "rigid", "--max-sigma", "0.05", "--refresh-zncc", "0.9",
               "--out", "dic", "--quiet", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = next(line for line in (tmp_path / "dic" / "DICe_solution_0001.txt").read_text().splitlines()
                if line.startswith(f"# {KEY}: "))  # fmt: skip
    options = json.loads(line.removeprefix(f"# {KEY}: "))["calls"][0]["kwargs"]
    chosen = {name: options[name] for name in ("reference", "shape", "max_sigma", "refresh_zncc")}
    assert chosen == {"reference": "auto", "shape": "rigid", "max_sigma": 0.05, "refresh_zncc": 0.9}


def test_an_existing_folder_is_kept(inputs, tmp_path):
    (tmp_path / "dic").mkdir()
    (tmp_path / "dic" / "mine.txt").write_text("keep me")
    done = run(str(inputs / "frames.tif"), "--out", "dic", cwd=tmp_path)
    assert done.returncode == 2 and "already exists" in done.stderr
    assert [f.name for f in (tmp_path / "dic").iterdir()] == ["mine.txt"]


def test_help_has_an_example(tmp_path):
    done = run("--help", cwd=tmp_path)
    assert done.returncode == 0 and "example:" in done.stdout and "napari-gridmip correlate-series " in done.stdout
