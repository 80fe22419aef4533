"""The local correlation image of a movie: ours against CaImAn's FFT formula in NumPy, and through dask from Zarr.

Peers: CaImAn's ``local_correlations_fft`` formula in NumPy (ndimage.convolve and shifted adds), CaImAn's own code
(``--caiman CHECKOUT``), and the in-memory call against dask from Zarr in new processes.

    python -m benchmarks run timeseries [--quick] [--repeats 2] [--folder /tmp/gridmip-bench]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from _harness import machine, measure, record, start_run, table

CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    mode, path = sys.argv[1], sys.argv[2]
    from napari_gridmip import local_correlation_image
    start = time.perf_counter()
    if mode == "dask":
        import dask, dask.array as da
        with dask.config.set(scheduler="threads"):
            image = local_correlation_image(da.from_zarr(path)).compute()
    else:
        import zarr
        image = np.asarray(local_correlation_image(zarr.open_array(path, mode="r")[:]))
    elapsed = time.perf_counter() - start
    peak = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] / 1024
    print(elapsed, peak, float(np.nanmean(image)))
    """
)


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Movie: 2000 x 512 x 512 float32 (2 GiB; ``--quick``: 200 x 256 x 256), noise
with flickering 9 x 9 patches, 8 neighbours.

1. In memory, one process: ``local_correlation_image`` on the NumPy movie; the
   same on the movie memory-mapped from a ``.npy`` file (its chunks reach JAX
   without a copy); and CaImAn's ``local_correlations_fft`` formula written
   with NumPy (z-score each pixel over time, sum each frame's 8 neighbours,
   mean product over time, divided by the neighbour count): once with the
   neighbour sum by ``scipy.ndimage.convolve`` (what CaImAn calls without
   OpenCV), once by 8 in-place shifted-slice additions (faster; the baseline
   to beat). Best of ``--repeats`` after a warm-up; peak extra resident
   memory of one call.
2. Through dask, each in a fresh process: the movie stored as Zarr (chunks of
   100 frames), ``local_correlation_image`` of ``da.from_zarr`` computed with
   the threaded scheduler; the process's peak resident memory (VmHWM, JAX and
   dask included) against the in-memory call on the loaded movie.
"""


def make_movie(frames: int, size: int, seed: int = 0) -> np.ndarray:
    """Unit noise plus flickering 9 x 9 patches on a 32-pixel grid, float32, built frame block by frame block."""
    rng = np.random.default_rng(seed)
    movie = np.empty((frames, size, size), np.float32)
    patches = [(y, x) for y in range(8, size - 9, 32) for x in range(8, size - 9, 32)]
    for start in range(0, frames, 100):
        block = rng.standard_normal((min(100, frames - start), size, size), dtype=np.float32)
        flicker = rng.standard_normal((block.shape[0], len(patches)), dtype=np.float32)
        for k, (y, x) in enumerate(patches):
            block[:, y : y + 9, x : x + 9] += 2 * flicker[:, k, None, None]
        movie[start : start + block.shape[0]] = block + 100
    return movie


def caiman_formula(movie: np.ndarray, *, shifted_adds: bool) -> np.ndarray:
    """CaImAn's local_correlations_fft (8 neighbours, no rolling window), in NumPy."""
    y = movie.astype(np.float32)  # CaImAn casts (a copy), then works in place
    y -= y.mean(axis=0)
    std = y.std(axis=0)
    std[std == 0] = np.inf
    y /= std
    rows, cols = y.shape[1:]
    kernel = np.ones((3, 3), np.float32)
    kernel[1, 1] = 0
    if shifted_adds:
        summed = np.zeros_like(y)
        count = np.zeros((rows, cols), np.float32)
        for a in (-1, 0, 1):
            for b in (-1, 0, 1):
                if a == b == 0:
                    continue
                dst = (slice(max(0, -a), rows - max(0, a)), slice(max(0, -b), cols - max(0, b)))
                src = (slice(max(0, a), rows - max(0, -a)), slice(max(0, b), cols - max(0, -b)))
                summed[(slice(None), *dst)] += y[(slice(None), *src)]
                count[dst] += 1
        summed *= y
        return summed.mean(axis=0) / count
    from scipy.ndimage import convolve

    summed = convolve(y, kernel[None], mode="constant")
    count = convolve(np.ones((rows, cols), np.float32), kernel, mode="constant")
    product = summed * y
    del summed, y
    return product.mean(axis=0) / count


