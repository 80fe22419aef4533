"""What napari itself costs the GUI thread to show one new layer, by kind, first of its kind and again.

No plugin code runs: ``viewer.layers.append`` of a layer made beforehand and the first paint, in a new process per
kind (no peer: the first layer of a kind against the second).

    xvfb-run -a python -m benchmarks run layer_insert [--quick] [--repeat 3] [--kinds image labels]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

KINDS = [
    "image", "labels", "shapes-rectangles", "shapes-rectangles-text", "shapes-lines", "vectors", "points",
    "points-text",
]  # fmt: skip


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
The part of a result's display that no plugin code runs: ``viewer.layers.append(layer)`` of a layer
model made beforehand (the widgets make theirs in the worker), then the first paint of the canvas
(where vispy compiles shaders and uploads data). Each kind in a fresh process beside an input Image
layer already shown, as when a widget's result arrives: "first" is the session's first layer of the
kind, "again" a second one. The cProfile line names napari's or vispy's function that took the
longest inside the first insert (from one more process, profiled; its times are not used).
bench_gui_freeze.py measures the freezes these add up to.
"""


def _layer(kind: str):
    import numpy as np
    from napari.layers import Image, Labels, Points, Shapes, Vectors

    rng = np.random.default_rng(0)
    if kind == "image":
        return Image(rng.random((64, 256, 256), np.float32))
    if kind == "labels":
        return Labels((rng.random((64, 256, 256)) > 0.5).astype(np.uint8))
    boxes = [np.array([[y, x], [y, x + 60], [y + 60, x + 60], [y + 60, x]], float) for y in (0, 50) for x in (0, 50)]
    if kind == "shapes-rectangles":
        return Shapes(boxes, shape_type="rectangle", edge_color="yellow", face_color="transparent")
    if kind == "shapes-rectangles-text":
        return Shapes(
            boxes,
            shape_type="rectangle",
            edge_color="yellow",
            face_color="transparent",
            features={"name": ["a 0.91", "b 0.87", "c 0.95", "d 0.10"]},
            text={"string": "{name}", "color": "yellow", "size": 9},
        )
    if kind == "shapes-lines":
        return Shapes([np.array([[30, 30], [30, 80]], float)] * 4, shape_type="line", edge_color="red")
    if kind == "vectors":
        return Vectors(rng.random((100, 2, 2)) * 50)
    if kind == "points-text":  # as the Stitch tiles widget labels its tiles: index and confidence, or "stage"
        labels = [f"{t}: {'stage' if t % 5 == 4 else f'{0.9 + t / 200:.2f}'}" for t in range(12)]
        return Points(
            rng.random((12, 2)) * 200,
            features={"label": labels},
            text={"string": "{label}", "size": 9, "color": "white"},
        )
    return Points(rng.random((100, 2)) * 200)


def child(kind: str, profiled: bool) -> dict:
    import cProfile
    import pstats

    import napari
    import numpy as np
    from qtpy.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])

    def settle(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            app.processEvents()
            time.sleep(0.002)

    viewer = napari.Viewer(show=True)
    viewer.add_image(np.random.default_rng(1).random((64, 256, 256), np.float32), name="input")
    settle(1.0)
    canvas = viewer.window._qt_viewer.canvas.native
    out: dict = {"kind": kind}
    for attempt in ("first", "again"):
        layer = _layer(kind)
        profile = cProfile.Profile()
        start = time.perf_counter()
        if profiled and attempt == "first":
            profile.enable()
        viewer.layers.append(layer)
        profile.disable()
        inserted = time.perf_counter()
        canvas.repaint()  # the paint that shows it, now rather than at the next turn of the event loop
        painted = time.perf_counter()
        out[f"{attempt}_insert_ms"] = round((inserted - start) * 1e3, 1)
        out[f"{attempt}_paint_ms"] = round((painted - inserted) * 1e3, 1)
        if profiled and attempt == "first":
            stats = pstats.Stats(profile)
            rows = [
                (value[3], f"{name[0].split('site-packages/')[-1]}:{name[1]} {name[2]}")
                for name, value in stats.stats.items()  # type: ignore[attr-defined]
                if ("napari" in name[0] or "vispy" in name[0]) and "events" not in name[0]
            ]
            # the deepest function that still holds most of the insert: the longest one below 60% of it
            total = (inserted - start) * 0.6
            below = sorted((r for r in rows if r[0] < total), reverse=True)[:1]
            out["held_most_by"] = [f"{where} {ms * 1e3:.0f} ms" for ms, where in below]
        settle(0.5)
    viewer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per kind; the best is shown")
    parser.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS, help="layer kinds (default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--profiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="one process per kind, image and labels only")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.profiled)))
        return
    if args.quick:
        args.repeat, args.kinds = 1, [k for k in args.kinds if k in ("image", "labels")] or args.kinds[:1]
    from _harness import record, start_run

    start_run("layer_insert", args)
    print(
        "| layer kind | first: insert (ms) | first: paint (ms) | again: insert (ms) | again: paint (ms) "
        "| inside the first insert |\n|---|---:|---:|---:|---:|---|"
    )
    for kind in args.kinds:
        results = []
        for number in range(args.repeat + 1):  # the last one profiled (cProfile slows it): only its line is used
            extra = ["--profiled"] if number == args.repeat else []
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, *extra], capture_output=True, text=True, timeout=300
            )
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is not None:
                results.append(json.loads(line[len("RESULT ") :]))
        timed = [r for r in results if "held_most_by" not in r]
        if not timed:
            print(f"| {kind} | failed | | | | |")
            continue
        best = min(timed, key=lambda r: r["first_insert_ms"] + r["first_paint_ms"])
        best["held_most_by"] = next((r["held_most_by"] for r in results if "held_most_by" in r), [])
        for what in ("insert", "paint"):  # first: the session's first layer of the kind; best: the second one
            record(f"{kind}: {what}", first_s=best[f"first_{what}_ms"] / 1e3,
                   times_s=[r[f"again_{what}_ms"] / 1e3 for r in timed], group=kind,
                   note="a new process each; the best process's first, every process's second",
                   held_most_by=best["held_most_by"] if what == "insert" else None)  # fmt: skip
        print(
            f"| {kind} | {best['first_insert_ms']:.0f} | {best['first_paint_ms']:.0f} | {best['again_insert_ms']:.0f} "
            f"| {best['again_paint_ms']:.0f} | {'; '.join(best['held_most_by'])} |"
        )


if __name__ == "__main__":
    main()
