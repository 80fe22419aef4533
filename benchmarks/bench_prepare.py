"""Each widget's first Run on its sample in a new process: on an empty cache, and after ``napari-gridmip --prepare``.

Peer: the same first Run on an empty cache; ``--widgets`` adds the real widgets' first Runs in napari.

    python -m benchmarks run prepare [--quick] [--only dic dic-affine] [--compute-on auto]
    xvfb-run -a python benchmarks/bench_prepare.py --widgets
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _harness import device, record, start_run  # noqa: E402

CHILD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    from napari_gridmip._sample_data import prepare as _prepare
    from napari_gridmip._jobs import prepare_jax
    import jax, jax.monitoring
    job = {j.name: j for j in _prepare.JOBS}[sys.argv[1]]
    where = sys.argv[2]
    compiles, hit = [], [False]
    def heard(event, *_, **__):
        if event == "/jax/compilation_cache/cache_hits":
            hit[0] = True
    def timed(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            if not hit[0]:
                compiles.append((round(seconds, 3), str(kwargs.get("fun_name", "?"))))
            hit[0] = False
    jax.monitoring.register_event_listener(heard)
    jax.monitoring.register_event_duration_secs_listener(timed)
    prepare_jax()
    start = time.perf_counter() - t0
    first = _prepare.run_job(job, where)
    fresh = sorted(compiles, reverse=True)
    warm = _prepare.run_job(job, where)
    device = jax.devices()[0]
    print("RESULT " + json.dumps({"device": f"{device.platform} ({device.device_kind})", "start": start,
                                  "first": first, "warm": warm,
                                  "compile": sum(s for s, _ in fresh), "programs": len(fresh), "largest": fresh[:3]}))
    """
)

# the bench_gui_freeze.py scenario of each job that has one
SCENARIOS = {
    "dic": "correlation-dic",
    "speckle": "correlation",
    "calcium": "correlation-calcium",
    "mipmap": "mipmap",
    "tiled": "tiled",
    "patches": "patches",
    "stitch": "stitch",
}


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
On a new machine, ``napari-gridmip --prepare`` compiles and keeps the programs of the widgets' first Runs, which
then take at most 3 s. For each job, in its own new process (``NAPARI_GRIDMIP_CACHE_DIR`` a new temporary folder):
the job's first Run on an empty cache, as the widget's worker runs it
(``napari_gridmip._sample_data.prepare.run_job``: the request made and JAX started first, as the widget does before
Run is clicked), with the XLA compiles it made (JAX's monitoring events; a program read from JAX's persistent cache
is not counted, one loaded from the kept executables makes no event at all); then a second call (warm). Then one
``napari-gridmip --prepare`` into another new folder (with ``--only``, the same preparation of those jobs alone),
and each job's first Run again in a new process on it: what a user's first Run after the preparation takes, and what
it still compiles.

