"""Soak test: every widget, many times, in one viewer, with cancels, vanishing inputs and re-docking.

    xvfb-run -a python -X faulthandler benchmarks/probes/soak.py [--iterations 30] [--rounds 3] [--census]

For each widget, ``--iterations`` times in one viewer: a run with random valid parameters, and at a
random moment one of: wait for it, press Cancel, delete the input layer, or close the dock and dock a
new widget. At the end a run is started and the viewer closed while it runs. Python's faulthandler is
on (a crash prints the stacks of every thread). Reported: errors (notifications, uncaught exceptions),
threads still running at the end, and resident memory: the growth from round 1 to round 2 (the same
runs again, JAX's compiled programs included) and, with three rounds, what the runs left behind from
round 2 to the last with JAX's caches dropped at both readings. Exit status 1 when a requirement fails:
no error, no thread left, memory left behind under 100 MB (the round 2 growth with two rounds).
``--census`` prints what grew between rounds (RSS before and after malloc_trim, objects by type, Qt
widgets), which is how a leak is told from a cache.

``tests/widgets/test_soak.py`` runs a short version (a few iterations) in the suite.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_GROWTH_MB = 100.0


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def census() -> dict[str, Any]:
    """What the process holds, for telling a leak (objects that pile up) from caches and the allocator."""
    import collections

    gc.collect()
    rss = rss_mb()
    _trim_allocator()
    objects = gc.get_objects()
    counts = collections.Counter(type(o).__qualname__ for o in objects)
    functions = collections.Counter(
        f"{o.__module__}.{o.__qualname__}" for o in objects if type(o).__name__ == "function"
    )
    del objects
    out: dict[str, Any] = {"rss_mb": rss, "rss_trimmed_mb": rss_mb(), "types": counts, "functions": functions}
    if "jax" in sys.modules:
        import jax

        arrays = jax.live_arrays()
        out["jax_arrays"] = len(arrays)
        out["jax_array_mb"] = sum(a.nbytes for a in arrays) / 2**20
    try:
        from qtpy.QtWidgets import QApplication

        widgets = QApplication.allWidgets()
        out["qwidgets"] = len(widgets)
        out["qwidget_types"] = collections.Counter(type(w).__name__ for w in widgets)
    except Exception:  # no Qt in this process
        pass
    return out


def rss_without_jax_caches_mb() -> float:
    """RSS once JAX's compiled programs and traces are dropped (``jax.clear_caches``) and the allocator
    trimmed: what the runs left behind that is not a cache of compiled programs."""
    import jax

    jax.clear_caches()
    gc.collect()
    _trim_allocator()
    return rss_mb()


def _trim_allocator() -> None:
    """Give glibc's free arena memory back to the system, so the RSS shows only what is held."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


def census_lines(before: dict[str, Any], after: dict[str, Any], top: int = 15) -> list[str]:
    lines = [
        f"  {key}: {before.get(key, 0):.0f} -> {after.get(key, 0):.0f}"
        for key in ("rss_mb", "rss_trimmed_mb", "jax_arrays", "jax_array_mb", "qwidgets")
        if key in after
    ]
    grown = (after["types"] - before["types"]).most_common(top)
    lines.append("  objects grown: " + ", ".join(f"{name} +{n}" for name, n in grown))
    grown = (after["functions"] - before["functions"]).most_common(6)
    lines.append("  functions grown: " + ", ".join(f"{name} +{n}" for name, n in grown))
    if "qwidget_types" in after:
        grown = (after["qwidget_types"] - before["qwidget_types"]).most_common(top)
        lines.append("  Qt widgets grown: " + ", ".join(f"{name} +{n}" for name, n in grown))
    return lines


