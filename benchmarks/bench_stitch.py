"""Stitching a mosaic with rough stage positions: register_tiles against m2stitch (and ASHLAR), cold and warm.

Peers: m2stitch (MIST's algorithm) and ASHLAR (``--ashlar``); cold is a new process's first call, warm the best of
``--repeats`` alternating; accuracy against the truth.

    python -m benchmarks run stitch [--quick] [--case small|camera|synthetic|all] [--ashlar] [--skip-m2stitch]
    python benchmarks/bench_stitch.py --scale 30 [--engines auto numpy jax] [--peers 600]
    python benchmarks/bench_stitch.py --only repetitive | --strip FOLDER | --real FOLDER --grid R C --overlap F
    xvfb-run -a python benchmarks/bench_stitch.py --first-run --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]  # this checkout's package, then the harness

from _harness import machine, record, start_run  # noqa: E402 - the harness imports NumPy alone: a cold child stays cold

# -- the cases --------------------------------------------------------------------------------


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Cases (each tool gets the tiles and the regular grid the stage reports, the same information):

- ``small``: a 5x5 mosaic of 183x245 float32 tiles, 6% overlap (11 and 15 px), +-3 px stage errors, Gaussian
  noise: the size of a real mosaic, clean enough for m2stitch to run.
- ``camera``: the same grid as a camera records it (``microscope_tiles``: cos^4 vignetting off-centre, shot noise
  at 2000 photo-electrons, a dark offset, uint16) with one background-only corner. (m2stitch 0.7 stops on it:
  "no good left pair" even at ``ncc_threshold=0.1``, and a NaN edge weight with the blank corner.) RMS errors
  count the tiles with texture.
- ``synthetic``: a 6x6 mosaic of 512x512 float32 tiles, 10% overlap, +-8 px stage errors, Gaussian noise.
- ``large``: a 5x5 mosaic of 1024x1024 uint16 tiles (the textured mosaic with 1% noise, quantised), 10%
  overlap, +-8 px stage errors (the first-call case; not in ``all``).
- ``--only repetitive``: accuracy only (no timing): large stage errors (a quarter of the tile between neighbours)
  with ``max_shift="auto"`` against the former 16 px, and repetitive textures (a lattice of 18 px, alone or beside
  texture) with the ambiguity rule on and off; per case the position error, the pairs used, ambiguous and rejected,
  and the mean NCC of the placed tiles' overlaps (see ``bench_repetitive``).
- ``--real FOLDER``: tiles ``img_r{row:03}_c{col:03}.tif`` (or any ``*.tif``, sorted, row-major) of a real
  acquisition, with ``--grid`` and ``--overlap`` (one fraction, or ``y x``); reference positions from MIST's
  stitching vector ``FOLDER/img-global-positions-1.txt`` or ``FOLDER/reference_positions.csv`` (``y,x`` per
  tile in the same order). Never downloaded here: give it a folder you fetched (docs/stitching.md says which).

Tools:

- ours: ``register_tiles(tiles, grid_positions(...), max_shift=16)``;
- m2stitch (MIST's algorithm): ``stitch_images(tiles, rows, cols, position_initial_guess=grid,
  row_col_transpose=False)`` (``ncc_threshold=0.1`` if its default finds no pair, as its error suggests);
- ASHLAR (``--ashlar``): ``EdgeAligner(FileSeriesReader(...), max_shift=16).run()``.

Cold: a new Python process with an empty JAX compilation cache (``JAX_COMPILATION_CACHE_DIR`` set to a fresh
temporary folder; the library itself never turns the persistent cache on, only the napari worker does), timing
the import and then the first call. Warm: best and median of ``--repeats`` calls in this process, ours and
m2stitch alternating, timed bare. Peak memory: the resident set's growth during one more call (PeakMemory, its
sampling thread kept out of the timed calls; cold: the child's ``ru_maxrss``). Accuracy: RMS and max tile error
against the truth, common translation removed; and "exact pairs": neighbour pairs whose overlap at the integer
positions correlates above 0.999 (the measure of MIST's paper; meaningful on real, integer-shifted tiles).
"""


def make_case(name: str, quick: bool):
    """(tiles, stage positions, grid, overlap, truth, the tiles with texture)."""
    from napari_gridmip import grid_positions
    from napari_gridmip._sample_data.mosaic import make_mosaic, microscope_tiles

    if name == "large":  # the first-call case: a 5x5 mosaic of 1024^2 uint16 camera tiles
        (grid, tile), overlap = ((3, 3), (256, 256)) if quick else ((5, 5), (1024, 1024)), 0.1
        sample = make_mosaic(grid_shape=grid, tile_shape=tile, overlap=overlap, stage_error=8, noise=0.01, seed=2)
        # quantised to uint16 (m2stitch finds no good pair on the vignetted camera tiles of ``microscope_tiles``)
        tiles = np.round(np.clip(sample.tiles, 0, None) / sample.tiles.max() * 60000).astype(np.uint16)
    elif name in ("small", "camera"):
        grid, tile, overlap = ((3, 3) if quick else (5, 5)), (183, 245), 0.06
        camera = name == "camera"
        sample = make_mosaic(grid_shape=grid, tile_shape=tile, overlap=overlap, stage_error=3,
                             noise=0.0 if camera else 0.01, blank_corner=camera, seed=1)  # fmt: skip
        tiles = microscope_tiles(sample, photons=2000, seed=1) if camera else sample.tiles
    else:
        (grid, tile), overlap = ((3, 3), (256, 256)) if quick else ((6, 6), (512, 512)), 0.1
        sample = make_mosaic(grid_shape=grid, tile_shape=tile, overlap=overlap, stage_error=8, noise=0.01, seed=0)
        tiles = sample.tiles
    stage = grid_positions(grid, tile, overlap)  # what the stage reports, in the grid's frame
    return tiles, stage, grid, overlap, sample.true_positions, ~sample.blank


