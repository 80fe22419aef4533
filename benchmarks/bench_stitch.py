"""Stitching a mosaic with rough stage positions: register_tiles against m2stitch and ASHLAR.

    python benchmarks/bench_stitch.py [--quick] [--repeats 3] [--skip-ashlar] [--skip-m2stitch]

A synthetic 6x6 mosaic of 512x512 float32 tiles, 10% overlap, cut at known
fractional positions from a generated fluorescence-like picture
(``napari_gridmip._sample_data.mosaic``), with +-8 px uniform stage errors
per tile and axis and Gaussian noise. Every tool gets the tiles and the
regular grid the stage reports (the same information):

- ours: ``register_tiles(tiles, grid_positions(...), max_shift=16)``;
- m2stitch (MIST's algorithm): ``stitch_images(tiles, rows, cols,
  position_initial_guess=grid, row_col_transpose=False)``;
- ASHLAR: the tiles written as TIFF files, read by its ``FileSeriesReader``
  (overlap, width, height: the grid) and aligned by ``EdgeAligner(reader,
  max_shift=16, do_make_thumbnail=False).run()``, its command line's path;
  with its default ``filter_sigma=0`` and with ``--filter-sigma 1``, which
  its documentation suggests for noisy images.

Error: each tool's positions against the truth, the common translation
removed (positions are defined up to one), RMS and max over tiles. Time: end
to end from the tiles in memory (ASHLAR: from the files it reads). Ours is
timed cold (a fresh process's first call, compiling its programs) and warm
(best of ``--repeats``); the peers have nothing to compile and run once.
``--quick``: a 3x3 mosaic of 256x256 tiles, seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import PeakMemory, Row, machine, table  # noqa: E402

from napari_gridmip import grid_positions, register_tiles  # noqa: E402
from napari_gridmip._sample_data.mosaic import make_mosaic  # noqa: E402


def errors(positions: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    e = positions - truth
    e = e - e.mean(axis=0)
    norm = np.sqrt((e**2).sum(axis=1))
    return float(np.sqrt((norm**2).mean())), float(norm.max())


def timed(fn):
    with PeakMemory() as memory:
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
    return out, elapsed, memory.extra_mb


def run_m2stitch(tiles, grid, stage):
    import m2stitch

    rows, cols = np.divmod(np.arange(len(tiles)), grid[1])
    options = {"rows": list(rows), "cols": list(cols), "position_initial_guess": stage, "row_col_transpose": False}
    try:
        result, _ = m2stitch.stitch_images(tiles, **options)
        note = ""
    except AssertionError as error:  # "there is no good top pair, (try lowering the ncc_threshold)": as it says
        result, _ = m2stitch.stitch_images(tiles, **options, ncc_threshold=0.1)
        note = f" (default threshold failed: {error}; ncc_threshold=0.1)"
    return result[["y_pos", "x_pos"]].to_numpy(dtype=float), note


def run_ashlar(folder, grid, overlap, max_shift, filter_sigma):
    import warnings

    from ashlar import reg
    from ashlar.fileseries import FileSeriesReader

    reader = FileSeriesReader(str(folder), "img_{series:03}.tif", overlap, grid[1], grid[0], pixel_size=1.0)
    aligner = reg.EdgeAligner(
        reader, channel=0, max_shift=max_shift, filter_sigma=filter_sigma, do_make_thumbnail=False, verbose=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        aligner.run()
    return np.asarray(aligner.positions, dtype=float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 3x3 mosaic of 256 px tiles")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-ashlar", action="store_true")
    parser.add_argument("--skip-m2stitch", action="store_true")
    args = parser.parse_args()
    grid, tile = ((3, 3), (256, 256)) if args.quick else ((6, 6), (512, 512))
    overlap, error, max_shift = 0.1, 8.0, 16
    sample = make_mosaic(grid_shape=grid, tile_shape=tile, overlap=overlap, stage_error=error, noise=0.01, seed=0)
    tiles, truth = sample.tiles, sample.true_positions
    stage = grid_positions(grid, tile, overlap)  # what the stage reports, in the grid's frame
    stage_rms, stage_max = errors(stage, truth)
    print(f"# {machine()}")
    print(f"# {grid[0]}x{grid[1]} tiles of {tile[0]}x{tile[1]}, {overlap:.0%} overlap, +-{error:g} px stage error")
    rows: list[Row] = []
    notes: dict[str, str] = {}

    result, cold, memory = timed(lambda: register_tiles(tiles, stage, max_shift=max_shift))
    rms, worst = errors(result.positions, truth)
    notes["ours, cold"] = f"{rms:.3f} px RMS, {worst:.3f} px max"
    rows.append(Row("ours, cold (compiles)", cold, cold, memory, notes["ours, cold"]))
    warm = []
    for _ in range(args.repeats):
        result, elapsed, memory = timed(lambda: register_tiles(tiles, stage, max_shift=max_shift))
        warm.append(elapsed)
    rows.append(Row("ours", min(warm), float(np.median(warm)), memory, notes["ours, cold"]))
    used = f"{int(result.accepted.sum())}/{len(result.pairs)} pairs used"
    print(f"# ours: {used}, median residual {result.median_residual:.3f} px")

    if not args.skip_m2stitch:
        (positions, note), elapsed, memory = timed(lambda: run_m2stitch(tiles, grid, stage))
        rms, worst = errors(positions, truth)
        rows.append(Row("m2stitch", elapsed, elapsed, memory, f"{rms:.3f} px RMS, {worst:.3f} px max{note}"))
    if not args.skip_ashlar:
        import tifffile

        with tempfile.TemporaryDirectory() as folder:
            for t, image in enumerate(tiles):
                tifffile.imwrite(Path(folder) / f"img_{t:03}.tif", image)
            for sigma in (0.0, 1.0):  # its default, and its --filter-sigma for noisy images (ours band-passes at 1)
                positions, elapsed, memory = timed(lambda s=sigma: run_ashlar(folder, grid, overlap, max_shift, s))
                rms, worst = errors(positions, truth)
                name = "ASHLAR" if sigma == 0 else f"ASHLAR --filter-sigma {sigma:g}"
                rows.append(Row(name, elapsed, elapsed, memory, f"{rms:.3f} px RMS, {worst:.3f} px max"))
    stage_note = f"{stage_rms:.3f} px RMS, {stage_max:.3f} px max"
    rows.append(Row("stage positions", float("nan"), float("nan"), 0, stage_note))
    print()
    print(table("register_tiles against m2stitch and ASHLAR (error: tile positions against the truth)", rows, "ours"))


if __name__ == "__main__":
    main()
