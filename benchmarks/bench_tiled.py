"""Tiled inference: apply_tiled against MONAI's sliding_window_inference, tiling and merging only.

Peers: MONAI's ``sliding_window_inference`` (torch, no grad) and the floor, one NumPy copy of the image; ours with
a NumPy, a JAX and a batched callable, and on dask.

    python -m benchmarks run tiled [--quick] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine, measure, start_run, table  # noqa: E402

from napari_gridmip import apply_tiled  # noqa: E402

# The method in full: ``--help`` prints it after the options.
DETAILS = """\
A (3, 4096, 4096) float32 image (MONAI: (1, 3, 4096, 4096)), 256 x 256 tiles,
overlap 0.25 (a step of 192 pixels, 21 x 21 = 441 tiles; both use the same
origins), Gaussian blend (sigma 0.125 x tile), 8 tiles per batch, and an
identity predictor, so that only the tiling and the merging are timed. Rows:
ours with a NumPy callable (called per tile), with a JAX function (one
vmapped program per batch of 8), a batched NumPy callable, and on a dask
image (1024-pixel chunks) stored into a preallocated array; MONAI's
``sliding_window_inference`` under ``torch.no_grad()``; and the floor, one
NumPy copy of the image. Each row's note gives its largest difference from
the image (identity: float rounding of the blend). ``--quick``: a (3, 1024,
1024) image with 128-pixel tiles, one repeat, for a check in seconds (its
peak memory reads 0: blocks this small come back from malloc's own heap).

Peak memory is resident memory above the level at the call (the image is
already there); compare it with the output (the size of the image here) and
one tile (3 x 256 x 256 x 4 bytes = 0.75 MiB).
"""


def identity(t):
    return t


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a 3x1024x1024 image, 128-pixel tiles, one repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--monai-repeats", type=int, default=2, help="MONAI's row takes seconds a call")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    start_run("tiled", args)
    side, tile = (1024, 128) if args.quick else (4096, 256)
    repeats = 1 if args.quick else args.repeats

    import dask.array as da
    import torch
    from monai.inferers import sliding_window_inference

    print(f"apply_tiled benchmarks; {machine()}, torch {torch.__version__} ({torch.get_num_threads()} threads)\n")
    image = np.random.default_rng(0).random((3, side, side), dtype=np.float32)
    options = dict(overlap=0.25, blend="gaussian", batch_size=args.batch)
    tensor = torch.from_numpy(image[None])
    lazy = da.from_array(image, chunks=(3, 1024, 1024))
    target = np.empty_like(image)

    def monai():
        with torch.no_grad():
            return sliding_window_inference(
                tensor, (tile, tile), args.batch, identity, overlap=0.25, mode="gaussian", sigma_scale=0.125
            )

    def dask_store():
        da.store(apply_tiled(identity, lazy, (tile, tile), **options), target, lock=False)
        return target

    runs = {
        "apply_tiled, NumPy fn per tile (ours)": lambda: apply_tiled(
            identity, image, (tile, tile), backend="numpy", **options
        ),
        "apply_tiled, JAX fn (vmapped, jit)": lambda: apply_tiled(
            identity, image, (tile, tile), backend="jax", **options
        ),
        "apply_tiled, NumPy fn batched": lambda: apply_tiled(
            identity, image, (tile, tile), backend="numpy", batched=True, **options
        ),
        "apply_tiled on dask, stored into an array": dask_store,
        "MONAI sliding_window_inference": monai,
        "floor: one NumPy copy of the image": lambda: image.copy(),
    }
    rows = []
    for name, run in runs.items():
        out = run()
        out = out.numpy()[0] if hasattr(out, "numpy") else np.asarray(out)
        error = float(np.abs(out.astype(np.float64) - image).max())
        del out
        count = min(repeats, args.monai_repeats) if name.startswith("MONAI") else repeats
        rows.append(measure(name, run, repeats=count, note=f"max error {error:.1e}"))
    grid = -(-(side - tile) // int(tile * 0.75)) + 1
    megabytes = image.nbytes / 2**20
    print(
        table(
            f"({image.shape[0]}, {side}, {side}) float32, {tile}-pixel tiles, overlap 0.25 ({grid}x{grid} tiles), "
            f"Gaussian blend, batches of {args.batch}; image and output {megabytes:.0f} MiB each, "
            f"a tile {3 * tile * tile * 4 / 2**20:.2f} MiB",
            rows,
            "apply_tiled, NumPy fn per tile (ours)",
        )
    )


if __name__ == "__main__":
    main()
