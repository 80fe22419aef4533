"""io.write_vtk_image: fields on a 3D grid as a VTK ImageData file, read back here with the XML parser and NumPy."""

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

pytest.importorskip("pyevtk")

from napari_gridmip.io import write_vtk_image  # noqa: E402 - after the skip

VTK_TYPES = {"Float32": "f4", "Float64": "f8", "UInt8": "u1", "Int8": "i1", "UInt16": "u2", "Int16": "i2",
             "UInt32": "u4", "Int32": "i4", "Int64": "i8", "UInt64": "u8"}  # fmt: skip


def read_vti(path):
    """``(image attributes, {name: array (Z, Y, X) or (Z, Y, X, 3)})`` of an XML ImageData file with raw appended
    data (what pyevtk writes): each array's bytes after its offset, behind a UInt64 byte count, x fastest."""
    raw = path.read_bytes()
    start = raw.index(b"<AppendedData")
    underscore = raw.index(b"_", raw.index(b">", start)) + 1
    head = raw[:start].decode() + "</VTKFile>"
    head = re.sub(r"<AppendedData.*", "", head, flags=re.S) if "<AppendedData" in head else head
    root = ET.fromstring(head)
    assert root.get("type") == "ImageData" and root.get("header_type") == "UInt64"
    order = "<" if root.get("byte_order") == "LittleEndian" else ">"
    image = root.find("ImageData")
    x0, x1, y0, y1, z0, z1 = map(int, image.get("WholeExtent").split())
    shape = (z1 - z0 + 1, y1 - y0 + 1, x1 - x0 + 1)
    arrays = {}
    for array in image.iter("DataArray"):
        offset = underscore + int(array.get("offset"))
        size = int(np.frombuffer(raw, f"{order}u8", 1, offset)[0])
        values = np.frombuffer(raw, order + VTK_TYPES[array.get("type")], offset=offset + 8,
                               count=size // int(VTK_TYPES[array.get("type")][1]))  # fmt: skip
        components = int(array.get("NumberOfComponents", "1"))
        arrays[array.get("Name")] = values.reshape(*shape, components) if components > 1 else values.reshape(shape)
    return image, arrays


def fields_of(shape=(3, 4, 5)):
    rng = np.random.default_rng(0)
    dz, dy, dx = rng.standard_normal((3, *shape)).astype(np.float32)
    dz[1, 2, 3] = np.nan  # a lost point stays NaN
    status = rng.integers(0, 6, shape).astype(np.uint8)
    return {"dz": dz, "dy": dy, "dx": dx, "status": status, "mask": status > 2}


def test_fields_and_the_grid_read_back(tmp_path):
    fields = fields_of()
    path = write_vtk_image(tmp_path / "dvc.vti", fields, origin=(6.0, 7.0, 8.0), spacing=(10.0, 11.0, 12.0),
                           vectors={"displacement": ("dz", "dy", "dx")})  # fmt: skip
    assert path == tmp_path / "dvc.vti" and sorted(p.name for p in tmp_path.iterdir()) == ["dvc.vti"]
    image, arrays = read_vti(path)
    # VTK's order is x, y, z: the package's (z, y, x) reversed
    assert image.get("Origin").split() == ["8.0", "7.0", "6.0"]
    assert image.get("Spacing").split() == ["12.0", "11.0", "10.0"]
    assert image.get("WholeExtent").split() == ["0", "4", "0", "3", "0", "2"]
    for name in ("dz", "dy", "dx", "status"):
        np.testing.assert_array_equal(arrays[name], fields[name])
        assert arrays[name].dtype == fields[name].dtype
    np.testing.assert_array_equal(arrays["mask"], fields["mask"].astype(np.uint8))
    # the vector's components in VTK's (x, y, z) order, each point's three together
    expected = np.stack([fields["dx"], fields["dy"], fields["dz"]], -1)
    np.testing.assert_array_equal(arrays["displacement"], expected)


def test_a_point_lies_where_vtk_puts_it(tmp_path):
    """Element [k, j, i] is VTK's point (i, j, k): a field that is its own z coordinate reads back as such."""
    z = np.arange(3, dtype=np.float64)[:, None, None] * np.ones((3, 4, 5))
    _, arrays = read_vti(write_vtk_image(tmp_path / "z.vti", {"z": z}))
    np.testing.assert_array_equal(arrays["z"], z)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": "out.vtk"}, "ends in .vti"),
        ({"fields": {}}, "no field"),
        ({"fields": {"a": np.zeros((3, 4)), "b": np.zeros((3, 4))}}, "3D"),
        ({"fields": {"a": np.zeros((3, 4, 5)), "b": np.zeros((3, 4, 6))}}, "one shape"),
        ({"spacing": (1.0, 0.0, 1.0)}, "spacing"),
        ({"origin": (1.0, 2.0)}, "origin"),
        ({"vectors": {"v": ("dz", "dy", "nope")}}, "nope"),
    ],
)
def test_bad_input_raises_and_writes_nothing(tmp_path, kwargs, message):
    arguments = {"path": "out.vti", "fields": fields_of(), **kwargs}
    with pytest.raises(ValueError, match=message):
        write_vtk_image(tmp_path / arguments.pop("path"), arguments.pop("fields"), **arguments)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_needs_overwrite(tmp_path):
    path = tmp_path / "dvc.vti"
    write_vtk_image(path, {"a": np.zeros((2, 2, 2), np.float32)})
    with pytest.raises(FileExistsError):
        write_vtk_image(path, {"a": np.ones((2, 2, 2), np.float32)})
    write_vtk_image(path, {"a": np.ones((2, 2, 2), np.float32)}, overwrite=True)
    np.testing.assert_array_equal(read_vti(path)[1]["a"], np.ones((2, 2, 2)))
    assert [p.name for p in tmp_path.iterdir()] == ["dvc.vti"]
