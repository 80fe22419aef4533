"""write_series_csv: one DICe-style CSV per frame, read back equal."""

import numpy as np
import pytest

import napari_gridmip as gm
from napari_gridmip._sample_data.dic_series import make_dic_series
from napari_gridmip.core.correlation.status import Status


@pytest.fixture(scope="module")
def series():
    frames, _ = make_dic_series("translation", frames=3, shape=(96, 96))
    return gm.correlate_series(frames, subset=21, step=12)


def test_each_frame_reads_back(tmp_path, series):
    files = gm.write_series_csv(series, tmp_path / "out", provenance={"subset": 21})
    assert [f.name for f in files] == [f"DICe_solution_{t:04d}.txt" for t in range(3)]
    text = files[1].read_text().splitlines()
    assert text[0].startswith("# napari-gridmip") and text[1] == "# subset: 21"
    header = text[2].split(",")
    assert header[:5] == ["SUBSET_ID", "COORDINATE_X", "COORDINATE_Y", "DISPLACEMENT_X", "DISPLACEMENT_Y"]
    numeric = np.genfromtxt(files[1], delimiter=",", comments="#", skip_header=3, usecols=range(len(header) - 1))
    names = [line.rsplit(",", 1)[1] for line in text[3:]]
    gy, gx = np.meshgrid(series.y, series.x, indexing="ij")
    np.testing.assert_allclose(numeric[:, 1], gx.ravel())
    np.testing.assert_allclose(numeric[:, 2], gy.ravel())
    np.testing.assert_allclose(numeric[:, 3], series.dx[1].ravel(), atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(numeric[:, 4], series.dy[1].ravel(), atol=1e-6, equal_nan=True)
    flags = numeric[:, header.index("STATUS_FLAG")]
    np.testing.assert_array_equal(flags, series.status[1].ravel())
    assert names == [Status(int(s)).name for s in series.status[1].ravel()]
    lost = series.status[1].ravel() != 0
    assert lost.any() and np.all(np.isnan(numeric[lost, 3]))


def test_bad_inputs_write_nothing(tmp_path, series):
    with pytest.raises(TypeError, match="correlate_series"):
        gm.write_series_csv(object(), tmp_path / "a")
    with pytest.raises(ValueError, match="strain"):
        gm.write_series_csv(series, tmp_path / "b", strain=(series.dx,))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert list(tmp_path.iterdir()) == []
