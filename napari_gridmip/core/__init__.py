"""Pure JAX kernels: no Qt, no napari, no layers, and the flat API's names (loaded on first use).

One subpackage per job (``occupancy``, ``patches``, ``correlation``), each with its dask twins in ``_chunked``;
``runtime`` decides where work runs; ``options``, ``validate``, ``interpolation`` and ``peak`` are shared leaves.
A name's first use loads its kernels (and JAX) and switches on JAX's persistent compilation cache.
"""

import importlib
import sys

from napari_gridmip.core.runtime import compile_cache

# public name -> the module that defines it
_API = {
    "occupancy_mipmap": "occupancy.pyramid",
    "mipmap_shapes": "occupancy.pyramid",
    "max_mipmap": "occupancy.pyramid",
    "threshold_mipmap": "occupancy.pyramid",
    "occupied_bbox": "occupancy.queries",
    "is_empty": "occupancy.queries",
    "occupied_chunks": "occupancy.queries",
    "pack_occupancy": "occupancy.packing",
    "unpack_occupancy": "occupancy.packing",
    "traverse_occupied": "occupancy.traverse",
    "orthographic_rays": "occupancy.render",
    "render_volume": "occupancy.render",
    "camera_rays": "occupancy.camera",
    "render_view": "occupancy.raycast",
    "colorize_view": "occupancy.raycast",
    "extract_patches": "patches.grid",
    "merge_patches": "patches.grid",
    "filter_tiled": "patches.tiled_filters",
    "apply_tiled": "patches.tiled",
    "grid_positions": "patches.stitch",
    "register_tiles": "patches.stitch",
    "fuse_tiles": "patches.fuse",
    "windowed_pearson": "correlation.maps",
    "find_displacement": "correlation.maps",
    "correlate_series": "correlation.series",
    "correlate_volumes": "correlation.volumes",
    "correlate_volume_series": "correlation.volume_series",
    "volume_strain": "correlation.strain3d",
    "displacement_vectors": "correlation.vectors",
    "integrate_gradient": "correlation.fields",
    "phase_from_displacement": "correlation.fields",
    "strain_field": "correlation.fields",
    "local_correlation_image": "correlation.timeseries",
    "track_speckles": "correlation.tracking",
    "Status": "correlation.status",
    "compute_on": "runtime.devices",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
        if "jax" in sys.modules:  # JAX loads with the kernels: compiled programs outlive the process from now on.
            # A kernel that runs without JAX where it can (register_tiles' NumPy engine on small mosaics) does not
            # pay JAX's import (0.76 s of its 1.3 s first call in a new process): its JAX part enables the cache
            compile_cache.enable()
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
