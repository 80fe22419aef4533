"""``--compute-on`` of the batch subcommands, and where the calls ran in the provenance they write.

In this process (``main``), not a subprocess: a pretended TPU (``jax.default_backend`` answering "tpu") shows the
rules that move work to the host recorded with the outputs."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import zarr

from napari_gridmip.cli import main


@pytest.fixture
def volume(tmp_path):
    path = tmp_path / "vol.npy"
    np.save(path, (np.random.default_rng(0).random((12, 10, 9)) > 0.9).astype(np.float32))
    return path


def ran_on(path) -> dict:
    return zarr.open(str(path), mode="r").attrs["napari_gridmip"]["ran_on"]


def test_the_option_is_recorded_with_the_outputs(volume, tmp_path, monkeypatch):
    main(["mipmap", str(volume), str(tmp_path / "host.ome.zarr"), "--compute-on", "host", "--quiet"])
    cpu = jax.devices("cpu")[0]
    assert ran_on(tmp_path / "host.ome.zarr") == {
        "compute_on": "host",
        "calls": [{"function": "napari_gridmip.write_mipmap", "platform": "cpu", "device_kind": cpu.device_kind}],
    }
    monkeypatch.setenv("NAPARI_GRIDMIP_COMPUTE_ON", "accelerator")  # the default where the option is not given
    main(["mipmap", str(volume), str(tmp_path / "env.ome.zarr"), "--quiet"])
    assert ran_on(tmp_path / "env.ome.zarr")["compute_on"] == "accelerator"
    main(["mipmap", str(volume), str(tmp_path / "auto.ome.zarr"), "--compute-on", "auto", "--quiet"])
    assert ran_on(tmp_path / "auto.ome.zarr")["compute_on"] == "auto"


def test_a_rule_that_moved_a_call_to_the_host_is_recorded(tmp_path, monkeypatch):
    movie = np.random.default_rng(1).random((30, 12, 14)).astype(np.float32)
    np.save(tmp_path / "movie.npy", movie)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    main(["corrimage", str(tmp_path / "movie.npy"), str(tmp_path / "auto.zarr"), "--quiet"])
    call, *later = ran_on(tmp_path / "auto.zarr")["calls"]
    assert call["function"] == "napari_gridmip.local_correlation_image"
    assert call["moved_to_host"] == ["memory_bound_place"]  # decided as the lazy graph was made, before writing
    # the blocks, computed as OUT was written (after the call), sum their moments in float64: a TPU's host's work
    assert later == [{"function": None, "platform": "cpu", "moved_to_host": ["float64"]}]
    main(["corrimage", str(tmp_path / "movie.npy"), str(tmp_path / "acc.zarr"), "--quiet", "--compute-on",
          "accelerator"])  # fmt: skip
    record = ran_on(tmp_path / "acc.zarr")
    assert record["compute_on"] == "accelerator" and "moved_to_host" not in record["calls"][0]
    monkeypatch.undo()
    from napari_gridmip import local_correlation_image

    want = np.asarray(local_correlation_image(movie))
    for name in ("auto.zarr", "acc.zarr"):
        np.testing.assert_allclose(zarr.open(str(tmp_path / name), mode="r")[:], want, rtol=1e-5, atol=1e-6)


def test_bad_values_are_one_line_errors(volume, tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["mipmap", str(volume), str(tmp_path / "a.ome.zarr"), "--compute-on", "gpu"])
    assert exited.value.code == 2
    assert "--compute-on: invalid choice: 'gpu'" in capsys.readouterr().err
    monkeypatch.setenv("NAPARI_GRIDMIP_COMPUTE_ON", "gpu")
    with pytest.raises(SystemExit) as exited:
        main(["mipmap", str(volume), str(tmp_path / "b.ome.zarr"), "--quiet"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "NAPARI_GRIDMIP_COMPUTE_ON must be one of 'auto', 'accelerator', 'host'; got 'gpu'" in error
    assert not (tmp_path / "b.ome.zarr").exists()
