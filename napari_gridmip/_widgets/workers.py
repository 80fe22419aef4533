"""Our background threads: every job of napari-gridmip's widgets runs here, never on a thread Qt or napari needs.

Part of the widgets package's internal API: :func:`workers` (the process's one :class:`Workers`, made on first
use; its ``submit`` runs a function in a lane) and :func:`workers_if_made` (the same, or None before any job), used
by the widgets and by the samples' run ahead (:mod:`napari_gridmip._sample_data.ahead`).

napari's ``create_worker`` (superqt) starts each worker on Qt's *global* ``QThreadPool``, which holds as many
threads as the machine has cores and which Qt itself borrows: Qt 5.15 splits the smooth scaling and the format
conversion of a large image into tasks of that pool and waits for them on the GUI thread. With the pool full of
our JAX jobs and the GUI thread waiting there while it holds the GIL, which the jobs need to go on, napari froze
for good (``tests/widgets/test_no_hang.py`` reproduces that freeze with Qt's pool).

So our jobs run on plain threads of this module, one per job, started only while their lane has room and ended
with the job (no idle thread is kept; nothing is left when the jobs are over). Three lanes bound how much runs
at once:

- ``"run"``: what the user asked for (Run), at most :data:`RUN_JOBS` at once, in order;
- ``"early"``: work started before the user asked (a widget preparing its run, JAX's start), one at a time; a
  newer early job replaces an older one still waiting, and a Run that adopts an early job still waiting moves it
  to the ``"run"`` lane, so that an early job never delays a Run;
- ``"render"``: the live full-resolution view, one at a time, the newest waiting one replacing older ones.

Results, yields, errors and the end of a job reach the GUI thread through a queued Qt signal: nothing on the GUI
thread ever waits for a worker. The workers are Python threads, not daemons, so that the interpreter's exit lets
a job end (a cancelled job stops at its next check) rather than stopping it inside XLA.
"""

from __future__ import annotations

import inspect
import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from qtpy.QtCore import QObject, Signal

RUN_JOBS = 2  # user-requested jobs at once (two widgets' Runs share the cores; a third waits its turn)
LANES = {"run": RUN_JOBS, "early": 1, "render": 1}
LATEST_ONLY = {"early", "render"}  # a waiting job of these lanes is replaced by a newer one of its group


class Task:
    """One job submitted to :class:`Workers`: its state, seen from both threads.

    ``cancelled`` is set by :meth:`cancel` (any thread): a waiting job then never starts, and a running one's
    outcome is dropped (the job itself stops at its own checks: the runner's progress reports, the live view's
    token). ``started`` and ``done`` are set under the workers' lock. Callbacks run on the GUI thread only.
    """

    _ids = itertools.count()

    def __init__(self, fn: Callable[..., Any], lane: str, callbacks: dict[str, Callable | None], name: str) -> None:
        self.id = next(self._ids)
        self.name = name
        self.lane = lane
        self.cancelled = False
        self.group: Any = None  # see Workers.submit
        self.started = False
        self.done = False
        self._fn: Callable[..., Any] | None = fn
        self._callbacks = callbacks

    def cancel(self) -> None:
        """Ask the job to stop (a waiting job never starts); whatever it still returns or yields is dropped."""
        self.cancelled = True

    @property
    def waiting(self) -> bool:
        return not self.started and not self.done

    def __repr__(self) -> str:
        state = "done" if self.done else "running" if self.started else "waiting"
        return f"<Task {self.id} {self.name!r} {self.lane} {state}{' cancelled' if self.cancelled else ''}>"


class _Relay(QObject):
    """Lives on the GUI thread; a worker's emit queues the call there."""

    deliver = Signal(object, object, object)  # task, callback name, value


