"""The core's option lists, JAX-free, so that the widgets can offer them without importing JAX.

The kernels validate against these tuples and the widgets build their choices
from them: one list per option, nothing to keep in sync.
"""

BLEND_MODES = ("mean", "gaussian", "hann", "max", "overwrite")
"""``merge_patches(blend=...)``: weighted means first, then the two order-based modes."""

WEIGHTED_BLENDS = ("mean", "gaussian", "hann")
"""The blend modes that divide by summed weights (and so return floats)."""

SUBPIXEL_METHODS = ("hessian", "paraboloid", "refine", "none")
"""``find_displacement(subpixel=...)``, the default first."""

PRECISIONS = ("float32", "float64")
"""``dtype=`` of the correlation functions, the default first."""