def run_child(mode: str, path: Path) -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    elapsed, peak, _ = (float(v) for v in done.stdout.split())
    return elapsed, peak


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="200 x 256 x 256: a check in seconds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--folder", default="/tmp/gridmip-bench", help="where the .npy and Zarr copies go")
    parser.add_argument("--skip-dask", action="store_true")
    parser.add_argument(
        "--caiman", type=Path,
        help="a CaImAn checkout: its own local_correlations_fft as rows too (with OpenCV's filter2D when "
        "opencv-python-headless is installed, as CaImAn's default)",
    )  # fmt: skip
    args = parser.parse_args()
    start_run("timeseries", args)
    frames, size = (200, 256) if args.quick else (2000, 512)
    folder = Path(args.folder) / f"timeseries-{frames}x{size}"
    folder.mkdir(parents=True, exist_ok=True)

    from napari_gridmip import local_correlation_image

    movie = make_movie(frames, size)
    np.save(folder / "movie.npy", movie)
    mapped = np.load(folder / "movie.npy", mmap_mode="r")
    check = np.abs(np.asarray(local_correlation_image(movie[:200])) - caiman_formula(movie[:200], shifted_adds=True))
    gap = float(check.max())
    print(f"local correlation image of a {frames} x {size} x {size} float32 movie, 8 neighbours; {machine()}")
    print(f"(ours against the formula on the first 200 frames: max difference {gap:.1e})\n")
    rows = [
        measure("local_correlation_image (ours)", lambda: np.asarray(local_correlation_image(movie)),
                repeats=args.repeats),
        measure("ours, memory-mapped .npy", lambda: np.asarray(local_correlation_image(mapped)), repeats=args.repeats,
                note="chunks aliased, no copy"),
        measure("CaImAn formula, NumPy + ndimage.convolve", lambda: caiman_formula(movie, shifted_adds=False),
                repeats=args.repeats, note="as CaImAn without OpenCV"),
        measure("CaImAn formula, NumPy + shifted adds", lambda: caiman_formula(movie, shifted_adds=True),
                repeats=args.repeats, note="the faster NumPy formula"),
    ]  # fmt: skip
    if args.caiman is not None:  # CaImAn's own code, read from the checkout (benchmarks/probes/caiman_check.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent / "probes"))
        from caiman_check import caiman_summary_images

        caiman = caiman_summary_images(args.caiman)
        try:
            import cv2  # noqa: F401

            branches = [(True, "CaImAn's own local_correlations_fft, OpenCV filter2D"), (False, "... without OpenCV")]
        except ImportError:
            branches = [(False, "CaImAn's own local_correlations_fft, without OpenCV")]
        for opencv, name in branches:
            gap = np.abs(caiman.local_correlations_fft(movie[:200], swap_dim=False, opencv=opencv)
                         - np.asarray(local_correlation_image(movie[:200]))).max()  # fmt: skip
            rows.append(measure(name, lambda o=opencv: caiman.local_correlations_fft(movie, swap_dim=False, opencv=o),
                                repeats=args.repeats, note=f"its code as run; {gap:.1e} from ours"))  # fmt: skip
    print(table("Movie in memory (NumPy float32)", rows, "local_correlation_image (ours)"))
    baseline = min(r.best_s for r in rows[2:])
    print(f"\nours is {baseline / rows[0].best_s:.1f}x faster than the fastest baseline")

    if not args.skip_dask:
        import zarr

        store = folder / "movie.zarr"
        if store.exists():
            shutil.rmtree(store)
        array = zarr.open_array(str(store), mode="w", shape=movie.shape, chunks=(100, size, size), dtype="float32")
        for start in range(0, frames, 100):
            array[start : start + 100] = movie[start : start + 100]
        del movie, mapped
        print(f"\n#### Through dask from Zarr (chunks of 100 frames, {frames * size * size * 4 / 2**30:.2f} GiB)\n")
        print("| path | time s | peak RSS MiB (whole process) |")
        print("|---|---:|---:|")
        for mode, name in (("dask", "dask.array.from_zarr, lazy, computed"), ("memory", "loaded into NumPy first")):
            results = [run_child(mode, store) for _ in range(max(1, args.repeats - 1))]
            best = min(results)
            record(name, times_s=[r[0] for r in results], peak_mb=best[1], group="through dask from Zarr",
                   reference="dask.array.from_zarr, lazy, computed", note="a new process each, whole RSS")  # fmt: skip
            print(f"| {name} | {best[0]:.2f} | {best[1]:.0f} |")


if __name__ == "__main__":
    main()
