"""How long the GUI thread stops answering while a widget runs and its layers are added, and where.

Each scenario's first Run in a new process with a real napari viewer: the longest gap of a 5 ms timer on the GUI
thread, what held the thread, and Python's full garbage collections (no peer: the bound is 250 ms).

    xvfb-run -a python -m benchmarks run gui_freeze [--quick] [--scenario all] [--threshold-ms 100]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback

SCENARIOS = [
    "mipmap",
    "mipmap-per-level",
    "mipmap-second",
    "patches",
    "stitch",
    "tiled",
    "correlation",
    "correlation-map",
    "correlation-dic",
    "correlation-calcium",
]


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Each scenario runs in a fresh Python process (so "first run" means the session's first): a real napari
viewer, the widget docked, its sample loaded, Run clicked through the button. A 5 ms QTimer on the GUI
thread records when the event loop gets to run; the longest gap between two ticks is the freeze. A
watchdog thread samples the GUI thread's Python stack (``sys._current_frames``) whenever it has not
ticked for ``--threshold-ms``, so each long freeze comes with the code that held the thread. The
durations of Python's full (generation 2) garbage collections during the run are listed too: one scans
every object of the process and holds the GIL in whichever thread started it, so the GUI thread waits.

Scenarios: ``mipmap`` (first run), ``mipmap-per-level`` (first run with one image layer per level),
``mipmap-second`` (a second run in the same session), ``patches``, ``stitch`` (the mosaic sample),
``tiled`` (a Gaussian in tiles of the occupancy volume), ``correlation``, ``correlation-map`` (with the 4D
map), ``correlation-dic`` (single pair, subsets, strain) and ``correlation-calcium`` (time series).
"""


def child(scenario: str, threshold_ms: float, settle: float = 0.5) -> dict:
    """Run one scenario in this process; return the freeze figures."""
    import napari
    from qtpy.QtCore import QTimer
    from qtpy.QtWidgets import QApplication

    viewer = napari.Viewer(show=True)
    if scenario.startswith("mipmap"):
        from napari_gridmip._widgets.mipmap_widget import MipmapWidget as Widget

        sample = "occupancy"
    elif scenario == "patches":
        from napari_gridmip._widgets.patches_widget import PatchesWidget as Widget

        sample = "tiles"
    elif scenario == "stitch":
        from napari_gridmip._widgets.stitch_widget import StitchWidget as Widget

        sample = "mosaic"
    elif scenario == "tiled":
        from napari_gridmip._widgets.tiled_widget import TiledWidget as Widget

        sample = "occupancy"  # a 3D volume, filtered in tiles (Gaussian by default)
    elif scenario == "correlation-dic":
        from napari_gridmip._widgets.correlation_widget import CorrelationWidget as Widget

        sample = "dic"  # the sample sets the single-pair mode (subset 31, step 4, strain)
    elif scenario == "correlation-calcium":
        from napari_gridmip._widgets.correlation_widget import CorrelationWidget as Widget

        sample = "calcium"  # time-series mode
    else:
        from napari_gridmip._widgets.correlation_widget import CorrelationWidget as Widget

        sample = "speckle"
    widget = Widget(viewer)
    viewer.window.add_dock_widget(widget)
    viewer.open_sample("napari-gridmip", sample)
    if scenario == "mipmap-per-level":
        widget.per_level.value = True
    if scenario == "correlation-map":
        widget.full_map.value = True
    app = QApplication.instance()
    end = time.perf_counter() + settle  # the user looks at the options before clicking
    while time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.01)

    ticks: list[float] = []
    main = threading.main_thread().ident
    samples: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    stop = threading.Event()

    def watchdog() -> None:
        while not stop.is_set():
            time.sleep(0.005)
            if ticks and (time.perf_counter() - ticks[-1]) * 1e3 > threshold_ms:
                frame = sys._current_frames().get(main)
                if frame is not None:
                    stack = traceback.extract_stack(frame)[-80:]
                    kinds[_kind(stack)] += 1
                    samples[
                        "\n".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in stack)
                    ] += 1

    # Python's cyclic garbage collector: a full collection scans every object of the process (napari's and
    # JAX's: hundreds of thousands) and holds the GIL in whichever thread started it, the GUI thread waiting
    garbage_runs: list[tuple[int, float]] = []
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif timer.isActive() and started[0]:  # a stop whose start was seen (not one under way at registration)
            garbage_runs.append((info["generation"], (time.perf_counter() - started[0]) * 1e3))
            started[0] = 0.0

    gc.callbacks.append(on_gc)
    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))

    def run_once() -> tuple[float, float]:
        ticks.clear()
        timer.start()
        start = time.perf_counter()
        widget.run_button.native.click()
        while widget.runner.busy:
            app.processEvents()
            time.sleep(0.001)
        done = time.perf_counter()
        settle = done + 1.0
        while time.perf_counter() < settle:  # the first draw of the new layers
            app.processEvents()
            time.sleep(0.001)
        timer.stop()
        gaps = [b - a for a, b in zip([start, *ticks], ticks)]
        return max(gaps) * 1e3, done - start

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    if scenario == "mipmap-second":
        run_once()
        samples.clear()
        kinds.clear()
        garbage_runs.clear()
    worst, total = run_once()
    stop.set()
    viewer.close()
    return {
        "scenario": scenario,
        "worst_gap_ms": round(worst, 1),
        "run_s": round(total, 2),
        "stacks": [{"samples": n, "stack": s} for s, n in samples.most_common(3)],
        "kinds_ms": {kind: 5 * n for kind, n in kinds.most_common()},
        "full_gc_ms": [round(ms) for generation, ms in garbage_runs if generation == 2],
        "objects": len(gc.get_objects()),
    }