``--widgets``: the same two first Runs through the real widget in napari (``bench_gui_freeze.py``'s scenarios, click
to last layer added), for the jobs that have one; needs a display.
"""


def _child(name: str, where: str, cache: str) -> dict:
    from bench_first_run import _result

    return _result([sys.executable, "-c", CHILD, name, where], cache)


def _prepare_into(cache: str, names: list[str] | None, where: str) -> tuple[float, str]:
    """``napari-gridmip --prepare`` (or the same for ``names`` alone) into ``cache``: its wall seconds, its output."""
    from bench_first_run import _env

    if names is None:
        command = [sys.executable, "-m", "napari_gridmip", "--prepare", "--compute-on", where]
    else:
        code = "import sys; from napari_gridmip._sample_data import prepare as p; "
        code += "sys.exit(p.prepare(sys.argv[1], names=sys.argv[2:]))"
        command = [sys.executable, "-c", code, where, *names]
    start = time.perf_counter()
    done = subprocess.run(command, env=_env(cache), capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"--prepare failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    return seconds, done.stdout


def _per_job(output: str) -> dict[str, float]:
    """The seconds --prepare printed for each job (its lines ``  NAME  S s  (...)``)."""
    seconds = {}
    for line in output.splitlines():
        parts = line.split()
        if line.startswith("  ") and len(parts) >= 3 and parts[2] == "s":
            seconds[parts[0]] = float(parts[1])
    return seconds


def _largest(result: dict) -> str:
    return ", ".join(f"{name} {s:.2f}" for s, name in result["largest"]) or "-"


def main() -> None:
    from napari_gridmip._sample_data.prepare import JOB_NAMES

    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=JOB_NAMES, help="these jobs (default: all)")
    parser.add_argument("--compute-on", default="auto", choices=["auto", "accelerator", "host"])
    parser.add_argument("--widgets", action="store_true", help="also the widgets' first Runs in napari (a display)")
    parser.add_argument("--quick", action="store_true", help="the mipmap and patches jobs alone (unless --only)")
    args = parser.parse_args()
    if args.quick and not args.only:
        args.only = ["mipmap", "patches"]
    start_run("prepare", args)
    names = list(args.only) if args.only else list(JOB_NAMES)
    cold = {}
    for name in names:  # JAX is never started here: a TPU serves one process at a time, each child in turn
        with tempfile.TemporaryDirectory() as cache:
            cold[name] = _child(name, args.compute_on, cache)
    print(f"{cold[names[0]]['device']}, {os.cpu_count()} CPUs, compute_on {args.compute_on!r}")
    platform, _, kind = cold[names[0]]["device"].partition(" (")
    device(platform, kind.rstrip(")"))
    with tempfile.TemporaryDirectory() as work:
        cache, pristine = str(Path(work) / "cache"), Path(work) / "prepared"
        wall, output = _prepare_into(cache, args.only and names, args.compute_on)
        print(f"\n`napari-gridmip --prepare`{' (' + ' '.join(names) + ')' if args.only else ''}: {wall:.1f} s\n")
        print(output)
        shutil.copytree(cache, pristine)
        prepared = {}

        def as_prepared() -> str:
            """The prepared folder as --prepare left it, at its own path: each job's first Run finds no other's
            there (JAX's cache key holds its folder's path: a copy elsewhere would miss every program)."""
            shutil.rmtree(cache)
            shutil.copytree(pristine, cache)
            return cache

        for name in names:
            prepared[name] = _child(name, args.compute_on, as_prepared())
        widgets = {}
        if args.widgets:
            from bench_first_run import _result

            for name in names:
                if name not in SCENARIOS:
                    continue
                command = [sys.executable, str(HERE / "bench_gui_freeze.py"), "--child", SCENARIOS[name]]
                with tempfile.TemporaryDirectory() as empty:
                    widgets[name] = (_result(command, empty)["run_s"], _result(command, as_prepared())["run_s"])
    seconds = _per_job(output)
    print(
        "| job | first Run, empty cache s | its XLA compiles s (programs) | --prepare s | first Run after --prepare s "
        "| XLA compiles left s (programs) | warm s | largest compiles left s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---|"
    )
    for name in names:
        a, b = cold[name], prepared[name]
        for label, r in (("empty cache", a), ("after --prepare", b)):
            record(f"{name}, {label}", first_s=r["first"], times_s=[r["warm"]], group=name,
                   reference=f"{name}, empty cache", note="first Run in a new process; warm: its second",
                   compile_s=r["compile"], programs=r["programs"], largest=r["largest"],
                   prepare_s=seconds.get(name) if label == "after --prepare" else None)  # fmt: skip
        print(
            f"| {name} | {a['first']:.2f} | {a['compile']:.2f} ({a['programs']}) | {seconds.get(name, 0.0):.1f} "
            f"| {b['first']:.2f} | {b['compile']:.2f} ({b['programs']}) | {min(a['warm'], b['warm']):.3f} "
            f"| {_largest(b)} |",
            flush=True,
        )
    if widgets:
        print("\n| widget scenario | first Run, empty cache s | first Run after --prepare s |\n|---|---:|---:|")
        for name, (empty, ready) in widgets.items():
            print(f"| {SCENARIOS[name]} ({name}) | {empty:.2f} | {ready:.2f} |")
            record(f"widget {SCENARIOS[name]}", first_s=empty, group="widgets", note="first Run, empty cache",
                   after_prepare_s=ready)  # fmt: skip


if __name__ == "__main__":
    main()
