"""The frame every widget shares: its inputs, then Run, Cancel and a status line.

Widgets are thin: they map fields to a request, hand the job made from it
(:mod:`napari_gridmip._jobs`) to the runner, and show the result. They connect
nothing to the viewer themselves: napari's ``add_dock_widget`` already keeps
``reset_choices`` in step with the layer list, and the widget hooks its own
refreshes onto that. When the dock is closed the widget cancels its job and
undoes napari's connections, so no callback reaches a closed widget.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from magicgui.widgets import CheckBox, ComboBox, Container, Label, PushButton, Widget
from qtpy.QtCore import QEvent, QObject, QTimer

from napari_gridmip import _settings
from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._widgets._runner import BackgroundRunner, notify_error
from napari_gridmip.core._options import switched_off

if TYPE_CHECKING:
    import napari

LAYER_EVENTS = ("inserted", "removed", "reordered", "renamed")  # what napari connects to reset_choices


def wrapping_label(name: str, label: str, value: str = "") -> Label:
    """A label whose long text wraps instead of widening the dock (the full text is also its tooltip)."""
    from qtpy.QtWidgets import QSizePolicy

    widget = Label(name=name, label=label, value=value)
    widget.native.setWordWrap(True)
    widget.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    widget.native.setMinimumWidth(0)
    return widget


class _DockLifetime(QObject):
    """Calls ``release`` once the widget is closed or taken out of its dock (napari re-parents it to None)."""

    def __init__(self, owner: JobWidget) -> None:
        super().__init__()
        self._owner = owner
        self._docked = False
        owner.native.installEventFilter(self)

    def on_destroyed(self, *_: object) -> None:
        self._owner.release()

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        kind = event.type()
        if kind == QEvent.Type.ParentChange:
            if obj.parent() is not None:
                self._docked = True
            elif self._docked:
                self._owner.release()
        elif kind == QEvent.Type.Close:
            self._owner.release()
        return False


class JobWidget(Container):
    """A dock widget that runs one job in the background.

    Subclasses create their fields, call :meth:`_finish`, and implement
    :meth:`make_job` (read the fields and layers on the GUI thread, return a
    :class:`~napari_gridmip._jobs.Job`) and, optionally, :meth:`show_result`.
    ``settings_key`` and ``persisted`` name the fields remembered across sessions.
    """

    settings_key = ""
    persisted: tuple[str, ...] = ()

    def __init__(self, viewer: napari.viewer.Viewer) -> None:
        super().__init__()
        self._viewer = viewer
        self.released = False
        self._ready = False  # set once the fields exist (magicgui may reset choices while building)
        self.run_button = PushButton(text="Run", name="run")
        self.cancel_button = PushButton(text="Cancel", name="cancel")
        self.keep_previous = CheckBox(
            name="keep_previous",
            text="Keep previous results",
            value=False,
            tooltip="Off: a re-run on the same input replaces its earlier result layers (same names and places, "
            "your colormap and visibility kept). On: every run adds new layers.",
        )
        self.copy_button = PushButton(text="Copy as Python", name="copy_python", enabled=False)
        self.copy_button.tooltip = (
            "Put a short script on the clipboard that makes the last result again from its input layers "
            "with the napari_gridmip functions"
        )
        self._results: list[weakref.ref] = []  # the layers the last run made or replaced
        self.status = wrapping_label("status", "Status", "Ready")
        self.summary = wrapping_label("summary", "Result")
        self.device = wrapping_label("device", "Device", "known after the first run")
        self.runner = BackgroundRunner(
            run_button=self.run_button, cancel_button=self.cancel_button, status=self.status, viewer=viewer
        )
        self.run_button.changed.connect(self.run)
        self.cancel_button.changed.connect(self.runner.cancel)
        self.copy_button.changed.connect(self.copy_python)
        self._lifetime = _DockLifetime(self)
        # closing the viewer deletes the dock without closing or re-parenting it: let go before Qt does
        self.native.destroyed.connect(self._lifetime.on_destroyed)
        self._last_run_key: Any = None
        self._following_layers = False  # set while the fields follow a change of the layer list
        self._prefetch_timer = QTimer()
        self._prefetch_timer.setSingleShot(True)
        self._prefetch_timer.setInterval(PREFETCH_DELAY_MS)
        self._prefetch_timer.timeout.connect(self._prefetch)

    def _finish(self, inputs: Sequence[Widget], outputs: Sequence[Widget] = ()) -> None:
        buttons = [self.keep_previous, self.run_button, self.cancel_button, self.status]
        self.extend([*inputs, *buttons, *outputs, self.summary, self.device, self.copy_button])
        self._restore_settings()
        self._ready = True
        start_jax_early()
        self.reset_choices()
        for field in inputs:  # an option changed: what Run would compute changed
            field.changed.connect(self._option_changed)

    # -- layer choices -----------------------------------------------------------------
    def layer_combo(self, name: str, label: str, types: tuple[type, ...], *, nullable: bool = False) -> ComboBox:
        """A layer chooser offering the viewer's layers of ``types``, newest first; long names never widen it."""
        from qtpy.QtWidgets import QComboBox

        # magicgui keeps the choices function in a typing.Annotated type, which typing caches for the
        # session: a closure over the widget would keep the widget (and its last result) alive
        owner = weakref.ref(self)

        def choices(_widget: Any = None) -> list[tuple[str, Any]]:
            widget = owner()
            if widget is None:
                return []
            return [(layer.name, layer) for layer in reversed(widget._viewer.layers) if isinstance(layer, types)]

        combo = ComboBox(name=name, label=label, choices=choices, nullable=nullable)
        combo.native.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        combo.native.setMinimumContentsLength(12)
        return combo

    def reset_choices(self, *args: Any) -> None:
        """Refresh the layer choices (napari calls this on every layer-list change while docked)."""
        self._following_layers = True  # the fields these set follow the layers: not a user's edit
        try:
            super().reset_choices(*args)
            if self._ready:
                self._layers_changed()
        finally:
            self._following_layers = False
        if self._ready:
            self._schedule_prefetch(delay_ms=LAYERS_PREFETCH_DELAY_MS)

    # -- work started before Run -------------------------------------------------------
    def _option_changed(self, *_: Any) -> None:
        """An input field changed: by the user (wait for them to stop), or by a change of the layer list."""
        self._schedule_prefetch(delay_ms=LAYERS_PREFETCH_DELAY_MS if self._following_layers else None)

    def _schedule_prefetch(self, *, delay_ms: int | None = None) -> None:
        """Prepare the run in the background once the inputs have been still for ``PREFETCH_DELAY_MS`` (an option
        edited: the user may still be typing), or ``delay_ms`` after a change of the layer list (never sooner
        than a wait already under way for an edited option)."""
        if not self._ready or self.released:  # whether it is switched on is asked when the timer fires
            return
        timer = self._prefetch_timer
        delay = PREFETCH_DELAY_MS if delay_ms is None else delay_ms
        if timer.isActive():
            delay = max(delay, timer.remainingTime())
        timer.start(delay)

    def run_key(self) -> Any:
        """What a run computes from: every input field's value, each layer by its identity, data and placement.

        Two equal keys make equal results, so a job started early (:meth:`_prefetch`) stands for a Run
        of the same key. None when an input cannot be keyed (then nothing is started early).
        """
        values = []
        for field in self:
            if field is self.keep_previous or isinstance(field, (PushButton, Label)):
                continue
            value = getattr(field, "value", None)
            if _is_layer(value):
                values.append((field.name, layer_key(value)))
            else:
                try:
                    hash(value)
                except TypeError:
                    return None
                values.append((field.name, value))
        return (type(self).__name__, tuple(values))

    def _prefetch(self) -> None:
        """Start, quietly, the job Run would start now, where it is small and its inputs in memory."""
        if self.released or self.runner.busy or not prefetch_enabled():
            return
        key = self.run_key()
        layers = [field.value for field in self if _is_layer(getattr(field, "value", None))]
        if key is None or key == self._last_run_key or not _small_in_memory(layers):
            return
        try:
            job = self.make_job()
        except (ValueError, TypeError):  # inputs not ready (no layer chosen yet...): Run will say so
            return
        self.runner.prefetch(job, key)

    def _layers_changed(self) -> None:
        """Hook for widgets that follow the layer list beyond their choices."""

    # -- settings ----------------------------------------------------------------------
    def _restore_settings(self) -> None:
        stored = _settings.load(self.settings_key) if self.settings_key else {}
        for name in self.persisted:
            field = getattr(self, name)
            if name in stored:
                try:
                    field.value = stored[name]
                except (ValueError, TypeError):  # a choice that no longer exists: keep the default
                    pass
            field.changed.connect(self._store_settings)

    def _store_settings(self, *_: Any) -> None:
        _settings.save(self.settings_key, {name: getattr(self, name).value for name in self.persisted})

    # -- running -----------------------------------------------------------------------
    def run(self) -> None:
        """Read the inputs and start the job; bad input becomes a notification."""
        if self.runner.busy or self.released:
            return
        try:
            job = self.make_job()
        except ValueError as error:
            self.runner._set_status(f"Failed: {error}")
            notify_error(str(error))
            return
        self._prefetch_timer.stop()
        key = self.run_key()
        self._last_run_key = key
        self.runner.start(job, on_done=self._on_done, replace=not self.keep_previous.value, key=key)

    def make_job(self) -> Job:
        raise NotImplementedError

    def _on_done(self, result: JobResult, added: list) -> None:
        self._results = [weakref.ref(layer) for layer in added]
        self.copy_button.enabled = True
        self.summary.value = result.summary
        self.summary.tooltip = result.summary
        self.device.value = self.runner.device_text
        self.show_result(result, added)

    def show_result(self, result: JobResult, added: list) -> None:
        """Hook: show what the job found beyond its layers (runs on the GUI thread after they are added)."""

    def python_script(self) -> str:
        """The script that reproduces the last result's layers still in the viewer (their provenance)."""
        from napari_gridmip._provenance import script_from_layers

        layers = [ref() for ref in self._results]
        return script_from_layers([layer for layer in layers if layer is not None and layer in self._viewer.layers])

    def copy_python(self) -> None:
        """Put :meth:`python_script` on the clipboard."""
        from qtpy.QtWidgets import QApplication

        try:
            text = self.python_script()
        except ValueError as error:
            notify_error(str(error))
            return
        QApplication.clipboard().setText(text)
        self.runner._set_status("Copied a Python script to the clipboard", tooltip=text)

    def release(self) -> None:
        """Cancel the job and undo napari's connections to this widget (its dock was closed)."""
        if self.released:
            return
        self.released = True
        self._prefetch_timer.stop()
        self.runner.detach()
        events = self._viewer.layers.events
        for name in LAYER_EVENTS:
            getattr(events, name).disconnect(self.reset_choices)


