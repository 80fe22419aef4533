"""The background run shared by every widget: part of the widgets package's internal API.

One :class:`BackgroundRunner` per widget owns at most one job at a time, run on our own threads (:mod:`.workers`:
never on Qt's global pool, which napari's ``create_worker`` uses and which Qt needs). It disables Run (and enables
Cancel) while busy, shows progress in napari's activity dock, turns errors into notifications, and adds the result
layers on the GUI thread all at once, or none of them. Jobs are plain :class:`~napari_gridmip._jobs.Job` objects
(Qt-free); the compute core never sees Qt.

What other packages of napari_gridmip may use (the samples' run ahead, :mod:`napari_gridmip._sample_data.ahead`):
:data:`BEFORE_RUN` (hooks called as a user's Run starts), :class:`Cancelled` (raised by a progress callback to stop
a job), :func:`compute_on_setting` (where napari's Preferences say jobs run), :func:`import_layer_dependencies`
(what result layers import, done off the GUI thread), :func:`notify_error`, :func:`watch_viewer` and
:func:`viewer_closed`. The rest is the widgets' own.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import weakref
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
from napari.utils import notifications
from napari.utils import progress as napari_progress
from qtpy.QtCore import QEvent, QObject, Qt, QTimer, Signal

from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._jobs.device_layers import run_freeing_copies
from napari_gridmip._jobs.layer_changes import LayerChanges
from napari_gridmip._widgets.workers import workers


class _CloseWatch(QObject):
    """Sees napari's main window of a viewer get its Close event: a child of that window (it goes with it) and
    its event filter. napari has no public event for a viewer's closing (napari/napari#4623) and leaves nothing
    public behind that tells; what told before, the private attribute of napari's ``Window`` that holds its Qt
    window (dropped by ``Window.close``), warns through the viewer napari hands a plugin's widget (a FutureWarning
    in napari 0.9, which announces its refusal from 0.10 on)."""

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.close_seen = False
        window.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        kind = event.type()
        if kind == QEvent.Type.Close:
            self.close_seen = True  # accepted unless the window is still visible after it (a confirmation refused)
        elif kind == QEvent.Type.Show:
            self.close_seen = False
        return False


def _main_window(viewer: Any) -> Any:
    """napari's Qt main window of ``viewer``, through the public ``Window.main_menu`` (its menu bar); None for a
    viewer model without a window. Raises RuntimeError once Qt has deleted the window (and its menu bar)."""
    menu = getattr(getattr(viewer, "window", None), "main_menu", None)
    return None if menu is None else menu.window()


def _watch_of(window: Any) -> _CloseWatch | None:
    return window.findChild(_CloseWatch, "", Qt.FindChildOption.FindDirectChildrenOnly)


def watch_viewer(viewer: Any) -> None:
    """Start watching ``viewer``'s window for its closing, once per window (what :func:`viewer_closed` reads).

    Called as a runner or a live view is made, while the window is open: a close before the watch is missed
    until Qt deletes the window."""
    with contextlib.suppress(RuntimeError):  # deleted already: viewer_closed knows without a watch
        window = _main_window(viewer)
        if window is not None and _watch_of(window) is None:
            _CloseWatch(window)


def viewer_closed(viewer: Any) -> bool:
    """Whether napari's window of ``viewer`` was closed (``viewer.close()``, or the user's closing of the window):
    nothing may be added to it any more, even before Qt has deleted the docked widgets (adding a layer then
    crashed in napari's canvas when the viewer was closed while a result was being shown).

    Public API only: the window's Close event seen by our watch (:func:`watch_viewer`) and the window hidden
    since (a viewer made with ``show=False`` is never visible, so the Close event is what tells), or the window
    deleted by Qt.
    """
    try:
        window = _main_window(viewer)
    except RuntimeError:  # wrapped C/C++ object has been deleted: the window is gone
        return True
    if window is None:
        return False
    watch = _watch_of(window)
    if watch is None:
        _CloseWatch(window)
        return False
    return watch.close_seen and not window.isVisible()


def compute_on_setting() -> str | ValueError:
    """Where a run computes (:func:`napari_gridmip._jobs.settings.compute_on`: napari's Preferences, or
    ``NAPARI_GRIDMIP_COMPUTE_ON``), read on the GUI thread as the run starts; a bad variable's ValueError, for the
    run to report as its failure."""
    from napari_gridmip._jobs import settings

    try:
        return settings.compute_on()
    except ValueError as error:
        return error


def notify_error(text: str) -> None:
    """Show an error as a napari notification (looked up at call time, so tests can catch it)."""
    notifications.show_error(text)


#: called on the GUI thread as a user's Run starts: the user's Run takes the cores, so a sample's run ahead
#: (:mod:`napari_gridmip._sample_data.ahead`, which registers its cancel here) stops at its next step, its largest
#: program compiled by then or still compiling in a thread of its own that the Run's job waits for rather than
#: compiles again (what remained of it, its run on the stand-in and its small programs, delayed the speckle pair
#: with contrast's layers by 0.4 s)
BEFORE_RUN: list[Callable[[], None]] = []


class Cancelled(Exception):
    """Raised inside a job when the user pressed Cancel."""


class _Relay(QObject):
    """Carries progress from the worker thread to the GUI thread (queued signal)."""

    progressed = Signal(int, int)


class BackgroundRunner:
    """Run one job at a time off the GUI thread for a widget.

    Parameters
    ----------
    run_button, cancel_button
        The widget's magicgui push buttons; the runner enables and disables them.
    status
        A magicgui label that shows what is happening.
    viewer
        Where result layers go.
    """

    def __init__(self, *, run_button: Any, cancel_button: Any, status: Any, viewer: Any) -> None:
        self._run_button = run_button
        self._cancel_button = cancel_button
        self._status = status
        self._viewer = viewer
        watch_viewer(viewer)  # now, while the window is open: viewer_closed must see its closing
        self._relay = _Relay()
        self._relay.progressed.connect(self._on_progress)
        self.worker: Any = None
        self.device_text = ""  # the JAX device, known after the first run
        self._pbar: napari_progress | None = None
        self._pbar_wanted: str | None = None  # the description of a progress bar still to be made (see _begin)
        self._holding: dict[str, Any] = {}
        self._cancel_requested = False
        self._detached = False  # the widget is gone: its buttons and labels may be deleted already
        self._showing: dict[str, Any] | None = None  # a result whose layers are being added
        # called on the GUI thread when a job is over (worker finished and last layer in), while the widget
        # is docked: the runner is the widget's own, so nothing outside it (napari keeps every worker) holds it
        self.on_idle: list[Callable[[], None]] = []
        self._cancel_button.enabled = False
        # a job started before Run was pressed (see prefetch): {"key", "holder", "worker"}
        self._prefetch: dict[str, Any] | None = None
        self._early_workers: set[Any] = set()  # early jobs' workers not finished yet (cancelled ones included)

    @property
    def prefetching(self) -> bool:
        """A job started early (:meth:`prefetch`) still runs, taken over or not."""
        return bool(self._early_workers)

    @property
    def prefetched(self) -> bool:
        """The early job is done and its result waits for Run."""
        return self._prefetch is not None and self._prefetch["holder"]["outcome"] is not None

    @property
    def busy(self) -> bool:
        """A job runs, or its layers are still being added (one per event-loop turn)."""
        return self.worker is not None or self._showing is not None

    def start(
        self,
        job: Job,
        *,
        on_done: Callable[[JobResult, list], None] | None = None,
        replace: bool = True,
        key: Any = None,
    ) -> Any:
        """Run ``job`` in a thread worker; add its layers on the GUI thread, then ``on_done(result, added)``.

        With ``replace``, a result layer takes the place of the layer of the same output from an earlier
        run on the same inputs (found by its provenance, :class:`~napari_gridmip._jobs.layer_changes.LayerChanges`):
        same position, the user's own display choices kept. Otherwise every run adds new layers.

        The job's ``progress(done, total)`` raises :class:`Cancelled` once
        Cancel was pressed, which is how long jobs stop early. The first job
        also prepares JAX there (compilation cache, device name), so nothing
        starts a JAX backend on the GUI thread.

        The job runs where napari's Preferences (or ``NAPARI_GRIDMIP_COMPUTE_ON``) say, read now
        (:func:`compute_on_setting`), and its layers' provenance records where its calls ran.

        ``key`` identifies the job's inputs and options (:meth:`prefetch`): when a job of the same key
        was started early, under the same setting, its run is taken over (its result, or the rest of its run)
        instead of starting again; any other early job is cancelled.
        """
        from napari_gridmip._jobs import placed, prepare_jax

        if self.busy:
            raise RuntimeError("a job is already running")
        for before in BEFORE_RUN:  # the samples' runs ahead cancelled (napari_gridmip._sample_data.ahead)
            before()
        where = compute_on_setting()
        early = self._prefetch
        # an early job that another widget's newer one replaced in the early lane never runs: not adoptable
        adoptable = early is not None and not early["holder"]["failed"] and not early["worker"].cancelled
        if adoptable and key is not None and early["key"] == key and early["where"] == where:
            return self._adopt(early, job.description, on_done, replace)
        self.drop_prefetch()
        self._begin(job.description)

        # the task keeps its callbacks (bound to this runner) only until it has finished; the job (its input
        # arrays) and the result go through this holder, emptied when it finishes (a soak measured
        # 10 MB a run kept otherwise, when napari's workers outlived their runs)
        holding = {"job": job, "on_done": on_done, "replace": replace, "runner": self}
        self._holding = holding

        def work() -> tuple[JobResult, str, list]:
            runner = holding["runner"]
            import_layer_dependencies()
            device = prepare_jax()
            if isinstance(where, Exception):  # a bad NAPARI_GRIDMIP_COMPUTE_ON: this run's failure to report
                raise where
            with placed(where):
                result = run_freeing_copies(holding["job"].run, runner._report)
            runner._check_cancel()
            # the layer models are made here too, so that the GUI thread only shows them
            return result, device, layers_ready_to_show(result.layers)

        self.worker = workers().submit(
            work, lane="run", name=job.description, on_returned=self._on_worker_returned,
            on_errored=self._on_errored, on_finished=self._on_finished,
        )  # fmt: skip
        return self.worker

    def _begin(self, description: str, *, progress_bar: bool = True) -> None:
        """The busy state of a run: Run disabled, Cancel enabled, a progress bar in the activity dock.

        The bar is made in the next event-loop turn: napari builds its activity dialog's entry then (60 ms, the
        session's first 200 ms, in GUI soaks), which was the longest part of a click on Run."""
        self._cancel_requested = False
        self._run_button.enabled = False
        self._cancel_button.enabled = True
        self._set_status(f"{description}...")
        self._pbar_wanted = description if progress_bar else None
        if progress_bar:
            QTimer.singleShot(0, self._open_pbar)

    def _open_pbar(self) -> None:
        if self._pbar_wanted is not None and self._pbar is None and self.worker is not None:
            self._pbar = napari_progress(total=0, desc=self._pbar_wanted)

    # -- jobs started before Run ---------------------------------------------
    def prefetch(self, job: Job, key: Any) -> None:
        """Start ``job`` in a worker before the user asks for it, quietly (no progress bar, buttons as they are).

        A first run's time is mostly JAX compiling its programs (docs/benchmarks.md, "First calls"): started
        when the widget is docked or its inputs change, the work is done, or under way, by the time Run is
        pressed with the same inputs and options (``key``), and :meth:`start` shows it. A job of another
        key is cancelled at its next progress report; the programs it compiled stay compiled.
        """
        from napari_gridmip._jobs import placed, prepare_jax

        if self.busy or self._detached:
            return
        where = compute_on_setting()
        if isinstance(where, Exception):  # Run reports it
            return
        if self._prefetch is not None and self._prefetch["key"] == key and self._prefetch["where"] == where:
            return
        self.drop_prefetch()
        holder: dict[str, Any] = {"job": job, "cancel": False, "failed": False, "outcome": None, "adopted": None}
        runner_ref = weakref.ref(self)

        def progress(done: int, total: int) -> None:
            if holder["cancel"]:
                raise Cancelled
            runner = runner_ref()
            if holder["adopted"] is not None and runner is not None:
                runner._report(done, total)

        def work() -> tuple[JobResult, str, list]:
            import_layer_dependencies()
            device = prepare_jax()
            with placed(where):
                result = run_freeing_copies(holder["job"].run, progress)
            holder["job"] = None  # the inputs may go as soon as the result exists
            if holder["cancel"]:
                raise Cancelled
            return result, device, layers_ready_to_show(result.layers)

        task = workers().submit(
            work, lane="early", name=f"early {job.description}",
            on_returned=lambda value: self._prefetch_returned(holder, value),
            on_errored=lambda error: self._prefetch_errored(holder, error),
            on_finished=lambda: self._prefetch_finished(holder, task),
        )  # fmt: skip
        self._prefetch = {"key": key, "holder": holder, "worker": task, "where": where}
        self._early_workers.add(task)

    def drop_prefetch(self) -> None:
        """Cancel the early job (if not taken over) and forget its result."""
        early, self._prefetch = self._prefetch, None
        if early is not None and early["holder"]["adopted"] is None:
            early["holder"]["cancel"] = True
            early["holder"]["outcome"] = None
            if early["worker"].waiting:  # never started: it never will (a running one stops at its next report)
                early["worker"].cancel()

    def _adopt(self, early: dict[str, Any], description: str, on_done: Callable | None, replace: bool) -> Any:
        """Take over the early job of the same key as this Run: show its result, or wait for it with progress."""
        holder = early["holder"]
        self._prefetch = None
        running = holder["outcome"] is None
        self._begin(description, progress_bar=running)
        self._holding = {"on_done": on_done, "replace": replace, "runner": self}
        holder["adopted"] = self._holding
        self.worker = early["worker"]
        if running:  # its progress and end are this run's from now on
            workers().promote(self.worker)  # still waiting for the early lane: it waits for a Run's turn instead
            return self.worker
        # done already: shown from the next event-loop turn, so that the click returns at once (the first layer's
        # insert is napari's longest step; it then is a step of its own)
        outcome, holder["outcome"] = holder["outcome"], None
        QTimer.singleShot(0, lambda: self._show_adopted(outcome))
        return self.worker

    def _show_adopted(self, outcome: tuple[JobResult, str, list]) -> None:
        """The adopted early job's result, a turn after the click (see :meth:`_adopt`)."""
        self.worker = None
        if self._cancel_requested:
            self._on_errored(Cancelled())
        else:
            self._on_worker_returned(outcome)
        if self._showing is None and not self._detached:
            self._became_idle()

    def _prefetch_returned(self, holder: dict[str, Any], value: tuple[JobResult, str, list]) -> None:
        if holder["cancel"]:
            return
        if holder["adopted"] is not None:
            self._on_worker_returned(value)
        else:
            holder["outcome"] = value

    def _prefetch_errored(self, holder: dict[str, Any], error: BaseException) -> None:
        holder["failed"] = True
        if holder["adopted"] is not None:  # the user's Run: report it as any run's error
            self._on_errored(error)
        # else: quietly dropped; Run starts the job again and reports its error then

    def _prefetch_finished(self, holder: dict[str, Any], worker: Any) -> None:
        self._early_workers.discard(worker)
        if holder["adopted"] is not None and self.worker is worker:
            self._on_finished()

    def _pbar_close(self) -> None:
        self._pbar_wanted = None
        if self._pbar is not None:
            self._pbar.close()
            self._pbar = None

    def cancel(self) -> None:
        """Ask the running job to stop; whatever it returns afterwards is dropped."""
        if self.busy:
            self._cancel_requested = True
            if not self._detached:
                self._status.value = "Cancelling..."
                self._cancel_button.enabled = False

    def detach(self) -> None:
        """The widget was closed: cancel, and from now on touch none of its buttons and labels (Qt may have
        deleted them while the worker finishes)."""
        self._detached = True  # first: cancel() then touches no label or button
        self.cancel()
        self.drop_prefetch()

    def _set_status(self, text: str, *, tooltip: str | None = None) -> None:
        if self._detached:
            return
        self._status.value = text
        self._status.tooltip = tooltip or text

    # -- worker thread ---------------------------------------------------
    def _check_cancel(self) -> None:
        if self._cancel_requested:
            raise Cancelled

    def _report(self, done: int, total: int) -> None:
        self._check_cancel()
        self._relay.progressed.emit(int(done), int(total))

    # -- GUI thread --------------------------------------------------------
    def _on_worker_returned(self, value: tuple[JobResult, str, list]) -> None:
        self._on_returned(value, self._holding.get("on_done"), self._holding.get("replace", True))

    def _on_progress(self, done: int, total: int) -> None:
        if self._pbar is not None:
            if self._pbar.total != total:
                self._pbar.total = total
            self._pbar.n = done
            self._pbar.refresh()

    def _on_returned(self, value: tuple[JobResult, str, list], on_done: Callable | None, replace: bool) -> None:
        result, device, new_layers = value
        self.device_text = device
        if viewer_closed(self._viewer):
            self.detach()
        if self._cancel_requested or self._detached:
            return
        viewer = self._viewer
        changes = LayerChanges(viewer)
        # One new layer per event-loop turn: napari builds each layer's controls and first visual as it is
        # inserted (100 to 250 ms for the first of a kind), so adding a result's layers together froze the
        # GUI for their sum (1.6 s for seven layers; benchmarks/bench_gui_freeze.py). The job is over, so
        # Cancel no longer applies; Run stays disabled until the last layer is in, and a failure, or the
        # widget closing, takes every layer of this result out again.
        self._showing = {
            "steps": _collect_first(
                _text_after_insert(changes.apply_stepwise(new_layers, replace=replace), new_layers)
            ),
            "changes": changes,
            "result": result,
            "on_done": on_done,
            "extent": _world_box(viewer),
        }
        if not self._detached:
            self._cancel_button.enabled = False
        self._show_next()

    def _show_next(self) -> None:
        showing = self._showing
        if showing is None:
            return
        started = time.perf_counter()
        closed = viewer_closed(self._viewer)
        if closed:  # the window went before its docks: nothing of this result may touch it, or the widget
            self.detach()
        try:
            if self._detached:
                raise Cancelled
            next(showing["steps"])
        except StopIteration as done:
            self._showing = None
            self._shown(showing, done.value)
        except BaseException as error:  # noqa: BLE001 - anything here must not leave half a result
            self._showing = None
            if not closed:
                with contextlib.suppress(Exception):  # a viewer being closed may refuse
                    showing["changes"].undo()
            self._end_showing()
            self._on_errored(error)
        else:
            # after a long step (a collection, a first insert), leave the event loop a moment for the paint and
            # input it owes: a zero timer can run first, and the two steps then froze the GUI as one
            # (bench_gui_freeze.py: the mipmap widget's collection and insert, 256 to 260 ms together; 137 to 140 ms
            # apart, a 1 ms timer being enough for Qt to run its due timers and paint first)
            long_step = time.perf_counter() - started > LONG_STEP_S
            QTimer.singleShot(BREATHE_MS if long_step else 0, self._show_next)

    def _shown(self, showing: dict[str, Any], added: list) -> None:
        result, on_done, viewer = showing["result"], showing["on_done"], self._viewer
        try:
            if on_done is not None:
                on_done(result, added)
        except Exception as error:  # noqa: BLE001 - anything here must not leave half a result
            showing["changes"].undo()
            self._end_showing()
            self._on_errored(error)
            return
        extent_before = showing["extent"]
        if extent_before is not None and not _contains(extent_before, _world_box(viewer)):
            viewer.reset_view()  # a result outside what was shown (a merged image beside its tiles): bring it in
        names = "\n".join(layer.name for layer in added)
        count = f"{len(added)} layer{'s' if len(added) != 1 else ''}"
        if added or not result.summary:
            self._set_status(f"Done: added {count}", tooltip=f"{result.summary}\nAdded:\n{names}")
        else:  # a job that writes files (an export) says what it wrote
            self._set_status(f"Done: {result.summary}")
        self._end_showing()

    def _end_showing(self) -> None:
        """Run is enabled again once the worker has finished and the last layer is in."""
        if self.worker is None and not self._detached:
            self._became_idle()

    def _became_idle(self) -> None:
        self._run_button.enabled = True
        self._cancel_button.enabled = False
        for callback in self.on_idle:
            callback()

    def _on_errored(self, error: BaseException) -> None:
        if isinstance(error, Cancelled):
            if not self._detached:  # a closed widget's job ends quietly
                self._status.value = "Cancelled"
                notifications.show_info("Cancelled: no layer was added")
            return
        self._set_status(f"Failed: {error}")
        notify_error(f"{type(error).__name__}: {error}")

    def _on_finished(self) -> None:
        self.worker = None
        self._holding.clear()
        self._pbar_close()
        if self._detached:
            return
        if self._cancel_requested and self._status.value.endswith("..."):
            self._status.value = "Cancelled"
        if self._showing is None:  # else: when its last layer is in
            self._became_idle()


LONG_STEP_S = 0.05  # a step of showing a result longer than this is followed by BREATHE_MS for the event loop
BREATHE_MS = 1
_COLLECTED = {"done": False}  # the process's first result shown: see _collect_first


def _collect_first(steps: Generator[None, None, list]) -> Generator[None, None, list]:
    """``steps``, after a full garbage collection in its own event-loop turn, for the first result of the process.

    A first run (JAX's imports and tracing above all) leaves many new long-lived objects, so Python's next
    full collection is due; it then falls inside napari's first layer insert, scanning every object of the
    process (100 to 150 ms) on top of the insert and its first paint. Collected first, it is a separate,
    shorter wait (bench_gui_freeze.py --scenario stitch: the longest freeze 352 to 540 ms -> 264 to 346 ms;
    with the labels a turn later, :func:`_text_after_insert`, 189 to 222 ms). Later runs rarely make one due.
    On the GUI thread, so that the Qt objects among the garbage are deleted in their own thread.
    """
    if not _COLLECTED["done"]:
        _COLLECTED["done"] = True
        gc.collect()
        yield
    return (yield from steps)


def _text_after_insert(steps: Generator[None, None, list], layers: list[Any]) -> Generator[None, None, list]:
    """``steps`` (inserting ``layers`` one per event-loop turn), with the new layers' text labels shown after the
    last insert, one layer per turn.

    The first paint of text renders every distinct character's glyph on the GUI thread (vispy, on the CPU:
    about 7 ms a glyph), on top of the layer's own first paint: the stitch widget's tile labels made its
    longest freeze (bench_gui_freeze.py --scenario stitch: 264 to 346 ms with the labels in the insert, 191 to
    196 ms for the insert alone). Shown a turn later, the two are separate waits.
    """
    from napari.layers.utils.text_manager import TextManager

    later = [
        layer
        for layer in layers
        # napari keeps a layer without labels as one empty string (0-d values): no scan of every label here
        if isinstance(getattr(layer, "text", None), TextManager) and layer.text.visible and np.ndim(layer.text.values)
    ]
    for layer in later:
        layer.text.visible = False
    try:
        added = yield from steps
    except BaseException:
        for layer in later:
            layer.text.visible = True
        raise
    for layer in later:
        if any(layer is shown for shown in added):
            yield  # its insert and first paint, then its labels
        layer.text.visible = True
    return added


_imports_started = threading.Event()


def import_layer_dependencies() -> None:
    """Import, once per process and in a thread of its own, what napari's layers import on their first use:
    pandas, for the features of a Vectors, Points or Shapes layer. Started as a job starts, it runs beside the
    job's compile (XLA's compile releases the GIL) instead of after it: a session's first Vectors layer imported
    it in 0.22 s of the DIC sample's first Run, between the job's end and its layers (docs/benchmarks.md §10)."""
    if _imports_started.is_set():
        return
    _imports_started.set()

    def load() -> None:
        try:
            import pandas  # noqa: F401
        except ImportError:  # napari's features import it themselves, and say so
            pass

    threading.Thread(target=load, name="napari-gridmip layer imports", daemon=True).start()


def layers_ready_to_show(layer_data: list[tuple]) -> list[Any]:
    """napari layer models for a job's layer-data tuples, made in the worker, with their first-use costs paid.

    Making a layer computes its contrast limits and thumbnail, and a Labels layer's colour lookup of a dtype
    may have napari compile it (numba) the first time in a session: seconds on the GUI thread otherwise
    (benchmarks/bench_gui_freeze.py, docs/benchmarks.md). The models hold no Qt objects; the GUI thread adds
    them.
    """
    from napari.layers import Labels, Layer

    layers = [Layer.create(data, _shown_colormap(dict(meta), kind), kind) for data, meta, kind in layer_data]
    for layer in layers:
        if isinstance(layer, Labels):
            # the lookups of the data's dtype and of int64, which napari's layer controls map on adding
            for dtype in {np.dtype(layer.data.dtype), np.dtype(np.int64)}:
                layer.colormap.map(np.zeros(1, dtype=dtype))
    return layers


def _shown_colormap(meta: dict[str, Any], kind: str) -> dict[str, Any]:
    """``meta`` with a Labels layer's direct colormap of one colour on label 1 (``{None or 0: transparent, 1:
    colour}``, the occupancy's) made the cyclic colormap of that colour, which shows the same pixels.

    napari maps a direct colormap through a typed dict that numba compiles in every process (1 to 1.5 s of the
    mipmap widget's first Run in each session, bench_first_run.py), where uint8 labels under a cyclic colormap
    go to the GPU as they are. Label 0, the background, stays transparent; both entries hold the colour, so
    napari's "shuffle colors" keeps it. The job's own output stays the plain dict (its jobs run without napari).
    """
    colormap = meta.get("colormap")
    if kind != "labels" or not isinstance(colormap, dict) or set(colormap) - {None, 0, 1} or 1 not in colormap:
        return meta
    background = [colormap.get(key, "transparent") for key in (None, 0)]
    if not all(isinstance(colour, str) and colour == "transparent" for colour in background):
        return meta  # a visible background (a colour name or an RGBA array): left as it is
    from napari.utils.colormaps import CyclicLabelColormap

    return {**meta, "colormap": CyclicLabelColormap(colors=[colormap[1], colormap[1]])}


def _world_box(viewer: Any) -> np.ndarray | None:
    """The displayed world extent ``(2, ndim)`` of the viewer's layers, or None when it has none."""
    if not len(viewer.layers):
        return None
    return np.asarray(viewer.layers.extent.world, dtype=float)


def _contains(outer: np.ndarray, inner: np.ndarray | None) -> bool:
    if inner is None or inner.shape != outer.shape:
        return False
    return bool(np.all(inner[0] >= outer[0] - 1e-9) and np.all(inner[1] <= outer[1] + 1e-9))
