"""GUI soak: random sequences of what users do, in one real napari session, under a watchdog outside the process.

    xvfb-run -a python benchmarks/probes/gui_soak.py [--actions 400] [--seed 0] [--pool N] [--watchdog 900] [--live]

Several widgets docked at once and undocked again, every small sample opened (File > Open Sample's own path,
``viewer.open_sample``), layers added, removed and renamed, options changed while a run is under way, Run,
Cancel and Run again, 2D and 3D switched with the full-resolution view on (``--live``; it renders in a
background job of its own), and at the end the viewer closed while a job runs. ``--pool N`` limits Qt's global
thread pool to N threads first (its default is the core count): our work must never need it.

The session runs in a child process; the parent kills it after ``--watchdog`` seconds (a deadlock that holds the
GIL stops every thread of the process, a watchdog thread included) and reports a hang. The child reports:

- hangs (the watchdog) and uncaught exceptions (``sys.excepthook``, ``threading.excepthook``, or raised by an
  action) with a frame of ours in their traceback: targets 0; napari's own exceptions are listed apart;
- error notifications (bad input on an action is a user's mistake the widget reports; listed for review);
- the event loop's longest gap (a 10 ms timer's lateness) and the longest single call of our GUI-thread code
  (a worker's result delivered, a layer of a result shown, a Run clicked, the layer choices refreshed, a live
  view's camera event or render start), each with the action it fell in: our target is 250 ms;
- jobs of ours started on Qt's global pool (napari's ``create_worker``): target none; and the most threads of
  that pool ever busy (sampled every 10 ms), which Qt 5.15 itself uses for large images;
- the threads still alive once the viewer is closed and its jobs have ended: target none;
- a crash of the process (a signal) with no frame of ours in the crashing thread (faulthandler's stack) is
  reported as ``napari_crash``, apart: one was seen, once in some twenty runs, in vispy's Qt paint event while
  the driver ran the event loop after closing the viewer (docs/benchmarks.md, section 9).

Exit status 1 when a target on hangs, exceptions, threads or the global pool fails.
``tests/widgets/test_gui_soak.py`` runs a short version in the suite; docs/benchmarks.md holds the long runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

KINDS = ("mipmap", "patches", "stitch", "tiled", "correlation", "volume")
SAMPLES = ("occupancy", "tiles", "mosaic", "speckle", "speckle-contrast", "dic", "calcium", "dic-series", "dvc")
LONG_CALL_MS = 250.0


def _widget_class(kind: str) -> type:
    from napari_gridmip._widgets.correlation_widget import CorrelationWidget
    from napari_gridmip._widgets.mipmap_widget import MipmapWidget
    from napari_gridmip._widgets.patches_widget import PatchesWidget
    from napari_gridmip._widgets.stitch_widget import StitchWidget
    from napari_gridmip._widgets.tiled_widget import TiledWidget
    from napari_gridmip._widgets.volume_widget import VolumeWidget

    return {"mipmap": MipmapWidget, "patches": PatchesWidget, "stitch": StitchWidget, "tiled": TiledWidget,
            "correlation": CorrelationWidget, "volume": VolumeWidget}[kind]  # fmt: skip


class Session:
    """The child process's session: the viewer, what is docked, and the monitors."""

    def __init__(self, rng: np.random.Generator, *, live: bool) -> None:
        import napari
        from qtpy.QtCore import QThreadPool, QTimer

        self.rng = rng
        self.live = live
        self.viewer = napari.Viewer(show=True)
        self.docked: dict[str, Any] = {}
        self.action = "start"
        self.uncaught: list[str] = []
        self.napari_errors: list[str] = []  # exceptions with none of our code in their traceback
        self.notifications: list[str] = []
        self.gaps: list[tuple[float, str]] = []
        self.calls: dict[str, tuple[float, str]] = {}
        self.pool_busiest = 0
        self.ours_on_global_pool = 0  # workers started from our code on Qt's global pool (napari's create_worker)
        self.counts: dict[str, int] = {}
        self._pool = QThreadPool.globalInstance()
        self._last_tick = time.perf_counter()
        self._ticker = QTimer()
        self._ticker.timeout.connect(self._tick)
        self._ticker.start(10)
        self._hook()
        # what the GUI thread does while the event loop is stalled: its stack, sampled from another thread
        self.stall_samples: dict[str, int] = {}
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample_stalls, name="gui_soak stall sampler", daemon=True)
        self._sampler.start()

    def _sample_stalls(self) -> None:
        import traceback

        main = threading.main_thread().ident
        while self._sampling:
            time.sleep(0.05)
            if time.perf_counter() - self._last_tick < 0.3:
                continue
            frame = sys._current_frames().get(main)
            if frame is None:
                continue
            stack = traceback.extract_stack(frame)
            # the innermost frames of ours and of napari / vispy / Qt bindings, as "file:function" (short)
            picked = [f"{f.filename.split('site-packages/')[-1].split('/main/')[-1]}:{f.name}" for f in stack
                      if "gui_soak" not in f.filename][-4:]  # fmt: skip
            key = f"[{self.action.split(' ', 1)[-1]}] " + " > ".join(picked)
            self.stall_samples[key] = self.stall_samples.get(key, 0) + 1

    # -- monitors ------------------------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.perf_counter()
        gap = (now - self._last_tick) * 1000 - 10
        self._last_tick = now
        if gap > 50:
            self.gaps.append((gap, self.action))
        self.pool_busiest = max(self.pool_busiest, self._pool.activeThreadCount())

    def _hook(self) -> None:
        """Time our GUI-thread entry points; catch uncaught exceptions and error notifications."""
        from napari.utils import notifications

        from napari_gridmip._widgets import base as _base
        from napari_gridmip._widgets import live_render, mipmap_widget
        from napari_gridmip._widgets import runner as _runner
        from napari_gridmip._widgets import workers as _workers

        def timed(owner: Any, name: str, label: str) -> None:
            original = getattr(owner, name)

            @functools.wraps(original)  # psygnal passes a signal's value only to slots whose signature takes it
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    ms = (time.perf_counter() - start) * 1000
                    if ms > self.calls.get(label, (0.0, ""))[0]:
                        self.calls[label] = (ms, self.action)

            setattr(owner, name, wrapper)

        timed(_workers.Workers, "_deliver", "a worker's result, yield or end delivered")
        timed(_runner.BackgroundRunner, "_show_next", "one layer of a result shown (napari's insert inside)")
        timed(_base.JobWidget, "run", "Run clicked")
        timed(_base.JobWidget, "reset_choices", "layer choices refreshed")
        timed(_base.JobWidget, "_prefetch", "an early run started")
        timed(live_render.LiveRender, "_changed", "live view: a camera or layer event")
        timed(live_render.LiveRender, "_render", "live view: a render started")
        timed(mipmap_widget.MipmapWidget, "_live_switched", "live view switched")

        def uncaught(kind: type, value: BaseException, tb: Any) -> None:
            self.record(value, tb)

        sys.excepthook = uncaught
        threading.excepthook = lambda args: self.uncaught.append(
            f"[{self.action}] thread {args.thread.name}: {args.exc_type.__name__}: {args.exc_value}"
        )
        original = notifications.show_error

        def notified(text: str) -> None:
            self.notifications.append(f"[{self.action}] {text}")
            original(text)

        notifications.show_error = notified
        _runner.notifications.show_error = notified

        # Qt and napari use Qt's global pool themselves (Qt 5.15 scales and converts large images there): what
        # must never happen is a job of ours started there, which is what napari's create_worker does
        import superqt.utils._qthreading as qthreading

        start = qthreading.WorkerBase.start

        def recorded_start(worker: Any) -> Any:
            import traceback

            if any("napari_gridmip" in frame.filename for frame in traceback.extract_stack()):
                self.ours_on_global_pool += 1
            return start(worker)

        qthreading.WorkerBase.start = recorded_start

    def record(self, error: BaseException, tb: Any) -> None:
        """An exception: ours when a frame of napari_gridmip is in its traceback, else napari's (or Qt's) own,
        listed apart (a real session shows those as napari's notifications)."""
        import traceback

        frames = traceback.extract_tb(tb) if tb is not None else []
        text = f"[{self.action}] {type(error).__name__}: {error}\n" + "".join(traceback.format_list(frames[-6:]))
        ours = any("napari_gridmip" in frame.filename for frame in frames)
        (self.uncaught if ours else self.napari_errors).append(text)

    # -- actions -------------------------------------------------------------------------------------------------
    def process(self, seconds: float) -> None:
        from qtpy.QtCore import QCoreApplication, QEvent
        from qtpy.QtWidgets import QApplication

        end = time.perf_counter() + seconds
        while True:
            QApplication.processEvents()
            QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
            if time.perf_counter() >= end:
                return
            time.sleep(0.002)

    def dock(self) -> None:
        free = [k for k in KINDS if k not in self.docked]
        if not free:
            return self.undock()
        kind = str(self.rng.choice(free))
        widget = _widget_class(kind)(self.viewer)
        self.viewer.window.add_dock_widget(widget, name=kind)
        self.docked[kind] = widget

    def undock(self) -> None:
        if not self.docked:
            return self.dock()
        kind = str(self.rng.choice(sorted(self.docked)))
        widget = self.docked.pop(kind)
        self.viewer.window.remove_dock_widget(widget.native)  # what the dock's close button does

    def sample(self) -> None:
        self.viewer.open_sample("napari-gridmip", str(self.rng.choice(SAMPLES)))

    def add_layer(self) -> None:
        shape = [(3, 48, 52), (64, 70), (6, 40, 40)][int(self.rng.integers(3))]
        self.viewer.add_image(self.rng.random(shape).astype(np.float32), name=f"random {self.rng.integers(1000)}")

    def remove_layer(self) -> None:
        if len(self.viewer.layers):
            self.viewer.layers.remove(self.viewer.layers[int(self.rng.integers(len(self.viewer.layers)))])

    def rename_layer(self) -> None:
        if len(self.viewer.layers):
            layer = self.viewer.layers[int(self.rng.integers(len(self.viewer.layers)))]
            layer.name = f"{layer.name} r{self.rng.integers(100)}"

    def change_option(self) -> None:
        from magicgui.widgets import CheckBox, ComboBox, FloatSpinBox, SpinBox

        if not self.docked:
            return self.dock()
        widget = self.docked[str(self.rng.choice(sorted(self.docked)))]
        fields = [f for f in widget if isinstance(f, (CheckBox, ComboBox, SpinBox, FloatSpinBox)) and f.enabled]
        fields = [f for f in fields if f.name != "live_3d"]  # switched on its own action
        if not fields:
            return
        field = fields[int(self.rng.integers(len(fields)))]
        if isinstance(field, CheckBox):
            field.value = not field.value
        elif isinstance(field, ComboBox):
            choices = [c for c in field.choices if c is not None]
            if choices:
                field.value = choices[int(self.rng.integers(len(choices)))]
        else:
            low, high = field.min, min(field.max, field.value + 8)
            field.value = type(field.value)(self.rng.uniform(max(low, field.value - 4), high))

    def run(self) -> None:
        if not self.docked:
            return self.dock()
        widget = self.docked[str(self.rng.choice(sorted(self.docked)))]
        if widget.run_button.enabled:
            widget.run_button.native.click()

    def cancel_and_run_again(self) -> None:
        busy = [w for w in self.docked.values() if w.runner.busy]
        if not busy:
            return self.run()
        widget = busy[0]
        widget.cancel_button.native.click()
        self.process(float(self.rng.uniform(0, 0.2)))
        if widget.run_button.enabled:
            widget.run_button.native.click()

    def switch_view(self) -> None:
        self.viewer.dims.ndisplay = 5 - self.viewer.dims.ndisplay

    def switch_live(self) -> None:
        widget = self.docked.get("mipmap")
        if widget is None:
            self.docked["mipmap"] = widget = _widget_class("mipmap")(self.viewer)
            self.viewer.window.add_dock_widget(widget, name="mipmap")
        if widget.layer.value is not None:
            widget.live_3d.value = not widget.live_3d.value

    def camera(self) -> None:
        self.viewer.camera.angles = tuple(float(a) for a in self.rng.uniform(-60, 60, 3))
        self.viewer.camera.zoom = float(self.viewer.camera.zoom * self.rng.uniform(0.7, 1.4))

    def wait(self) -> None:
        self.process(float(self.rng.uniform(0.05, 1.0)))

    def step(self, number: int) -> None:
        actions = {
            "dock": 3, "undock": 1, "sample": 2, "add layer": 1, "remove layer": 1, "rename layer": 1,
            "change option": 4, "run": 5, "cancel and run again": 2, "wait": 5, "switch 2D/3D": 1, "camera": 1,
        }  # fmt: skip
        if self.live:
            actions["switch live view"] = 2
        names = list(actions)
        weights = np.array([actions[n] for n in names], float)
        name = names[int(self.rng.choice(len(names), p=weights / weights.sum()))]
        self.action = f"#{number} {name}"
        self.counts[name] = self.counts.get(name, 0) + 1
        method = {"add layer": "add_layer", "remove layer": "remove_layer", "rename layer": "rename_layer",
                  "change option": "change_option", "cancel and run again": "cancel_and_run_again",
                  "switch 2D/3D": "switch_view", "switch live view": "switch_live"}.get(name, name)  # fmt: skip
        try:
            getattr(self, method)()
        except Exception as error:  # noqa: BLE001 - what the user's click would have met, shown by napari
            self.record(error, error.__traceback__)
        self.process(float(self.rng.uniform(0, 0.15)))

    def close_mid_job(self) -> float:
        """Start a run, close the viewer while it runs; seconds until our last job has ended."""
        from napari_gridmip._widgets.workers import workers

        self.action = "close the viewer mid-job"
        if not self.docked:
            self.dock()
        try:
            self.viewer.open_sample("napari-gridmip", "speckle")
        except Exception as error:  # noqa: BLE001
            self.record(error, error.__traceback__)
        self.process(0.3)
        for widget in self.docked.values():
            if widget.run_button.enabled:
                widget.run_button.native.click()
                break
        self.process(0.05)
        self.viewer.close()
        closed = time.perf_counter()
        while workers().busy() and time.perf_counter() - closed < 120:
            self.process(0.05)
        self.process(0.3)
        return time.perf_counter() - closed


