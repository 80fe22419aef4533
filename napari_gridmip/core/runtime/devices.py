"""Where the kernels run: the user's override of the rules in ``core.runtime.strategy``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from napari_gridmip.core.runtime import strategy

__all__ = ["compute_on"]


@contextlib.contextmanager
def compute_on(where: str) -> Iterator[Any]:
    """Run the kernels called in a ``with`` block where ``where`` says.

    By default (``"auto"``) the library places a few kernels itself where they finish first: on a TPU machine the
    memory-bound ones (``occupancy_mipmap``, ``max_mipmap``, ``local_correlation_image``) with NumPy or dask
    inputs, the DIC series' IC-GN (``correlate_series``) and the live view's render (``render_view``) run on the
    host CPU, whose memory reads the data faster than the chip's link carries it, or which gathers faster
    (docs/accelerator.md). This block overrides that choice for the calls made in it, and for the dask results
    computed in it (in dask's threads too). ``NAPARI_GRIDMIP_COMPUTE_ON`` sets the same outside any block
    (the process's default); napari's Preferences (napari-gridmip, "All widgets") set it for the widgets'
    runs, and ``--compute-on`` for the command line's.

    Parameters
    ----------
    where : {"auto", "accelerator", "host"}
        ``"auto"``: the library's rules. ``"accelerator"``: every kernel on JAX's default device (the
        accelerator where there is one), the rules that move work to the host off; on a machine without an
        accelerator that is the CPU, as it is anyway. ``"host"``: every kernel on the host CPU
        (``jax.default_device(jax.devices("cpu")[0])`` in the block), whatever the accelerator. A TPU has no
        float64 arithmetic: float64 work runs on its host under every setting.

    Returns
    -------
    contextlib.AbstractContextManager
        A context manager; ``with compute_on(...) as device`` binds the JAX device the block's kernels run on
        unless a rule moves them (under ``"host"``, the host CPU). Nothing global changes: JAX's default
        device is set for the block in this thread only, and no flag of JAX is flipped. Blocks nest, the
        innermost winning.

    Raises
    ------
    ValueError
        If ``where`` is not one of ``"auto"``, ``"accelerator"``, ``"host"`` (the message names it and them), or
        ``NAPARI_GRIDMIP_COMPUTE_ON`` holds another value when a kernel reads it.

    Examples
    --------
    >>> import numpy as np
    >>> import napari_gridmip as gm
    >>> with gm.compute_on("host") as device:
    ...     levels = gm.max_mipmap(np.ones((4, 4, 4), np.float32))
    >>> device.platform, levels[1].devices() == {device}
    ('cpu', True)
    """
    with strategy.compute_scope(where) as device:
        yield device
