"""File > Open Sample for the samples whose first Run is mostly XLA compiling: that Run starts in the background
on stand-in inputs of the sample's shapes, so that its programs are made, or under way, by the time Run is pressed.

Why: the DIC pair's first Run in a new session compiles its band program for 2.2 to 2.5 s of about 3 s on a 2-core
CPU, the speckle pair with contrast's for 3.4 s of 4.3 s; both compute in 0.1 to 0.3 s once compiled
(docs/accelerator.md, "Preparing a machine"), and a widget's own early start
(:func:`napari_gridmip._widgets.base.prefetch_enabled`) begins only once it is docked with its inputs. A program
depends on its inputs' shapes, dtypes and options, not on their values, so the sample's first Run (its job in
:data:`napari_gridmip._sample_data.prepare.JOBS`) runs in the widgets' early lane
(:mod:`napari_gridmip._widgets.workers`) on a textured stand-in of the sample's shapes and dtypes, its result
dropped. Where this session has imported JAX and the job already, it starts as the sample is asked for, beside the
sample's making on the GUI thread (XLA's compile releases the GIL); otherwise at the event loop's next turn, once
napari has added the sample, since those imports would hold the GIL the making needs. The widget's Run then finds
the programs made, or waits for the compile under way rather than starting a second one; a Run cancels what is
left of the run ahead (:data:`napari_gridmip._widgets.runner.BEFORE_RUN`), as napari's quit does.

Only those samples, only where early starts are on and the widget's remembered options that change the programs
are its defaults (:data:`_PROGRAM_OPTIONS`), and only with a Qt application: the other samples' first Runs compile
for under a second, or compute for longer than they compile, which a run ahead would spend whether or not the user
runs it. The plain sample functions (``napari_gridmip._sample_data``) stay free of Qt and of this; this module
imports Qt only when a run ahead starts.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

_LOG = logging.getLogger(__name__)
NAME_PREFIX = "run ahead"  # the workers' task name of a sample's run ahead (tests wait for these)


def dic_sample() -> list[tuple]:
    """File > Open Sample > DIC pair (:func:`napari_gridmip._sample_data.dic.dic_sample`), its first Run started."""
    from napari_gridmip._sample_data.dic import dic_sample as make
    from napari_gridmip._sample_data.dic import dic_stand_in

    start_run_ahead("dic", dic_stand_in)
    return make()


def speckle_contrast_sample() -> list[tuple]:
    """File > Open Sample > Speckle pair with transmission and dark-field
    (:func:`napari_gridmip._sample_data.speckle_contrast_sample`), its first Run started."""
    from napari_gridmip._sample_data import speckle_contrast_sample as make
    from napari_gridmip._sample_data import speckle_contrast_stand_in

    start_run_ahead("speckle-contrast", speckle_contrast_stand_in)
    return make()


def start_run_ahead(sample: str, stand_in: Callable[[], list[tuple]]) -> Any:
    """Run, in our early lane, the widget's first Run on the sample ``sample`` (a File > Open Sample key), on the
    layers ``stand_in()`` gives (made in the worker: the sample's shapes, dtypes and suggested settings), its result
    dropped and its failures logged at debug level (the widget's own Run reports what fails). The task; None where
    early starts are off, no job runs ahead of this sample, or (JAX or the job not imported yet in this session) the
    run is submitted at the event loop's next turn, after napari has added the sample. Call on the GUI thread."""
    from qtpy.QtCore import QCoreApplication, QTimer

    from napari_gridmip._sample_data.prepare import JOBS, run_job
    from napari_gridmip._widgets.base import prefetch_enabled
    from napari_gridmip._widgets.runner import BEFORE_RUN, Cancelled, compute_on_setting, import_layer_dependencies
    from napari_gridmip._widgets.workers import workers

    app = QCoreApplication.instance()
    if app is None or not prefetch_enabled() or not _default_options():  # no event loop: nobody to run it for
        return None
    job = next((j for j in JOBS if j.ahead_of_sample == sample), None)
    where = compute_on_setting()
    if job is None or isinstance(where, Exception):  # a bad setting: the widget's Run reports it
        return None
    _cancel_at_quit(app)
    if cancel_runs_ahead not in BEFORE_RUN:  # a user's Run cancels what is left of the runs ahead
        BEFORE_RUN.append(cancel_runs_ahead)
    holder: dict[str, Any] = {}  # the task, once submit() has it (its worker may start before that)

    def cancelled() -> bool:
        task = holder.get("task")
        return task is not None and task.cancelled

    def progress(done: int, total: int) -> None:
        if cancelled():
            raise Cancelled

    def work() -> None:
        if cancelled():  # napari quit before the worker started
            return
        run_job(job, where, layers=stand_in(), progress=progress)
        # what the result layers of the widget's Run import (pandas), unless that Run began it: after the run,
        # not beside it, where its 0.3 s of imports held the GIL that the sample's making on the GUI thread needs
        import_layer_dependencies()

    def failed(error: BaseException) -> None:
        _LOG.debug("run ahead of the %s sample failed", sample, exc_info=error)

    def submit() -> Any:
        holder["task"] = workers().submit(work, lane="early", name=f"{NAME_PREFIX} {job.title}", on_errored=failed)
        return holder["task"]

    if _imported():
        return submit()
    # a session's first use of JAX and of our jobs: their imports (1.5 s, holding the GIL) beside the sample's
    # making on the GUI thread made napari wait 2.4 to 2.6 s for the DIC pair instead of 0.6 to 0.8 s; so the run
    # starts once napari has added the sample, at the event loop's next turn
    _PENDING.append(submit)
    QTimer.singleShot(0, _start_pending)
    return None


#: what a run ahead imports before it compiles (a correlation job), each a second or more of imports the first time
_FIRST_IMPORTS = ("jax", "napari_gridmip._jobs.correlation", "napari_gridmip.core.correlation.subsets")
_PENDING: list[Callable[[], Any]] = []  # runs ahead to submit at the event loop's next turn


#: the Correlation widget's remembered options that no sample sets and that change a first Run's programs, with the
#: widget's defaults: a returning user who chose others would run programs the run ahead never made
_PROGRAM_OPTIONS = {"subset_shape": "translation", "precision": "float32", "full_map": False}
_QUIT_WATCHED: list[Any] = []  # the application whose aboutToQuit cancels the runs ahead


def _default_options() -> bool:
    """Whether the Correlation widget's remembered options are the defaults the run ahead assumes."""
    from napari_gridmip._jobs import settings as _settings

    stored = _settings.load("correlation")
    return all(stored.get(name, default) == default for name, default in _PROGRAM_OPTIONS.items())


def _imported() -> bool:
    """Whether this session has imported what a run ahead imports (then it may start beside the sample's making)."""
    return all(name in sys.modules for name in _FIRST_IMPORTS)


def _start_pending() -> None:
    """Submit the runs ahead left for this turn of the event loop (each on its own: one failing leaves the rest)."""
    while _PENDING:
        submit = _PENDING.pop(0)
        try:
            submit()
        except Exception:  # noqa: BLE001 - a run ahead is an optimisation: the widget's Run reports real failures
            _LOG.debug("a run ahead could not be submitted", exc_info=True)


def _cancel_at_quit(app: Any) -> None:
    """Once per application: at its quit, the pending runs ahead are dropped and the running ones cancelled (each
    stops at its next progress report; a compile under way ends first, as XLA's cannot be interrupted)."""
    if any(watched is app for watched in _QUIT_WATCHED):
        return
    _QUIT_WATCHED.append(app)
    app.aboutToQuit.connect(cancel_runs_ahead)


def cancel_runs_ahead() -> None:
    """Drop the runs ahead still to be submitted and cancel those submitted (napari quits, or a Run starts); each
    stops at its next progress report."""
    _PENDING.clear()
    for task in running_ahead():
        task.cancel()


def running_ahead() -> list[Any]:
    """The samples' runs ahead still running or waiting (those still to be submitted as their ``submit`` function)."""
    from napari_gridmip._widgets.workers import workers_if_made

    pool = workers_if_made()
    tasks = [] if pool is None else [task for task in pool.busy() if task.name.startswith(NAME_PREFIX)]
    return [*_PENDING, *tasks]
