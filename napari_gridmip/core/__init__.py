"""Pure JAX kernels: no Qt, no napari, no layers.

One subpackage per job (``occupancy``, ``patches``, ``correlation``), each
with its kernels and, in its ``_chunked`` module, their block-by-block twins
on dask arrays; the pieces they share (input checks, option lists, the scoped
x64 switch, the host-to-device hand-over, peak fits) sit at this level.

The kernels' modules (and so JAX) load when one of these names is first used,
so that jax-free helpers such as ``core._validate`` import fast.
"""

import importlib

# public name -> the module that defines it
_API = {
    "occupancy_mipmap": "occupancy.pyramid",
    "mipmap_shapes": "occupancy.pyramid",
    "extract_patches": "patches.grid",
    "merge_patches": "patches.grid",
    "windowed_pearson": "correlation.maps",
    "find_displacement": "correlation.maps",
    "track_speckles": "correlation.subsets",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
