"""The frame every widget shares: its inputs, then Run, Cancel and a status line.

Part of the widgets package's internal API: :class:`JobWidget` and the layout helpers for the widgets, and
:func:`prefetch_enabled` (napari's Preferences: whether runs start before Run is pressed) for the samples' run
ahead (:mod:`napari_gridmip._sample_data.ahead`).

The canvas first: a dock is a narrow column (:data:`DOCK_WIDTH`) that scrolls when it is taller than the
window, each field's label above it, the rarely used options in a collapsed "Advanced" section, and the
options of one mode shown only in that mode (:meth:`JobWidget.show_fields`). With napari's own layer controls
on the left (320 to 337 px), the canvas keeps at least 60% of a 1400 px wide window.

Widgets are thin: they map fields to a request, hand the job made from it
(:mod:`napari_gridmip._jobs`) to the runner, and show the result. napari's
``add_dock_widget`` already keeps ``reset_choices`` in step with the layer list,
and the widget hooks its own refreshes onto that. The one connection a widget
makes itself is its :class:`~napari_gridmip._jobs.device_layers.LayerWatch`: the layer
list's ``removed`` event, and the edits of the layers it ran on, which keep their
device copies current (:meth:`JobWidget.device_input`). When the dock is closed
the widget cancels its job and undoes napari's connections and its own, so no
callback reaches a closed widget.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from magicgui.widgets import CheckBox, ComboBox, Container, Label, PushButton, Widget
from qtpy.QtCore import QEvent, QObject, QSize, QTimer
from qtpy.QtWidgets import QBoxLayout, QComboBox, QFrame, QScrollArea, QWidget

from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._jobs import settings as _settings
from napari_gridmip._jobs.device_layers import DeviceInput, LayerWatch
from napari_gridmip._widgets.runner import BackgroundRunner, notify_error
from napari_gridmip.core.options import switched_off

if TYPE_CHECKING:
    import napari

LAYER_EVENTS = ("inserted", "removed", "reordered", "renamed")  # what napari connects to reset_choices
# The width a dock asks for: napari's layer controls take 320 px (PyQt6) to 337 px (PyQt5) of a 1400 px window
# and the splitters 26 px, so a dock of 190 px leaves the canvas 847 px (60.5%) and more. The dock can be
# dragged wider, up to DOCK_MAX_WIDTH.
DOCK_WIDTH = 190
DOCK_MAX_WIDTH = 450
FIELD_MIN_WIDTH = 60  # spin boxes, line edits and combo boxes take the column's width, but ask for no more than this
COMBO_MIN_CHARACTERS = 10  # a combo box shows at least this many characters; long choices never widen the dock


def wrapping_label(name: str, label: str, value: str = "") -> Label:
    """A label whose long text wraps instead of widening the dock (the full text is also its tooltip)."""
    from qtpy.QtWidgets import QSizePolicy

    widget = Label(name=name, label=label, value=value)
    widget.native.setWordWrap(True)
    widget.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    widget.native.setMinimumWidth(0)
    return widget


def narrow(field: Widget) -> None:
    """Let an editable field shrink to :data:`FIELD_MIN_WIDTH` (its natural width, e.g. a spin box's range or a
    combo box's longest choice, would widen the dock); it still takes the column's whole width."""
    native = field.native
    if isinstance(native, QComboBox):
        native.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        native.setMinimumContentsLength(COMBO_MIN_CHARACTERS)
    if native.minimumWidth() == 0:  # a minimum the widget chose itself stays
        native.setMinimumWidth(min(FIELD_MIN_WIDTH, native.minimumSizeHint().width()) or FIELD_MIN_WIDTH)


def labels_above(container: Container) -> None:
    """Put each field's label above it, not beside it (magicgui puts it on the left): a narrow column has room
    for a long label and its field only one above the other. Fields without a label (buttons, check boxes,
    nested containers without one) are left as they are; value widgets are narrowed (:func:`narrow`)."""
    for field in container:
        native = field.native
        row = native.parentWidget()
        if isinstance(field, Container):
            if not field.labels:  # a row of widgets (buttons, check boxes): its own fields
                for inner in field:
                    if not isinstance(inner, (PushButton, CheckBox, Label, Container)):
                        narrow(inner)
            else:
                labels_above(field)
        elif not isinstance(field, (PushButton, CheckBox, Label)):
            narrow(field)
        if row is None or row is container.native:  # not wrapped in a label row
            continue
        layout = row.layout()
        if isinstance(layout, QBoxLayout) and layout.direction() != QBoxLayout.Direction.TopToBottom:
            layout.setDirection(QBoxLayout.Direction.TopToBottom)
            layout.setSpacing(1)
            label = layout.itemAt(0).widget()
            if label is not None:  # as wide as its text (short enough for the column); an empty one takes no row
                label.setMinimumWidth(0)
                label.setVisible(bool(field.label))


class _DockScroll(QScrollArea):
    """The dock's body: :data:`DOCK_WIDTH` wide (at most :data:`DOCK_MAX_WIDTH` when dragged), as tall as its
    fields, scrolling vertically when the window is shorter; never horizontally (the fields fit the width)."""

    def __init__(self, content: QWidget) -> None:
        super().__init__()
        from qtpy.QtCore import Qt

        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setMaximumWidth(DOCK_MAX_WIDTH)
        self.setWidget(content)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        content = self.widget()
        height = content.sizeHint().height() if content is not None else 0
        return QSize(DOCK_WIDTH, height)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        content = self.widget()
        width = content.minimumSizeHint().width() if content is not None else 0
        scrollbar = self.verticalScrollBar().sizeHint().width()
        return QSize(min(width + scrollbar, DOCK_WIDTH), 60)


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
        self._relevant: dict[Widget, bool] = {}  # fields shown only in some modes: whether the current one uses them
        self._advanced_fields: list[Widget] = []  # the fields in the Advanced section, closed by default
        self._advanced_defaults: dict[str, Any] = {}
        self.released = False
        self._ready = False  # set once the fields exist (magicgui may reset choices while building)
        # napari docks ``native``: the scroll area around the fields (see the ``native`` property)
        self._scroll = _DockScroll(super().native)
        self._scroll._magic_widget = self
        self.run_button = PushButton(text="Run", name="run")
        self.cancel_button = PushButton(text="Cancel", name="cancel")
        self.keep_previous = CheckBox(
            name="keep_previous",
            text="Keep earlier results",
            value=False,
            tooltip="Off: a re-run on the same input replaces its earlier result layers (same names and places, "
            "your colormap and visibility kept). On: every run adds new layers, the earlier results kept.",
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
        # the device copies of the layers this widget runs on: current while they are
        self.device_layers = LayerWatch(viewer.layers)
        self._lifetime = _DockLifetime(self)
        # closing the viewer deletes the dock without closing or re-parenting it: let go before Qt does
        self.native.destroyed.connect(self._lifetime.on_destroyed)
        self._last_run_key: Any = None
        self._following_layers = False  # set while the fields follow a change of the layer list
        self._prefetch_timer = QTimer()
        self._prefetch_timer.setSingleShot(True)
        self._prefetch_timer.setInterval(PREFETCH_DELAY_MS)
        self._prefetch_timer.timeout.connect(self._prefetch)

    @property
    def starting_early(self) -> bool:
        """A job before Run is scheduled (the inputs' wait for stillness under way) or still running."""
        return self._prefetch_timer.isActive() or self.runner.prefetching

    @property
    def native(self) -> Any:
        """The dock's body, a scroll area around the fields (what napari docks); the fields' own widget is in it."""
        scroll = self.__dict__.get("_scroll")
        return scroll if scroll is not None else super().native

    def _unify_label_widths(self) -> None:
        """Nothing to line up: each label is above its field (:func:`labels_above`), not in a column beside it."""

    def _finish(
        self, inputs: Sequence[Widget], outputs: Sequence[Widget] = (), advanced: Sequence[Widget] = ()
    ) -> None:
        """Lay the dock out: ``inputs``, the Advanced section (``advanced`` and Keep earlier results, closed),
        Run and Cancel, the status, ``outputs``, the result, the device and Copy as Python."""
        self.advanced = PushButton(name="advanced", text="Advanced")
        self.advanced.native.setCheckable(True)
        self.advanced.native.setStyleSheet("text-align: left; padding-left: 6px")
        self.advanced.tooltip = "Show or hide the options most runs leave as they are"
        self._advanced_fields = [*advanced, self.keep_previous]
        buttons = Container(
            name="run_cancel", layout="horizontal", labels=False, widgets=[self.run_button, self.cancel_button]
        )
        buttons.label = ""  # no caption above the two buttons
        buttons.margins = (0, 0, 0, 0)
        self.device.visible = False  # shown once a run has named it
        self.extend(
            [*inputs, self.advanced, *self._advanced_fields, buttons, self.status, *outputs, self.summary,
             self.device, self.copy_button]
        )  # fmt: skip
        labels_above(self)
        self.margins = (2, 4, 2, 4)  # the dock's own frame is margin enough
        super().native.layout().addStretch(1)  # the fields at the top of a tall dock, not spread over it
        self._advanced_defaults = {field.name: getattr(field, "value", None) for field in self._advanced_fields}
        self._restore_settings()
        self._ready = True
        start_jax_early()
        self.reset_choices()
        for field in [*inputs, *advanced]:  # an option changed: what Run would compute changed
            field.changed.connect(self._option_changed)
        self.advanced.native.toggled.connect(self._update_fields)  # a click, or its value set
        for field in self._advanced_fields:
            field.changed.connect(self._update_fields)
        self._update_fields()

    # -- what is shown -----------------------------------------------------------------
    def show_fields(self, shown: dict[Widget, bool]) -> None:
        """Show each field of ``shown`` where the current mode uses it (True) and hide it elsewhere; a field
        of the Advanced section only while the section is open."""
        self._relevant.update(shown)
        self._update_fields()

    def _update_fields(self, *_: Any) -> None:
        if not self._advanced_fields:  # still being built
            return
        opened = bool(self.advanced.value)
        for field, relevant in self._relevant.items():
            if field not in self._advanced_fields:
                field.visible = relevant
        changed = 0
        for field in self._advanced_fields:
            relevant = self._relevant.get(field, True)
            field.visible = relevant and opened
            changed += relevant and getattr(field, "value", None) != self._advanced_defaults.get(field.name)
        arrow = "\u25be" if opened else "\u25b8"  # a triangle pointing down (open) or right (closed)
        self.advanced.text = f"{arrow} Advanced" + (f" ({changed})" if changed else "")
        what = "Hide" if opened else "Show"
        self.advanced.tooltip = f"{what} the options most runs leave as they are" + (
            f"; {changed} of them differ from their defaults" if changed else ""
        )

    # -- layer choices -----------------------------------------------------------------
    def layer_combo(self, name: str, label: str, types: tuple[type, ...], *, nullable: bool = False) -> ComboBox:
        """A layer chooser offering the viewer's layers of ``types``, newest first; long names never widen it."""
        # magicgui keeps the choices function in a typing.Annotated type, which typing caches for the
        # session: a closure over the widget would keep the widget (and its last result) alive
        owner = weakref.ref(self)

        def choices(_widget: Any = None) -> list[tuple[str, Any]]:
            widget = owner()
            if widget is None:
                return []
            return [(layer.name, layer) for layer in reversed(widget._viewer.layers) if isinstance(layer, types)]

        combo = ComboBox(name=name, label=label, choices=choices, nullable=nullable)
        narrow(combo)
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
        for field in _leaves(self):
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
        layers = [field.value for field in _leaves(self) if _is_layer(getattr(field, "value", None))]
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

    def device_input(self, layer: Any, data: Any, *, index: str = "") -> DeviceInput | None:
        """For a request: ``data`` (``layer``'s data with ``index`` applied, as code) as the job takes it from the
        device copy kept since an earlier run, where its kernels run on an accelerator
        (:func:`napari_gridmip._jobs.device_layers.resolve`); None for lazy data, or with the Preferences' share 0."""
        return self.device_layers.input(layer, data, index=index, percent=_settings.device_layers_percent())

    def _on_done(self, result: JobResult, added: list) -> None:
        self._results = [weakref.ref(layer) for layer in added]
        self.copy_button.enabled = True
        self.summary.value = result.summary
        self.summary.tooltip = result.summary
        self.device.value = self.runner.device_text
        self.device.visible = True
        self.show_result(result, added)

    def show_result(self, result: JobResult, added: list) -> None:
        """Hook: show what the job found beyond its layers (runs on the GUI thread after they are added)."""

    def python_script(self) -> str:
        """The script that reproduces the last result's layers still in the viewer (their provenance)."""
        from napari_gridmip._jobs.plan import script_from_layers

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
        # at the interpreter's exit after a script's viewer.close(), Qt deletes the timer first (PyQt aborts on
        # the exception a slot raises); a deleted timer has stopped
        with contextlib.suppress(RuntimeError):
            self._prefetch_timer.stop()
        self.runner.detach()
        self.device_layers.close()
        events = self._viewer.layers.events
        for name in LAYER_EVENTS:
            getattr(events, name).disconnect(self.reset_choices)


PREFETCH_DELAY_MS = 400  # inputs still for this long: start the run they describe in the background
# after a change of the layer list (a sample or file opened: its layers arrive within one event-loop turn), start
# sooner: a user who opens a sample and clicks Run half a second later gets the result 0.35 s earlier
# (bench_first_run.py --part widgets)
LAYERS_PREFETCH_DELAY_MS = 50
PREFETCH_MAX_BYTES = 256 * 2**20  # inputs larger than this (or lazy) are only computed when Run asks


def click_callback(widget: JobWidget, act: Callable[[Any, Any], None]) -> Callable[[Any, Any], Any]:
    """A napari mouse-drag callback that calls ``act(widget, event)`` on a click (a left press and release without
    a drag) while ``widget`` lives and is not released. It holds the widget weakly, and ``act`` must not close over
    it: a callback napari keeps after the dock closed then does not keep the widget (and its last result) alive."""
    owner = weakref.ref(widget)

    def on_click(source: Any, event: Any) -> Any:
        current = owner()
        if current is None or current.released or getattr(event, "button", 1) != 1:
            return
        yield
        dragged = False
        while event.type == "mouse_move":
            dragged = True
            yield
        current = owner()
        if not dragged and current is not None and not current.released:
            act(current, event)

    return on_click


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
    from napari_gridmip._widgets.workers import workers

    # errors are left to the first job, which runs prepare_jax again and reports them
    _JAX_STARTED["worker"] = workers().submit(prepare_jax, lane="early", name="start JAX")


def _leaves(container: Container) -> list[Widget]:
    """The widgets of ``container`` and of the containers in it (a row of check boxes, a filter's parameters)."""
    out: list[Widget] = []
    for field in container:
        out.extend(_leaves(field) if isinstance(field, Container) else [field])
    return out


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