@dataclass
class Report:
    runs: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    threads_left: list[str] = field(default_factory=list)
    jobs_end_s: float = 0.0  # from the viewer's close to the end of its last job
    rss_start_mb: float = 0.0  # after the first round
    rss_end_mb: float = 0.0  # after the second
    clean_start_mb: float | None = None  # after the second round, JAX's caches dropped (three rounds or more)
    clean_end_mb: float | None = None  # after the last round, the same
    censuses: list[dict[str, Any]] = field(default_factory=list)  # after each round, layers cleared

    @property
    def growth_mb(self) -> float:
        """Round 2 against round 1: what the runs leave behind plus programs compiled only in round 2."""
        return self.rss_end_mb - self.rss_start_mb

    @property
    def left_behind_mb(self) -> float | None:
        """Last round against round 2, JAX's caches dropped both times: what the runs leave behind."""
        if self.clean_start_mb is None or self.clean_end_mb is None:
            return None
        return self.clean_end_mb - self.clean_start_mb

    @property
    def ok(self) -> bool:
        left = self.left_behind_mb
        return not self.errors and not self.threads_left and (self.growth_mb if left is None else left) < MAX_GROWTH_MB

    def lines(self) -> list[str]:
        lines = [
            f"runs: {self.runs}; actions: {self.actions}",
            f"errors: {len(self.errors)}" + "".join(f"\n  {e}" for e in self.errors[:10]),
            f"threads left running: {self.threads_left or 'none'} (the last job ended {self.jobs_end_s:.2f} s after "
            "the viewer closed)",
            f"resident memory (layers cleared): {self.rss_start_mb:.0f} MB after round 1, "
            f"{self.rss_end_mb:.0f} MB after round 2 (the same runs again): growth {self.growth_mb:+.0f} MB, "
            "JAX's compiled programs included",
        ]
        left = self.left_behind_mb
        if left is not None:
            lines.append(
                f"resident memory with JAX's caches dropped (jax.clear_caches, malloc_trim): "
                f"{self.clean_start_mb:.0f} MB after round 2, {self.clean_end_mb:.0f} MB after the last: "
                f"left behind {left:+.0f} MB (limit {MAX_GROWTH_MB:.0f})"
            )
        else:
            lines[-1] += f" (limit {MAX_GROWTH_MB:.0f})"
        return lines


def _inputs(kind: str, rng: np.random.Generator, size: str) -> list[tuple[np.ndarray, str]]:
    """Fresh input layers for one widget (small ones for the test suite's short run)."""
    if kind == "mipmap":
        n = 40 if size == "small" else 128
        volume = np.zeros((n, n + 3, n - 5), np.float32)
        for _ in range(6):
            z, y, x = rng.integers(0, n - 8, 3)
            volume[z : z + 6, y : y + 6, x : x + 6] = rng.random()
        return [(volume, "soak volume")]
    if kind == "tiled":
        n = 120 if size == "small" else 1024
        return [(rng.random((n, n + 7)).astype(np.float32), "soak image")]
    if kind == "stitch":
        from napari_gridmip._sample_data.mosaic import make_mosaic

        tile = 64 if size == "small" else 160
        sample = make_mosaic(grid_shape=(2, 2), tile_shape=(tile, tile), overlap=0.25, stage_error=3, seed=3)
        return [(np.asarray(sample.tiles), "soak mosaic tiles")]
    if kind == "patches":
        from napari_gridmip import extract_patches

        n = 96 if size == "small" else 512
        image = rng.random((3, n, n)).astype(np.float32)
        return [(np.asarray(extract_patches(image, (32, 32), (24, 24))), "soak tiles")]
    from napari_gridmip._sample_data import make_speckle_pair

    shape = (48, 48) if size == "small" else (192, 192)
    img1, img2, _ = make_speckle_pair(frames=6, shape=shape, seed=int(rng.integers(100)))
    return [(img1, "soak sample"), (img2, "soak reference")]


