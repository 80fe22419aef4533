"""Speckle tracking: ``track_speckles`` against mbipy's UMPA (plain NumPy), same data and parameters.

Peer: mbipy's ``umpa`` (``pip install mbipy``), subsets 5 x 5 and 1 x 1: warm best, peak memory, and our first call
in a new process.

    python -m benchmarks run tracking [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import group, machine, measure, start_run  # noqa: E402

# The method in full: ``--help`` prints it after the options.
DETAILS = """\
The data: a reference stack of K Gaussian-smoothed random speckle frames (1 + 0.3 n), and a sample that is
the reference shifted by (1.3, -0.7) px, with 0.9 transmission and its speckle visibility scaled by 0.8
(dark-field), plus 1% noise. mbipy is called as its authors intend (``umpa(sample, reference,
search_window, template_window, df=True)``, its default Hamming-weighted template); ours is
``track_speckles(sample, reference, window, subset=...)`` with its defaults (Newton refinement, dark-field,
uncertainty). Warm: best of ``--repeats`` after one call (and one call's peak memory); cold: ours in a new
process with an empty JAX cache.
mbipy's 1 x 1 template cannot fit a dark-field, so that row is without it.
"""


def make_data(frames: int, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    pad = 12
    ref = ndimage.gaussian_filter(rng.standard_normal((frames, size + 2 * pad, size + 2 * pad)), (0, 1.5, 1.5))
    ref = ref / ref.std()
    moved = ndimage.shift(ref, (0, 1.3, -0.7), order=3)
    reference = (1 + 0.3 * ref)[:, pad:-pad, pad:-pad]
    sample = 0.9 * (1 + 0.8 * 0.3 * moved)[:, pad:-pad, pad:-pad]
    sample = sample + 0.01 * rng.standard_normal(sample.shape)
    return sample.astype(np.float32), reference.astype(np.float32)


COLD = """
import time, numpy as np, sys
sys.path.insert(0, {bench!r})
from bench_tracking import make_data
sample, reference = make_data({frames}, {size})
start = time.perf_counter()
import napari_gridmip as gm
out = gm.track_speckles(sample, reference, (9, 9), subset={subset})
np.asarray(out.dark_field)
print(time.perf_counter() - start)
"""


def cold(frames: int, size: int, subset: tuple[int, int]) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache}
        code = COLD.format(bench=str(Path(__file__).resolve().parent), frames=frames, size=size, subset=subset)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    start_run("tracking", args)
    from mbipy.src.phase_retrieval.explicit.umpa import umpa

    from napari_gridmip import track_speckles

    frames, size = (8, 128) if args.quick else (20, 256)
    sample, reference = make_data(frames, size)
    s64, r64 = sample.astype(np.float64), reference.astype(np.float64)
    lines = [
        f"Speckle tracking: K={frames}, {size}x{size}, search 9x9; {machine()}",
        "",
        "| subset | ours warm s | ours cold s | mbipy UMPA warm s | mbipy / ours (warm) | peak MiB ours / mbipy "
        "| ours median dy, dx, D | mbipy median dy, dx, D |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for subset in ((5, 5), (1, 1)):
        df = subset != (1, 1)

        def ours_call(s=subset):
            return np.asarray(track_speckles(sample, reference, (9, 9), subset=s).dark_field)

        ours = measure("ours", ours_call, repeats=args.repeats)
        theirs = measure("mbipy", lambda s=subset, d=df: umpa(s64, r64, (9, 9), s, df=d), repeats=args.repeats)
        first = cold(frames, size, subset)
        group(f"subset {subset[0]}x{subset[1]}", [ours, theirs], "ours")
        ours.extra["first_call_new_process_s"] = first
        got = track_speckles(sample, reference, (9, 9), subset=subset)
        inner = (slice(8, -8), slice(8, -8))
        mine = [float(np.nanmedian(np.asarray(a)[inner])) for a in (got.dy, got.dx, got.dark_field)]
        peer = umpa(s64, r64, (9, 9), subset, df=df)
        # mbipy returns (dx, dy, ...) with its own sign convention: report as returned, for the reader to compare
        peer_med = [float(np.nanmedian(np.asarray(a)[inner])) for a in peer[:3]]
        lines.append(
            f"| {subset[0]}x{subset[1]} | {ours.best_s:.2f} | {first:.2f} | {theirs.best_s:.2f} "
            f"| {theirs.best_s / ours.best_s:.1f} | {ours.peak_mb:.0f} / {theirs.peak_mb:.0f} "
            f"| {mine[0]:.3f}, {mine[1]:.3f}, {mine[2]:.3f} | {', '.join(f'{v:.3f}' for v in peer_med)} |"
        )
        print(lines[-1], flush=True)
    lines += ["", "Target: at least 5x mbipy; the pixel-wise case no slower than subset 5x5."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