class Workers:
    """The process's background jobs for napari-gridmip: see the module's docstring.

    One instance per process (:func:`workers`), made on the GUI thread by the first widget.
    """

    def __init__(self, lanes: dict[str, int] | None = None) -> None:
        self._limits = dict(LANES if lanes is None else lanes)
        self._lock = threading.Lock()
        self._waiting: dict[str, deque[Task]] = {lane: deque() for lane in self._limits}
        self._running: dict[str, set[Task]] = {lane: set() for lane in self._limits}
        self._relay = _Relay()
        self._relay.deliver.connect(self._deliver)

    # -- GUI thread ----------------------------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[..., Any],
        *,
        lane: str = "run",
        name: str = "",
        on_returned: Callable[[Any], None] | None = None,
        on_yielded: Callable[[Any], None] | None = None,
        on_errored: Callable[[BaseException], None] | None = None,
        on_finished: Callable[[], None] | None = None,
        group: Any = None,
    ) -> Task:
        """Run ``fn()`` on a worker of ``lane`` once the lane has room; a generator function's items go to
        ``on_yielded`` one by one. The callbacks run on the GUI thread: ``on_returned(value)`` or
        ``on_errored(error)`` (neither once the task is cancelled), then ``on_finished()`` in every case.

        In the lanes of :data:`LATEST_ONLY`, the job replaces the jobs of the same ``group`` still waiting there
        (one viewer's live view does not drop another's render)."""
        if lane not in self._limits:
            raise ValueError(f"lane must be one of {sorted(self._limits)}; got {lane!r}")
        callbacks = {"returned": on_returned, "yielded": on_yielded, "errored": on_errored, "finished": on_finished}
        task = Task(fn, lane, callbacks, name or getattr(fn, "__qualname__", "job"))
        task.group = group
        with self._lock:
            if lane in LATEST_ONLY:
                for old in self._waiting[lane]:
                    if old.group == group:
                        old.cancel()
            self._waiting[lane].append(task)
        self._pump()
        return task

    def promote(self, task: Task) -> None:
        """A user's Run adopts ``task``: if it still waits in its lane, it moves to the ``"run"`` lane's queue."""
        with self._lock:
            if task.waiting and task.lane != "run" and task in self._waiting[task.lane]:
                self._waiting[task.lane].remove(task)
                task.lane = "run"
                self._waiting["run"].append(task)
        self._pump()

    def cancel_all(self) -> None:
        """Cancel every job, running or waiting (the viewer is closing)."""
        with self._lock:
            tasks = [t for lane in self._limits for t in (*self._waiting[lane], *self._running[lane])]
        for task in tasks:
            task.cancel()
        self._pump()

    def busy(self) -> list[Task]:
        """The jobs running or waiting now."""
        with self._lock:
            return [t for lane in self._limits for t in (*self._running[lane], *self._waiting[lane])]

    def _deliver(self, task: Task, kind: str, value: Any) -> None:
        callback = task._callbacks.get(kind)
        if kind == "finished":
            task._callbacks = {}  # the job, its widget and its result go with the task's last callback
        if callback is None or (task.cancelled and kind in ("returned", "yielded", "errored")):
            return
        if kind == "finished":
            callback()
        else:
            callback(value)

    # -- any thread ----------------------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Start the waiting jobs their lanes have room for; drop the cancelled ones that never started."""
        starting, dropped = [], []
        with self._lock:
            for lane, limit in self._limits.items():
                queue = self._waiting[lane]
                while queue and (queue[0].cancelled or len(self._running[lane]) < limit):
                    task = queue.popleft()
                    if task.cancelled:
                        task.done = True
                        dropped.append(task)
                        continue
                    task.started = True
                    self._running[lane].add(task)
                    starting.append(task)
        for task in dropped:
            task._fn = None
            self._emit(task, "finished", None)
        for task in starting:
            thread = threading.Thread(target=self._work, args=(task,), name=f"napari-gridmip {task.name}")
            thread.start()

    def _emit(self, task: Task, kind: str, value: Any) -> None:
        try:
            self._relay.deliver.emit(task, kind, value)
        except RuntimeError:  # the relay is gone: Qt is shutting down, nobody is listening
            pass

    def _work(self, task: Task) -> None:
        fn, task._fn = task._fn, None
        try:
            if inspect.isgeneratorfunction(fn):
                for item in fn():
                    if task.cancelled:
                        break
                    self._emit(task, "yielded", item)
            else:
                value = fn()
                if not task.cancelled:
                    self._emit(task, "returned", value)
        except BaseException as error:  # noqa: BLE001 - every failure is the GUI's to report
            if not task.cancelled:
                self._emit(task, "errored", error)
        finally:
            del fn
            with self._lock:
                self._running[task.lane].discard(task)
                task.done = True
            self._emit(task, "finished", None)
            self._pump()


_WORKERS: dict[str, Workers] = {}


def workers() -> Workers:
    """The process's :class:`Workers`, made on first use (call it first from the GUI thread)."""
    if "workers" not in _WORKERS:
        _WORKERS["workers"] = Workers()
    return _WORKERS["workers"]


def workers_if_made() -> Workers | None:
    """The process's :class:`Workers` where a widget or a sample has made them, else None (made by no one here)."""
    return _WORKERS.get("workers")