def _randomise(kind: str, widget: Any, rng: np.random.Generator) -> None:
    """Random valid parameters for one run."""
    widget.keep_previous.value = bool(rng.random() < 0.2)
    if kind == "mipmap":
        widget.threshold.value = float(rng.uniform(0, 0.9))
        widget.per_level.value = bool(rng.random() < 0.3)
    elif kind == "tiled":
        widget.filter.value = str(rng.choice(["gaussian", "median", "white_tophat", "connected_components"]))
        widget.tile.value = int(rng.choice([32, 64, 256]))
        widget.overlap.value = int(rng.choice([0, 4]))
    elif kind == "patches":
        widget.stride.value = "24, 24"
        widget.blend.value = str(rng.choice(["mean", "gaussian", "hann", "max", "overwrite"]))
    elif kind == "stitch":
        widget.grid_shape.value = "2, 2"
        widget.overlap.value = 0.25
        widget.max_shift.value = int(rng.choice([4, 6]))
        widget.blend.value = str(rng.choice(["linear", "mean", "max", "overwrite"]))
    else:
        # the two pair modes on the same stacks (the time-series mode has its own tests and sample)
        widget.mode.value = str(rng.choice(["stacks", "single pair, subset"]))
        if widget.mode.value != "stacks":
            widget.subset_rows.value = widget.subset_cols.value = int(rng.choice([3, 5]))
            widget.step.value = int(rng.choice([1, 2]))
        w = int(rng.choice([3, 5, 7, 9]))
        widget.window_rows.value = widget.window_cols.value = w
        widget.subpixel.value = str(rng.choice(["hessian", "paraboloid", "refine", "none"]))
        widget.precision.value = str(rng.choice(["float32", "float64"]))
        widget.full_map.value = bool(rng.random() < 0.3)


def _measure(report: Report, viewer: Any, round_number: int, *, rounds: int, take_census: bool) -> None:
    """The readings after a round, layers cleared (else a round's results would count as growth)."""
    viewer.layers.clear()
    _process(0.5)
    gc.collect()
    if round_number == 0:
        report.rss_start_mb = rss_mb()
    elif round_number == 1:
        report.rss_end_mb = rss_mb()
    if take_census:  # after the readings above: the census trims the allocator's free memory
        report.censuses.append(census())
    if rounds > 2 and round_number == 1:
        report.clean_start_mb = rss_without_jax_caches_mb()
    elif rounds > 2 and round_number == rounds - 1:
        report.clean_end_mb = rss_without_jax_caches_mb()


def _choose_inputs(kind: str, widget: Any, viewer: Any) -> None:
    if kind == "patches":
        widget.layer.value = viewer.layers["soak tiles"]
    elif kind == "tiled":
        widget.layer.value = viewer.layers["soak image"]
    elif kind == "stitch":
        widget.layer.value = viewer.layers["soak mosaic tiles"]
    elif kind == "correlation":
        widget.img1.value = viewer.layers["soak sample"]
        widget.img2.value = viewer.layers["soak reference"]


def _widget_class(kind: str) -> type:
    if kind == "mipmap":
        from napari_gridmip._widgets.mipmap_widget import MipmapWidget

        return MipmapWidget
    if kind == "patches":
        from napari_gridmip._widgets.patches_widget import PatchesWidget

        return PatchesWidget
    if kind == "stitch":
        from napari_gridmip._widgets.stitch_widget import StitchWidget

        return StitchWidget
    if kind == "tiled":
        from napari_gridmip._widgets.tiled_widget import TiledWidget

        return TiledWidget
    from napari_gridmip._widgets.correlation_widget import CorrelationWidget

    return CorrelationWidget


def _shared_pool_threads() -> set[threading.Thread]:
    """Threads of dask's threaded scheduler pools: dask keeps them for the process's later computes by
    design (``dask.threaded.default_pool``), so they are not threads a widget left behind."""
    try:
        import dask.threaded
    except ImportError:
        return set()
    pools = [getattr(dask.threaded, "default_pool", None), *getattr(dask.threaded, "pools", {}).values()]
    threads: set[threading.Thread] = set()
    for pool in pools:
        if isinstance(pool, dict):  # pools maps thread -> {num_workers: pool}
            pools.extend(pool.values())
            continue
        threads.update(getattr(pool, "_threads", ()))
    return threads