def _threads_left() -> list[str]:
    """Threads still alive, dask's own pools left out (soak.py's rule; run as a script, this folder is on the path)."""
    from soak import _shared_pool_threads

    shared = _shared_pool_threads()
    return [t.name for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive() and t not in shared]  # fmt: skip


def child(args: argparse.Namespace) -> dict[str, Any]:
    from qtpy.QtCore import QThreadPool

    if args.pool:
        QThreadPool.globalInstance().setMaxThreadCount(args.pool)
    session = Session(np.random.default_rng(args.seed), live=args.live)
    started = time.perf_counter()
    for number in range(args.actions):
        session.step(number)
    jobs_end_s = session.close_mid_job()
    session._ticker.stop()
    session._sampling = False
    gaps = sorted(session.gaps, reverse=True)
    return {
        "actions": args.actions,
        "seconds": time.perf_counter() - started,
        "pool": args.pool or QThreadPool.globalInstance().maxThreadCount(),
        "counts": session.counts,
        "uncaught": session.uncaught,
        "napari_errors": session.napari_errors,
        "notifications": session.notifications,
        "longest_gaps_ms": [(round(g), a) for g, a in gaps[:5]],
        "gaps_over_250ms": sum(g > LONG_CALL_MS for g, _ in gaps),
        "longest_calls_ms": {k: (round(ms, 1), a) for k, (ms, a) in sorted(session.calls.items())},
        "global_pool_busiest": session.pool_busiest,
        "ours_on_global_pool": session.ours_on_global_pool,
        "jobs_end_after_close_s": round(jobs_end_s, 2),
        "threads_left": _threads_left(),
        # 50 ms samples of the GUI thread's stack while the event loop was stalled over 300 ms, most frequent first
        "stall_samples": sorted(session.stall_samples.items(), key=lambda kv: -kv[1])[:12],
    }


