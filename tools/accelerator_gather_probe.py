"""What an affine IC-GN step's reads cost on an accelerator: the B-spline's 16 taps at every subset pixel's warped
position as 16 element gathers (the library's ``affine._interpolate``) against one gather of table rows (each
position's 4x4 coefficients as one row of 16 values), and the subsets at the points' integer grid as element
gathers against static slices of the image's phase planes (issue 34: the 1024^2 affine DIC took 33.8 s warm on a
TPU v5e against 2.0 s on its host, and runs on the host there since). Prints warm seconds, best of 3, and whether
the two ways agree.

    python tools/accelerator_gather_probe.py [--size 1024] [--step 4] [--subset 31]
    python tools/accelerator_gather_probe.py --widths 1,16,128,512,4096   # gathers by row width only

``--widths``: the throughput of one gather of whole rows from a table of 256 MiB, by row width (float32 values
per row), each gathering 256 MiB in all: the figure a design of gathered bricks or blocks (the live view's render,
an IC-GN without element taps) needs first.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def best(f, *args, repeats=3):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return min(times), f(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--step", type=int, default=4)
    parser.add_argument("--subset", type=int, default=31)
    parser.add_argument("--widths", default="", help="row widths to time gathers of (and nothing else)")
    args = parser.parse_args()
    if args.widths:
        row_widths([int(w) for w in args.widths.split(",")])
        return
    n, step, s = args.size, args.step, args.subset
    rng = np.random.default_rng(0)
    coefficients = jnp.asarray(rng.random((1, n + 4, n + 4), dtype=np.float32))
    grid = (n - s - 12) // step
    cy = np.arange(grid) * step + 6 + s // 2
    cyy, cxx = np.meshgrid(cy, cy, indexing="ij")
    hs = s // 2
    eta, zeta = np.meshgrid(np.arange(-hs, hs + 1), np.arange(-hs, hs + 1), indexing="ij")
    py = jnp.asarray(
        (cyy.ravel()[:, None] + eta.ravel()[None] + rng.uniform(-2, 2, (grid * grid, 1))).astype(np.float32)
    )
    px = jnp.asarray(
        (cxx.ravel()[:, None] + zeta.ravel()[None] + rng.uniform(-2, 2, (grid * grid, 1))).astype(np.float32)
    )
    print(f"{jax.default_backend()}: {n}^2, {grid * grid} points x {s * s} subset pixels", flush=True)

    from napari_gridmip.core.correlation import affine

    interpolate = jax.jit(affine._interpolate)
    t_elements, a = best(interpolate, coefficients, py, px)
    print(f"16 element gathers: {t_elements:.4f} s", flush=True)

    @jax.jit
    def table_of(c):
        k, rows, cols = c.shape
        taps = [c[:, a : rows - 3 + a, b : cols - 3 + b] for a in range(4) for b in range(4)]
        return jnp.stack(taps, -1).reshape(k * (rows - 3) * (cols - 3), 16)

    @jax.jit
    def table_interpolate(table, c_shape, py, px):
        rows, cols = c_shape
        py = jnp.clip(py, 0, rows - 5)
        px = jnp.clip(px, 0, cols - 5)
        y0, x0 = jnp.floor(py), jnp.floor(px)
        wy, wx = affine._weights(py - y0), affine._weights(px - x0)
        index = (y0.astype(jnp.int32) + 1) * (cols - 3) + x0.astype(jnp.int32) + 1
        taps = jnp.take(table, index, axis=0)  # (..., 16)
        out = 0
        for i in range(4):
            row = 0
            for j in range(4):
                row = row + wx[j] * taps[..., i * 4 + j]
            out = out + wy[i] * row
        return out[None]

    table = table_of(coefficients)
    shape = coefficients.shape[1:]
    t_table, b = best(lambda t, y, x: table_interpolate(t, shape, y, x), table, py, px)
    print(f"table rows of 16: {t_table:.4f} s; largest difference {float(jnp.max(jnp.abs(a - b))):.3g}", flush=True)

    image = coefficients[:, 2:-2, 2:-2]
    first = 6
    index = jnp.asarray((cyy.ravel()[:, None] + eta.ravel()[None]) * n + cxx.ravel()[:, None] + zeta.ravel()[None])

    @jax.jit
    def element_subsets(img, index):
        return jnp.take(img.reshape(1, -1), index, axis=1, mode="clip")

    @jax.jit
    def phase_subsets(img):
        k, m, w = img.shape
        size = -(-max(m, w) // step) * step + step * (s // step + 2)
        padded = jnp.pad(img, ((0, 0), (0, size - m), (0, size - w)))
        phases = padded.reshape(k, size // step, step, size // step, step).transpose(0, 2, 4, 1, 3)
        planes = []
        for e in range(s):
            qy, ry = divmod(first + e, step)
            for z in range(s):
                qx, rx = divmod(first + z, step)
                planes.append(phases[:, ry, rx, qy : qy + grid, qx : qx + grid])
        return jnp.stack(planes, -1).reshape(k, grid * grid, s * s)

    t_el, c = best(element_subsets, image, index)
    t_ph, d = best(phase_subsets, image)
    print(f"subsets: element gathers {t_el:.4f} s, phase-plane slices {t_ph:.4f} s; equal: {bool(jnp.all(c == d))}")


def row_widths(widths: list[int]) -> None:
    """Seconds and GB/s of one ``jnp.take`` of random rows (256 MiB gathered) from a 256 MiB table, per width."""
    rng = np.random.default_rng(1)
    values = 1 << 26  # 256 MiB of float32, the table and the gathered rows alike
    print(f"{jax.default_backend()}: gathers of 256 MiB from a 256 MiB table", flush=True)
    for width in widths:
        rows = values // width
        table = jnp.asarray(rng.random((rows, width), dtype=np.float32))
        index = jnp.asarray(rng.integers(0, rows, rows, dtype=np.int32))
        take = jax.jit(lambda t, i: jnp.take(t, i, axis=0))
        seconds, out = best(take, table, index)
        same = bool(jnp.array_equal(out[:5], table[index[:5]]))
        print(
            f"rows of {width:5d}: {seconds:.4f} s, {values * 4 / seconds / 1e9:6.1f} GB/s ({rows} rows); right: {same}",
            flush=True,
        )
        del table, index, out


if __name__ == "__main__":
    main()
