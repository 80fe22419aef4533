"""The frame every widget shares: its inputs, then Run, Cancel and a status line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from magicgui.widgets import ComboBox, Container, Label, PushButton, Widget

from napari_gridmip._widgets._runner import BackgroundRunner, LayerDataTuple, ProgressCallback, notify_error

if TYPE_CHECKING:
    import napari


class JobWidget(Container):
    """A dock widget that runs one core job in the background.

    Subclasses add their input widgets with :meth:`_finish`, and implement
    :meth:`_make_job`, which reads the inputs on the GUI thread and returns
    ``(job, to_layers, description)`` for :class:`BackgroundRunner`.
    """

    def __init__(self, viewer: napari.viewer.Viewer) -> None:
        super().__init__()
        self._viewer = viewer
        self.run_button = PushButton(text="Run", name="run")
        self.cancel_button = PushButton(text="Cancel", name="cancel")
        self.status = Label(value="Ready", name="status", label="Status")
        self.runner = BackgroundRunner(
            run_button=self.run_button, cancel_button=self.cancel_button, status=self.status, viewer=viewer
        )
        self.run_button.changed.connect(self.run)
        self.cancel_button.changed.connect(self.runner.cancel)
        # The layer choices follow the layer list, docked or not.
        viewer.layers.events.inserted.connect(self.reset_choices)
        viewer.layers.events.removed.connect(self.reset_choices)
        viewer.layers.events.reordered.connect(self.reset_choices)

    def _finish(self, inputs: Sequence[Widget]) -> None:
        self.extend([*inputs, self.run_button, self.cancel_button, self.status])
        self.reset_choices()

    def layer_combo(self, name: str, label: str, types: tuple[type, ...], *, nullable: bool = False) -> ComboBox:
        """A layer chooser offering the viewer's layers of ``types``, newest first."""

        def choices(_widget: Any = None) -> list[tuple[str, Any]]:
            return [(layer.name, layer) for layer in reversed(self._viewer.layers) if isinstance(layer, types)]

        return ComboBox(name=name, label=label, choices=choices, nullable=nullable)

    def run(self) -> None:
        """Read the inputs and start the job; bad input becomes a notification."""
        if self.runner.busy:
            return
        try:
            job, to_layers, description, on_done = self._make_job()
        except ValueError as error:
            self.status.value = f"Failed: {error}"
            notify_error(str(error))
            return
        self.runner.start(job, to_layers, description=description, on_done=on_done)

    def _make_job(
        self,
    ) -> tuple[
        Callable[[ProgressCallback], Any],
        Callable[[Any], Sequence[LayerDataTuple]],
        str,
        Callable[[Any], None] | None,
    ]:
        raise NotImplementedError


def require_layer(combo: ComboBox, what: str) -> Any:
    """The chosen layer, or a ValueError saying that one is needed."""
    layer = combo.value
    if layer is None:
        raise ValueError(f"choose {what} first: the viewer has none")
    return layer


def jax_device_text() -> str:
    """Which JAX device runs the work, e.g. ``'JAX device: cpu (TFRT_CPU_0)'``."""
    import jax

    device = jax.devices()[0]
    return f"JAX device: {device.platform} ({device.device_kind}, {len(jax.devices())} available)"