def _crashing_stack(stderr: str) -> str:
    """The crashing thread's stack from faulthandler's dump ("Current thread ... (most recent call first):")."""
    marker = stderr.rfind("Current thread")
    if marker < 0:
        marker = stderr.rfind("Fatal Python error")
    return stderr[marker:].split("\n\n")[0] if marker >= 0 else stderr[-3000:]


def _ours_crashed(stderr: str) -> bool:
    """Whether the crashing thread was in our code (a frame of napari_gridmip in its stack)."""
    return "napari_gridmip" in _crashing_stack(stderr)


def verdict(report: dict[str, Any]) -> list[str]:
    """The targets that failed (empty: all met). The event loop's timings are reported, not judged here."""
    failed = []
    if report.get("hung"):
        failed.append(f"hung: no answer after {report['watchdog_s']} s")
    if report.get("uncaught"):
        failed.append(f"{len(report['uncaught'])} uncaught exception(s)")
    if report.get("threads_left"):
        failed.append(f"threads left: {report['threads_left']}")
    if report.get("ours_on_global_pool"):
        failed.append(f"{report['ours_on_global_pool']} job(s) of ours started on Qt's global pool")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actions", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool", type=int, default=0, help="limit Qt's global pool to N threads (0: Qt's default)")
    parser.add_argument("--live", action="store_true", help="switch the full-resolution 3D view on and off too")
    parser.add_argument("--watchdog", type=float, default=900.0, help="seconds before the session counts as hung")
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        try:
            report = child(args)
        except BaseException:  # the soak's own driver failed (its hooks would swallow the traceback): report it
            import traceback

            report = {"uncaught": [f"the soak's driver raised:\n{traceback.format_exc()}"]}
        print("REPORT " + json.dumps(report), flush=True)
        return 0
    command = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--child"]
    command += ["--actions", str(args.actions), "--seed", str(args.seed), "--pool", str(args.pool)]
    command += ["--live"] if args.live else []
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.watchdog)
        lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
        if lines:
            report = json.loads(lines[-1][len("REPORT ") :])
        elif done.returncode < 0 and not _ours_crashed(done.stderr):
            # killed by a signal in a thread with no frame of ours (faulthandler's stack): napari's, vispy's or the
            # OpenGL driver's own crash, reported apart from ours
            report = {"napari_crash": f"signal {-done.returncode}:\n{_crashing_stack(done.stderr)}"}
        else:
            report = {"uncaught": [f"the session ended without a report (exit {done.returncode}):\n"
                                   f"{done.stderr[-4000:]}"]}  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr
        report = {"hung": True, "watchdog_s": args.watchdog, "stderr_tail": (stderr or "")[-4000:]}
    report["wall_s"] = round(time.perf_counter() - started, 1)
    failed = verdict(report)
    report["failed"] = failed
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("FAILED: " + "; ".join(failed) if failed else "all targets met (hangs, exceptions, threads, global pool)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