def _process(seconds: float) -> None:
    """Run the event loop for ``seconds``, deletions included (processEvents alone leaves the widgets that Qt
    was asked to delete later, as napari does for a removed layer's controls, until the loop returns)."""
    from qtpy.QtCore import QCoreApplication, QEvent
    from qtpy.QtWidgets import QApplication

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        QApplication.processEvents()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        time.sleep(0.002)


def _wait_idle(widget: Any, timeout: float = 120.0) -> None:
    from qtpy.QtWidgets import QApplication

    end = time.perf_counter() + timeout
    while widget.runner.busy:
        if time.perf_counter() > end:
            raise TimeoutError(f"{type(widget).__name__} still busy after {timeout} s")
        QApplication.processEvents()
        time.sleep(0.002)


def soak(
    viewer: Any,
    *,
    iterations: int = 30,
    seed: int = 0,
    size: str = "large",
    kinds: tuple[str, ...] = ("mipmap", "patches", "stitch", "tiled", "correlation"),
    close_viewer: bool = True,
    rounds: int = 2,
    take_census: bool = False,
) -> Report:
    """Drive every widget ``iterations`` times in ``viewer``; see the module docstring."""
    from napari.utils import notifications

    rng = np.random.default_rng(seed)
    report = Report()
    errors = report.errors
    original_hook = sys.excepthook
    original_thread_hook = threading.excepthook

    def uncaught(kind: type, value: BaseException, tb: Any) -> None:
        import traceback

        frames = traceback.extract_tb(tb) if tb is not None else []
        ours = [f for f in frames if "napari_gridmip" in f.filename]
        where = (ours or frames or [None])[-1]
        at = f" at {where.filename.split('site-packages/')[-1]}:{where.lineno} {where.name}" if where else ""
        errors.append(f"[{LAST_ACTION[0]}] uncaught {kind.__name__}: {value}{at}")

    sys.excepthook = uncaught
    threading.excepthook = lambda args: errors.append(
        f"[{LAST_ACTION[0]}] thread {args.thread}: {args.exc_type.__name__}: {args.exc_value}"
    )
    show_error = notifications.show_error

    def notified(text: str) -> None:  # every error notification, the widgets' included (they call this one)
        errors.append(f"[{LAST_ACTION[0]}] notification: {text}")
        show_error(text)

    notifications.show_error = notified
    try:
        # Rounds of the same random sequence. The first compiles the programs the parameters need (JAX keeps
        # compiled programs, by design); the second repeats it: its growth is what the runs leave behind plus
        # the programs the first round never reached (a cancel lands later once compiling is cached). With a
        # third round, JAX's caches are dropped after the second and after the third: their difference is
        # what the runs leave behind, whatever JAX compiled.
        for round_number in range(rounds):
            rng = np.random.default_rng(seed)
            for kind in kinds:
                widget = _widget_class(kind)(viewer)
                viewer.window.add_dock_widget(widget)
                for i in range(iterations):
                    if not any(name in viewer.layers for _, name in _inputs(kind, rng, "small")):
                        for data, name in _inputs(kind, rng, size):
                            viewer.add_image(data, name=name)
                        widget.reset_choices()
                    _choose_inputs(kind, widget, viewer)
                    _randomise(kind, widget, rng)
                    action = str(rng.choice(["wait", "cancel", "delete input", "re-dock"])) if i else "wait"
                    report.actions[action] = report.actions.get(action, 0) + 1
                    LAST_ACTION[0] = f"round {round_number} {kind} #{i} {action}"
                    widget.run_button.native.click()
                    report.runs += 1
                    _process(float(rng.uniform(0, 0.3)))
                    if action == "cancel":
                        widget.cancel_button.native.click()
                    elif action == "delete input":
                        for _, name in _inputs(kind, rng, "small"):
                            if name in viewer.layers:
                                viewer.layers.remove(name)
                    elif action == "re-dock":
                        viewer.window.remove_dock_widget(widget.native)  # what the dock's close button does
                        _wait_idle(widget)
                        widget = _widget_class(kind)(viewer)
                        viewer.window.add_dock_widget(widget)
                        continue
                    _wait_idle(widget)
                    if len(viewer.layers) > 40:  # "keep previous results" piles layers up: start afresh
                        viewer.layers.clear()
                viewer.window.remove_dock_widget(widget.native)
                del widget
            _measure(report, viewer, round_number, rounds=rounds, take_census=take_census)
        if close_viewer:  # close the viewer while a job runs
            last = _widget_class(kinds[-1])(viewer)
            viewer.window.add_dock_widget(last)
            for data, name in _inputs(kinds[-1], rng, size):
                if name not in viewer.layers:
                    viewer.add_image(data, name=name)
            last.reset_choices()
            _choose_inputs(kinds[-1], last, viewer)
            _randomise(kinds[-1], last, rng)
            last.run_button.native.click()
            _process(0.05)
            viewer.close()
        from qtpy.QtCore import QThreadPool

        from napari_gridmip._widgets.workers import workers

        # the jobs were cancelled when their widgets went with the viewer; each stops at its next progress report
        closed = time.perf_counter()
        while workers().busy() and time.perf_counter() - closed < 120:
            _process(0.05)
        report.jobs_end_s = time.perf_counter() - closed
        _process(0.2)
        shared = _shared_pool_threads()
        report.threads_left = [
            t.name
            for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive() and t not in shared
        ]
        if QThreadPool.globalInstance().activeThreadCount():
            report.threads_left.append(f"{QThreadPool.globalInstance().activeThreadCount()} Qt pool thread(s)")
    finally:
        sys.excepthook = original_hook
        threading.excepthook = original_thread_hook
        notifications.show_error = show_error
    return report


