"""First Runs in a real session: several samples one after the other in one napari, each widget docked in turn.

A first session (empty compile cache) and the next ones, each a new process: click to last layer, and the time
File > Open Sample held the GUI thread (no peer: the targets are 3 s and 1.5 s).

    xvfb-run -a python -m benchmarks run session [--quick] [--sessions 2] [--settle 0.5] [--samples dic mosaic]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

STEPS = (
    ("speckle", "correlation", "Correlation map on the speckle sample"),
    ("mosaic", "stitch", "Stitch tiles on the mosaic sample"),
    ("dic", "correlation", "Correlation map on the DIC sample"),
    ("speckle-contrast", "correlation", "Correlation map on the speckle pair with contrast"),
    ("occupancy", "mipmap", "Occupancy mipmap on the occupancy sample"),
    ("tiles", "patches", "Reassemble patches on the tiles sample"),
    ("calcium", "correlation", "Correlation map (time series) on the calcium sample"),
)


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Each step: File > Open Sample's path (``viewer.open_sample``), the widget docked, ``--settle`` seconds for the
user to look (the early run may start then, as it would), Run clicked, and the time from the click to the last
result layer in (Run enabled again, status "Done"); and the time File > Open Sample held the GUI thread (the
sample made, or read from its cache, and added). Layers are cleared and the dock removed before the next step.
Each session is a new process; the first has an empty persistent cache, the next reuses it. Targets: every
first Run at most 3 s in the first session, 1.5 s in the next.
"""


def session(settle: float, steps: tuple = STEPS) -> list[dict]:
    import napari
    from qtpy.QtWidgets import QApplication

    from napari_gridmip._widgets.correlation_widget import CorrelationWidget
    from napari_gridmip._widgets.mipmap_widget import MipmapWidget
    from napari_gridmip._widgets.patches_widget import PatchesWidget
    from napari_gridmip._widgets.stitch_widget import StitchWidget

    classes = {"correlation": CorrelationWidget, "stitch": StitchWidget, "mipmap": MipmapWidget,
               "patches": PatchesWidget}  # fmt: skip
    viewer = napari.Viewer(show=True)

    def process(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while True:
            QApplication.processEvents()
            if time.perf_counter() >= end:
                return
            time.sleep(0.002)

    rows = []
    for sample, kind, label in steps:
        viewer.layers.clear()
        opening = time.perf_counter()
        viewer.open_sample("napari-gridmip", sample)  # on the GUI thread: the sample made (or read), then added
        opened = time.perf_counter() - opening
        widget = classes[kind](viewer)
        viewer.window.add_dock_widget(widget, name=kind)
        process(settle)
        clicked = time.perf_counter()
        widget.run_button.native.click()
        while widget.runner.busy or not widget.run_button.enabled:
            process(0.005)
            if time.perf_counter() - clicked > 300:
                break
        seconds = time.perf_counter() - clicked
        rows.append(
            {"step": label, "seconds": round(seconds, 2), "open": round(opened, 2), "status": widget.status.value}
        )
        viewer.window.remove_dock_widget(widget.native)
        process(0.1)
    viewer.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--settle", type=float, default=0.5, help="seconds between docking and the click")
    parser.add_argument("--samples", nargs="+", choices=[s[0] for s in STEPS], help="these steps (default: all)")
    parser.add_argument("--quick", action="store_true", help="one session, the occupancy step alone")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.samples = 1, args.samples or ["occupancy"]
    steps = tuple(s for s in STEPS if not args.samples or s[0] in args.samples)
    if args.child:
        print("ROWS " + json.dumps(session(args.settle, steps)), flush=True)
        return
    from _harness import record, start_run

    start_run("session", args)
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "NAPARI_GRIDMIP_CACHE_DIR": os.path.join(folder, "cache"),
               "NAPARI_CONFIG": os.path.join(folder, "napari.yaml"),  # a new user's settings
               "NAPARI_GRIDMIP_CONFIG_DIR": os.path.join(folder, "config")}  # fmt: skip
        results = []
        for number in range(args.sessions):
            only = ["--samples", *args.samples] if args.samples else []
            done = subprocess.run([sys.executable, __file__, "--child", "--settle", str(args.settle), *only], env=env,
                                  capture_output=True, text=True, timeout=1200)  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if line.startswith("ROWS ")]
            if not lines:
                sys.exit(f"session {number + 1} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(lines[-1][5:]))
    print(f"| step | {' | '.join(f'session {i + 1} (s)' for i in range(len(results)))} |")
    print(f"|---|{'---:|' * len(results)}")
    for i, (_, _, label) in enumerate(steps):
        print(f"| {label} | {' | '.join(str(r[i]['seconds']) for r in results)} |")
        record(label, first_s=results[0][i]["seconds"], times_s=[r[i]["seconds"] for r in results[1:]],
               group="first Runs", note="click to last layer: the first session, then the next ones (times_s)",
               open_sample_s=[r[i]["open"] for r in results], status=results[-1][i]["status"])  # fmt: skip
    print("\nFile > Open Sample, the sample made (or read from the cache) and added, on the GUI thread:\n")
    print(f"| sample | {' | '.join(f'session {i + 1} (s)' for i in range(len(results)))} |")
    print(f"|---|{'---:|' * len(results)}")
    for i, (sample, _, _) in enumerate(steps):
        print(f"| {sample} | {' | '.join(str(r[i]['open']) for r in results)} |")
    statuses = {r[i]["status"][:60] for r in results for i in range(len(steps))}
    print("statuses:", sorted(statuses))


if __name__ == "__main__":
    main()
