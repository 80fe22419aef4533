"""Full resolution in 3D: per view of the sparse sample, what the live view costs and what it shows.

Peers: a dense ray march with the same step (samples per ray) and napari's own coarse view from the same camera;
cold (compiles, reads chunks) and warm per pass; ``--gui``: the same moves in a real viewer, switch off and on.

    python -m benchmarks run live_render [--quick] [--sizes 512 2048] [--views overview]
    xvfb-run -a python benchmarks/bench_live_render.py --gui --sizes 512
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._harness import PeakMemory, machine, record, start_run  # noqa: E402
from napari_gridmip._jobs.live_render import Display, LiveSource, ViewState  # noqa: E402
from napari_gridmip._sample_data.sparse import open_sparse_volume  # noqa: E402

CANVAS = (600, 800)
BRIGHT = 700  # the filaments' values start near here (their floor is 700 - 250)


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
For each size (the "Sparse volume (large)" sample's generator at that size, written into a temporary cache on
first use) and each view (an orthographic overview of the whole volume, a perspective close-up), the live
view's two passes as the widget runs them (``LiveSource.progressive``):

- time to first pixels (the coarse pass) and to full resolution, cold (first render: compiles, reads chunks)
  and warm (the same view again: chunks in the cache);
- chunks read against chunks in the volume's box;
- peak resident memory above the start (the pool of occupied cells is 512 MiB at most, 43 MiB for the whole 2048^3
  sample; no dense copy is made);
- samples per ray against a dense ray march with the same step;
- napari's coarse view from the same camera (its coarsest level, which napari shows in 3D) against ours: pixels
  brighter than the filaments' floor (700) in each.
"""


def views(size: int) -> dict[str, ViewState]:
    from napari.utils.colormaps import ensure_colormap

    display = Display("mip", ensure_colormap("magma"), "magma", (0.0, 2000.0), 1.0, 1000.0, 0.05)
    center = (size / 2,) * 3
    view = np.array([-0.62, 0.45, 0.64])
    view /= np.linalg.norm(view)
    up = np.array([0.3, -0.9, 0.2])
    fit = min(CANVAS) / (size * 1.5)
    close = tuple(np.array(center) + np.array([0.1, -0.12, 0.08]) * size)
    return {
        "overview (orthographic)": ViewState(center, tuple(view), tuple(up), fit, 0.0, "right", CANVAS, (), display),
        "close-up (perspective 40)": ViewState(
            close, tuple(view), tuple(up), fit * 6, 40.0, "right", CANVAS, (), display
        ),  # fmt: skip
    }


