"""Full resolution in 3D: resident memory and time to full resolution over a camera tour in a real viewer.

Peer: the same tour with the switch left off (``--napari-alone``: napari alone). Needs a display (Xvfb).

    xvfb-run -a python -m benchmarks run live_memory [--quick] [--size 2048] [--napari-alone]
    xvfb-run -a python benchmarks/bench_live_memory.py --size 4096 --cache /tmp/live4096
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import note, record, start_run  # noqa: E402 - this folder is on the path (run as a script)

GIB = 2**30
WINDOW = (1400, 900)


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
A shown napari viewer (1400 x 900, the Occupancy mipmap widget docked) opens the "Sparse volume (large)" sample
(what File > Open Sample calls; ``--size 4096`` the same generator at 4096^3, written once to disk chunk by chunk
in a child process: only the occupied voxels' coordinates are ever in memory, never a dense volume), switches to
3D, clicks "Full resolution in 3D" and runs a scripted tour: rotations, zooms in and out, pans, a perspective
close-up, the switch off and on, and 2D and back to 3D once. After each move it waits for the full-resolution
picture (the widget's live view holds a final state and no worker), or, for the moves that render nothing (the
switch off, 2D), a second of the event loop. Resident memory (RSS) is sampled every 50 ms by a thread (psutil) and
the kernel's own peak (``ru_maxrss``) is read after each move.

Per move: the time from the move to the full-resolution picture (it includes the widget's 300 ms wait for the
camera to rest and the coarse pass), the render's own time, RSS after the move, the sampled peak during it and the
peak so far, the bytes held by the live view's pools (committed bricks) and by JAX's live arrays.
"""


class RssSampler:
    """The process's resident set every ``interval`` seconds in a thread: the latest, the peak, the peak since a
    mark."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self._process = psutil.Process()
        self.interval = interval
        self.peak = self.window_peak = self.now = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def sample(self) -> int:
        self.now = self._process.memory_info().rss
        self.peak = max(self.peak, self.now)
        self.window_peak = max(self.window_peak, self.now)
        return self.now

    def mark(self) -> None:
        """Start a new window (its peak: :attr:`window_peak`)."""
        self.window_peak = self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def max_rss() -> int:
    """The kernel's peak resident set of this process (bytes; Linux gives KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_sample(size: int, cache: Path | None) -> dict:
    """Write the sample at ``size`` into its cache (a child process, so that the tour's peak is the viewer's)."""
    env = dict(os.environ)
    if cache is not None:
        env["NAPARI_GRIDMIP_CACHE_DIR"] = str(cache)
    code = (
        "import json, resource, time\n"
        "from napari_gridmip._sample_data.sparse import open_sparse_volume\n"
        f"start = time.perf_counter(); levels, attrs = open_sparse_volume({size})\n"
        "print(json.dumps({'seconds': time.perf_counter() - start, 'occupied': attrs['occupied'],\n"
        "                  'chunks_written': attrs['chunks_written'], 'chunks_total': attrs['chunks_total'],\n"
        "                  'levels': attrs['levels'], 'cells_occupied': int(attrs['cells'].sum()),\n"
        "                  'peak_rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tour() -> list[tuple[str, str, dict]]:
    """The 20 moves: (name, kind, arguments). Kinds: camera (angles, zoom relative to the fitted view, centre as
    a fraction of the volume, perspective; each optional), switch (on/off), ndisplay (2 or 3)."""
    return [
        ("switch on: overview (the first render)", "switch", {"on": True}),
        ("rotate 40 degrees", "camera", {"angles": (-40, 10, 100)}),
        ("rotate", "camera", {"angles": (10, -30, 160)}),
        ("zoom in x2", "camera", {"zoom": 2.0}),
        ("zoom in x4", "camera", {"zoom": 4.0}),
        ("pan", "camera", {"center": (0.5, 0.62, 0.4)}),
        ("pan", "camera", {"center": (0.35, 0.45, 0.6)}),
        ("zoom out x1", "camera", {"zoom": 1.0, "center": (0.5, 0.5, 0.5)}),
        ("rotate", "camera", {"angles": (-20, 30, 145)}),
        ("perspective close-up (30, x5)", "camera", {"zoom": 5.0, "perspective": 30.0, "center": (0.5, 0.55, 0.45)}),
        ("pan (perspective)", "camera", {"center": (0.42, 0.5, 0.55)}),
        ("switch off", "switch", {"on": False}),
        ("switch on", "switch", {"on": True}),
        ("rotate (perspective)", "camera", {"angles": (-35, 15, 120)}),
        ("2D", "ndisplay", {"ndisplay": 2}),
        ("3D again", "ndisplay", {"ndisplay": 3}),
        ("zoom in x8, orthographic", "camera", {"zoom": 8.0, "perspective": 0.0, "center": (0.5, 0.5, 0.5)}),
        ("pan", "camera", {"center": (0.55, 0.45, 0.52)}),
        ("zoom out x0.7", "camera", {"zoom": 0.7, "center": (0.5, 0.5, 0.5)}),
        ("rotate back to the overview", "camera", {"angles": (-20, 30, 145), "zoom": 1.0}),
    ]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]  # fmt: skip


