"""Pure JAX kernels: no Qt, no napari, no layers.

The kernels' modules (and so JAX) load when one of these names is first used,
so that jax-free helpers such as ``core._validate`` import fast.
"""

import importlib

# public name -> the module that defines it
_API = {
    "occupancy_mipmap": "mipmap",
    "mipmap_shapes": "mipmap",
    "extract_patches": "patches",
    "merge_patches": "patches",
    "windowed_pearson": "correlation",
    "find_displacement": "correlation",
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
