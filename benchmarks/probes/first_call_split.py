"""Where a first call's time goes: JAX's monitoring events of one benchmark case, in a new process.

    python benchmarks/probes/first_call_split.py dic track_speckles       # compile cache off: everything compiles
    NAPARI_GRIDMIP_CACHE_DIR=/tmp/c python benchmarks/probes/first_call_split.py --keep-compile-cache dic  # twice

For each case of ``benchmarks/bench_accelerator.py`` named (same inputs), in this process: the first call, then
a warm one, each with the sum and count of every duration event JAX reported during it (tracing, lowering to
MLIR, XLA's backend compile, the persistent cache's reads and writes), and the rest of the call, which is the
run itself, the transfers and Python. One JSON line per case on stdout: where the first call goes, on the host,
on an accelerator, and in the next process with the persistent cache.

With ``--keep-compile-cache``, the library's own cache (``NAPARI_GRIDMIP_CACHE_DIR``, programs over 0.05 s kept)
serves the next process; a ``JAX_COMPILATION_CACHE_DIR`` of the user's wins over it and keeps JAX's own
threshold (programs over 1 s), so fewer of ours.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", help="case names of bench_accelerator.py (its --list)")
    parser.add_argument("--keep-compile-cache", action="store_true", help="leave the persistent cache on")
    parser.add_argument("--quick", action="store_true", help="the cases ~8x smaller a side")
    args = parser.parse_args()
    if not args.keep_compile_cache:
        os.environ["NAPARI_GRIDMIP_COMPILE_CACHE"] = "0"
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bench_accelerator as bench
    import jax
    import jax.monitoring

    events: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()

    def listen(event: str, duration: float, **_: object) -> None:
        events[event] += duration
        counts[event] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    cases = bench.BY_NAME
    bench.selected(",".join(args.cases))  # the benchmark's own check of the names (SystemExit on an unknown one)
    options = bench.Options(args.quick, 2048, None)
    for name in args.cases:
        inputs, _ = cases[name].make(options)
        cache = None
        if args.keep_compile_cache:
            from napari_gridmip.core.runtime.compile_cache import enable

            cache = str(enable())
        row: dict[str, object] = {"case": name, "backend": jax.default_backend(), "cache": cache}
        for label in ("first", "warm"):
            events.clear()
            counts.clear()
            start = time.perf_counter()
            bench.timed(cases[name].call, inputs)
            total = time.perf_counter() - start
            split = {event.rsplit("/", 1)[-1]: [round(seconds, 3), counts[event]] for event, seconds in events.items()}
            top_level = sum(
                seconds
                for event, seconds in events.items()
                if event.endswith(("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration"))
            )
            row[label] = {"total_s": round(total, 3), "events": split, "rest_s": round(total - top_level, 3)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
