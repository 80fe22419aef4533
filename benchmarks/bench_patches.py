"""Reassembling images from patches: ours against the problem statement's two methods, NumPy and tiler.

Peers: the statement's jitted reshape/transpose and its ``lax.scatter``, NumPy's transpose-and-copy, and tiler's
Merger (boxcar, hann) for overlapping tiles; alternating in one process.

    python -m benchmarks run patches [--quick] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).parent))
from _harness import alternate, machine, ratio, start_run, table  # noqa: E402

from napari_gridmip import extract_patches, merge_patches  # noqa: E402
from napari_gridmip.core.patches.grid import patch_origins  # noqa: E402

# The method in full: ``--help`` prints it after the options.
DETAILS = """\
(a) Non-overlapping (16, 16, 3, 256, 256) float32 patches -> (3, 4096, 4096):
    merge_patches with the patches already on the JAX device, against the
    statement's two methods written here to its recipe: its jitted
    reshape/transpose, and its ``lax.scatter`` of every element to its own
    output index (indices from a meshgrid, the batch axis 0 included, jitted as
    a whole); plus NumPy's transpose-and-copy and the end-to-end figure from
    and to NumPy. The statement's reshape alone is wrong: reshaping
    ``(V, H, C, PH, PW)`` straight to ``(V*PH, H*PW, C)`` interleaves patch rows
    with channels (checked below: it does not give the image back); the row
    timed moves the axes first, ``(C, V, PH, H, PW)``, then reshapes, as its
    answer meant to.
(b) Overlapping tiles of a 2048x2048x3 image, 256-pixel tiles, stride 128:
    merge_patches "mean" and "gaussian" against tiler's Merger (boxcar and
    hann windows), with each one's round-trip error, border included; and the
    statement's scatter, which it offers for overlapping patches: as written
    (overlaps are overwritten, by whichever update XLA applies last) against
    our "overwrite", and as a scatter-add of values and of ones then a
    division (our extension, the mean) against our "mean".
All rows of a table in one process, timed alternating (``--repeats`` rounds,
each calling every row once, after a warm-up; best and median).
"""


def numpy_transpose_copy(patches: np.ndarray) -> np.ndarray:
    v, h, c, ph, pw = patches.shape
    return np.ascontiguousarray(patches.transpose(2, 0, 3, 1, 4)).reshape(c, v * ph, h * pw)


@jax.jit
def statement_reshape_transpose(patches):
    """The statement's jitted reshape/transpose, with the axes moved before the reshape (see the module doc)."""
    v, h, c, ph, pw = patches.shape
    image = jnp.transpose(patches, (2, 0, 3, 1, 4)).reshape(c, v * ph, h * pw)
    return jnp.expand_dims(image, 0)


def statement_reshape_alone(patches):
    """The statement's reshape as written: ``(V, H, C, PH, PW)`` -> ``(V*PH, H*PW, C)`` -> channels first. Wrong."""
    v, h, c, ph, pw = patches.shape
    return jnp.expand_dims(jnp.transpose(jnp.reshape(patches, (v * ph, h * pw, c)), (2, 0, 1)), 0)


def statement_scatter(patches, image_shape, origins):
    """The statement's lax.scatter: every element to (0, channel, row, col), into zeros of shape (1, C, H, W).

    ``origins`` are the patches' first rows and columns (``v * PH`` and ``h * PW``
    without overlap, as in the statement; any grid here).
    """
    v, h, c, ph, pw = patches.shape
    iv, ih, ic, iy, ix = jnp.meshgrid(*(jnp.arange(n) for n in patches.shape), indexing="ij")
    rows = jnp.asarray(origins[0])[iv] + iy
    cols = jnp.asarray(origins[1])[ih] + ix
    indices = jnp.stack([jnp.zeros_like(rows), ic, rows, cols], axis=-1)
    numbers = lax.ScatterDimensionNumbers(
        update_window_dims=(), inserted_window_dims=(0, 1, 2, 3), scatter_dims_to_operand_dims=(0, 1, 2, 3)
    )
    return indices, numbers


@partial(jax.jit, static_argnums=(1, 2))
def scatter_set(patches, image_shape, origins):
    indices, numbers = statement_scatter(patches, image_shape, origins)
    return lax.scatter(jnp.zeros((1, *image_shape), patches.dtype), indices, patches, numbers)


@partial(jax.jit, static_argnums=(1, 2))
def scatter_mean(patches, image_shape, origins):
    """The statement's scatter as a scatter-add of values and of ones, then their ratio: a mean at overlaps."""
    indices, numbers = statement_scatter(patches, image_shape, origins)
    zeros = jnp.zeros((1, *image_shape), patches.dtype)
    total = lax.scatter_add(zeros, indices, patches, numbers)
    count = lax.scatter_add(zeros, indices, jnp.ones_like(patches), numbers)
    return total / count


