"""How long a NumPy path would take for the DIC pair's translation search alone (issue 33, item 4).

    python tools/numpy_search_probe.py

The library's first DIC call on a 2-core CPU is held by XLA's compile of its band program (docs/benchmarks.md,
section 12); issue 33 names "a NumPy path for small inputs" as a way round it. This times the cheapest NumPy form
of the integer part of that band, on bench_first_run's DIC pair (1024^2, subset 31, step 4, window 21, a speckle
pattern shifted by (0.4, -0.3) px): the sample's and reference's box sums once (float64 summed-area tables), then
per offset one product of the two images, a running sum along rows picked at the grid's columns, and one along
the columns picked at its rows; the offsets split over threads (NumPy releases the GIL). Best of 3. No sub-pixel
refinement: the library's ``refine`` adds its Gram planes and Newton steps on top, so this is a lower bound.
Beside it, in the same process, the library's ``find_displacement`` on the same pair (``subpixel`` "none"
and "refine": its first call, then best of 3; with NAPARI_GRIDMIP_COMPILE_CACHE=0 the first call compiles).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def _box_sums(img: np.ndarray, side: int) -> np.ndarray:
    """Every ``side`` x ``side`` box's sum (float64), indexed by its first row and column."""
    table = np.zeros((img.shape[0] + 1, img.shape[1] + 1))
    table[1:, 1:] = img.cumsum(0, dtype=np.float64).cumsum(1)
    return table[side:, side:] - table[:-side, side:] - table[side:, :-side] + table[:-side, :-side]


def translation_search(a: np.ndarray, b: np.ndarray, *, subset: int, step: int, window: int, threads: int):
    """Integer displacement (dy, dx) and the ZNCC of each offset at each grid point, in NumPy."""
    reach = window // 2
    ys = reach + step * np.arange((a.shape[0] - subset - 2 * reach) // step + 1)
    xs = reach + step * np.arange((a.shape[1] - subset - 2 * reach) // step + 1)
    count = subset**2
    mean_a = _box_sums(a, subset)[np.ix_(ys, xs)] / count
    var_a = _box_sums(a * a, subset)[np.ix_(ys, xs)] - count * mean_a**2
    sums_b, squares_b = _box_sums(b, subset), _box_sums(b * b, subset)
    y0, y1, x0, x1 = ys[0], ys[-1] + subset, xs[0], xs[-1] + subset
    region, rows, cols = a[y0:y1, x0:x1], ys - y0, xs - x0
    offsets = [(dy, dx) for dy in range(-reach, reach + 1) for dx in range(-reach, reach + 1)]

    def zncc(offset: tuple[int, int]) -> np.ndarray:
        dy, dx = offset
        product = region * b[y0 + dy : y1 + dy, x0 + dx : x1 + dx]
        along = np.zeros((product.shape[0], product.shape[1] + 1))
        np.cumsum(product, axis=1, dtype=np.float64, out=along[:, 1:])
        picked = along[:, cols + subset] - along[:, cols]
        down = np.zeros((picked.shape[0] + 1, len(xs)))
        np.cumsum(picked, axis=0, out=down[1:])
        cross = down[rows + subset] - down[rows]
        mean_b = sums_b[np.ix_(ys + dy, xs + dx)] / count
        var_b = squares_b[np.ix_(ys + dy, xs + dx)] - count * mean_b**2
        return (cross - count * mean_a * mean_b) / np.sqrt(var_a * var_b)

    with ThreadPoolExecutor(threads) as pool:
        r = np.stack(list(pool.map(zncc, offsets)))
    return np.asarray(offsets)[r.argmax(0)], r


def main() -> None:
    from scipy.ndimage import gaussian_filter, shift

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--window", type=int, default=21)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    a = gaussian_filter(rng.random((args.size, args.size)), 2).astype(np.float32)
    b = shift(a, (0.4, -0.3), order=3).astype(np.float32)
    for threads in (1, 2):
        best = np.inf
        for _ in range(args.repeats):
            start = time.perf_counter()
            found, r = translation_search(a, b, subset=31, step=4, window=args.window, threads=threads)
            best = min(best, time.perf_counter() - start)
        print(
            f"{threads} thread(s): {best:.2f} s for {found.shape[0]}x{found.shape[1]} points x {r.shape[0]} "
            f"offsets; median integer peak ({np.median(found[..., 0]):.0f}, {np.median(found[..., 1]):.0f})"
        )
    import napari_gridmip as gm

    for subpixel in ("none", "refine"):
        start = time.perf_counter()
        out = gm.find_displacement(a[None], b[None], (args.window,) * 2, subset=(31, 31), step=4, subpixel=subpixel)
        np.asarray(out.dy)
        first, best = time.perf_counter() - start, np.inf
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = gm.find_displacement(a[None], b[None], (args.window,) * 2, subset=(31, 31), step=4,
                                       subpixel=subpixel)  # fmt: skip
            np.asarray(out.dy)
            best = min(best, time.perf_counter() - start)
        print(
            f"library, subpixel={subpixel}: first {first:.2f} s, warm {best:.2f} s; "
            f"median dy, dx ({np.nanmedian(out.dy):.2f}, {np.nanmedian(out.dx):.2f})"
        )


if __name__ == "__main__":
    main()
