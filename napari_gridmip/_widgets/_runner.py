"""The background run shared by every widget.

One :class:`BackgroundRunner` per widget owns at most one napari thread
worker. It disables Run (and enables Cancel) while busy, shows progress in
napari's activity dock, turns errors into notifications, and adds the result
layers on the GUI thread all at once, or none of them. Jobs are plain
functions of a progress callback; the compute core never sees Qt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from napari.utils import notifications
from napari.utils import progress as napari_progress
from qtpy.QtCore import QObject, Signal

ProgressCallback = Callable[[int, int], None]
LayerDataTuple = tuple[Any, dict, str]


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
        self._pbar: napari_progress | None = None
        self._cancel_requested = False
        self._cancel_button.enabled = False

    @property
    def busy(self) -> bool:
        return self.worker is not None

    def start(
        self,
        job: Callable[[ProgressCallback], Any],
        to_layers: Callable[[Any], Sequence[LayerDataTuple]],
        *,
        description: str,
        on_done: Callable[[Any], None] | None = None,
    ) -> Any:
        """Start ``job(progress)`` in a thread worker.

        ``progress(done, total)`` may be called by the job from its thread; it
        raises :class:`Cancelled` once Cancel was pressed, which is how long
        jobs stop early. ``to_layers(result)`` runs in the worker too and
        returns napari layer-data tuples; they are added on the GUI thread, and
        then ``on_done(result)`` runs there (for example to show a summary).
        """
        from napari.qt.threading import create_worker

        if self.busy:
            raise RuntimeError("a job is already running")
        self._cancel_requested = False
        self._run_button.enabled = False
        self._cancel_button.enabled = True
        self._status.value = f"{description}..."
        self._pbar = napari_progress(total=0, desc=description)

        def work() -> tuple[Any, Sequence[LayerDataTuple]]:
            result = job(self._report)
            self._check_cancel()
            layers = to_layers(result)
            self._check_cancel()
            return result, layers

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

    def _on_returned(self, value: tuple[Any, Sequence[LayerDataTuple]], on_done: Callable | None) -> None:
        result, layer_data = value
        if self._cancel_requested:
            return
        added = []
        try:
            from napari.layers import Layer

            new_layers = [Layer.create(data, dict(meta), kind) for data, meta, kind in layer_data]
            for layer in new_layers:
                added.append(self._viewer.add_layer(layer))
            if on_done is not None:
                on_done(result)
        except Exception as error:  # noqa: BLE001 - anything here must not leave half a result
            for layer in added:
                if layer in self._viewer.layers:
                    self._viewer.layers.remove(layer)
            self._on_errored(error)
            return
        self._status.value = f"Done: added {', '.join(repr(layer.name) for layer in added)}"

    def _on_errored(self, error: BaseException) -> None:
        if isinstance(error, Cancelled):
            self._status.value = "Cancelled"
            notifications.show_info("Cancelled: no layer was added")
            return
        self._status.value = f"Failed: {error}"
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
