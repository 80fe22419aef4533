"""Reassembling images from patches: ours against NumPy, a per-element scatter and tiler.

    python benchmarks/bench_patches.py [--repeats 5] [--scatter-repeats 1]

(a) Non-overlapping (16, 16, 3, 256, 256) float32 patches -> (3, 4096, 4096):
    merge_patches with the patches already on the JAX device, against NumPy's
    transpose-and-copy of the same array and the per-element lax.scatter of the
    well-known JAX answer; plus the end-to-end figure from and to NumPy.
(b) Overlapping tiles of a 2048x2048x3 image, 256-pixel tiles, stride 128:
    merge_patches "mean" and "gaussian" against tiler's Merger (boxcar and
    hann windows), with each one's round-trip error, border included.
All in one run, after a warm-up, best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine, measure, table  # noqa: E402

from napari_gridmip import extract_patches, merge_patches  # noqa: E402


def numpy_transpose_copy(patches: np.ndarray) -> np.ndarray:
    v, h, c, ph, pw = patches.shape
    return np.ascontiguousarray(patches.transpose(2, 0, 3, 1, 4)).reshape(c, v * ph, h * pw)


@jax.jit
def scatter_per_element(patches):
    """The question's second answer: every element scattered to its own output index."""
    v, h, c, ph, pw = patches.shape
    iv, ih, ic, iy, ix = jnp.meshgrid(*(jnp.arange(n) for n in patches.shape), indexing="ij")
    out = jnp.zeros((c, v * ph, h * pw), patches.dtype)
    return out.at[ic, iv * ph + iy, ih * pw + ix].set(patches)


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scatter-repeats", type=int, default=1)
    args = parser.parse_args()
    print(f"merge_patches benchmarks; {machine()}\n")

    # (a) non-overlapping
    rng = np.random.default_rng(0)
    host = rng.random((16, 16, 3, 256, 256), dtype=np.float32)
    device = jax.device_put(host)
    shape, stride = (3, 4096, 4096), (256, 256)
    expected = numpy_transpose_copy(host)
    assert np.array_equal(np.asarray(merge_patches(device, shape, stride)), expected)
    assert np.array_equal(np.asarray(scatter_per_element(device)), expected)
    rows = [
        measure("merge_patches (ours), on device", lambda: merge_patches(device, shape, stride), repeats=args.repeats),
        measure("NumPy transpose + copy", lambda: numpy_transpose_copy(host), repeats=args.repeats),
        measure("per-element lax.scatter", lambda: scatter_per_element(device), repeats=args.scatter_repeats),
        measure(
            "merge_patches (ours), NumPy in and out",
            lambda: np.asarray(merge_patches(host, shape, stride)),
            repeats=args.repeats,
        ),
    ]
    print(
        table(
            "(a) (16, 16, 3, 256, 256) float32 -> (3, 4096, 4096), no overlap", rows, "merge_patches (ours), on device"
        )
    )
    print()

    # (b) overlapping
    image = rng.random((3, 2048, 2048), dtype=np.float32)
    patches = extract_patches(image, (256, 256), (128, 128))
    patches_host = np.asarray(patches)
    image_hwc = np.ascontiguousarray(image.transpose(1, 2, 0))
    errors = {}
    for blend in ("mean", "gaussian"):
        errors[blend] = float(
            np.abs(np.asarray(merge_patches(patches, image.shape, (128, 128), blend=blend)) - image).max()
        )
    runs = {w: tiler_merge(image_hwc, w, 256, 128) for w in ("boxcar", "hann")}
    for w, run in runs.items():
        errors[w] = float(np.abs(run() - image_hwc).max())
    rows = [
        measure(
            "merge_patches mean (ours)",
            lambda: merge_patches(patches, image.shape, (128, 128), blend="mean"),
            repeats=args.repeats,
            note=f"max error {errors['mean']:.1e}",
        ),
        measure(
            "merge_patches gaussian (ours)",
            lambda: merge_patches(patches, image.shape, (128, 128), blend="gaussian"),
            repeats=args.repeats,
            note=f"max error {errors['gaussian']:.1e}",
        ),
        measure(
            "merge_patches gaussian (ours), NumPy in and out",
            lambda: np.asarray(merge_patches(patches_host, image.shape, (128, 128), blend="gaussian")),
            repeats=args.repeats,
        ),
        measure("tiler Merger boxcar", runs["boxcar"], repeats=args.repeats, note=f"max error {errors['boxcar']:.1e}"),
        measure("tiler Merger hann", runs["hann"], repeats=args.repeats, note=f"max error {errors['hann']:.1e}"),
    ]
    print(
        table(
            f"(b) 2048x2048x3, 256-pixel tiles, stride 128 ({patches.shape[0] * patches.shape[1]} tiles)",
            rows,
            "merge_patches gaussian (ours)",
        )
    )


if __name__ == "__main__":
    main()
