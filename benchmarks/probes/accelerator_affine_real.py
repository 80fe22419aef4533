"""The affine DIC on public real images (DIC Challenge 1.0 sample 1): the host CPU's IC-GN against an accelerator's.

The accelerator's strategies: one window per point, a band's rows together (``core._backend.spline_windows`` and
``ic_gn_rows_together``). The images: the DIC Challenge 1.0 sample 1 shift series (8-bit, 512 x 512, 0.1 px
steps), as published by jaredvanblitterswyk/image_deformation
(``rigid_body_translation/reu_sample1_00_upsample_10_rigid_pixel_shift``).

    python benchmarks/probes/accelerator_affine_real.py DIR

On a CPU-only machine the accelerator's strategies are forced on the CPU; on an accelerator they run on it as
its defaults, against the same call inside ``strategy.on_host()``. Prints, per shift, the largest differences
of the fields and whether their NaN agree (the bound: 1e-3 px), and the host's dx bias.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import jax
import numpy as np
import tifffile

from napari_gridmip import find_displacement
from napari_gridmip.core.runtime import strategy

ARGS = dict(subset=(31, 31), step=8, subpixel="refine", shape="affine")


@contextlib.contextmanager
def accelerators_strategies():
    """The accelerator's strategies: its own defaults there, forced on a CPU."""
    if jax.default_backend() != "cpu":
        yield
        return
    saved = (strategy.spline_windows, strategy.ic_gn_rows_together)
    strategy.spline_windows = strategy.ic_gn_rows_together = lambda: True
    try:
        yield
    finally:
        strategy.spline_windows, strategy.ic_gn_rows_together = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="the reu_sample1_00_upsample_10_rigid_pixel_shift folder")
    parser.add_argument("--shifts", default="1,3,5,7", help="images of the series (tenths of a pixel)")
    args = parser.parse_args()
    reference = tifffile.imread(args.dir / "trxy_s2_00_0.tiff").astype(np.float32)[None]
    print(f"{jax.default_backend()}: affine DIC, window 7, {ARGS}")
    for k in (int(s) for s in args.shifts.split(",")):
        image = tifffile.imread(args.dir / f"trxy_s2_00_{k}.tiff").astype(np.float32)[None]
        with strategy.on_host():
            host = find_displacement(image, reference, (7, 7), **ARGS)
        with accelerators_strategies():
            other = find_displacement(image, reference, (7, 7), **ARGS)
        diff = {n: float(np.nanmax(np.abs(np.asarray(getattr(other, n)) - np.asarray(getattr(host, n)))))
                for n in host._fields}  # fmt: skip
        same_nan = all(
            np.array_equal(np.isnan(np.asarray(getattr(other, n))), np.isnan(np.asarray(getattr(host, n))))
            for n in host._fields
        )
        gradients = max(diff[n] for n in ("dy_y", "dy_x", "dx_y", "dx_x"))
        dx = np.asarray(host.dx)  # img1 is the shifted image: dx = -shift
        print(f"shift {k / 10:.1f} px: host dx bias {np.nanmean(dx) + k / 10:+.4f}; accelerator's against the host: "
              f"dy {diff['dy']:.1e}, dx {diff['dx']:.1e} px, gradients {gradients:.1e}, zncc {diff['peak']:.1e}; "
              f"same NaN: {same_nan}; {dx.size} points")  # fmt: skip


if __name__ == "__main__":
    main()
