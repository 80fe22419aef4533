"""The core's option lists: public, JAX-free tuples of the words each option takes (the default first).

The kernels validate against them and the widgets and the command line build their choices from them (without
importing JAX): one list per option, nothing to keep in sync. Import them from here.
"""

import os

BLEND_MODES = ("mean", "gaussian", "hann", "max", "overwrite")
"""``merge_patches(blend=...)``: weighted means first, then the two order-based modes."""

WEIGHTED_BLENDS = ("mean", "gaussian", "hann")
"""The blend modes that divide by summed weights (and so return floats)."""

SUBPIXEL_METHODS = ("hessian", "paraboloid", "refine", "none")
"""``find_displacement(subpixel=...)``, the default first."""

PRECISIONS = ("float32", "float64")
"""``dtype=`` of the correlation functions, the default first."""

TILED_BLENDS = ("gaussian", "mean", "hann", "crop")
"""``apply_tiled(blend=...)``, the default first: three weighted means over the tiles' overlap (the
windows of ``merge_patches``), or ``"crop"``, each pixel from the one tile that owns it (seams midway
through the overlap, no arithmetic)."""

TILED_BACKENDS = ("auto", "jax", "numpy")
"""``apply_tiled(backend=...)``: how ``fn`` is run, the default first."""

PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")
"""``apply_tiled(pad_mode=...)``: NumPy's ``np.pad`` modes for axes shorter than the tile."""
OFF_WORDS = ("0", "false", "no", "off")
"""What an on/off environment variable of ours (``NAPARI_GRIDMIP_COMPILE_CACHE``, ``NAPARI_GRIDMIP_PREFETCH``) may
say to mean off, in any case; anything else, or unset, is on."""


def switched_off(variable: str) -> bool:
    """Whether the environment variable ``variable`` is set to one of :data:`OFF_WORDS`."""
    return os.environ.get(variable, "").strip().lower() in OFF_WORDS


GRID_ORDERS = ("row-major", "column-major", "snake")
"""``grid_positions(order=...)``: the order in which a stage visits the grid, the default first."""

FUSE_BLENDS = ("linear", "mean", "max", "overwrite")
"""``fuse_tiles(blend=...)``: linear ramps towards tile edges (the default), equal weights, max, last tile wins."""

FUSE_INTERPOLATIONS = ("linear", "cubic", "nearest")
"""``fuse_tiles(interpolation=...)``: how a tile at a fractional position is resampled, the default first."""

STITCH_SUBPIXEL = ("refine", "quadratic", "none")
"""``register_tiles(subpixel=...)``: Gauss-Newton refinement, the quadratic fit it starts from, or integer shifts."""

COMPUTE_ON = ("auto", "accelerator", "host")
"""``compute_on(where)``, ``NAPARI_GRIDMIP_COMPUTE_ON`` and the command line's ``--compute-on``: where the kernels
run, the default first: by the rules of :mod:`.runtime.strategy` (``"auto"``), on JAX's default device with those rules
that move work to the host off (``"accelerator"``), or all on the host CPU (``"host"``)."""
