"""Data larger than memory: the CLI's OME-Zarr pyramid of a Zarr volume, and a displacement field through dask.

Peers: the in-memory paths (the volume or stacks loaded into NumPy first), each in a process of its own: time and
the process's peak resident memory.

    python -m benchmarks run large [--quick] [--folder /tmp/gridmip-bench] [--size 1024]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from _harness import record, start_run

# The method in full: ``--help`` prints it after the options.
DETAILS = """\
1. A 1024^3 uint8 Zarr volume (1 GiB; sparse balls, chunks of 128^3) is turned
   into an OME-Zarr occupancy pyramid by ``napari-gridmip mipmap`` (a separate
   process, whose peak resident memory is measured), against the in-memory path
   in another process: load the whole volume into NumPy, ``occupancy_mipmap``,
   and write the same pyramid with ``write_mipmap``.
2. The displacement field of a K=20, 2048x2048 float32 stack pair (15x15
   window) from Zarr through dask (row bands of 256), against the in-memory call
   on the loaded stacks, each in its own process.

Each row is the best of ``--repeats`` runs; peak RSS is the process's maximum
resident memory (VmHWM), JAX, dask and zarr themselves included (about 260 MiB).
"""


def make_inputs(folder: Path, size: int, frames: int, image: int) -> None:
    import numpy as np
    import zarr

    volume_path = folder / "volume.zarr"
    if not volume_path.exists():
        volume = zarr.open_array(str(volume_path), mode="w", shape=(size,) * 3, chunks=(128,) * 3, dtype="uint8")
        rng = np.random.default_rng(0)
        centres = rng.integers(0, size, (40, 3))
        radii = rng.integers(4, size // 16, 40)
        z = np.arange(128)
        for start in range(0, size, 128):  # slab by slab: never the whole volume in memory
            slab = np.zeros((min(128, size - start), size, size), np.uint8)
            zz = (start + z[: slab.shape[0]])[:, None, None]
            for (cz, cy, cx), r in zip(centres, radii):
                if abs(cz - (start + 64)) > r + 64:
                    continue
                y0, y1, x0, x1 = max(cy - r, 0), min(cy + r + 1, size), max(cx - r, 0), min(cx + r + 1, size)
                yy, xx = np.ogrid[y0:y1, x0:x1]
                ball = (zz - cz) ** 2 + (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
                slab[:, y0:y1, x0:x1][ball] = 200
            volume[start : start + slab.shape[0]] = slab
    for name, seed in (("img1.zarr", 1), ("img2.zarr", 2)):
        path = folder / name
        if not path.exists():
            from scipy import ndimage

            rng = np.random.default_rng(seed)
            stack = zarr.open_array(str(path), mode="w", shape=(frames, image, image), chunks=(frames, 256, image),
                                    dtype="float32")  # fmt: skip
            base = np.random.default_rng(0)
            for k in range(frames):
                frame = ndimage.gaussian_filter(base.random((image, image), dtype=np.float32), 1.5)
                if seed == 1:  # img1: img2 shifted by (1.3, -0.7), plus a little noise
                    frame = ndimage.shift(frame, (1.3, -0.7), order=3) + 0.01 * rng.random(frame.shape)
                stack[k] = frame


def child(code: str, *args: str) -> tuple[float, str]:
    """Run ``code`` in a fresh process; return (seconds, its last stdout line)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return seconds, done.stdout.strip().splitlines()[-1]


def peak_of(code: str, *args: str) -> tuple[float, float]:
    """Seconds and the child's own peak RSS, read by the child itself from /proc (VmHWM).

    (``ru_maxrss`` would not do: Linux keeps it across fork and exec, so a child
    reports at least the parent's RSS at the fork.)
    """
    report = "\nprint([line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')][0])"
    seconds, line = child(code + report, *args)
    return seconds, int(line) / 1024


