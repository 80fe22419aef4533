"""Compile time of find_displacement for long stacks (local correlation of time series), K frames.

Each K in a new process (no persistent cache): the first call, compile included, and the second call; ratios
against the smallest K (the compiled program stays the same size whatever K).

    python -m benchmarks run long_stacks [--quick] [--frames 10 100 500 1000 2000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

from _harness import record, start_run

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from napari_gridmip import find_displacement
    k, size, w = (int(v) for v in sys.argv[1:4])
    a, b = np.random.default_rng(0).random((2, k, size, size), dtype=np.float32)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        np.asarray(find_displacement(a, b, (w, w))[0])
        times.append(time.perf_counter() - start)
    print(json.dumps(times))
    """
)


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Each K runs in a fresh process (no compiled program carried over, no
persistent cache): the first call, compile included, and the second call.
Sums over more than 16 frames loop over unrolled blocks of 16, so the compiled
program, and the compile, stay the same size whatever K.
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, nargs="+", default=[10, 100, 500, 1000, 2000])
    parser.add_argument("--size", type=int, default=48)
    parser.add_argument("--window", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="K = 10 and 40, 32x32: seconds")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.size = [10, 40], 32
    start_run("long_stacks", args)
    size, window = f"{args.size}x{args.size}", f"{args.window}x{args.window}"
    print(f"find_displacement, {size}, window {window}, float32, a fresh process each\n")
    print("| K | first call s (compile included) | second call s |")
    print("|---:|---:|---:|")
    for k in args.frames:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(k), str(args.size), str(args.window)], capture_output=True, text=True
        )
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        first, second = json.loads(done.stdout.strip().splitlines()[-1])
        record(f"K={k}", first_s=first, times_s=[second], group="find_displacement", reference=f"K={args.frames[0]}",
               note="a new process each, no persistent cache")  # fmt: skip
        print(f"| {k} | {first:.2f} | {second:.3f} |")


if __name__ == "__main__":
    main()
