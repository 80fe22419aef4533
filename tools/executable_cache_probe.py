"""What a cache of executables of our own would take off DIC's first call in a next process: tracing and lowering.

    rm -rf /tmp/xc
    for mode in save kept jax load kept jax load kept; do python tools/executable_cache_probe.py $mode /tmp/xc; done

JAX's persistent cache (what the library uses) stores XLA's executables, but a next process still traces and
lowers each program to find its key: 0.4 s of DIC 2048^2's 2.5 s on this 2-core host, 2.1 s of 3.8 s on the TPU
(docs/accelerator.md, thirteenth session). ``jax.experimental.serialize_executable`` can store an executable
with its trees and load it with no tracing. This probe does that for DIC's two large programs (``subsets._band``
and ``subsets._prepared``) by hand, keyed by nothing but their name, so it is a measurement, not a design (a
real key must carry every static option, aval, device and scope):

- ``save``: a first call as the library makes it (persistent cache on, in DIR/jax), then both programs lowered,
  compiled and serialized for the arguments of their first calls, into DIR;
- ``jax``: a new process's first call as today (the persistent cache in DIR/jax);
- ``load``: a new process that loads both executables from DIR, calls them in place of the jitted programs
  (their static options dropped, as an executable takes only the arrays), with the band's compile-ahead
  thread off (it would trace), and the persistent cache on for the small programs.

- ``kept``: a new process's first call with the library's own kept executables (``core/_executables.py``, built
  after this probe's figures), which the other modes switch off.

One JSON line: the mode, the first call, a warm call, and the largest difference from the ``save`` run's output.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]
PROGRAMS = ("_band", "_prepared")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("save", "jax", "load", "kept"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--quick", action="store_true", help="DIC 256^2 instead of 2048^2")
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    os.environ["NAPARI_GRIDMIP_CACHE_DIR"] = str(args.folder)
    if args.mode != "kept":
        os.environ["NAPARI_GRIDMIP_EXECUTABLE_CACHE"] = "0"
    import bench_accelerator as bench
    import jax
    import numpy as np
    from jax.experimental import serialize_executable

    from napari_gridmip.core._compile_cache import enable
    from napari_gridmip.core.correlation import subsets

    enable()
    case = bench.BY_NAME["dic"]
    inputs, _ = case.make(bench.Options(args.quick, 2048, None))
    seen: dict[str, tuple] = {}
    jitted_of = {name: getattr(subsets, name).jitted for name in PROGRAMS}  # the kept programs' jax.jit
    if args.mode == "save":
        for name in PROGRAMS:  # the kept programs' jit replaced by one that records its first call's arguments

            class Recording:
                def __init__(self, jitted, name):
                    self.jitted, self.name = jitted, name

                def __call__(self, *a, **k):
                    seen.setdefault(self.name, (a, k))
                    return self.jitted(*a, **k)

                def lower(self, *a, **k):
                    return self.jitted.lower(*a, **k)

            getattr(subsets, name).jitted = Recording(jitted_of[name], name)
    elif args.mode == "load":
        for name in PROGRAMS:
            payload, in_tree, out_tree = pickle.loads((args.folder / f"{name}.pickle").read_bytes())
            started = time.perf_counter()
            compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
            seen[name] = (time.perf_counter() - started,)

            def loaded(*a, _compiled=compiled, **_static):
                return _compiled(*a)

            getattr(subsets, name).jitted = loaded
        subsets._compile_band_ahead = lambda *a, **k: None
    started = time.perf_counter()
    _, out = bench.timed(case.call, inputs)  # (seconds, the outputs as NumPy by name)
    first = time.perf_counter() - started
    started = time.perf_counter()
    bench.timed(case.call, inputs)
    warm = time.perf_counter() - started
    flat = np.concatenate([np.ravel(out[key]).astype(np.float64) for key in sorted(out)])
    row = {"mode": args.mode, "backend": jax.default_backend(), "first_s": round(first, 3), "warm_s": round(warm, 3)}
    if args.mode == "save":
        np.save(args.folder / "out.npy", flat)
        for name in PROGRAMS:
            a, k = seen[name]
            jitted = jitted_of[name]
            payload = serialize_executable.serialize(jitted.lower(*a, **k).compile())
            (args.folder / f"{name}.pickle").write_bytes(pickle.dumps(payload))
    else:
        reference = np.load(args.folder / "out.npy")
        row["largest_difference"] = (
            float(np.nanmax(np.abs(flat - reference))) if flat.shape == reference.shape else None
        )
        row["same_nan"] = bool((np.isnan(flat) == np.isnan(reference)).all()) if flat.shape == reference.shape else None
    if args.mode == "load":
        row["deserialize_s"] = {name: round(seen[name][0], 3) for name in PROGRAMS}
        row["first_with_loads_s"] = round(first + sum(seen[name][0] for name in PROGRAMS), 3)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
