"""Where an accelerator's windowed IC-GN interpolation (``affine._interpolate_windows``) spends a step: the
windows' read (one ``dynamic_slice`` per point, vmapped: a gather of partial rows) against a gather of whole rows
of a table of strided tiles, and the weighted slices on a window already read, against the 16 element gathers of
``affine._interpolate``, on the default device and on the host CPU (issue 34: the 1024^2 affine DIC's IC-GN on a
TPU v5e took 4.6 s warm with the windows against 1.9 s on its host). Prints warm seconds, best of 3.

    python tools/accelerator_window_probe.py [--points 8000] [--size 1024] [--subset 31]
"""

from __future__ import annotations

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from accelerator_gather_probe import best as gather_best  # tools/ is the script's folder: on sys.path
from jax import lax

from napari_gridmip.core.correlation import affine


def best(f, *args):
    """The best warm time of 3 (accelerator_gather_probe.py's timing, run from this folder)."""
    return gather_best(f, *args)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=8000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--subset", type=int, default=31)
    args = parser.parse_args()
    n, size, s = args.points, args.size, args.subset
    rng = np.random.default_rng(0)
    c = rng.random((1, size + 4, size + 4), dtype=np.float32)
    hs = s // 2
    eta, zeta = (a.ravel().astype(np.float32) for a in np.meshgrid(np.arange(-hs, hs + 1), np.arange(-hs, hs + 1),
                                                                   indexing="ij"))  # fmt: skip
    cy = rng.integers(hs + 8, size - hs - 8, n).astype(np.float32)[:, None]
    cx = rng.integers(hs + 8, size - hs - 8, n).astype(np.float32)[:, None]
    p = rng.normal(scale=[2, 0.01, 0.01, 2, 0.01, 0.01], size=(n, 6)).astype(np.float32)
    py = cy + eta + p[:, :1] + p[:, 1:2] * eta + p[:, 2:3] * zeta
    px = cx + zeta + p[:, 3:4] + p[:, 4:5] * eta + p[:, 5:6] * zeta
    taps = 2 * affine.SPLINE_MARGIN + 4
    height = s + taps - 1
    top = rng.integers(0, size + 4 - height, n).astype(np.int32)
    left = rng.integers(0, size + 4 - height, n).astype(np.int32)
    stride = 8
    wide = height + stride  # a tile holds every window starting in its stride x stride corner

    @jax.jit
    def windows(c, top, left):
        return jax.vmap(lambda y, x: lax.dynamic_slice(c, (0, y, x), (1, height, height)), out_axes=-1)(top, left)

    @jax.jit
    def tiles(c):
        grid = (c.shape[1] - wide) // stride + 1
        rows = [c[0, i * stride : i * stride + wide] for i in range(grid)]  # static slices: (wide, cols) each
        strip = jnp.stack(rows)  # (grid, wide, cols)
        cols = [strip[:, :, j * stride : j * stride + wide] for j in range(grid)]
        return jnp.stack(cols, 1).reshape(grid * grid, wide * wide), grid

    @partial(jax.jit, static_argnums=2)
    def tile_rows(table, index, grid):
        return table[index]

    @jax.jit
    def weighted(window, wy, wx):  # the 64 weighted slices of a window already read
        out = 0
        for a in range(taps):
            row = 0
            for b in range(taps):
                row = row + wx[b] * window[:, a : a + s, b : b + s]
            out = out + wy[a] * row
        return out

    gathers = jax.jit(affine._interpolate)
    windowed = jax.jit(partial(affine._interpolate_windows, subset=(s, s)))
    for where in (jax.devices()[0], jax.devices("cpu")[0]):
        with jax.default_device(where):
            cd, pyd, pxd, topd, leftd = jax.device_put((c, py, px, top, left), where)
            print(f"{where.platform}: {n} points x {s}^2 pixels, image {size}^2", flush=True)
            print(f"  16 element gathers (_interpolate):          {best(gathers, cd, pyd, pxd):.4f} s", flush=True)
            print(f"  windows (_interpolate_windows):             {best(windowed, cd, pyd, pxd):.4f} s", flush=True)
            print(f"  its windows' read (vmapped dynamic_slice):  {best(windows, cd, topd, leftd):.4f} s", flush=True)
            table, grid = tiles(cd)
            index = jnp.asarray((top // stride) * int(grid) + left // stride)
            print(f"  tile table ({table.shape[0]} x {wide}^2) made in  {best(lambda a: tiles(a)[0], cd):.4f} s",
                  flush=True)  # fmt: skip
            print(f"  tile rows' gather:                          {best(tile_rows, table, index, int(grid)):.4f} s",
                  flush=True)  # fmt: skip
            window = windows(cd, topd, leftd)
            wy = [jnp.full((s, s, n), 1.0 / taps, jnp.float32)] * taps
            print(f"  64 weighted slices of read windows:         {best(weighted, window, wy, wy):.4f} s", flush=True)


if __name__ == "__main__":
    main()
