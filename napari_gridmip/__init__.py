"""napari-gridmip: occupancy mipmaps, patch reassembly and windowed correlation in JAX.

The names exported here are the pure compute core and its I/O entry points; importing this package pulls
in neither Qt, magicgui nor napari, and imports JAX only when one of them is
first used (so the widgets' modules load fast). The napari widgets load through
the plugin manifest (``napari.yaml``).
"""

import os

# JAX preallocates 75% of a GPU's memory on first use; a GPU may also drive the
# display, so allocate on demand unless the user already chose otherwise.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

try:
    from napari_gridmip._version import version as __version__
except ImportError:  # pragma: no cover - running from a source tree without a build
    __version__ = "0.0.0"

from napari_gridmip import core as _core  # noqa: E402 - lazy itself: JAX loads on first use

# napari_gridmip.io: lazy readers (mosaics with their stage positions too) and the OME-Zarr and Fiji writers
_IO = ("read_array", "read_tiles", "read_mosaic", "write_mipmap", "write_ome_zarr", "write_tile_configuration",
       "write_series_csv")  # fmt: skip

__all__ = ["__version__", *_core.__all__, *_IO]


def __getattr__(name: str):
    if name in _core.__all__:
        value = getattr(_core, name)
    elif name in _IO:
        import napari_gridmip.io  # 0.06 s (NumPy, the readers): only when a reader or writer is first used

        value = getattr(napari_gridmip.io, name)
    else:
        raise AttributeError(f"module 'napari_gridmip' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return __all__
