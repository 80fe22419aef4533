"""Occupancy mipmap of a 512^3 bool volume: ours against the problem statement's method and the usual answers.

Peers: the statement's ``lax.reduce_window`` (eager and jitted), the strongest reduce_window variant, a strided
ones-kernel conv and NumPy reshape-and-any; on the device and end to end from NumPy, alternating.

    python -m benchmarks run mipmap [--quick] [--size 512 --repeats 7]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).parent))
from _harness import alternate, block, machine, ratio, start_run, table  # noqa: E402

from napari_gridmip import occupancy_mipmap  # noqa: E402

# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Baselines, all in one process, timed alternating (``--repeats`` rounds, each
calling every row once, after a warm-up; best and median):
(s) the statement's method, written here to its recipe: ``lax.reduce_window``
    with ``lax.max`` over 2x2x2 windows, stride 2, ``'SAME'`` padding, every
    level kept as int32, one dispatch per level (eager, as written);
(s') the same jitted as a whole (one program for all levels, int32 levels);
(a) the strongest reduce_window variant we found: jitted as a whole, bool
    levels (no int32 copies), ``lax.bitwise_or``, ``'VALID'``;
(b) a 2x2x2 ones-kernel strided conv per level (the question's own code, jitted per level),
(c) NumPy reshape-and-any.
Twice: with the volume already on the JAX device, and end to end from a NumPy
array to NumPy levels (what the widget does).
"""


def statement_mipmap(grid):
    """(s) The statement's recipe: reduce_window max over 2x2x2, 'SAME', int32 levels, one dispatch per level.

    Cubic power-of-two volumes only, as in the statement. Eager: each level is
    its own reduce_window dispatch and its own int32 conversion.
    """
    current = jnp.asarray(grid, dtype=jnp.bool_)
    levels = [current.astype(jnp.int32)]
    for _ in range(int(math.log2(grid.shape[0]))):
        current = lax.reduce_window(current, False, lax.max, (2, 2, 2), (2, 2, 2), "SAME")
        levels.append(current.astype(jnp.int32))
    return levels


statement_mipmap_jit = jax.jit(statement_mipmap)  # (s') the same, one program for all levels


@jax.jit
def reduce_window_bool(grid):
    """(a) The strongest reduce_window variant we found: one program, bool levels, bitwise_or, 'VALID'."""
    levels = [grid]
    for _ in range(int(math.log2(grid.shape[0]))):
        levels.append(lax.reduce_window(levels[-1], False, lax.bitwise_or, (2, 2, 2), (2, 2, 2), "VALID"))
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
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7, help="rounds of alternating calls")
    parser.add_argument("--quick", action="store_true", help="128^3, 3 rounds")
    args = parser.parse_args()
    start_run("mipmap", args)
    if args.quick:
        args.size, args.repeats = 128, 3
    size, rounds = args.size, args.repeats

    host = make_volume(size)
    device = jax.device_put(host)
    ours = "occupancy_mipmap (ours)"
    stmt, stmt_jit, strongest = (
        "(s) statement: reduce_window max, SAME, int32 levels, eager",
        "(s') statement jitted as a whole (int32 levels)",
        "(a) reduce_window jitted as a whole, bool levels",
    )
    print(f"occupancy mipmap of a {size}^3 bool volume ({host.mean():.2%} occupied); {machine()}\n")
    resident = alternate(
        [
            (ours, lambda: occupancy_mipmap(device), "bool levels"),
            (stmt, lambda: statement_mipmap(device), "one dispatch per level"),
            (stmt_jit, lambda: statement_mipmap_jit(device)),
            (strongest, lambda: reduce_window_bool(device)),
            ("(b) ones-kernel strided conv loop", lambda: conv_loop(device)),
            ("(c) NumPy reshape + any", lambda: numpy_reshape_any(host), "host input"),
        ],
        rounds=rounds,
    )
    print(table("Volume already on the JAX device", resident, ours))
    print()

    def to_numpy(levels):
        return [np.asarray(level) for level in levels]

    end_to_end = alternate(
        [
            (ours, lambda: to_numpy(occupancy_mipmap(host))),
            (stmt, lambda: to_numpy(statement_mipmap(host)), "jnp.asarray inside, as written"),
            (stmt_jit, lambda: to_numpy(statement_mipmap_jit(host))),
            (strongest, lambda: to_numpy(reduce_window_bool(jnp.asarray(host)))),
            ("(b) ones-kernel strided conv loop", lambda: to_numpy(conv_loop(jnp.asarray(host)))),
            ("(c) NumPy reshape + any", lambda: numpy_reshape_any(host)),
            (
                "floor: one NumPy read of the volume",
                lambda: np.bitwise_or.reduce(host.view(np.uint64), axis=None),
                "lower bound",
            ),
            ("jnp.asarray of the volume alone", lambda: block(jnp.asarray(host)), "the transfer the baselines pay"),
        ],
        rounds=rounds,
    )
    print(table("End to end: NumPy volume in, NumPy levels out", end_to_end, ours))
    # the outputs checked after the timing, so that each row's first call is the process's (compiles included)
    expected = numpy_reshape_any(host)
    for name, fn in [
        ("ours", occupancy_mipmap),
        ("statement", statement_mipmap),
        ("statement jit", statement_mipmap_jit),
        ("reduce_window bool", reduce_window_bool),
        ("conv", conv_loop),
    ]:
        got = fn(device)
        assert len(got) == len(expected) and all(np.array_equal(np.asarray(g), e) for g, e in zip(got, expected)), name
    print("\nOurs against (ratios of best times, this run):")
    for label, rows in (("device-resident", resident), ("end to end", end_to_end)):
        print(
            f"- {label}: {ratio(rows, stmt, ours):.2f}x the statement as written, "
            f"{ratio(rows, stmt_jit, ours):.2f}x it jitted, {ratio(rows, strongest, ours):.2f}x the strongest variant"
        )


if __name__ == "__main__":
    main()