PREFETCH_DELAY_MS = 400  # inputs still for this long: start the run they describe in the background
# after a change of the layer list (a sample or file opened: its layers arrive within one event-loop turn), start
# sooner: a user who opens a sample and clicks Run half a second later gets the result 0.35 s earlier
# (bench_first_run.py --part widgets)
LAYERS_PREFETCH_DELAY_MS = 50
PREFETCH_MAX_BYTES = 256 * 2**20  # inputs larger than this (or lazy) are only computed when Run asks


def prefetch_enabled() -> bool:
    """Whether widgets start their run before Run is pressed: napari's Preferences, napari-gridmip, "All
    widgets", "Start a run before Run is pressed" (``general.start_early``), unless ``NAPARI_GRIDMIP_PREFETCH=0``."""
    if switched_off("NAPARI_GRIDMIP_PREFETCH"):
        return False
    return bool(_settings.load("general").get("start_early", True))


# the session's one early start of JAX (see start_jax_early): its worker, once started
_JAX_STARTED: dict[str, Any] = {"worker": None}


def start_jax_early() -> None:
    """Import JAX and start its backend in a worker, once per session, when the first widget is made.

    Importing JAX and starting the backend (the persistent compile cache set up, the device named:
    :func:`napari_gridmip._jobs.prepare_jax`) takes about a second before a first job can trace anything
    (docs/benchmarks.md, "First calls": the import column); done while the user opens data and sets the
    options, it is out of the first Run's way, and out of the early start's. Nothing of JAX runs on the
    GUI thread, and nothing starts when early starts are switched off (:func:`prefetch_enabled`).
    """
    if _JAX_STARTED["worker"] is not None or not prefetch_enabled():
        return
    from napari_gridmip._jobs import prepare_jax
    from napari_gridmip._widgets._workers import workers

    # errors are left to the first job, which runs prepare_jax again and reports them
    _JAX_STARTED["worker"] = workers().submit(prepare_jax, lane="early", name="start JAX")