def malloc_info() -> dict:
    """glibc's view of the heap (all arenas): bytes in use (heap and mmapped blocks) and free in the arenas."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"malloc_in_use": info.uordblks + info.hblkhd, "malloc_free": info.fordblks}


def held_bytes(widget) -> dict:
    """What the live view holds: committed bricks of its pools, their reserved size, JAX's live arrays; glibc's
    heap."""
    import jax

    live = widget._live
    source = getattr(live, "_source", None) if live is not None else None
    pools = reserved = 0
    if source is not None:
        for cache in source.caches.values():
            pools += cache.nbytes
            reserved += getattr(getattr(cache, "atlas", None), "nbytes", 0)
    arrays = jax.live_arrays()
    return {"pools": pools, "pools_reserved": reserved, "jax_arrays": len(arrays),
            "jax_bytes": sum(a.nbytes for a in arrays), **malloc_info()}  # fmt: skip


def run(size: int, cache: Path | None, timeout: float, *, alone: bool = False, rounds: int = 1) -> dict:
    import napari
    from qtpy.QtWidgets import QApplication

    from napari_gridmip._widgets.mipmap_widget import MipmapWidget

    sampler = RssSampler()
    stages: dict[str, int] = {"imports": sampler.sample()}
    generated = make_sample(size, cache)
    if cache is not None:
        os.environ["NAPARI_GRIDMIP_CACHE_DIR"] = str(cache)
    app = QApplication.instance() or QApplication([])
    viewer = napari.Viewer(title="napari-gridmip", show=True)
    viewer.window._qt_window.resize(*WINDOW)
    widget = MipmapWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Occupancy mipmap")
    for _ in range(20):
        app.processEvents()
    stages["viewer"] = sampler.sample()
    # what File > Open Sample > "Sparse volume (large)" calls (napari.yaml's sample_sparse_volume command)
    from napari_gridmip._sample_data.sparse import sparse_volume_sample

    [(data, kwargs, _)] = sparse_volume_sample(size)
    layer = viewer.add_image(data, **kwargs)
    widget.layer.value = layer
    for _ in range(20):
        app.processEvents()
    stages["sample in 2D"] = sampler.sample()
    viewer.dims.ndisplay = 3
    viewer.reset_view()
    for _ in range(40):
        app.processEvents()
        time.sleep(0.01)
    stages["3D, napari's coarse level"] = sampler.sample()
    fitted = viewer.scene.camera.zoom
    shape = np.asarray(layer.data[0].shape)

    def settle(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            app.processEvents()
            time.sleep(0.01)

    def wait_final(moved: float) -> tuple[float | None, object]:
        live = widget._live
        while time.perf_counter() - moved < timeout:
            app.processEvents()
            live = widget._live
            if live is not None and live._final_state is not None and live.worker is None:
                shown = time.perf_counter() - moved
                finals = [p for p in live.pictures if p.final]
                settle(0.3)  # the quad's upload and napari's redraw
                return shown, finals[-1] if finals else None
            time.sleep(0.005)
        return None, None

    rows = []
    for number, (name, kind, args) in enumerate(tour() * rounds, 1):
        sampler.mark()
        moved = time.perf_counter()
        if kind == "switch":
            if widget.live_3d.value != args["on"] and not alone:
                widget.live_3d.native.click()
        elif kind == "ndisplay":
            viewer.dims.ndisplay = args["ndisplay"]
        else:
            camera = viewer.scene.camera
            if "angles" in args:
                camera.angles = args["angles"]
            if "zoom" in args:
                camera.zoom = fitted * args["zoom"]
            if "center" in args:
                camera.center = tuple(np.asarray(args["center"]) * shape)
            if "perspective" in args:
                camera.perspective = args["perspective"]
        renders = not (kind == "switch" and not args["on"]) and not (kind == "ndisplay" and args["ndisplay"] == 2)
        if renders and alone:  # napari alone: its own redraws and slicing
            settle(2.0)
            shown, picture = None, None
        elif renders:
            shown, picture = wait_final(moved)
        else:
            settle(1.0)
            shown, picture = None, None
        gc.collect()
        row = {
            "move": number, "name": name, "renders": renders,
            "full_resolution_s": shown, "render_s": getattr(picture, "seconds", None),
            "chunks_read": getattr(picture, "chunks_read", None), "chunks_used": getattr(picture, "chunks_used", None),
            "rss": sampler.sample(), "window_peak": sampler.window_peak, "peak": sampler.peak, "max_rss": max_rss(),
            **held_bytes(widget),
        }  # fmt: skip
        rows.append(row)
        print(
            f"{number:2d} {name:40s} full {shown if shown is None else round(shown, 2)} s, "
            f"RSS {row['rss'] / GIB:.2f} GiB, peak {row['window_peak'] / GIB:.2f} (so far {row['peak'] / GIB:.2f}, "
            f"ru_maxrss {row['max_rss'] / GIB:.2f}), pools {row['pools'] / 2**20:.0f} MiB, "
            f"JAX {row['jax_arrays']} arrays {row['jax_bytes'] / 2**20:.0f} MiB, "
            f"malloc in use {row.get('malloc_in_use', 0) / GIB:.2f} GiB, free {row.get('malloc_free', 0) / GIB:.2f}",
            flush=True,
        )
        if renders and shown is None and not alone:
            print(f"   timed out after {timeout:.0f} s", flush=True)
    if widget.live_3d.value:
        widget.live_3d.native.click()
    settle(1.0)
    gc.collect()
    stages["after the tour, switch off"] = sampler.sample()
    canvas = tuple(int(v) for v in viewer.canvas.size)
    viewer.close()
    sampler.stop()
    return {"size": size, "canvas": canvas, "alone": alone, "generated": generated, "stages": stages, "moves": rows,
            "peak": max(sampler.peak, max_rss()), "sampled_peak": sampler.peak, "max_rss": max_rss()}  # fmt: skip


def table(result: dict) -> str:
    g = result["generated"]
    stages = result["stages"].items()
    before = ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in stages if k != "after the tour, switch off")
    lines = [
        f"\n### {result['size']}^3 ({g['occupied']:.4%} occupied, {g['chunks_written'][0]} of "
        f"{g['chunks_total'][0]} chunks stored, {g['cells_occupied']} occupied 8^3 cells, {g['levels']} levels), "
        f"canvas {result['canvas'][1]} x {result['canvas'][0]} px\n",
        f"Before the tour: {before}.\n",
        "| # | move | full resolution s (render s) | chunks read / used | RSS after GiB | peak during GiB | "
        "peak so far GiB | C heap in use GiB | pools MiB | JAX arrays (MiB) |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["moves"]:
        if result.get("alone"):
            full, chunks = "(switch left off)", ""
        elif r["renders"] and r["full_resolution_s"] is not None:
            full = f"{r['full_resolution_s']:.2f} ({r['render_s']:.2f})" if r["render_s"] is not None else "shown"
            chunks = f"{r['chunks_read']} / {r['chunks_used']}"
        else:
            full, chunks = ("timed out" if r["renders"] else "(no render)"), ""
        lines.append(
            f"| {r['move']} | {r['name']} | {full} | {chunks} | {r['rss'] / GIB:.2f} | {r['window_peak'] / GIB:.2f} | "
            f"{r['peak'] / GIB:.2f} | {r.get('malloc_in_use', 0) / GIB:.2f} | {r['pools'] / 2**20:.0f} | "
            f"{r['jax_arrays']} ({r['jax_bytes'] / 2**20:.0f}) |"
        )
    times = [r["full_resolution_s"] for r in result["moves"][1:] if r["renders"] and r["full_resolution_s"]]
    median, longest = (np.median(times), max(times)) if times else (float("nan"), float("nan"))
    lines.append(
        f"\nPeak resident: **{result['peak'] / GIB:.2f} GiB** (sampled every 50 ms: {result['sampled_peak'] / GIB:.2f}"
        f" GiB; ru_maxrss {result['max_rss'] / GIB:.2f} GiB); after the tour with the switch off: "
        f"{result['stages']['after the tour, switch off'] / GIB:.2f} GiB. Time to full resolution after the first "
        f"render: median {median:.2f} s, longest {longest:.2f} s. The sample written in "
        f"{g['seconds']:.1f} s by a child process (its peak {g['peak_rss'] / GIB:.2f} GiB; 0 s: cached)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--cache", type=Path, default=None, help="where the sample is written (default: its cache)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a move may wait for full resolution")
    parser.add_argument("--napari-alone", action="store_true", help="the same tour with the switch left off")
    parser.add_argument("--rounds", type=int, default=1, help="the tour this many times over (does memory creep?)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.add_argument("--quick", action="store_true", help="the tour over a 512^3 sample")
    args = parser.parse_args()
    if args.quick:
        args.size = 512
    start_run("live_memory", args)
    import tempfile

    os.environ.setdefault("NAPARI_GRIDMIP_CONFIG_DIR", tempfile.mkdtemp())
    result = run(args.size, args.cache, args.timeout, alone=args.napari_alone, rounds=args.rounds)
    for move in result["moves"]:  # each move's time to full resolution and the resident peak during it
        if move["full_resolution_s"] is not None:
            record(f"{move['move']} {move['name']}", first_s=move["full_resolution_s"], group="tour",
                   peak_mb=(move["window_peak"] - result["stages"]["3D, napari's coarse level"]) / 2**20,
                   note="first_s: the move to its full-resolution picture; peak above the RSS before the tour",
                   render_s=move["render_s"], rss_gib=move["rss"] / GIB, chunks_read=move["chunks_read"])  # fmt: skip
    note("tour", {k: v for k, v in result.items() if k != "moves"})
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
