"""Files written whole or not at all (core._files)."""

import os

import pytest

from napari_gridmip.core.runtime.files import write_atomically


def test_text_and_bytes_replace_the_file_and_leave_nothing_beside(tmp_path):
    path = tmp_path / "new" / "folder" / "file.json"
    write_atomically(path, "first")
    write_atomically(path, b"second \xff")
    assert path.read_bytes() == b"second \xff"
    assert os.listdir(path.parent) == ["file.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_partial(tmp_path, monkeypatch):
    path = tmp_path / "file.json"
    write_atomically(path, "old")

    def refuse(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["file.json"]