LAST_ACTION = ["start"]  # what the soak did last, for the draw trace


def _trace_draws(path: str) -> None:
    import os

    from vispy.visuals.visual import Visual

    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    draw = Visual.draw

    def traced(self: Any) -> Any:
        os.write(descriptor, f"{LAST_ACTION[0]}: {type(self).__name__} {id(self):x}\n".encode())
        return draw(self)

    Visual.draw = traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=["small", "large"], default="large")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the same runs (3 or more: JAX's caches measured apart)"
    )
    parser.add_argument("--kinds", default="mipmap,patches,stitch,tiled,correlation", help="widgets, comma-separated")
    parser.add_argument(
        "--census",
        action="store_true",
        help="after each round: RSS (also after malloc_trim), JAX arrays, objects grown",
    )
    parser.add_argument(
        "--trace-draws",
        metavar="FILE",
        help="write each vispy visual's class and the soak's last action to FILE before it is drawn, unbuffered, "
        "so that a crash inside OpenGL (which faulthandler shows only as glDrawArrays) names what was drawn",
    )
    args = parser.parse_args()
    faulthandler.enable()
    if args.trace_draws:
        _trace_draws(args.trace_draws)
    import napari

    viewer = napari.Viewer()
    start = time.perf_counter()
    kinds = tuple(args.kinds.split(","))
    report = soak(
        viewer,
        iterations=args.iterations,
        seed=args.seed,
        size=args.size,
        kinds=kinds,
        rounds=args.rounds,
        take_census=args.census,
    )
    print(f"soak: {args.iterations} iterations a widget, seed {args.seed}, {time.perf_counter() - start:.0f} s")
    print("\n".join(report.lines()))
    for number, (before, after) in enumerate(zip(report.censuses, report.censuses[1:]), start=1):
        print(f"census, after round {number} -> after round {number + 1}:")
        print("\n".join(census_lines(before, after)))
    print("PASS" if report.ok else "FAIL")
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
