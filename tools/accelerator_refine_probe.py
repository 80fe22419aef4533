"""Where the refinement's time goes on an accelerator: its band program with img1's taps gathered as 4x4 blocks
of K-vectors (the library's layout, K last), against a layout with each row's columns and frames flattened
into one axis, so that a block is 4 gathered runs of 4 K contiguous values, and against a table of every
block as one row (16 K values; 16x img1's memory), gathered as an embedding lookup (issue 34:
find_displacement refine ran 0.2x its host CPU on a TPU v5e). Prints warm seconds per band and whole image,
each layout, and whether they agree.

    python tools/accelerator_refine_probe.py [--size 1024] [--frames 10] [--rows 256]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core.correlation import refine


def blocks_k_last(img1k, item, rows, cols, k):
    zero = jnp.int32(0)
    take = jax.vmap(jax.vmap(lambda r, c: lax.dynamic_slice(img1k, (item, r, c, zero), (1, 4, 4, k))[0]))
    return take(rows, cols)


def blocks_flat(img1f, item, rows, cols, k):
    take = jax.vmap(jax.vmap(lambda r, c: lax.dynamic_slice(img1f, (item, r, c * k), (1, 4, 4 * k))[0]))
    return take(rows, cols).reshape(rows.shape + (4, 4, k))


def block_table(img1k, lanes: int = 0):
    """Every 4x4 block of K-vectors as one row of a table ``(B * R * C, 16 K)`` (padded to ``lanes``): a block is
    then one row gathered by its index, as an embedding lookup (16x img1's memory)."""
    batch, rows, cols, k = img1k.shape
    r, c = rows - 3, cols - 3
    parts = [img1k[:, i : i + r, j : j + c, :] for i in range(4) for j in range(4)]
    table = jnp.stack(parts, axis=3).reshape(batch * r * c, 16 * k)
    if lanes and table.shape[1] % lanes:
        table = jnp.pad(table, ((0, 0), (0, lanes - table.shape[1] % lanes)))
    return table, (r, c)


def blocks_table(table_and_shape, item, rows, cols, k):
    table, (r, c) = table_and_shape
    index = (item * r + rows) * c + cols
    found = jnp.take(table, index.reshape(-1), axis=0, mode="clip")[:, : 16 * k]
    return found.reshape(rows.shape + (4, 4, k))


TAKES = {"k-last": blocks_k_last, "flat": blocks_flat, "table": blocks_table, "table-256": blocks_table}


@partial(jax.jit, static_argnames=("layout", "block"))
def newton_band(img, z2, dy, dx, row0, *, layout, block):
    k = z2.shape[1]
    rows_all, cols_all = z2.shape[-2:]
    out_cols = dy.shape[-1]
    x = jnp.arange(out_cols, dtype=dy.dtype)[None, :]
    y = (row0 + jnp.arange(block, dtype=jnp.int32)).astype(dy.dtype)[:, None]
    z = jnp.moveaxis(lax.dynamic_slice(z2[0], (0, row0, 0), (k, block, out_cols)), 0, -1)
    py = jnp.clip(y + lax.dynamic_slice(dy[0], (row0, 0), (block, out_cols)), 0, rows_all - 1)
    px = jnp.clip(x + lax.dynamic_slice(dx[0], (row0, 0), (block, out_cols)), 0, cols_all - 1)
    take = TAKES[layout]

    def newton(_, position):
        py, px = position
        y0, x0 = jnp.floor(py), jnp.floor(px)
        blocks = take(
            img, jnp.int32(0), y0.astype(jnp.int32) - 1 + refine.PAD, x0.astype(jnp.int32) - 1 + refine.PAD, k
        )
        sy, sx = refine._newton_step(blocks, py - y0, px - x0, z)
        return jnp.clip(py + sy, 0, rows_all - 1), jnp.clip(px + sx, 0, cols_all - 1)

    return lax.fori_loop(0, refine.ITERATIONS, newton, (py, px))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=10)
    parser.add_argument("--rows", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n, k = args.size, args.frames
    img1 = rng.random((1, k, n, n), np.float32)
    img1k = refine._padded_k_last(jnp.asarray(img1), dtype="float32")
    img1f = img1k.reshape(img1k.shape[0], img1k.shape[1], -1)
    z2 = jnp.asarray(rng.standard_normal((1, k, n, n), np.float32))
    dy = jnp.asarray(rng.uniform(-3, 3, (1, n, n)).astype(np.float32))
    dx = jnp.asarray(rng.uniform(-3, 3, (1, n, n)).astype(np.float32))
    print(jax.devices(), f"{n}^2, K={k}, band {args.rows} rows")
    results = {}
    t0 = time.perf_counter()
    tables = {"table": jax.block_until_ready(block_table(img1k)), "table-256": block_table(img1k, 128)}
    jax.block_until_ready(tables["table-256"])
    print(f"block tables made in {time.perf_counter() - t0:.3f} s (eager, first)")
    for layout, img in (
        ("k-last", img1k),
        ("flat", img1f),
        ("table", tables["table"]),
        ("table-256", tables["table-256"]),
    ):
        run = partial(newton_band, img, z2, dy, dx, layout=layout, block=args.rows)
        t0 = time.perf_counter()
        jax.block_until_ready(run(jnp.int32(0)))
        first = time.perf_counter() - t0
        best = np.inf
        for _ in range(3):
            t0 = time.perf_counter()
            results[layout] = jax.block_until_ready(run(jnp.int32(0)))
            best = min(best, time.perf_counter() - t0)
        print(f"{layout}: first {first:.3f} s, band {best:.4f} s, image ~{best * n / args.rows:.3f} s")
    maker = jax.jit(partial(block_table, lanes=128))
    jax.block_until_ready(maker(img1k))
    t0 = time.perf_counter()
    jax.block_until_ready(maker(img1k))
    print(f"block table (256 lanes), jitted, warm: {time.perf_counter() - t0:.4f} s")
    for layout in ("flat", "table", "table-256"):
        difference = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(results["k-last"], results[layout]))
        print(f"largest difference k-last / {layout}: {difference:.3g}")


if __name__ == "__main__":
    main()