def read_real(folder: Path, grid, overlap):
    """Real tiles (sorted ``*.tif``, row-major), the stage grid, and reference positions if the folder has them.

    References: MIST's stitching vector ``img-global-positions-*.txt`` (``file: NAME; ... position: (x, y)``)
    or ``reference_positions.csv`` (``y,x`` per tile, in the tiles' order).
    """
    import re

    import tifffile

    from napari_gridmip import grid_positions

    files = sorted(folder.glob("*.tif")) + sorted(folder.glob("*.tiff"))
    tiles = np.stack([tifffile.imread(f) for f in files])
    if len(tiles) != grid[0] * grid[1]:
        raise SystemExit(f"{folder}: {len(tiles)} tiles for a {grid[0]}x{grid[1]} grid")
    stage = grid_positions(grid, tiles.shape[1:], overlap if len(overlap) > 1 else overlap[0])
    ref = None
    vectors = sorted(folder.glob("img-global-positions-*.txt"))
    if vectors:
        found = {}
        for line in vectors[0].read_text().splitlines():
            match = re.search(r"file: ([^;]+);.*position: \((-?\d+), (-?\d+)\)", line)
            if match:
                found[Path(match[1]).name.split(".")[0]] = (float(match[3]), float(match[2]))  # (y, x)
        ref = np.array([found[f.name.split(".")[0]] for f in files])
    elif (folder / "reference_positions.csv").exists():
        ref = np.loadtxt(folder / "reference_positions.csv", delimiter=",", skiprows=1)[:, :2]
    return tiles, stage, grid, overlap, ref


# -- measures ---------------------------------------------------------------------------------