def _kind(stack: list) -> str:
    """What held the GUI thread, by the innermost library among the frames."""
    names = [f.filename for f in stack]
    entry = next((i for i, name in enumerate(names) if "numba" in name), None)
    if entry is not None and entry > 0:
        caller = stack[entry - 1]
        return f"numba compile, from {caller.filename.split('site-packages/')[-1]}:{caller.lineno}"
    for key, label in (
        ("numba", "numba compile (napari's Labels colormap)"),
        ("/jax/", "jax"),
        ("vispy", "vispy (drawing, first visuals)"),
        ("layer_controls", "napari layer controls"),
        ("qt_dims", "napari dims sliders"),
        ("napari_gridmip", "napari-gridmip"),
        ("napari", "napari, other"),
    ):
        if any(key in name for name in names[::-1]):
            return label
    return "other (event loop, Qt, waiting for the GIL)"


def _run_child(scenario: str, args: argparse.Namespace, config: str) -> subprocess.CompletedProcess:
    command = [sys.executable, __file__, "--child", scenario, "--threshold-ms", str(args.threshold_ms)]
    command += ["--settle", str(args.settle)]
    env = {**os.environ, "NAPARI_CONFIG": os.path.join(config, "settings.yaml")}
    env.pop("NAPARI_GRIDMIP_CONFIG_DIR", None)  # the plugin's settings beside napari's new file, as a new user's
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", default="all", choices=["all", *SCENARIOS])
    parser.add_argument("--threshold-ms", type=float, default=100.0)
    parser.add_argument("--stacks", action="store_true", help="print where the GUI thread was during long freezes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--settle", type=float, default=0.5, help="seconds between the sample opening and the click (default 0.5)"
    )
    parser.add_argument("--quick", action="store_true", help="the mipmap scenario alone (unless --scenario)")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.threshold_ms, args.settle)))
        return
    if args.quick and args.scenario == "all":
        args.scenario = "mipmap"
    from _harness import record, start_run

    start_run("gui_freeze", args)
    scenarios = SCENARIOS if args.scenario == "all" else [args.scenario]
    print(
        "| scenario | longest GUI freeze (ms) | run (s) | full garbage collections (ms) | GUI thread held by (ms) |\n"
        "|---|---:|---:|---|---|"
    )
    details = []
    for scenario in scenarios:
        # a new user's settings (napari's file, the plugin's beside it): a scenario that switches on the full map
        # or per-level layers must not leave them on for the next one (they are remembered across sessions)
        with tempfile.TemporaryDirectory(prefix="gridmip-config-") as config:
            done = _run_child(scenario, args, config)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"| {scenario} | failed: {done.stderr.strip().splitlines()[-1:]} | | | |")
            continue
        result = json.loads(line[len("RESULT ") :])
        held = ", ".join(f"{kind} {ms}" for kind, ms in result["kinds_ms"].items())
        full = ", ".join(map(str, result["full_gc_ms"])) or "none"
        print(f"| {scenario} | {result['worst_gap_ms']:.0f} | {result['run_s']:.2f} | {full} | {held} |")
        record(scenario, first_s=result["run_s"], group="scenarios", note="a new process: the session's first Run",
               longest_freeze_ms=result["worst_gap_ms"], full_gc_ms=result["full_gc_ms"],
               held_ms=result["kinds_ms"])  # fmt: skip
        details.append(result)
    if args.stacks:
        for result in details:
            for entry in result["stacks"]:
                print(f"\n## {result['scenario']}: {entry['samples']} samples of 5 ms\n{entry['stack']}")


if __name__ == "__main__":
    main()
