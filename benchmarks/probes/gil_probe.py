"""How long a kernel's call keeps every other Python thread from running: the GIL it holds, measured without Qt.

    python benchmarks/probes/gil_probe.py dic track_speckles local_correlation_image      # the default backend
    JAX_PLATFORMS=cpu python benchmarks/probes/gil_probe.py --quick dic                   # the host, small inputs

The plugin runs JAX in a worker thread while napari's GUI thread draws: a call that holds the GIL while it waits
(for a compile, a transfer, a device) stops the GUI for as long (the bound: the event loop never blocked over
250 ms by our code). ``benchmarks/bench_gui_freeze.py`` measures that in a real viewer, but an accelerator
machine has no Qt. Here each case of ``benchmarks/bench_accelerator.py`` (same inputs) runs in a worker thread,
first call then warm call, while the main thread sleeps ``--interval-ms`` at a time and records how late each
wake-up comes. One JSON line per case and call: the longest wait beyond the interval, how many waits passed 50
and 250 ms, Python's full garbage collections in the call (each holds the GIL for its whole scan, whichever
thread started it: docs/benchmarks.md, the GUI freeze), and for the three longest the other threads' innermost
frames when the main thread got the GIL back (the holder has just let it go: where it was, or had just moved on
from). On a 2-core host a wait also counts the cores being busy: a compile beside a trace leaves the main thread
no core (0.11 to 0.13 s for DIC 256^2's first call here, the worker in XLA's compile, the GIL released).
A dispatch on an accelerator may hold the GIL while it waits for the device (a program that donates its input).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

#: Waits beyond the interval counted in the output (seconds); 0.25 is the bound for the event loop.
COUNTED = (0.05, 0.25)


def frames_of_others(depth: int = 3) -> dict[str, list[str]]:
    """Each other thread's innermost ``depth`` frames as ``file:line function``, then its innermost frame in
    the library: the thread that held the GIL has just let it go, so its frames show where."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    out = {}
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        stack = traceback.extract_stack(frame)[::-1]
        shown = stack[:depth] + [f for f in stack[depth:] if "napari_gridmip" in f.filename][:1]
        out[names.get(ident, str(ident))] = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in shown]
    return out


def probe(call, inputs, *, interval: float, timed) -> dict:
    """Run ``timed(call, inputs)`` in a worker thread and time the main thread's wake-ups until it ends."""
    failure: list[BaseException] = []

    def work() -> None:
        try:
            timed(call, inputs)
        except BaseException as error:  # noqa: BLE001 - reported in the row
            failure.append(error)

    collections: list[float] = []  # full (generation 2) collections: each holds the GIL for all of its scan
    began: list[float] = []

    def on_collect(phase: str, info: dict) -> None:
        if info.get("generation") == 2:
            if phase == "start":
                began.append(time.perf_counter())
            elif began:
                collections.append(time.perf_counter() - began.pop())

    gc.callbacks.append(on_collect)
    worker = threading.Thread(target=work, name="gil-probe worker", daemon=True)
    waits: list[tuple[float, list[str]]] = []
    start = time.perf_counter()
    worker.start()
    last = time.perf_counter()
    while worker.is_alive():
        time.sleep(interval)
        now = time.perf_counter()
        late = now - last - interval
        if late > COUNTED[0]:
            waits.append((late, frames_of_others()))
        last = now
    total = time.perf_counter() - start
    gc.callbacks.remove(on_collect)
    waits.sort(key=lambda wait: -wait[0])
    longest = waits[0][0] if waits else 0.0
    row = {
        "total_s": round(total, 3),
        "longest_wait_s": round(longest, 3),
        **{f"waits_over_{int(bound * 1000)}ms": sum(late > bound for late, _ in waits) for bound in COUNTED},
        "full_collections_s": [round(seconds, 3) for seconds in collections],
        "longest": [{"s": round(late, 3), "threads": at} for late, at in waits[:3]],
    }
    if failure:
        row["error"] = repr(failure[0])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", help="case names of bench_accelerator.py (its --list)")
    parser.add_argument("--quick", action="store_true", help="the cases ~8x smaller a side")
    parser.add_argument("--interval-ms", type=float, default=2.0, help="the main thread's sleep (default 2)")
    args = parser.parse_args()
    os.environ.setdefault("NAPARI_GRIDMIP_COMPILE_CACHE", "0")  # a first call compiles, as in a new install
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bench_accelerator as bench
    import jax

    bench.selected(",".join(args.cases))  # the benchmark's own check of the names (SystemExit on an unknown one)
    options = bench.Options(args.quick, 2048, None)
    for name in args.cases:
        inputs, _ = bench.BY_NAME[name].make(options)
        for label in ("first", "warm"):
            row = probe(bench.BY_NAME[name].call, inputs, interval=args.interval_ms / 1000, timed=bench.timed)
            print(json.dumps({"case": name, "call": label, "backend": jax.default_backend(), **row}), flush=True)


if __name__ == "__main__":
    main()