def errors(positions: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    e = positions - truth
    e = e - e.mean(axis=0)
    norm = np.sqrt((e**2).sum(axis=1))
    return float(np.sqrt((norm**2).mean())), float(norm.max())


def exact_pairs(tiles: np.ndarray, positions: np.ndarray, grid, threshold: float = 0.999) -> tuple[int, int]:
    """Neighbour pairs (sharing an edge in the grid) whose overlap at the rounded positions has NCC > threshold."""
    rounded = np.round(positions).astype(int)
    shape = np.array(tiles.shape[1:3])
    count = total = 0
    for t in range(len(tiles)):
        r, c = divmod(t, grid[1])
        for u in ([t + 1] if c + 1 < grid[1] else []) + ([t + grid[1]] if r + 1 < grid[0] else []):
            total += 1
            delta = rounded[u] - rounded[t]
            lo, hi = np.maximum(0, delta), np.minimum(shape, shape + delta)
            if np.any(hi - lo < 2):
                continue
            a = tiles[t][lo[0] : hi[0], lo[1] : hi[1]].astype(np.float64).ravel()
            b = tiles[u][lo[0] - delta[0] : hi[0] - delta[0], lo[1] - delta[1] : hi[1] - delta[1]]
            b = b.astype(np.float64).ravel()
            a, b = a - a.mean(), b - b.mean()
            ncc = float(a @ b / max(np.sqrt((a @ a) * (b @ b)), 1e-30))
            count += ncc > threshold
    return count, total


# -- the tools --------------------------------------------------------------------------------


def run_ours(tiles, stage, grid):
    from napari_gridmip import register_tiles

    return register_tiles(tiles, stage, max_shift=16).positions, ""


def run_m2stitch(tiles, stage, grid):
    import m2stitch

    rows, cols = np.divmod(np.arange(len(tiles)), grid[1])
    options = {"rows": list(rows), "cols": list(cols), "position_initial_guess": stage, "row_col_transpose": False}
    images = np.asarray(tiles, np.float32)
    try:
        result, _ = m2stitch.stitch_images(images, **options)
        note = ""
    except AssertionError:  # "there is no good top pair, (try lowering the ncc_threshold)": as it says
        result, _ = m2stitch.stitch_images(images, **options, ncc_threshold=0.1)
        note = " (ncc_threshold=0.1: its default found no pair)"
    return result[["y_pos", "x_pos"]].to_numpy(dtype=float), note


def run_ashlar(folder, grid, overlap, max_shift=16, pattern="img_{series:03}.tif"):
    import warnings

    from ashlar import reg
    from ashlar.fileseries import FileSeriesReader

    reader = FileSeriesReader(str(folder), pattern, overlap, grid[1], grid[0], pixel_size=1.0)
    aligner = reg.EdgeAligner(reader, channel=0, max_shift=max_shift, do_make_thumbnail=False, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        aligner.run()
    return np.asarray(aligner.positions, dtype=float), ""


TOOLS = {"ours": run_ours, "m2stitch": run_m2stitch}


def child(tool: str, data: str) -> None:
    """In a new process: import, then the first call; print the timings as JSON."""
    import resource

    loaded = np.load(data)
    tiles, stage, grid = loaded["tiles"], loaded["stage"], tuple(loaded["grid"])
    start = time.perf_counter()
    if tool == "ours":
        import napari_gridmip  # noqa: F401
    else:
        import m2stitch  # noqa: F401
    imported = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    positions, note = TOOLS[tool](tiles, stage, grid)
    called = time.perf_counter()
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(json.dumps({"import_s": imported - start, "call_s": called - imported, "peak_mb": peak,
                      "positions": positions.tolist(), "note": note}))  # fmt: skip


def cold(tool: str, tiles, stage, grid) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "case.npz"
        np.savez(data, tiles=tiles, stage=stage, grid=np.array(grid))
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(Path(folder) / "jax-cache"), "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, __file__, "--child", tool, str(data)], env=env, capture_output=True,
                             text=True, check=True, cwd=ROOT)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def timed(fn, memory: bool = True):
    """``(fn(), seconds, peak extra MiB)``; ``memory=False``: no RSS sampler around the call (0 MiB).

    The sampler is a Python thread reading the RSS every millisecond, sharing the interpreter with the call: the
    warm times are taken without it and the memory in one more call with it.
    """
    from _harness import PeakMemory

    if not memory:
        start = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - start, 0.0
    with PeakMemory() as sampled:
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
    return out, elapsed, sampled.extra_mb


def bench_case(title, tiles, stage, grid, overlap, truth, args, real=False, keep=None) -> None:
    from _harness import Row, table

    tools = ["ours"] + ([] if args.skip_m2stitch else ["m2stitch"])
    rows: list[Row] = []

    def describe(positions, note=""):
        parts = []
        if truth is not None and not real:
            chosen = slice(None) if keep is None else keep
            rms, worst = errors(positions[chosen], truth[chosen])
            parts.append(f"{rms:.3f} px RMS, {worst:.3f} px max")
        if real:  # fractional synthetic shifts and noise never reach 0.999: the count is for real tiles
            count, total = exact_pairs(tiles, positions, grid)
            parts.append(f"exact pairs {count}/{total}")
        return ", ".join(parts) + note

    colds = {}
    for tool in tools:
        try:
            colds[tool] = cold(tool, tiles, stage, grid)
        except subprocess.CalledProcessError as error:
            colds[tool] = {"error": error.stderr.strip().splitlines()[-1]}
    warm: dict[str, list[float]] = {tool: [] for tool in tools}
    results = {}
    for r in range(args.repeats + 1):  # alternate, so that the machine's load falls on both; the last: memory
        for tool in tools[r % len(tools) :] + tools[: r % len(tools)]:
            try:
                (positions, note), elapsed, memory = timed(lambda t=tool: TOOLS[t](tiles, stage, grid),
                                                           memory=r == args.repeats)  # fmt: skip
            except Exception as error:  # noqa: BLE001 - a peer that fails is reported, not fatal
                results[tool] = (None, f"failed: {error}", 0.0)
                continue
            if r < args.repeats:
                warm[tool].append(elapsed)
            results[tool] = (positions, note, memory)
    for tool in tools:
        c = colds[tool]
        if "error" in c:
            rows.append(Row(f"{tool}, cold", float("nan"), float("nan"), 0, f"failed: {c['error']}"))
        else:
            note = f"import {c['import_s']:.2f} s + first call; {describe(np.array(c['positions']), c['note'])}"
            rows.append(Row(f"{tool}, cold", c["call_s"], c["import_s"] + c["call_s"], c["peak_mb"], note))
    for tool in tools:
        positions, note, memory = results.get(tool, (None, "not run", 0.0))
        if positions is None or not warm[tool]:
            rows.append(Row(f"{tool}, warm", float("nan"), float("nan"), 0, note))
            continue
        rows.append(
            Row(f"{tool}, warm", min(warm[tool]), float(np.median(warm[tool])), memory, describe(positions, note))
        )
    for tool in tools:  # the run's record: warm times, the new process's first call and import, the accuracy
        c, (positions, note, memory) = colds[tool], results.get(tool, (None, "not run", 0.0))
        accuracy = note if positions is None else describe(positions, note)
        record(tool, times_s=warm[tool], first_s=c.get("call_s"), peak_mb=memory, group=title, reference="ours",
               note="first call: a new process", import_s=c.get("import_s"), first_peak_mb=c.get("peak_mb"),
               accuracy=accuracy, error=c.get("error"))  # fmt: skip
    if args.ashlar and not real:
        import tifffile

        with tempfile.TemporaryDirectory() as folder:
            for t, image in enumerate(tiles):
                tifffile.imwrite(Path(folder) / f"img_{t:03}.tif", image)
            (positions, note), elapsed, memory = timed(lambda: run_ashlar(folder, grid, overlap))
            rows.append(Row("ASHLAR", elapsed, elapsed, memory, describe(positions, note)))
            record("ASHLAR", first_s=elapsed, peak_mb=memory, group=title, reference="ours",
                   accuracy=describe(positions, note))  # fmt: skip
    if truth is not None:
        rows.append(Row("reference positions" if real else "true positions", float("nan"), float("nan"), 0,
                        describe(truth)))  # fmt: skip
    rows.append(Row("stage positions", float("nan"), float("nan"), 0, describe(stage)))
    print()
    print(table(title + " (cold: 'best' is the first call, 'median' adds the import)", rows, "ours, warm"))
    by = {r.name: r for r in rows}
    if "m2stitch, warm" in by and np.isfinite(by["m2stitch, warm"].best_s):
        print(f"\nwarm: ours {by['m2stitch, warm'].best_s / by['ours, warm'].best_s:.1f}x faster than m2stitch; "
              f"cold first call: {by['m2stitch, cold'].best_s / by['ours, cold'].best_s:.1f}x; "
              f"cold import + call: {by['m2stitch, cold'].median_s / by['ours, cold'].median_s:.1f}x")  # fmt: skip


# -- large stage errors and repetitive texture (accuracy only) ---------------------------------------------------


def repetitive_cases():
    """``(title, sample, [(row label, register_tiles options, rule on)])``: the mosaics of ``--only repetitive``."""
    from napari_gridmip._sample_data.mosaic import cut_mosaic, lattice_picture, texture

    def errors(n, bound, seed):
        return np.round(np.random.default_rng(seed).uniform(-bound, bound, (n, 2)))

    corner = errors(9, 16, 5)
    corner[0], corner[[1, 3, 4]] = -16, 16  # tile 0 moved away from its three neighbours by 32 px per axis
    large = [("auto", {}, True), ("max_shift=16", {"max_shift": 16}, True)]
    rule = [("auto", {}, True), ("auto, rule off", {}, False)]
    yield ("texture 3x3 of 128 px, 40% (51 px), +-16 px, tile 0 32 px from all neighbours",
           cut_mosaic(texture((360, 360), seed=3), grid_shape=(3, 3), tile_shape=(128, 128), overlap=0.4,
                      errors=corner, seed=1), large)  # fmt: skip
    yield ("texture 2x4 of 128 px, 40%, +-16 px",
           cut_mosaic(texture((300, 420), seed=6), grid_shape=(2, 4), tile_shape=(128, 128), overlap=0.4,
                      errors=errors(8, 16, 7), seed=2), large)  # fmt: skip
    yield ("texture 3x3 of 256 px, 35% (90 px), +-30 px",
           cut_mosaic(texture((660, 660), seed=8), grid_shape=(3, 3), tile_shape=(256, 256), overlap=0.35,
                      errors=errors(9, 30, 9), seed=3), large)  # fmt: skip
    picture = lattice_picture((400, 400), period=18, textured=0.45, seed=4)
    yield ("lattice (18 px) in the lower right, texture elsewhere: 3x3 of 128 px, 30%, +-12 px",
           cut_mosaic(picture, grid_shape=(3, 3), tile_shape=(128, 128), overlap=0.3, errors=errors(9, 12, 2),
                      seed=1), rule)  # fmt: skip
    picture = lattice_picture((400, 400), period=18, textured=0.0, seed=4)
    yield ("lattice alone: 3x3 of 128 px, 30%, +-12 px",
           cut_mosaic(picture, grid_shape=(3, 3), tile_shape=(128, 128), overlap=0.3, errors=errors(9, 12, 2),
                      seed=1), rule)  # fmt: skip
    for spots in (12, 60):
        picture = lattice_picture((400, 400), period=18, textured=0.0, features=spots, seed=4)
        yield (f"lattice with {spots} unique spots (400x400 px): 3x3 of 128 px, 30%, +-12 px",
               cut_mosaic(picture, grid_shape=(3, 3), tile_shape=(128, 128), overlap=0.3, errors=errors(9, 12, 2),
                          seed=1), rule)  # fmt: skip


def overlap_ncc(tiles: np.ndarray, positions: np.ndarray, pairs: np.ndarray, least: int = 8) -> float:
    """The mean NCC of the raw tiles over their overlaps at the rounded placed positions (pairs overlapping by at
    least ``least`` px along every axis): how well the placement's neighbours agree, truth unknown."""
    rounded = np.round(positions).astype(int)
    shape = np.array(tiles.shape[1:])
    values = []
    for i, j in pairs:
        delta = rounded[j] - rounded[i]
        lo, hi = np.maximum(0, delta), np.minimum(shape, shape + delta)
        if np.any(hi - lo < least):
            continue
        a = tiles[i][tuple(slice(x, y) for x, y in zip(lo, hi))].astype(np.float64).ravel()
        b = tiles[j][tuple(slice(x - s, y - s) for x, y, s in zip(lo, hi, delta))].astype(np.float64).ravel()
        a, b = a - a.mean(), b - b.mean()
        values.append(float(a @ b / max(np.sqrt((a @ a) * (b @ b)), 1e-30)))
    return float(np.mean(values)) if values else float("nan")


def ashlar_on(sample, max_shift: int) -> np.ndarray:
    """ASHLAR's positions for a sample mosaic: its tiles written as TIFF files it reads itself, the same grid and
    overlap (its own stage model), the same search."""
    import tifffile

    rows, cols = sample.grid_shape
    with tempfile.TemporaryDirectory() as folder:
        for k, tile in enumerate(sample.tiles):
            tifffile.imwrite(Path(folder) / f"img_{k:03}.tif", tile)
        positions, _ = run_ashlar(folder, (rows, cols), sample.overlap, max_shift=max_shift)
    return positions


def bench_repetitive(ashlar: bool = False) -> None:
    """Accuracy only: each case registered with each option; errors against the truth (the common translation:
    the mean over the tiles not placed from the stage), the worst error of a pair used (a repeat taken: about a
    period), pairs used, ambiguous (resolved by the neighbours' consensus), rejected (of which left ambiguous),
    and the overlaps' mean NCC at the placed positions."""
    from napari_gridmip import register_tiles
    from napari_gridmip.core.patches import pair_search

    print("| case | search | max_shift px | RMS / max error px, all tiles | worst pair used, px "
          "| tiles from the stage | pairs used / ambiguous (resolved) / rejected (left ambiguous) "
          "| mean overlap NCC |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|---:|")
    original = pair_search.is_ambiguous
    for title, sample, runs in repetitive_cases():
        for label, options, rule in runs:
            pair_search.is_ambiguous = original if rule else (lambda peak, rival: False)
            try:
                r = register_tiles(sample.tiles, sample.stage_positions, **options)
            finally:
                pair_search.is_ambiguous = original
            if label == "auto":
                searched = r.max_shift  # ASHLAR's search: auto's
            placed = ~r.placed_from_stage
            error = r.positions - sample.true_positions
            error = error - error[placed if placed.any() else slice(None)].mean(axis=0)
            norm = np.linalg.norm(error, axis=1)
            left = np.array(r.reasons) == "ambiguous"
            rejected = int((~r.accepted).sum())
            pairs = (f"{int(r.accepted.sum())} / {int(r.ambiguous.sum())} ({int((r.ambiguous & r.accepted).sum())})"
                     f" / {rejected} ({int(left.sum())}) of {len(r.pairs)}")  # fmt: skip
            i, j = r.pairs[:, 0], r.pairs[:, 1]
            truth = sample.true_positions[j] - sample.true_positions[i] - (r.stage_positions[j] - r.stage_positions[i])
            pair_error = np.linalg.norm(r.shift - truth, axis=1)[r.accepted]
            worst = f"{pair_error.max():.3f}" if len(pair_error) else "none used"
            print(f"| {title} | {label} | {r.max_shift} | {np.sqrt((norm**2).mean()):.3f} / {norm.max():.3f} "
                  f"| {worst} | {int(r.placed_from_stage.sum())} | {pairs} "
                  f"| {overlap_ncc(sample.tiles, r.positions, r.pairs):.3f} |")  # fmt: skip
        stage = sample.stage_positions - sample.true_positions
        stage = np.linalg.norm(stage - stage.mean(axis=0), axis=1)
        i, j = r.pairs[:, 0], r.pairs[:, 1]
        offset = sample.true_positions[j] - sample.true_positions[i] - (r.stage_positions[j] - r.stage_positions[i])
        print(f"| {title} | stage positions (offsets off by {np.abs(offset).max():.1f} px at most) | "
              f"| {np.sqrt((stage**2).mean()):.3f} / {stage.max():.3f} | | | "
              f"| {overlap_ncc(sample.tiles, sample.stage_positions, r.pairs):.3f} |")  # fmt: skip
        if ashlar:
            positions = ashlar_on(sample, searched)
            error = positions - sample.true_positions
            norm = np.linalg.norm(error - error.mean(axis=0), axis=1)
            print(f"| {title} | ASHLAR 1.20 (max_shift={searched}) | {searched} "
                  f"| {np.sqrt((norm**2).mean()):.3f} / {norm.max():.3f} | | | "
                  f"| {overlap_ncc(sample.tiles, positions, r.pairs):.3f} |")  # fmt: skip


# -- a real strip with repetitive texture: ours, Fiji's placement, m2stitch and ASHLAR ---------------------------


def bench_strip(folder: Path, repeats: int) -> None:
    """The real 1 x 10 strip of broadinstitute/starrynight's tests (``starrynight/tests/fixtures/stitch_images``):
    8-bit camera frames (929 x 594) of ruled paper with handwritten digits, 50% overlap on the stage
    (``tile_config.txt``: 297 px steps), the true steps 241 to 358 px (off by up to 62 px). Fiji's placement is its
    ``tile_config.registered.txt``. No truth: each placement is judged by its overlaps' NCC (raw tiles, rounded
    positions), pair by pair against Fiji's. ASHLAR reads the files itself (``{series}.tif``); m2stitch gets the
    tiles and the stage, with ``ncc_threshold=0.1`` where its default finds no pair."""
    from napari_gridmip import register_tiles
    from napari_gridmip.io import read_mosaic

    stage_mosaic = read_mosaic(folder / "tile_config.txt")
    fiji = read_mosaic(folder / "tile_config.registered.txt").positions
    tiles, stage = np.asarray(stage_mosaic.tiles), stage_mosaic.positions
    pairs = np.array([(k, k + 1) for k in range(len(tiles) - 1)])

    def per_pair(positions):
        return np.array([overlap_ncc(tiles, positions, pairs[k : k + 1]) for k in range(len(pairs))])

    reference = per_pair(fiji)
    rows, failed = [], []
    for label, max_shift in (("ours, max_shift=80", 80), ("ours, auto", "auto"), ("ours, max_shift=40", 40)):
        result, times = None, []
        for _ in range(repeats):
            start = time.perf_counter()
            result = register_tiles(tiles, stage, max_shift=max_shift)
            times.append(time.perf_counter() - start)
        used = f"{int(result.accepted.sum())} of {len(result.pairs)} ({int(result.broad_band.sum())} broad band)"
        rows.append((f"{label} ({result.max_shift} px)", result.positions, min(times), used))
        record(rows[-1][0], times_s=times, group="strip", reference="ours, max_shift=80 (80 px)", pairs_used=used)
    try:
        (positions, note), elapsed, _ = timed(lambda: run_m2stitch(tiles, stage, (1, len(tiles))), memory=False)
        rows.append(("m2stitch" + note, positions, elapsed, ""))
        record("m2stitch", first_s=elapsed, group="strip", reference="ours, max_shift=80 (80 px)", note=note)
    except Exception as error:  # noqa: BLE001 - a peer's failure is a row of the table
        failed.append(f"m2stitch: {error!r}")  # (0.7.2 on one row: KeyError('top_ncc_first'), no vertical pairs)
    try:
        (positions, note), elapsed, _ = timed(
            lambda: run_ashlar(folder, (1, len(tiles)), 0.5, max_shift=80, pattern="{series}.tif"), memory=False
        )
        rows.append(("ASHLAR (max_shift=80)", positions, elapsed, ""))
        record("ASHLAR (max_shift=80)", first_s=elapsed, group="strip", reference="ours, max_shift=80 (80 px)")
    except Exception as error:  # noqa: BLE001
        failed.append(f"ASHLAR: {error!r}")
    rows.append(("Fiji (its registered file)", fiji, float("nan"), ""))
    rows.append(("stage (tile_config.txt)", stage, float("nan"), ""))
    print("| placement | mean overlap NCC | worst pair - Fiji's | pairs below Fiji's by > 0.03 | per pair "
          "| pairs used | time s (best) |")  # fmt: skip
    print("|---|---:|---:|---:|---|---|---:|")
    for label, positions, seconds, used in rows:
        values = per_pair(positions)
        below = values - reference
        print(f"| {label} | {values.mean():.3f} | {below.min():+.3f} | {int((below < -0.03).sum())} "
              f"| {' '.join(f'{v:.2f}' for v in values)} | {used} | {seconds:.2f} |")  # fmt: skip
    for line in failed:
        print(f"| {line.split(':')[0]} failed: {line.split(': ', 1)[1]} | | | | | | |")


# -- scale: a large grid from a Zarr store, read lazily ----------------------------------------------------------


def procedural_region(y0: int, x0: int, shape, seed: int = 0, components: int = 48) -> np.ndarray:
    """A fluorescence-like picture at any window, without holding the whole: products of random cosines, exp'd.

    ``sum_k a_k cos(2 pi fy_k y + p_k) cos(2 pi fx_k x + q_k)`` (one matrix product per window), random
    frequencies from 1/300 to 1/5 cycles per pixel (log-uniform), amplitudes falling as f^-0.5; the same
    numbers at a pixel whichever window asks.
    """
    rng = np.random.default_rng(seed)
    fy, fx = (np.exp(rng.uniform(np.log(1 / 300), np.log(1 / 5), components)) for _ in range(2))
    py, px = rng.uniform(0, 2 * np.pi, (2, components))
    a = (fy * fx) ** -0.25
    a /= np.sqrt((a**2).sum() / 4)
    y = np.arange(y0, y0 + shape[0])[:, None]
    x = np.arange(x0, x0 + shape[1])[:, None]
    field = (np.cos(2 * np.pi * y * fy + py) * a) @ np.cos(2 * np.pi * x * fx + px).T
    return np.exp(0.8 * field)


def write_scale_mosaic(folder: Path, grid: int, tile: int, overlap: float, error: int, hole: int):
    """A grid x grid mosaic of tile x tile uint16 tiles in a Zarr store (one chunk per tile), written tile by tile.

    Integer true positions (stage grid + uniform errors up to ``error``); Poisson noise; a background-only
    square of ``hole`` x ``hole`` tiles in the middle (no specimen: shot noise on the background only).
    Returns (the Zarr path, stage positions, true positions, which tiles lie in the hole).
    """
    import zarr

    rng = np.random.default_rng(5)
    step = int(round(tile * (1 - overlap)))
    index = np.stack(np.divmod(np.arange(grid * grid), grid), 1)
    stage = (index * step).astype(float)
    true = stage + rng.integers(-error, error + 1, stage.shape)
    lo, hi = (grid - hole) // 2, (grid - hole) // 2 + hole
    in_hole = np.all((index >= lo) & (index < hi), axis=1)
    hole_lo, hole_hi = lo * step - error, (hi - 1) * step + tile + error  # scene pixels without specimen
    path = folder / "tiles.zarr"
    store = zarr.open(str(path), mode="w", shape=(grid * grid, tile, tile), chunks=(1, tile, tile), dtype="uint16")
    for t, (y0, x0) in enumerate(true.astype(int)):
        picture = procedural_region(y0, x0, (tile, tile))
        ys, xs = np.arange(y0, y0 + tile)[:, None], np.arange(x0, x0 + tile)[None, :]
        blank = (ys >= hole_lo) & (ys < hole_hi) & (xs >= hole_lo) & (xs < hole_hi)
        picture = np.where(blank, 0.0, picture)
        store[t] = (rng.poisson(200 * (0.1 + picture)) + 100).astype(np.uint16)
    return path, stage, true, in_hole


def bench_scale(args) -> None:
    import dask.array as da
    from _harness import PeakMemory

    from napari_gridmip import register_tiles
    from napari_gridmip.core.patches import stitch

    grid, tile, overlap, error = args.scale, 512, 0.1, 8
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        hole = max(grid // 6, 1)
        path, stage, true, in_hole = write_scale_mosaic(Path(folder), grid, tile, overlap, error, hole=hole)
        print(f"# wrote {grid * grid} tiles of {tile}x{tile} uint16 ({grid * grid * tile * tile * 2 / 2**30:.2f} GiB) "
              f"to Zarr in {time.perf_counter() - start:.0f} s")  # fmt: skip
        tiles = da.from_zarr(str(path))
        for engine in args.engines:
            stitch.FORCE_ENGINE = None if engine == "auto" else engine
            with PeakMemory() as memory:
                start = time.perf_counter()
                result = register_tiles(tiles, stage, max_shift=16)
                elapsed = time.perf_counter() - start
            textured = ~in_hole
            rms, worst = errors(result.positions[textured], true[textured])
            record(f"register_tiles, engine {engine}", first_s=elapsed, peak_mb=memory.extra_mb, group="scale",
                   rms_px=rms, worst_px=worst, pairs_used=int(result.accepted.sum()))  # fmt: skip
            correction = result.positions - stage
            drift = np.abs(correction[in_hole] - correction.mean(axis=0)).max()
            print(f"| {engine} | {elapsed:.1f} | {memory.extra_mb:.0f} | {int(result.accepted.sum())}/"
                  f"{len(result.pairs)} | {rms:.3f} / {worst:.3f} | {int(result.placed_from_stage.sum())} "
                  f"({int(in_hole.sum())} in the hole) | {drift:.2f} |")  # fmt: skip
        stitch.FORCE_ENGINE = None
        if args.peers:
            for tool in ("m2stitch", "ashlar"):
                print(peer_at_scale(tool, Path(folder), path, stage, true, ~in_hole, grid, overlap, args.peers))


PEER_AT_SCALE = """
import sys, time, json, warnings
import numpy as np
sys.path[:0] = [{root!r}, {bench!r}]
from bench_stitch import run_ashlar, run_m2stitch
tool, zarr_path, folder, grid, overlap = {tool!r}, {zarr_path!r}, {folder!r}, {grid}, {overlap}
stage = np.array({stage})
start = time.perf_counter()
if tool == "m2stitch":
    import zarr
    tiles = np.asarray(zarr.open(zarr_path, mode="r")[:], np.float32)  # m2stitch takes the tiles in memory
    positions, note = run_m2stitch(tiles, stage, (grid, grid))
else:
    positions, note = run_ashlar(folder, (grid, grid), overlap)  # ASHLAR reads its TIFF files itself
print(json.dumps({{"s": time.perf_counter() - start, "positions": positions.tolist(), "note": note}}))
"""


def peer_at_scale(tool, folder: Path, zarr_path: Path, stage, true, textured, grid, overlap, timeout) -> str:
    """m2stitch or ASHLAR on the scale mosaic, in a new process stopped after ``timeout`` s: a table row."""
    import resource

    if tool == "ashlar" and not (folder / "tiff").exists():
        import tifffile
        import zarr

        (folder / "tiff").mkdir()
        store = zarr.open(str(zarr_path), mode="r")
        for t in range(store.shape[0]):
            tifffile.imwrite(folder / "tiff" / f"img_{t:03}.tif", store[t])
    code = PEER_AT_SCALE.format(root=str(ROOT), bench=str(Path(__file__).parent), tool=tool,
                                zarr_path=str(zarr_path), folder=str(folder / "tiff"), grid=grid, overlap=overlap,
                                stage=stage.tolist())  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return f"| {tool} | did not finish in {timeout} s at grid {grid}x{grid} | | | | | |"
    if out.returncode != 0:
        return f"| {tool} | failed: {out.stderr.strip().splitlines()[-1][:120]} | | | | | |"
    result = json.loads(out.stdout.strip().splitlines()[-1])
    peak = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) / 1024
    rms, worst = errors(np.array(result["positions"])[textured], true[textured])
    return f"| {tool}{result['note']} | {result['s']:.1f} | {peak:.0f} (process peak) | | {rms:.3f} / {worst:.3f} | | |"


FIRST_RUN = """
import time
import napari
from qtpy.QtWidgets import QApplication
from napari_gridmip._widgets.stitch_widget import StitchWidget
viewer = napari.Viewer(show=False)
widget = StitchWidget(viewer)
viewer.window.add_dock_widget(widget)
viewer.open_sample("napari-gridmip", "mosaic")
app = QApplication.instance()
start = time.perf_counter()
widget.run_button.native.click()
while widget.runner.busy:
    app.processEvents()
    time.sleep(0.005)
print(f"{time.perf_counter() - start:.2f} s from the click to done; {widget.summary.value}")
viewer.close()
"""


def bench_first_run(repeats: int) -> None:
    """The Stitch tiles widget's first Run on the mosaic sample, each in a new process with empty caches."""
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_COMPILATION_CACHE_DIR": str(Path(folder) / "jax"),
                   "NAPARI_GRIDMIP_CACHE_DIR": str(Path(folder) / "gridmip")}  # fmt: skip
            out = subprocess.run([sys.executable, "-c", FIRST_RUN], env=env, capture_output=True, text=True, cwd=ROOT)
            lines = [line for line in out.stdout.splitlines() if "from the click" in line]
            if lines:
                record("Stitch tiles widget, first Run", first_s=float(lines[-1].split()[0]), group="first run",
                       note="a new process, empty caches", summary=lines[-1])  # fmt: skip
            print(f"- widget first Run: {lines[-1] if lines else out.stderr.strip().splitlines()[-1]}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=("small", "camera", "synthetic", "large", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="3x3 mosaics")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ashlar", action="store_true", help="also ASHLAR (the synthetic case, --only repetitive)")
    parser.add_argument("--skip-m2stitch", action="store_true")
    parser.add_argument("--real", type=Path, help="a folder of real tiles (see the docstring)")
    parser.add_argument("--strip", type=Path, help="starrynight's stitch_images folder (see bench_strip)")
    parser.add_argument("--grid", type=int, nargs=2, help="rows, columns of --real")
    parser.add_argument("--overlap", type=float, nargs="+", help="nominal overlap of --real, a fraction (or y x)")
    parser.add_argument("--scale", type=int, metavar="N", help="an N x N grid of 512^2 tiles from Zarr (e.g. 30)")
    parser.add_argument("--engines", nargs="*", default=["auto"], help="--scale: auto, numpy and/or jax")
    parser.add_argument("--peers", type=int, metavar="SECONDS", help="--scale: m2stitch and ASHLAR too, each "
                        "stopped after SECONDS")  # fmt: skip
    parser.add_argument("--first-run", action="store_true", help="the widget's first Run, new process (xvfb-run)")
    parser.add_argument("--only", choices=("repetitive",), help="repetitive: large stage errors and repetitive "
                        "texture, accuracy only")  # fmt: skip
    args = parser.parse_args()
    start_run("stitch", args)
    print(f"# {machine()}")
    if args.only == "repetitive":
        bench_repetitive(ashlar=args.ashlar)
        return
    if args.strip:
        bench_strip(args.strip, args.repeats)
        return
    if args.first_run:
        bench_first_run(args.repeats)
        return
    if args.scale:
        print("| engine | time s | peak extra MiB | pairs used | RMS / max error px (textured tiles) "
              "| tiles from the stage | background drift px |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        bench_scale(args)
        return
    if args.real:
        tiles, stage, grid, overlap, ref = read_real(args.real, tuple(args.grid), args.overlap)
        bench_case(f"real tiles from {args.real.name}", tiles, stage, grid, overlap, ref, args, real=True)
        return
    for case in ("small", "camera", "synthetic") if args.case == "all" else (args.case,):
        tiles, stage, grid, overlap, truth, keep = make_case(case, args.quick)
        shape = "x".join(map(str, tiles.shape[1:]))
        title = f"{case}: {grid[0]}x{grid[1]} tiles of {shape} {tiles.dtype}, {overlap:.0%} overlap"
        bench_case(title, tiles, stage, grid, overlap, truth, args, keep=keep)


if __name__ == "__main__":
    main()
