"""Where a warm call's time goes on the device: JAX's profiler around one call of a benchmark case, op by op.

    python benchmarks/probes/accelerator_profile.py track_speckles dic --out $OUT/profile

For each case of ``benchmarks/bench_accelerator.py`` named (same inputs, put on the device first), two warm-up
calls, then one call under ``jax.profiler.trace`` with a Perfetto trace. From that trace, per device (the TPU's
own lines, and the host's): the time of each compiled program (XLA module) and of its ops, summed by name and
sorted, with counts, and the device's busy time against the call's wall time (the gap is the host's: Python,
dispatch, transfers, waits). One text summary per case on stdout and in ``--out``, with the trace beside it.
This says which ops hold a call, a first step to each kernel's distance from the chip's limits.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]


def _trace_events(folder: Path) -> list[dict]:
    (path,) = sorted(folder.rglob("perfetto_trace.json.gz"))[-1:] or [None]
    if path is None:
        raise SystemExit(f"no perfetto_trace.json.gz under {folder}")
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def summarise(events: list[dict], wall_s: float, top: int) -> list[str]:
    """Per process (device), per thread (line): the summed durations by event name, largest first."""
    process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name"}  # fmt: skip
    totals: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    counts: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    spans: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    where: dict[str, str] = {}  # an op's source line or JAX name, where the trace gives one
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        key = (process.get(e["pid"], str(e["pid"])), thread.get((e["pid"], e.get("tid")), str(e.get("tid"))))
        totals[key][e["name"]] += e["dur"] / 1e6
        counts[key][e["name"]] += 1
        spans[key].append((e["ts"], e["ts"] + e["dur"]))
        args = e.get("args") or {}
        if e["name"] not in where and any(k in args for k in ("source", "tf_op", "long_name")):
            where[e["name"]] = " | ".join(str(args[k])[:160] for k in ("source", "tf_op") if k in args)
    lines = [f"call: {wall_s:.4f} s wall"]
    for key in sorted(totals, key=lambda k: -sum(totals[k].values())):
        name, line = key
        if "TPU" not in name and "GPU" not in name and "XLA" not in line and "python" not in line.lower():
            continue
        merged, end = 0.0, -1.0  # the line's busy time: its spans' union
        for a, b in sorted(spans[key]):
            if b > end:
                merged += (b - max(a, end)) / 1e6
                end = b
        lines.append(f"\n{name} / {line}: busy {merged:.4f} s ({merged / wall_s:.0%} of the call)")
        for op, seconds in totals[key].most_common(top):
            lines.append(f"  {seconds:9.4f} s  x{counts[key][op]:<6d} {op[:150]}  {where.get(op, '')}".rstrip())
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", help="case names of bench_accelerator.py (its --list)")
    parser.add_argument("--out", type=Path, default=Path("accelerator-out/profile"))
    parser.add_argument("--top", type=int, default=25, help="ops listed per line")
    parser.add_argument("--quick", action="store_true", help="the cases ~8x smaller a side")
    args = parser.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bench_accelerator as bench
    import jax

    cases = bench.BY_NAME
    bench.selected(",".join(args.cases))  # the benchmark's own check of the names (SystemExit on an unknown one)
    options = bench.Options(args.quick, 2048, None)
    for name in args.cases:
        inputs, _ = cases[name].make(options)
        inputs = bench.device_inputs(inputs)
        for _ in range(2):
            bench.timed(cases[name].call, inputs)
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        with jax.profiler.trace(str(folder), create_perfetto_trace=True):
            start = time.perf_counter()
            bench.timed(cases[name].call, inputs)
            wall = time.perf_counter() - start
        lines = [f"# {name} on {jax.default_backend()} ({jax.devices()[0].device_kind})", *summarise(
            _trace_events(folder), wall, args.top)]  # fmt: skip
        text = "\n".join(lines)
        (args.out / f"{name}.txt").write_text(text + "\n")
        print(text, flush=True)


if __name__ == "__main__":
    main()
