"""Pure JAX kernels: no Qt, no napari, no layers."""

from napari_gridmip.core.correlation import find_displacement, windowed_pearson
from napari_gridmip.core.mipmap import mipmap_shapes, occupancy_mipmap
from napari_gridmip.core.patches import extract_patches, merge_patches

__all__ = [
    "extract_patches",
    "find_displacement",
    "merge_patches",
    "mipmap_shapes",
    "occupancy_mipmap",
    "windowed_pearson",
]
