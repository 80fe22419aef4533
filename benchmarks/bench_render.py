"""Full-resolution render of a sparse Zarr volume, reading only the chunks the rays need; and the threshold slider.

Peers: the dense MIP over every chunk (``volume.max(axis=0)`` on the same dask array), chunks read counted; the
slider's move against the mipmap widget's NumPy path.

    python -m benchmarks run render [--quick] [--size 1024 --chunk 64 --image 1024] [--slider-only]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine, measure, record, start_run, table  # noqa: E402

from napari_gridmip import max_mipmap, occupancy_mipmap, orthographic_rays, render_volume, threshold_mipmap  # noqa: E402

# The method in full: ``--help`` prints it after the options.
DETAILS = """\
1. A ``size``^3 uint16 volume is written to a Zarr array in a temporary folder
   (chunks ``chunk``^3, zstd-compressed, empty chunks not stored unless
   ``--store-empty``): a few balls
   and thin shells of values 200-1000 on a background of 0, in a small share
   of the chunks. Its occupancy pyramid (threshold 100) is built once from
   the dask array (timed on its own row: it reads every chunk once, and the
   viewer already has it when the user asks for a render).
2. ``render_volume`` makes a ``image``^2 maximum intensity projection of the
   dask volume along z (every pixel one ray through a column), and one along
   an oblique direction. Its baseline for the z view is the dense MIP over
   all chunks, ``volume.max(axis=0)`` on the same dask array (the same image,
   checked). Chunks read are counted by a wrapper that dask reads through.
3. The threshold slider: from the max pyramid of a 256^3 float32 volume to the
   bool level the viewer shows (``threshold_mipmap`` of one level, to NumPy), and the
   mipmap widget's own move (NumPy threshold of the shown level, its count, and
   setting a napari Labels layer's data; no canvas).
