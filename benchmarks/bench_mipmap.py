"""Occupancy mipmap of a 512^3 bool volume: ours against the usual answers.

    python benchmarks/bench_mipmap.py [--size 512] [--repeats 7]

Baselines, all in the same run, after a warm-up, best of ``--repeats``:
(a) lax.reduce_window per level in a Python loop (the well-known answer),
(b) a 2x2x2 ones-kernel strided conv per level,
(c) NumPy reshape-and-any.
Twice: with the volume already on the JAX device, and end to end from a NumPy
array to NumPy levels (what the widget does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).parent))
from _harness import block, machine, measure, table  # noqa: E402

from napari_gridmip import occupancy_mipmap  # noqa: E402


@jax.jit
def _reduce_window_level(grid):
    return lax.reduce_window(grid, False, lax.bitwise_or, (2, 2, 2), (2, 2, 2), "VALID")


def reduce_window_loop(grid):
    """(a) As in the original answer: cubic power-of-two volumes, a float log2 and one dispatch per level."""
    levels = [grid]
    for _ in range(int(jnp.log2(grid.shape[0]))):
        levels.append(_reduce_window_level(levels[-1]))
    return levels


@jax.jit
def _conv_level(grid):
    kernel = jnp.ones((1, 1, 2, 2, 2), jnp.float32)
    out = lax.conv_general_dilated(grid.astype(jnp.float32)[None, None], kernel, (2, 2, 2), "VALID")
    return out[0, 0] > 0


def conv_loop(grid):
    """(b) A strided conv with a ones kernel, one level at a time."""
    levels = [grid]
    for _ in range(int(jnp.log2(grid.shape[0]))):
        levels.append(_conv_level(levels[-1]))
    return levels


def numpy_reshape_any(grid):
    """(c) NumPy: reshape into 2x2x2 blocks and any() (power-of-two sizes)."""
    levels = [grid]
    while levels[-1].shape[0] > 1:
        g = levels[-1]
        d, h, w = g.shape
        levels.append(g.reshape(d // 2, 2, h // 2, 2, w // 2, 2).any(axis=(1, 3, 5)))
    return levels


def make_volume(size: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    volume = rng.random((size, size, size), dtype=np.float32) > 0.995  # scattered voxels
    volume[size // 4 : size // 2, size // 4 : size // 2, size // 3 : size // 2] = True  # and a solid block
    return volume


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    size, repeats = args.size, args.repeats

    host = make_volume(size)
    device = jax.device_put(host)
    expected = numpy_reshape_any(host)
    for name, fn in [("ours", occupancy_mipmap), ("reduce_window", reduce_window_loop), ("conv", conv_loop)]:
        got = fn(device)
        assert len(got) == len(expected) and all(np.array_equal(np.asarray(g), e) for g, e in zip(got, expected)), name

    print(f"occupancy mipmap of a {size}^3 bool volume ({host.mean():.2%} occupied); {machine()}\n")
    resident = [
        measure("occupancy_mipmap (ours)", lambda: occupancy_mipmap(device), repeats=repeats),
        measure("(a) lax.reduce_window loop", lambda: reduce_window_loop(device), repeats=repeats),
        measure("(b) ones-kernel strided conv loop", lambda: conv_loop(device), repeats=repeats),
        measure("(c) NumPy reshape + any", lambda: numpy_reshape_any(host), repeats=repeats, note="host input"),
    ]
    print(table("Volume already on the JAX device", resident, "occupancy_mipmap (ours)"))
    print()

    def to_numpy(levels):
        return [np.asarray(level) for level in levels]

    end_to_end = [
        measure("occupancy_mipmap (ours)", lambda: to_numpy(occupancy_mipmap(host)), repeats=repeats),
        measure(
            "(a) lax.reduce_window loop",
            lambda: to_numpy(reduce_window_loop(jnp.asarray(host))),
            repeats=repeats,
        ),
        measure("(b) ones-kernel strided conv loop", lambda: to_numpy(conv_loop(jnp.asarray(host))), repeats=repeats),
        measure("(c) NumPy reshape + any", lambda: numpy_reshape_any(host), repeats=repeats),
        measure(
            "floor: one NumPy read of the volume",
            lambda: np.bitwise_or.reduce(host.view(np.uint64), axis=None),
            repeats=repeats,
            note="lower bound",
        ),
        measure(
            "jnp.asarray of the volume alone",
            lambda: block(jnp.asarray(host)),
            repeats=repeats,
            note="the transfer the baselines pay",
        ),
    ]
    print(table("End to end: NumPy volume in, NumPy levels out", end_to_end, "occupancy_mipmap (ours)"))


if __name__ == "__main__":
    main()
