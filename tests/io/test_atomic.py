"""The one atomic-write helper (core/runtime/files.py): a file or a folder appears whole under its name or not at
all, and every writer of the package goes through it."""

import subprocess
import types

import numpy as np
import pytest

from napari_gridmip.core.runtime.files import OutputExistsError, atomic_path, write_atomically


def test_a_file_appears_only_when_complete(tmp_path):
    target = tmp_path / "a.txt"
    with atomic_path(target) as partial:
        partial.write_text("whole")
        assert not target.exists() and partial.parent == tmp_path
    assert target.read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]
    with atomic_path(tmp_path / "b.vti", suffix=".vti") as partial:  # a writer that wants its own suffix
        assert partial.name.endswith(".vti") and partial.name != "b.vti"
        partial.write_text("vtk")
    assert (tmp_path / "b.vti").read_text() == "vtk"


def test_a_failure_leaves_what_was_there(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="half-way"), atomic_path(target, overwrite=True) as partial:
        partial.write_text("half")
        raise RuntimeError("half-way")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_folder_replaces_a_folder(tmp_path):
    target = tmp_path / "out.zarr"
    (target / "old").mkdir(parents=True)
    with atomic_path(target, overwrite=True) as partial:
        (partial / "new").mkdir(parents=True)
    assert [p.name for p in target.iterdir()] == ["new"] and [p.name for p in tmp_path.iterdir()] == ["out.zarr"]


def test_an_existing_output_is_refused_before_and_after(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("mine")
    with pytest.raises(OutputExistsError, match="already exists; pass overwrite=True") as refused:
        with atomic_path(target):
            raise AssertionError("the block must not run")
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, FileExistsError)
    assert refused.value.path == target
    # another writer finishes first: its output stays, ours goes
    other = tmp_path / "b.txt"
    with pytest.raises(OutputExistsError), atomic_path(other) as partial:
        partial.write_text("ours")
        other.write_text("theirs")
    assert other.read_text() == "theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_nothing_written_is_an_error_and_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing was written"), atomic_path(tmp_path / "a.txt"):
        pass
    with pytest.raises(ValueError, match="does not exist"), atomic_path(tmp_path / "no" / "a.txt"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_write_atomically_makes_the_folder_and_replaces(tmp_path):
    target = tmp_path / "deep" / "settings.json"
    write_atomically(target, "one")
    write_atomically(target, b"two")
    assert target.read_text() == "two" and [p.name for p in target.parent.iterdir()] == ["settings.json"]


def test_every_writer_uses_the_one_helper():
    """No other temporary-name-and-rename in the package: its writers' atomicity is the helper's, tested here."""
    import napari_gridmip

    root = napari_gridmip.__file__.rsplit("/", 1)[0]
    found = subprocess.run(["grep", "-rln", "--include=*.py", r"os\.replace\|os\.rename\|\.rename(", root],
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    assert [f[len(root) + 1 :] for f in found] == ["core/runtime/files.py"]


def _series(t: int = 2) -> types.SimpleNamespace:
    """A two-frame series of 2 x 3 points whose second frame's status cannot be read (a failure half-way)."""

    class Status:
        def __getitem__(self, index):
            if index == 1:
                raise RuntimeError("frame 1 failed")
            return np.zeros((2, 3), np.int8)

    field = np.zeros((t, 2, 3))
    names = ("dy", "dx", "zncc", "dx_x", "dx_y", "dy_x", "dy_y", "sigma_dx", "sigma_dy", "key_frame")
    return types.SimpleNamespace(y=np.arange(2.0), x=np.arange(3.0), status=Status(), **dict.fromkeys(names, field))


@pytest.mark.parametrize("existing", [False, True])
def test_a_series_failing_half_way_writes_no_file(tmp_path, existing):
    from napari_gridmip.io import write_series_csv

    folder = tmp_path / "dic"
    if existing:
        folder.mkdir()
        (folder / "DICe_solution_0000.txt").write_text("an earlier run's")
    with pytest.raises(RuntimeError, match="frame 1 failed"):
        write_series_csv(_series(), folder)
    if existing:
        assert [p.name for p in folder.iterdir()] == ["DICe_solution_0000.txt"]
        assert (folder / "DICe_solution_0000.txt").read_text() == "an earlier run's"
    else:
        assert list(tmp_path.iterdir()) == []