"""


class CountingArray:
    """Reads through to a Zarr array, counting the chunk reads dask makes."""

    def __init__(self, array):
        self.array, self.shape, self.dtype, self.ndim = array, array.shape, array.dtype, array.ndim
        self.reads = 0

    def __getitem__(self, key):
        part = self.array[key]
        if part.size:
            self.reads += 1
        return part


def make_volume(folder: Path, size: int, chunk: int, seed: int = 0, store_empty: bool = False):
    """Balls and shells written region by region; chunks left at the fill value are stored only if ``store_empty``."""
    import zarr

    array = zarr.create_array(
        str(folder / "volume.zarr"),
        shape=(size,) * 3,
        chunks=(chunk,) * 3,
        dtype=np.uint16,
        fill_value=0,
        config={"write_empty_chunks": store_empty},
    )
    if store_empty:  # every chunk on disk, as many writers leave them (compressed zeros)
        for z in range(0, size, chunk):
            array[z : z + chunk] = 0
    rng = np.random.default_rng(seed)
    for i in range(6):
        radius = rng.uniform(0.03, 0.07) * size
        centre = rng.uniform(0.15, 0.85, 3) * size
        lo = np.maximum(np.floor(centre - radius - 2).astype(int), 0)
        hi = np.minimum(np.ceil(centre + radius + 2).astype(int), size)
        z, y, x = np.ogrid[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
        r = np.sqrt((z - centre[0]) ** 2 + (y - centre[1]) ** 2 + (x - centre[2]) ** 2)
        inside = r <= radius if i % 2 == 0 else np.abs(r - radius) < 1.0  # balls and thin shells
        region = (slice(lo[0], hi[0]), slice(lo[1], hi[1]), slice(lo[2], hi[2]))
        values = np.asarray(array[region])
        values[inside] = rng.integers(200, 1000, int(inside.sum()))
        array[region] = values
    return array


def stored_chunks(folder: Path) -> int:
    return sum(1 for p in (folder / "volume.zarr" / "c").rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--image", type=int, default=1024, help="pixels per image side (one ray each)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="256^3 in chunks of 32, 256^2 rays, 1 repeat")
    parser.add_argument(
        "--store-empty", action="store_true", help="store the empty chunks too (compressed zeros), as many writers do"
    )
    parser.add_argument("--slider-only", action="store_true", help="only the threshold slider rows (256^3)")
    args = parser.parse_args()
    start_run("render", args)
    if args.quick:
        args.size, args.chunk, args.image, args.repeats = 256, 32, 256, 1
    dask.config.set(scheduler="threads")
    print(f"{machine()}\n")

    if not args.slider_only:
        render_rows(args)
    slider_rows(args)


def render_rows(args) -> None:
    size, chunk, m = args.size, args.chunk, args.image
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        array = make_volume(folder, size, chunk, store_empty=args.store_empty)
        total = (size // chunk + (size % chunk > 0)) ** 3
        print(f"{size}^3 uint16 Zarr volume in chunks of {chunk}^3: {total} chunks, {stored_chunks(folder)} stored\n")
        counting = CountingArray(array)
        volume = da.from_array(counting, chunks=array.chunks)

        start = time.perf_counter()
        levels = [np.asarray(level) for level in dask.compute(*occupancy_mipmap(volume, threshold=100))]
        build = time.perf_counter() - start
        occupancy = levels[0].mean()
        record("occupancy pyramid from the dask volume", first_s=build, group="build", note="every chunk read once")
        print(f"occupancy pyramid built in {build:.1f} s ({occupancy:.3%} of voxels occupied; every chunk read once)\n")

        z_rays = orthographic_rays((size / 2,) * 3, (1, 0, 0), (0, -1, 0), (m, m), pixel_size=size / m)
        view = np.array([0.8, 0.5, 0.33])
        oblique = orthographic_rays((size / 2,) * 3, view, (0, -1, 0), (m, m), pixel_size=1.8 * size / m)

        def reads_of(fn):
            counting.reads = 0
            result = fn()
            return result, counting.reads

        ours_z, ours_z_reads = reads_of(lambda: render_volume(volume, levels, *z_rays, fill=0))
        dense_z, dense_reads = reads_of(lambda: volume.max(axis=0).compute())
        if m == size:  # one ray per column: the same image as the dense MIP
            np.testing.assert_array_equal(ours_z, dense_z)
        _, ours_oblique_reads = reads_of(lambda: render_volume(volume, levels, *oblique, fill=0))

        rows = [
            measure(
                "render_volume MIP along z (ours)",
                lambda: render_volume(volume, levels, *z_rays, fill=0),
                repeats=args.repeats,
                note=f"{ours_z_reads} of {total} chunks read ({ours_z_reads / total:.1%})",
            ),
            measure(
                "dense MIP along z, volume.max(axis=0)",
                lambda: volume.max(axis=0).compute(),
                repeats=args.repeats,
                note=f"{dense_reads} of {total} chunks read ({dense_reads / total:.0%})",
            ),
            measure(
                "render_volume MIP, oblique (ours)",
                lambda: render_volume(volume, levels, *oblique, fill=0),
                repeats=args.repeats,
                note=f"{ours_oblique_reads} of {total} chunks read ({ours_oblique_reads / total:.1%})",
            ),
        ]
        title = f"{m}^2 rays through a {size}^3 Zarr volume ({occupancy:.2%} occupied)"
        print(table(title, rows, "render_volume MIP along z (ours)"))
        print()


def slider_rows(args) -> None:
    """The threshold slider."""
    n = 64 if args.quick else 256
    rng = np.random.default_rng(1)
    values = rng.random((n, n, n), dtype=np.float32)
    max_mipmap(values)  # compiles
    start = time.perf_counter()
    pyramid = max_mipmap(values)
    [np.asarray(level) for level in pyramid]
    made = time.perf_counter() - start
    thresholds = iter(np.linspace(0.5, 0.999, 1000))
    slider = [
        measure(
            f"threshold_mipmap, level {k} {tuple(pyramid[k].shape)} to NumPy",
            lambda k=k: np.asarray(threshold_mipmap([pyramid[k]], threshold=float(next(thresholds)))[0]),
            repeats=5,
        )
        for k in (0, 1, 2)
    ]
    slider.append(
        measure(
            "threshold_mipmap, every level to NumPy",
            lambda: [np.asarray(level) for level in threshold_mipmap(pyramid, threshold=float(next(thresholds)))],
            repeats=5,
        )
    )
    # the widget's own move: re-threshold the shown level with NumPy (GUI thread), count it, set the Labels layer
    from napari.layers import Labels

    from napari_gridmip._jobs.mipmap import Pyramid, as_labels
    from napari_gridmip._jobs.world import Frame

    kept = Pyramid("v", values, [values, *(np.asarray(level) for level in pyramid[1:])], Frame.unit(3), "", False,
                   (0.0, 1.0))  # fmt: skip
    for k in (0, 2):
        layer = Labels(as_labels(kept.level(k, 0.5)))

        def move(k=k, layer=layer):
            level = kept.level(k, float(next(thresholds)))
            kept.summary(k, 0.0, kept.count(k, 0.0, level))
            layer.data = as_labels(level)

        slider.append(measure(f"widget move, level {k}: NumPy threshold + count + Labels.data", move, repeats=5))
    slider.append(
        measure(
            "occupancy_mipmap of the volume (rebuilding instead)",
            lambda: [np.asarray(level) for level in occupancy_mipmap(values, threshold=float(next(thresholds)))],
            repeats=5,
        )
    )
    print(table(f"Threshold slider: one move, from the max pyramid of a {n}^3 float32 volume (built in "
                f"{made * 1e3:.0f} ms, once)", slider, slider[0].name))  # fmt: skip


if __name__ == "__main__":
    main()