def tiler_merge(image_hwc: np.ndarray, window: str, tile: int, overlap: int) -> np.ndarray:
    from tiler import Merger, Tiler

    tiler = Tiler(
        data_shape=image_hwc.shape, tile_shape=(tile, tile, image_hwc.shape[2]), overlap=overlap, channel_dimension=2
    )
    tiles = np.stack([t for _, t in tiler.iterate(image_hwc)])
    merger = Merger(tiler, window=window)

    def run():
        merger.reset()
        merger.add_batch(0, len(tiles), tiles)
        return merger.merge(unpad=True)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="rounds of alternating calls")
    parser.add_argument("--quick", action="store_true", help="(a) 8x8 patches of 128, (b) 512x512, 3 rounds")
    args = parser.parse_args()
    start_run("patches", args)
    grid, patch, side = (8, 128, 512) if args.quick else (16, 256, 2048)
    rounds = 3 if args.quick else args.repeats
    print(f"merge_patches benchmarks; {machine()}; {rounds} rounds, alternating\n")

    # (a) non-overlapping
    rng = np.random.default_rng(0)
    host = rng.random((grid, grid, 3, patch, patch), dtype=np.float32)
    device = jax.device_put(host)
    shape, stride = (3, grid * patch, grid * patch), (patch, patch)
    origins = tuple(tuple(range(0, grid * patch, patch)) for _ in range(2))
    expected = numpy_transpose_copy(host)
    assert np.array_equal(np.asarray(merge_patches(device, shape, stride)), expected)
    assert np.array_equal(np.asarray(statement_reshape_transpose(device))[0], expected)
    assert np.array_equal(np.asarray(scatter_set(device, shape, origins))[0], expected)
    assert not np.array_equal(np.asarray(statement_reshape_alone(device))[0], expected), "the reshape alone is wrong"
    ours = "merge_patches (ours), on device"
    stmt_reshape = "statement's jitted reshape/transpose (axes moved first)"
    stmt_scatter = "statement's lax.scatter, jitted"
    rows = alternate(
        [
            (ours, lambda: merge_patches(device, shape, stride)),
            (stmt_reshape, lambda: statement_reshape_transpose(device), "output (1, C, H, W)"),
            (stmt_scatter, lambda: scatter_set(device, shape, origins), "every element to its own index"),
            ("NumPy transpose + copy", lambda: numpy_transpose_copy(host)),
            ("merge_patches (ours), NumPy in and out", lambda: np.asarray(merge_patches(host, shape, stride))),
        ],
        rounds=rounds,
    )
    print(table(f"(a) {host.shape} float32 -> {shape}, no overlap", rows, ours))
    print(
        f"\nOurs: {ratio(rows, stmt_reshape, ours):.2f}x the statement's reshape/transpose, "
        f"{ratio(rows, stmt_scatter, ours):.2f}x its scatter, {ratio(rows, 'NumPy transpose + copy', ours):.2f}x NumPy"
    )
    print()

    # (b) overlapping
    tile, step = side // 8, side // 16
    image = rng.random((3, side, side), dtype=np.float32)
    patches = extract_patches(image, (tile, tile), (step, step))
    patches_host = np.asarray(patches)
    image_hwc = np.ascontiguousarray(image.transpose(1, 2, 0))
    origins = tuple(tuple(int(o) for o in patch_origins(side, tile, step)) for _ in range(2))
    merge = {
        blend: (lambda blend=blend: merge_patches(patches, image.shape, (step, step), blend=blend))
        for blend in ("mean", "gaussian", "overwrite")
    }
    errors = {blend: float(np.abs(np.asarray(run()) - image).max()) for blend, run in merge.items()}
    runs = {w: tiler_merge(image_hwc, w, tile, tile - step) for w in ("boxcar", "hann")}
    for w, run in runs.items():
        errors[w] = float(np.abs(run() - image_hwc).max())
    errors["scatter"] = float(np.abs(np.asarray(scatter_set(patches, image.shape, origins))[0] - image).max())
    errors["scatter mean"] = float(np.abs(np.asarray(scatter_mean(patches, image.shape, origins))[0] - image).max())
    ours, ours_mean, ours_overwrite = (
        "merge_patches gaussian (ours)",
        "merge_patches mean (ours)",
        "merge_patches overwrite (ours)",
    )
    scatter, scatter_add = (
        "statement's lax.scatter (overlaps overwritten)",
        "statement's scatter as scatter-add / count (mean)",
    )
    rows = alternate(
        [
            (ours_mean, merge["mean"], f"max error {errors['mean']:.1e}"),
            (ours, merge["gaussian"], f"max error {errors['gaussian']:.1e}"),
            (ours_overwrite, merge["overwrite"], f"max error {errors['overwrite']:.1e}"),
            (
                "merge_patches gaussian (ours), NumPy in and out",
                lambda: np.asarray(merge_patches(patches_host, image.shape, (step, step), blend="gaussian")),
            ),
            ("tiler Merger boxcar", runs["boxcar"], f"max error {errors['boxcar']:.1e}"),
            ("tiler Merger hann", runs["hann"], f"max error {errors['hann']:.1e}"),
            (scatter, lambda: scatter_set(patches, image.shape, origins), f"max error {errors['scatter']:.1e}"),
            (
                scatter_add,
                lambda: scatter_mean(patches, image.shape, origins),
                f"max error {errors['scatter mean']:.1e}",
            ),
        ],
        rounds=rounds,
    )
    n_tiles = patches.shape[0] * patches.shape[1]
    print(table(f"(b) {side}x{side}x3, {tile}-pixel tiles, stride {step} ({n_tiles} tiles)", rows, ours))
    print(
        f"\nOurs: mean {ratio(rows, 'tiler Merger boxcar', ours_mean):.2f}x tiler boxcar, "
        f"gaussian {ratio(rows, 'tiler Merger hann', ours):.2f}x tiler hann; "
        f"overwrite {ratio(rows, scatter, ours_overwrite):.2f}x the statement's scatter; "
        f"mean {ratio(rows, scatter_add, ours_mean):.2f}x the scatter-add mean"
    )


if __name__ == "__main__":
    main()