PYRAMID_REFERENCE = "napari-gridmip mipmap (dask, block by block)"
FIELD_REFERENCE = "find_displacement through dask (row bands)"
CLI = "import sys; from napari_gridmip.cli import main; main(sys.argv[1:])"
IN_MEMORY_MIPMAP = textwrap.dedent(
    """
    import sys, numpy as np, zarr
    from napari_gridmip import write_mipmap
    volume = zarr.open_array(sys.argv[1], mode="r")[:]
    write_mipmap(volume, sys.argv[2])
    """
)
FIELD = textwrap.dedent(
    """
    import sys, numpy as np, zarr, dask, dask.array as da
    from napari_gridmip import find_displacement
    lazy = sys.argv[3] == "dask"
    if lazy:
        img1, img2 = da.from_zarr(sys.argv[1]), da.from_zarr(sys.argv[2])
        dy, dx, peak = dask.compute(*find_displacement(img1, img2, (15, 15)))
    else:
        img1, img2 = zarr.open_array(sys.argv[1], mode="r")[:], zarr.open_array(sys.argv[2], mode="r")[:]
        dy, dx, peak = (np.asarray(r) for r in find_displacement(img1, img2, (15, 15)))
    print(float(np.nanmedian(dy)), float(np.nanmedian(dx)), file=sys.stderr)
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", type=Path, default=Path("/tmp/gridmip-bench"))
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--image", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a 256^3 volume, K=4 stacks of 512^2: seconds")
    args = parser.parse_args()
    if args.quick:
        args.size, args.frames, args.image = 256, 4, 512
    start_run("large", args)
    # inputs are kept between runs, in a folder of their own sizes
    folder = args.folder / f"large-{args.size}-{args.frames}x{args.image}"
    folder.mkdir(parents=True, exist_ok=True)
    make_inputs(folder, args.size, args.frames, args.image)
    volume = str(folder / "volume.zarr")
    gib = args.size**3 / 2**30

    rows = []
    for label, code, extra in (
        (PYRAMID_REFERENCE, CLI, ["mipmap", volume, "{out}", "--quiet"]),
        ("in memory: load + write_mipmap", IN_MEMORY_MIPMAP, [volume, "{out}"]),
    ):
        runs = []
        for _ in range(args.repeats):
            out = folder / "pyramid.ome.zarr"
            shutil.rmtree(out, ignore_errors=True)
            runs.append(peak_of(code, *(e.format(out=out) for e in extra)))
        best = min(runs)
        record(label, times_s=[r[0] for r in runs], peak_mb=best[1], group="pyramid", reference=PYRAMID_REFERENCE,
               note="a new process each (start-up included), its whole RSS")  # fmt: skip
        rows.append((label, *best))
    print(f"occupancy pyramid of a {args.size}^3 uint8 Zarr volume ({gib:.2f} GiB) to OME-Zarr\n")
    print("| path | best s | GiB/s | x dask | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|")
    for label, seconds, peak in rows:
        print(f"| {label} | {seconds:.1f} | {gib / seconds:.2f} | {seconds / rows[0][1]:.2f} | {peak:.0f} |")

    img1, img2 = str(folder / "img1.zarr"), str(folder / "img2.zarr")
    rows = []
    for label, mode in (
        (FIELD_REFERENCE, "dask"),
        ("in memory (loaded stacks)", "memory"),
    ):
        runs = [peak_of(FIELD, img1, img2, mode) for _ in range(args.repeats)]
        best = min(runs)
        record(label, times_s=[r[0] for r in runs], peak_mb=best[1], group="displacement field",
               reference=FIELD_REFERENCE, note="a new process each (start-up included), its whole RSS")  # fmt: skip
        rows.append((label, *best))
    stack_mib = 2 * args.frames * args.image**2 * 4 / 2**20
    print(f"\ndisplacement field, K={args.frames}, {args.image}x{args.image} float32 from Zarr (two stacks: "
          f"{stack_mib:.0f} MiB), 15x15 window, process total (start-up and reading included)\n")  # fmt: skip
    print("| path | best s | x dask | peak RSS MiB |")
    print("|---|---:|---:|---:|")
    for label, seconds, peak in rows:
        print(f"| {label} | {seconds:.1f} | {seconds / rows[0][1]:.2f} | {peak:.0f} |")


if __name__ == "__main__":
    main()
