"""The background run shared by every widget.

One :class:`BackgroundRunner` per widget owns at most one napari thread
worker. It disables Run (and enables Cancel) while busy, shows progress in
napari's activity dock, turns errors into notifications, and adds the result
layers on the GUI thread all at once, or none of them. Jobs are plain
:class:`~napari_gridmip._jobs.Job` objects (Qt-free); the compute core never
sees Qt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from napari.utils import notifications
from napari.utils import progress as napari_progress
from qtpy.QtCore import QObject, Signal

from napari_gridmip._jobs import Job, JobResult


def notify_error(text: str) -> None:
    """Show an error as a napari notification (looked up at call time, so tests can catch it)."""
    notifications.show_error(text)


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
        self._relay = _Relay()
        self._relay.progressed.connect(self._on_progress)
        self.worker: Any = None
        self.device_text = ""  # the JAX device, known after the first run
        self._pbar: napari_progress | None = None
        self._cancel_requested = False
        self._cancel_button.enabled = False

    @property
    def busy(self) -> bool:
        return self.worker is not None

    def start(self, job: Job, *, on_done: Callable[[JobResult, list], None] | None = None) -> Any:
        """Run ``job`` in a thread worker; add its layers on the GUI thread, then ``on_done(result, added)``.

        The job's ``progress(done, total)`` raises :class:`Cancelled` once
        Cancel was pressed, which is how long jobs stop early. The first job
        also prepares JAX there (compilation cache, device name), so nothing
        starts a JAX backend on the GUI thread.
        """
        from napari.qt.threading import create_worker

        from napari_gridmip._jobs import prepare_jax

        if self.busy:
            raise RuntimeError("a job is already running")
        self._cancel_requested = False
        self._run_button.enabled = False
        self._cancel_button.enabled = True
        self._set_status(f"{job.description}...")
        self._pbar = napari_progress(total=0, desc=job.description)

        def work() -> tuple[JobResult, str]:
            device = prepare_jax()
            result = job.run(self._report)
            self._check_cancel()
            return result, device

        worker = create_worker(work, _start_thread=False, _ignore_errors=True)  # errors: _on_errored
        worker.returned.connect(lambda value: self._on_returned(value, on_done))
        worker.errored.connect(self._on_errored)
        worker.finished.connect(self._on_finished)
        self.worker = worker
        worker.start()
        return worker

    def cancel(self) -> None:
        """Ask the running job to stop; whatever it returns afterwards is dropped."""
        if self.busy:
            self._cancel_requested = True
            self._status.value = "Cancelling..."
            self._cancel_button.enabled = False

    def _set_status(self, text: str, *, tooltip: str | None = None) -> None:
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
    def _on_progress(self, done: int, total: int) -> None:
        if self._pbar is not None:
            if self._pbar.total != total:
                self._pbar.total = total
            self._pbar.n = done
            self._pbar.refresh()

    def _on_returned(self, value: tuple[JobResult, str], on_done: Callable | None) -> None:
        result, device = value
        self.device_text = device
        if self._cancel_requested:
            return
        viewer = self._viewer
        extent_before = _world_box(viewer)
        added = []
        try:
            from napari.layers import Layer

            new_layers = [Layer.create(data, dict(meta), kind) for data, meta, kind in result.layers]
            for layer in new_layers:
                added.append(viewer.add_layer(layer))
            if on_done is not None:
                on_done(result, added)
        except Exception as error:  # noqa: BLE001 - anything here must not leave half a result
            for layer in added:
                if layer in viewer.layers:
                    viewer.layers.remove(layer)
            self._on_errored(error)
            return
        if extent_before is not None and not _contains(extent_before, _world_box(viewer)):
            viewer.reset_view()  # a result outside what was shown (a merged image beside its tiles): bring it in
        names = "\n".join(layer.name for layer in added)
        count = f"{len(added)} layer{'s' if len(added) != 1 else ''}"
        self._set_status(f"Done: added {count}", tooltip=f"{result.summary}\nAdded:\n{names}")

    def _on_errored(self, error: BaseException) -> None:
        if isinstance(error, Cancelled):
            self._status.value = "Cancelled"
            notifications.show_info("Cancelled: no layer was added")
            return
        self._set_status(f"Failed: {error}")
        notify_error(f"{type(error).__name__}: {error}")

    def _on_finished(self) -> None:
        if self._cancel_requested and self._status.value.endswith("..."):
            self._status.value = "Cancelled"
        self.worker = None
        if self._pbar is not None:
            self._pbar.close()
            self._pbar = None
        self._run_button.enabled = True
        self._cancel_button.enabled = False


def _world_box(viewer: Any) -> np.ndarray | None:
    """The displayed world extent ``(2, ndim)`` of the viewer's layers, or None when it has none."""
    if not len(viewer.layers):
        return None
    return np.asarray(viewer.layers.extent.world, dtype=float)


def _contains(outer: np.ndarray, inner: np.ndarray | None) -> bool:
    if inner is None or inner.shape != outer.shape:
        return False
    return bool(np.all(inner[0] >= outer[0] - 1e-9) and np.all(inner[1] <= outer[1] + 1e-9))
