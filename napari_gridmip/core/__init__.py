"""Pure JAX kernels: no Qt, no napari, no layers."""

from napari_gridmip.core.mipmap import mipmap_shapes, occupancy_mipmap

__all__ = ["mipmap_shapes", "occupancy_mipmap"]