def _is_layer(value: Any) -> bool:
    """Whether a field's value is a napari layer (duck-typed: napari's layer classes load lazily)."""
    return hasattr(value, "data") and hasattr(value, "affine")


def layer_key(layer: Any) -> tuple:
    """A layer as a run sees it: the object, its data object, name and placement (a change of any is a new run)."""
    return (
        id(layer),
        id(layer.data),
        layer.name,
        np.asarray(layer.affine.affine_matrix).tobytes(),
        np.asarray(layer.scale).tobytes(),
        np.asarray(layer.translate).tobytes(),
    )


def _small_in_memory(layers: Sequence[Any]) -> bool:
    """Whether ``layers`` hold NumPy data of at most ``PREFETCH_MAX_BYTES`` together, none of them Labels (lazy data
    is never read early; a multiscale layer's data, a list of levels, counts as lazy)."""
    total = 0
    for layer in layers:
        # Labels are painted in place (the same array, new values): never keyed by identity alone
        if not isinstance(layer.data, np.ndarray) or type(layer).__name__ == "Labels":
            return False
        total += layer.data.nbytes
    return total <= PREFETCH_MAX_BYTES


def require_layer(combo: ComboBox, what: str) -> Any:
    """The chosen layer, or a ValueError saying that one is needed."""
    layer = combo.value
    if layer is None:
        raise ValueError(f"choose {what} first: the viewer has none")
    return layer