def coarse_bright(source: LiveSource, state: ViewState) -> tuple[int, int]:
    """Bright pixels in napari's coarse view (the coarsest level) and in ours (level 0), same camera."""
    from napari_gridmip.core.occupancy.camera import camera_rays
    from napari_gridmip.core.occupancy.raycast import render_view

    top = len(source.levels) - 1
    factor = source.factors[top]
    scale = source.scale * factor
    translate = source.translate - 0.5 * source.scale + 0.5 * scale
    rays = camera_rays(state.center, state.view, state.up, state.canvas, zoom=state.zoom,
                       perspective=state.perspective, scale=scale, translate=translate)  # fmt: skip
    level = np.asarray(source.levels[top][...])  # napari holds this level in memory in 3D anyway
    cells = np.ones(tuple(-(-n // 4) for n in level.shape), bool)  # a dense march (no skipping)
    coarse = render_view(level, cells, rays.origins, rays.directions, t_near=rays.t_near, step=0.8).values
    return int(np.sum(coarse > BRIGHT))


def run_size(size: int, folder: Path, only: list[str] | None = None) -> list[str]:
    start = time.perf_counter()
    levels, attrs = open_sparse_volume(size, folder=folder)
    written = time.perf_counter() - start
    rows = [
        f"\n### {size}^3 (uint16, {attrs['occupied']:.3%} occupied, {attrs['chunks_written'][0]} of "
        f"{attrs['chunks_total'][0]} chunks stored, {len(levels)} levels; sample opened in {written:.1f} s)\n",
        "| view | pass | cold s | warm s | chunks read (cold) / used / in box | samples per ray vs dense | "
        "peak MB | bright px | new programs (cold) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    source = LiveSource(levels, attrs["cells"], attrs["cell"], (1.0, 1.0, 1.0), (0.0, 0.0, 0.0))
    import jax.monitoring

    traces = [0]  # JAX traces a function for each new program (then compiled, or loaded from its disk cache)
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *_, **__: traces.__setitem__(0, traces[0] + (event == "/jax/core/compile/jaxpr_trace_duration"))
    )

    def passes(state) -> tuple[list, list[int]]:
        pictures, compiled = [], []
        before = traces[0]
        for picture in source.progressive(state):
            pictures.append(picture)
            compiled.append(traces[0] - before)
            before = traces[0]
        return pictures, compiled

    for name, state in views(size).items():
        if only and not any(name.startswith(o) for o in only):
            continue
        with PeakMemory() as memory:
            cold, compiled = passes(state)
        warm, _ = passes(state)
        napari_bright = coarse_bright(source, state)
        for c, w, k in zip(cold, warm, compiled):
            what = "full resolution" if c.final else f"coarse (level {c.level}, {c.rgba.shape[1]}x{c.rgba.shape[0]})"
            bright = int(np.sum(c.values > BRIGHT)) if c.final else ""
            record(f"{size}^3 {name}, {'full resolution' if c.final else 'coarse'}", best_s=w.seconds,
                   first_s=c.seconds, peak_mb=memory.extra_mb, group=f"{size}^3", note=what,
                   chunks_read_cold=c.chunks_read, chunks_used=c.chunks_used, chunks_total=c.chunks_total,
                   samples_share=c.samples / max(c.samples_dense, 1), new_programs_cold=k)  # fmt: skip
            rows.append(
                f"| {name} | {what} | {c.seconds:.2f} | {w.seconds:.2f} | {c.chunks_read} / {c.chunks_used} / "
                f"{c.chunks_total} | {c.samples / max(c.samples_dense, 1):.2%} | "
                f"{memory.extra_mb:.0f} | {bright} | {k} |"
            )
        rows.append(
            f"| {name} | napari's coarse view (level {len(levels) - 1}) | | | | 100% (dense) | | {napari_bright} | |"
        )
        print("\n".join(rows[-3:]), flush=True)
    return rows


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per thread name of this process (Linux /proc), e.g. llvmpipe's GL threads, XLA's, the GUI's."""
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        name = "GUI (main)" if task.name == str(os.getpid()) else name.rstrip("0123456789-:")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


def gui(size: int, folder: Path) -> list[str]:
    """The live view in a real viewer: camera moves, then rests; what the GUI thread does meanwhile, and whose.

    The same three camera moves are made with the switch off (napari alone) and on, in one process. A 5 ms QTimer
    on the GUI thread records when the event loop runs: the longest gap between two ticks is the freeze. The
    GUI thread's time in our own callbacks (the live view's event handlers and the picture's upload into the quad
    layer) and in napari's canvas draws (timed from vispy's draw event) is summed per move, with the CPU seconds
    of each thread group of the process (llvmpipe: Mesa's software OpenGL; the render's XLA and worker threads).
    Run under xvfb-run.
    """
    import threading
    import traceback

    import napari
    from qtpy.QtCore import QTimer
    from qtpy.QtWidgets import QApplication

    from napari_gridmip._widgets import live_render as live_module
    from napari_gridmip._widgets.live_render import DEBOUNCE_MS
    from napari_gridmip._widgets.mipmap_widget import MipmapWidget

    app = QApplication.instance() or QApplication([])
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1400, 900)
    widget = MipmapWidget(viewer)
    viewer.window.add_dock_widget(widget)
    levels, attrs = open_sparse_volume(size, folder=folder)
    layer = viewer.add_image(levels, multiscale=True, contrast_limits=(0, 2000), colormap="magma",
                             metadata={"gridmip_cells": {"cells": attrs["cells"], "cell": attrs["cell"],
                                                         "threshold": 0.0}})  # fmt: skip
    widget.layer.value = layer
    viewer.dims.ndisplay = 3
    viewer.reset_view()

    ours: list[float] = []  # durations of our GUI-thread callbacks
    longest: dict[str, float] = {}  # the longest of each (ms), over the run
    for name in ("_changed", "_render", "_on_yielded", "_data_changed", "_show"):
        original = getattr(live_module.LiveRender, name)

        def timed(self, *args, _original=original, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                if _name != "_show":  # inside _on_yielded
                    ours.append(spent)
                longest[_name] = max(longest.get(_name, 0), spent * 1000)

        setattr(live_module.LiveRender, name, timed)
    draws: list[float] = []
    draw_start: list[float] = []
    scene = viewer.window._qt_viewer.canvas._scene_canvas
    scene.events.draw.connect(lambda event: draw_start.append(time.perf_counter()), position="first")
    scene.events.draw.connect(lambda event: draws.append(time.perf_counter() - draw_start[-1]), position="last")

    ticks: list[float] = []
    stalls: dict[str, float] = {}  # where the GUI thread was when it had not ticked for 250 ms: the innermost frames
    main = threading.main_thread().ident
    done = threading.Event()

    def watchdog() -> None:
        while not done.is_set():
            time.sleep(0.05)
            if ticks and time.perf_counter() - ticks[-1] > 0.25:
                frame = sys._current_frames().get(main)
                if frame is not None:
                    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                        for f in reversed(traceback.extract_stack(frame)[-6:]))  # fmt: skip
                    stalls[where] = stalls.get(where, 0) + 0.05

    threading.Thread(target=watchdog, daemon=True).start()
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start(5)
    fitted = viewer.scene.camera.zoom
    moves = (("overview", (-20, 30, 145), 1.0), ("rotated", (-40, 10, 100), 1.0), ("zoomed x4", (-40, 10, 100), 4.0))

    def move(angles, zoom, until) -> dict:
        ticks.clear()
        ours.clear()
        draws.clear()
        cpu = _thread_cpu()
        viewer.scene.camera.angles = angles
        viewer.scene.camera.zoom = fitted * zoom
        moved = time.perf_counter()
        ticks.append(moved)
        shown = []
        while not until(moved, shown):
            app.processEvents()
            live = widget._live
            if live is not None and len(live.pictures) > len(shown):
                shown.append(time.perf_counter())
            time.sleep(0.002)
        after = _thread_cpu()
        ticks.append(time.perf_counter())
        spent = {k: after.get(k, 0) - cpu.get(k, 0) for k in after}
        return {"shown": [t - moved - DEBOUNCE_MS / 1000 for t in shown], "stall": max(np.diff(ticks)) * 1000,
                "ours_max": max(ours, default=0) * 1000, "ours": sum(ours), "draws": len(draws),
                "draw_s": sum(draws), "draw_max": max(draws, default=0) * 1000, "cpu": spent,
                "wall": ticks[-1] - moved}  # fmt: skip

    def cpu_text(spent: dict) -> str:
        top = sorted(((v, k) for k, v in spent.items() if v >= 0.05), reverse=True)[:4]
        return ", ".join(f"{k} {v:.1f}" for v, k in top)

    # napari alone, the switch off: the same moves, each until the canvas has not been drawn for 2 s
    alone = {}
    for name, angles, zoom in moves:
        alone[name] = move(angles, zoom, lambda moved, shown: time.perf_counter() - max(
            [moved, *[s + d for s, d in zip(draw_start[-len(draws):] if draws else [], draws)]]) > 2.0)  # fmt: skip
    viewer.scene.camera.angles = (0, 0, 90)
    app.processEvents()
    clicked = time.perf_counter()
    widget.live_3d.native.click()  # adds the quad layer (hidden): napari makes its controls and visual
    click_ms = (time.perf_counter() - clicked) * 1000
    rows = [f"\n### In napari: {size}^3, canvas {tuple(viewer.canvas.size)}\n",
            "| camera | switch | first pixels s | full resolution s | longest GUI stall ms | longest of ours ms | "
            "ours total s | canvas draws (total s, longest ms) | CPU s per thread group |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, angles, zoom in moves:
        widget._live.pictures.clear()
        r = move(angles, zoom, lambda moved, shown: bool(shown) and widget._live.pictures[-1].final
                 and widget._live.worker is None)  # fmt: skip
        a = alone[name]
        for label, x in (("off (napari alone)", a), ("on", r)):
            if x["shown"]:  # the move's first pixels, and its full resolution as its one timed figure
                record(f"in napari {size}^3, {name}, switch {label}", best_s=x["shown"][-1], first_s=x["shown"][0],
                       group=f"in napari {size}^3", note="first_s: first pixels; best_s: full resolution",
                       longest_gui_stall_ms=x["stall"], longest_of_ours_ms=x["ours_max"], draws=x["draws"])  # fmt: skip
            first = f"{x['shown'][0]:.2f}" if x["shown"] else ""
            full = f"{x['shown'][-1]:.2f}" if x["shown"] else ""
            rows.append(f"| {name} | {label} | {first} | {full} | {x['stall']:.0f} | {x['ours_max']:.0f} | "
                        f"{x['ours']:.2f} | {x['draws']} ({x['draw_s']:.1f}, {x['draw_max']:.0f}) | "
                        f"{cpu_text(x['cpu'])} |")  # fmt: skip
        print("\n".join(rows[-2:]), flush=True)
    widget.live_3d.native.click()
    timer.stop()
    done.set()
    rows.append(f"\nTurning the switch on (the click, on the GUI thread): {click_ms:.0f} ms.")
    rows.append("\nThe longest of each of our GUI-thread callbacks over the run (ms): " + ", ".join(
        f"{k} {v:.0f}" for k, v in sorted(longest.items(), key=lambda kv: -kv[1])))  # fmt: skip
    rows.append("\nWhere the GUI thread stood during stalls over 250 ms (seconds sampled, innermost first):\n")
    rows += [f"- {seconds:.2f} s: {where}" for where, seconds in sorted(stalls.items(), key=lambda kv: -kv[1])[:8]]
    viewer.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--views", nargs="+", default=None, help="only these views (overview, close-up)")
    parser.add_argument("--cache", type=Path, default=None, help="where the samples are written (default: a temp)")
    parser.add_argument("--gui", action="store_true", help="the live view in a real viewer (under xvfb-run)")
    parser.add_argument("--quick", action="store_true", help="a 256^3 sample, the overview alone")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.views = [256], args.views or ["overview"]
    start_run("live_render", args)
    if args.gui:
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for size in args.sizes:
                rows += gui(size, args.cache or Path(tmp))
        print("\n".join(rows))
        return
    rows = [f"Canvas {CANVAS[1]} x {CANVAS[0]} px; {machine()}"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.cache or Path(tmp)
        for size in args.sizes:
            rows += run_size(size, folder, args.views)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
