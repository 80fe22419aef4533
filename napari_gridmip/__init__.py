"""napari-gridmip: occupancy mipmaps, patch reassembly and windowed correlation in JAX.

The names exported here are the pure compute core; importing this package pulls
in neither Qt, magicgui nor napari. The napari widgets load through the plugin
manifest (``napari.yaml``).
"""

import os

# JAX preallocates 75% of a GPU's memory on first use; a GPU may also drive the
# display, so allocate on demand unless the user already chose otherwise.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from napari_gridmip.core import (  # noqa: E402
    extract_patches,
    find_displacement,
    merge_patches,
    mipmap_shapes,
    occupancy_mipmap,
    windowed_pearson,
)

try:
    from napari_gridmip._version import version as __version__
except ImportError:  # pragma: no cover - running from a source tree without a build
    __version__ = "0.0.0"

__all__ = [
    "__version__",
    "extract_patches",
    "find_displacement",
    "merge_patches",
    "mipmap_shapes",
    "occupancy_mipmap",
    "windowed_pearson",
]
