"""'Full resolution in 3D': follow napari's camera and show full-resolution renders in the 3D canvas.

While on and the viewer is in 3D, every change of the camera (angles, zoom, centre, perspective), of the canvas
size, of the dims point of a >3D layer and of the layer's display (rendering mode, colormap, contrast limits,
gamma, iso threshold, attenuation) hides the last picture, so that napari's own (coarse) view shows while the
camera moves, and restarts a short timer. When the camera has rested for :data:`DEBOUNCE_MS`, a worker of ours
(:mod:`.workers`, its "render" lane) renders the view (:class:`~napari_gridmip._jobs.live_render.LiveSource`: a
coarse pass, then full resolution) and each picture is shown as the texture of a quad on the plane through the
camera's centre, facing the camera and spanning the canvas: a napari Surface layer drawn over the volume without
depth test (``translucent_no_depth``), so that it covers exactly the canvas pixels the volume's own render covers. The
layer is added (hidden) when the switch is turned on, so that napari's making of a layer does not hold the GUI
thread while pictures arrive; each picture then costs the GUI thread one upload of its uint8 texture. A newer
state cancels the render under way (its pictures are dropped). Turning the switch off, closing the source layer
or the widget stops the worker, disconnects every event and removes the quad layer.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any

import numpy as np

DEBOUNCE_MS = 300  # the camera has rested this long: render
PICTURES_KEPT = 4  # the coarse and final pictures of the last two renders
FACES = np.array([[0, 1, 2], [0, 2, 3]])
TEXCOORDS = np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])  # napari flips textures vertically
LAYER_EVENTS = ("colormap", "contrast_limits", "gamma", "rendering", "iso_threshold", "attenuation")
DATA_EVENTS = ("data", "scale", "translate")  # what the render's source (levels, cells, placement) is made from
CAMERA_EVENTS = ("center", "zoom", "angles", "perspective")


def canvas_size(viewer: Any) -> tuple[int, int]:
    """``(height, width)`` of the view napari's camera projects onto (what its zoom is relative to): the public
    canvas model, equal to the vispy view's rectangle in napari 0.9, shown or hidden (the model follows the
    canvas's resizes, a hidden canvas the model); that rectangle was read before through napari's private Qt
    viewer, a FutureWarning from a plugin's widget."""
    return tuple(int(v) for v in viewer.canvas.size)


class _Token:
    """Shared between the GUI and one render: set ``cancelled`` to stop it at its next check."""

    def __init__(self) -> None:
        self.cancelled = False


def source_key(layer: Any, index: tuple[int, ...], threshold: float) -> tuple:
    """What a live view's source of ``layer`` is made from, but its data's generation (see ``LiveRender``)."""
    return (id(layer), index, float(threshold), tuple(layer.scale), tuple(layer.translate))


class WarmAhead:
    """Before the switch is turned on: the source of ``layer`` made and its render programs compiled (or loaded
    from the disk cache) in the render lane, so that the live view, once switched on for that layer, finds both.

    The Occupancy mipmap widget starts one when a layer the live view could show cheaply is chosen (a 3D layer
    whose occupancy cells are stored with it: this plugin's reader and sample), as its other early work, and only
    where early starts are on. Of the chunks, only the coarse pass's are read ahead (at most its cache's 128 MiB;
    level 0's wait for the switch): a user who never turns it on pays one compile per session, on our worker, and
    from the next session a read of the disk cache. The
    first view of a user's first session waited 2.3 s for that compile after the click on 2 cores
    (docs/occupancy.md, the first view's trace).
    """

    def __init__(self, viewer: Any, layer: Any, threshold: float) -> None:
        from napari_gridmip._jobs.live_render import ViewState
        from napari_gridmip._widgets.runner import compute_on_setting
        from napari_gridmip._widgets.workers import workers

        state = ViewState.of(viewer, layer, canvas=canvas_size(viewer))
        where = compute_on_setting()
        self.key = source_key(layer, state.index, threshold)
        self.source: Any = None  # set by the worker once made (before its programs are)
        self._token = token = _Token()
        self._layer = layer_ref = weakref.ref(layer)
        self._data = _ref(layer.data)  # the data it was made from: a layer's data replaced since is not served

        def work() -> None:
            from napari_gridmip._jobs.live_render import source_for_layer

            layer = layer_ref()
            if token.cancelled or layer is None:
                return
            source = source_for_layer(layer, state.index, threshold)
            if token.cancelled:
                return
            self.source = source
            with _placed(where):  # its programs compiled for where the renders run
                source.warm(state.display, cancel=lambda: token.cancelled, preload=False)
                source.preload_coarse(cancel=lambda: token.cancelled)

        self.task = workers().submit(work, lane="render", name="full resolution in 3D: early warm-up",
                                     on_errored=lambda error: None,  # the live view reports it
                                     group=("early warm-up", id(viewer)))  # fmt: skip

    def serves(self, layer: Any, threshold: float, index: tuple[int, ...] = ()) -> bool:
        """Whether its source is the one a live view of ``layer`` at ``index`` and ``threshold`` would make now:
        the same layer, data, placement and threshold, and not cancelled."""
        return (
            not self._token.cancelled and self._layer() is layer and self._data() is layer.data
            and self.key == source_key(layer, index, threshold)
        )  # fmt: skip

    def cancel(self) -> None:
        """Stop at the next check (a compile under way ends first)."""
        self._token.cancelled = True


def _placed(where: Any) -> Any:
    """The block of a render's work, in a worker: where napari's Preferences say (read on the GUI thread as it was
    asked for, :func:`~napari_gridmip._widgets.runner.compute_on_setting`), which the render follows
    (``core._backend.render_on_host``). A bad ``NAPARI_GRIDMIP_COMPUTE_ON`` fails the render, which says so."""
    if isinstance(where, Exception):
        raise where
    from napari_gridmip.core import compute_on

    return compute_on(where)


def _ref(value: Any) -> Any:
    """A weak reference to ``value`` where it takes one, else a strong one (a callable either way)."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: value


class LiveRender:
    """The live full-resolution view of one Image layer in one viewer.

    Parameters
    ----------
    viewer
        The napari viewer.
    layer
        The source Image layer (3D, or >3D followed through the dims sliders).
    threshold
        Voxels above it are occupied (the Occupancy mipmap widget's threshold).
    on_status
        Called on the GUI thread with a line saying what is happening.
    overlay
        The quad layer of a live view stopped for another source layer (:meth:`stop` with ``keep_overlay``): used
        again, so that a new source costs no napari layer removal and insert (each 0.3 to 0.6 s of the GUI thread
        with many layers open, in GUI soaks).
    ahead
        A :class:`WarmAhead` started before the switch: its source is used where it is of this layer and
        threshold.
    """

    def __init__(
        self, viewer: Any, layer: Any, *, threshold: float = 0.0, on_status: Any = None, overlay: Any = None,
        ahead: WarmAhead | None = None,
    ) -> None:  # fmt: skip
        from qtpy.QtCore import QTimer

        from napari_gridmip._widgets.runner import watch_viewer

        self._viewer = viewer
        watch_viewer(viewer)  # while the window is open: the live view stops quietly once it closes
        self._layer = weakref.ref(layer)
        self.threshold = float(threshold)
        self._on_status = on_status or (lambda text: None)
        if overlay is not None and overlay in viewer.layers and overlay.ndim != layer.ndim:
            # a quad for a source of another dimensionality: napari keeps a layer's dims, so it is not reused
            _remove_drawn_last(viewer, overlay)
        self.overlay: Any = overlay if overlay is not None and overlay in viewer.layers else None  # the quad layer
        if self.overlay is not None:
            self.overlay.name = f"{layer.name} full resolution"
            layers = viewer.layers
            if layers.index(self.overlay) < layers.index(layer):  # drawn after its source, as when it was added
                layers.move(layers.index(self.overlay), len(layers))
        self.worker: Any = None
        self._token: _Token | None = None
        # the source of the latest key (layer, dims index, threshold, placement, data generation): written by the
        # workers themselves, so that a render cancelled after making it leaves it to the next (a layer without
        # stored cells pays a pass over its data to make one)
        self._sources: dict[Any, Any] = {}
        self._generation = 0  # counts the layer's data changes (a source of older data is never used again)
        self._warm_token: _Token | None = None
        self._sources_lock = threading.Lock()  # a worker's check of the generation and its store, as one step
        self._ahead = ahead
        self._pending_state: Any = None  # the state of the render under way
        self._shown_state: Any = None  # the state of the picture on screen (final or not)
        self._final_state: Any = None
        # the last pictures the renders yielded (for tests and the status line): each holds canvas-sized arrays,
        # so a session of camera moves must not keep them all
        self.pictures: deque[Any] = deque(maxlen=PICTURES_KEPT)
        self.active = True
        self._timer = QTimer()
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self._render)
        self._connections = [
            *[(getattr(viewer.scene.camera.events, name), self._changed) for name in CAMERA_EVENTS],
            (viewer.dims.events.current_step, self._changed),
            (viewer.dims.events.ndisplay, self._changed),
            (viewer.canvas.events.size, self._changed),
            (viewer.layers.events.removed, self._removed),
            *[(getattr(layer.events, name), self._changed) for name in LAYER_EVENTS],
            *[(getattr(layer.events, name), self._data_changed) for name in DATA_EVENTS],
        ]
        self._prepare()
        for emitter, callback in self._connections:
            emitter.connect(callback)
        # once the switch's click is handled: started before napari's insert of the quad layer, the warm-up's
        # tracing (which holds the GIL) made that insert on the GUI thread twice as long (0.29 s to 0.64 s) for no
        # gain in the first view, and started within the click it lengthened the click's handling in GUI soaks
        QTimer.singleShot(0, self._warm)
        self._changed()

    @property
    def _source(self) -> Any:
        """The latest source made (None before the first render or warm-up, and after a data change)."""
        return next(iter(self._sources.values()), None)

    # -- events --------------------------------------------------------------------------------------------------
    def _changed(self, *_: Any) -> None:
        """Something the view depends on may have changed: hide the picture if it did, render after a rest."""
        if not self.active:
            return
        layer = self._layer()
        if layer is None:
            self.stop()
            return
        if self._viewer.dims.ndisplay != 3:
            self._hide()
            self._cancel()
            self._on_status("Full resolution in 3D: waiting for the 3D view")
            return
        from napari_gridmip._jobs.live_render import ViewState

        state = ViewState.of(self._viewer, layer, canvas=canvas_size(self._viewer))
        if state == self._final_state:
            self._show_overlay()  # nothing moved (an event from our own quad layer, or a jitter)
            return
        if state == self._pending_state and self.worker is not None:
            return  # the render under way is of this very state
        if state != self._shown_state:
            self._hide()
        self._cancel()
        self._timer.start()

    def _data_changed(self, *_: Any) -> None:
        """New data or placement: a new source (levels, cells, caches), and a new render."""
        self._drop_sources()
        self._final_state = None
        self._hide()
        self._cancel()
        self._changed()

    def _removed(self, event: Any) -> None:
        removed = event.value
        if removed is self._layer() or (self.overlay is not None and removed is self.overlay):
            if removed is self.overlay:
                self.overlay = None
            self.stop()

    # -- rendering -----------------------------------------------------------------------------------------------
    def _render(self) -> None:
        if not self.active:
            return
        layer = self._layer()
        if layer is None or self._viewer.dims.ndisplay != 3:
            return
        from napari_gridmip._jobs.live_render import ViewState, release_free_memory
        from napari_gridmip._widgets.runner import compute_on_setting
        from napari_gridmip._widgets.workers import workers

        state = ViewState.of(self._viewer, layer, canvas=canvas_size(self._viewer))
        if state == self._final_state:
            self._show_overlay()
            return
        self._cancel()
        self._pending_state = state
        token = self._token = _Token()
        source_of = self._source_of(layer, state.index)
        where = compute_on_setting()

        def work():
            try:
                with _placed(where):  # the generator runs, and is closed, in the worker's thread
                    source = source_of()
                    for picture in source.progressive(state, cancel=lambda: token.cancelled):
                        if token.cancelled:
                            return
                        yield state, picture
            finally:  # the render's temporaries are freed: their pages back to the system, not kept by malloc
                release_free_memory()

        self._on_status("Full resolution in 3D: rendering…")
        task = workers().submit(
            work, lane="render", name="full resolution in 3D",
            on_yielded=lambda item, token=token: self._on_yielded(item, token),
            on_errored=lambda error, token=token: self._on_errored(error, token),
            on_finished=lambda: self._on_finished(task), group=("live view", id(self._viewer)),
        )  # fmt: skip
        self.worker = task

    def _source_of(self, layer: Any, index: tuple[int, ...]) -> Any:
        """A function for a worker: the source of ``layer`` at ``index`` now, made there if it is new."""
        from napari_gridmip._jobs.live_render import source_for_layer

        key = (*source_key(layer, index, self.threshold), self._generation)
        threshold = self.threshold
        ahead = self._ahead
        if ahead is not None and (self._generation != 0 or not ahead.serves(layer, threshold, index)):
            ahead = None  # of other data, placement or threshold (a change this view saw, or one before it)

        def source_of() -> Any:
            source = self._sources.get(key)
            if source is None and ahead is not None:
                source = ahead.source  # None while the early warm-up still makes it
                if source is not None:
                    self._keep_source(key, source)
            if source is None:
                source = source_for_layer(layer, index, threshold)
                self._keep_source(key, source)
            return source

        return source_of

    def _keep_source(self, key: tuple, source: Any) -> None:
        """Keep ``source`` as the one of ``key`` (from a worker), unless the data changed or the view stopped."""
        with self._sources_lock:
            if key[-1] == self._generation:
                self._sources = {key: source}  # one at a time: each holds chunk caches

    def _warm(self) -> None:
        """Make the source and compile its render programs now, in the render lane, while napari adds the quad
        layer and the camera comes to rest: the first render then compiles nothing (1.6 s of the first view of a
        user's first session on 2 cores; docs/occupancy.md)."""
        from napari_gridmip._jobs.live_render import ViewState
        from napari_gridmip._widgets.runner import compute_on_setting, viewer_closed
        from napari_gridmip._widgets.workers import workers

        layer = self._layer()
        if not self.active or layer is None or viewer_closed(self._viewer) or self._viewer.dims.ndisplay != 3:
            return  # in 2D: the first render, in 3D, makes its source and programs
        state = ViewState.of(self._viewer, layer, canvas=canvas_size(self._viewer))
        token = self._warm_token = _Token()
        source_of = self._source_of(layer, state.index)
        where = compute_on_setting()

        def work() -> None:
            if token.cancelled:
                return
            source = source_of()
            if not token.cancelled:
                with _placed(where):  # its programs compiled for where the renders run
                    source.warm(state.display, cancel=lambda: token.cancelled)

        # a failure shows in the render that follows
        workers().submit(work, lane="render", name="full resolution in 3D: warm-up",
                         on_errored=lambda error: None, group=("live view", id(self._viewer)))  # fmt: skip

    def _on_yielded(self, item: Any, token: _Token) -> None:
        from napari_gridmip._widgets.runner import viewer_closed

        if token.cancelled or not self.active or viewer_closed(self._viewer):
            return
        state, picture = item
        self.pictures.append(picture)
        self._show(state, picture)
        what = "full resolution" if picture.final else f"coarse pass (level {picture.level})"
        self._on_status(
            f"Full resolution in 3D: {what}, {picture.rgba.shape[1]} x {picture.rgba.shape[0]} px in "
            f"{picture.seconds:.1f} s; {picture.chunks_used} of {picture.chunks_total} chunks used "
            f"({picture.chunks_read} read), {picture.samples / max(picture.samples_dense, 1):.1%} of a dense "
            "march's samples"
        )

    def _on_errored(self, error: Exception, token: _Token) -> None:
        from napari_gridmip.core.occupancy.raycast import RenderCancelled

        if isinstance(error, RenderCancelled) or token.cancelled:
            return
        from napari_gridmip._widgets.runner import notify_error

        notify_error(f"Full resolution in 3D: {error}")
        self._on_status(f"Full resolution in 3D failed: {error}")

    def _on_finished(self, worker: Any) -> None:
        if self.worker is worker:
            self.worker = None

    def _drop_sources(self) -> None:
        """Stop the warm-up and forget the sources; a source a worker still makes is not kept (new generation)."""
        self._cancel_warm()
        with self._sources_lock:
            self._generation += 1
            self._sources = {}

    def _cancel_warm(self) -> None:
        """The warm-up job stops at its next check (its source or programs would be of another state)."""
        if self._warm_token is not None:
            self._warm_token.cancelled = True

    def set_threshold(self, threshold: float) -> None:
        """A new occupancy threshold: new cells, a new render."""
        if float(threshold) != self.threshold:
            self._cancel_warm()
            self.threshold = float(threshold)
            self._final_state = None
            self._changed()

    def _cancel(self) -> None:
        self._pending_state = None
        if self._token is not None:
            self._token.cancelled = True
        if self.worker is not None:
            self.worker.cancel()
            self.worker = None

    # -- the quad ------------------------------------------------------------------------------------------------
    def _show(self, state: Any, picture: Any) -> None:
        if self._layer() is None:
            return
        self._place(picture.corners, picture.texture)
        self._shown_state = state
        if picture.final:
            self._final_state = state
        self._show_overlay()

    def _place(self, corners: np.ndarray, texture: np.ndarray) -> None:
        """The quad at ``corners`` (world, the 3 displayed axes) with ``texture``; added as a layer the first time."""
        layer = self._layer()
        if layer.ndim > 3:  # the quad sits at the dims point in the leading world axes
            lead = np.asarray(self._viewer.dims.point[-layer.ndim : -3])
            corners = np.concatenate([np.broadcast_to(lead, (4, len(lead))), corners], axis=1)
        if self.overlay is None or self.overlay not in self._viewer.layers:
            selection = set(self._viewer.layers.selection)
            active = self._viewer.layers.selection.active
            self.overlay = self._viewer.add_surface(
                (corners, FACES), texture=texture, texcoords=TEXCOORDS, vertex_colors=np.ones((4, 4)),
                shading="none", blending="translucent_no_depth", name=f"{layer.name} full resolution",
                metadata={"gridmip_live_render": True}, visible=False,
            )  # fmt: skip
            self._viewer.layers.selection.clear()
            self._viewer.layers.selection.update(selection)
            self._viewer.layers.selection.active = active
        else:
            # one upload: napari's Surface refreshes its visual (which uploads the texture) when the texture is set,
            # when the data is set and when it is made visible, but not while it is hidden; so the quad is hidden
            # (no refresh), changed, and shown again by the caller (one refresh, one upload)
            self.overlay.visible = False
            with self.overlay.events.texture.blocker():
                self.overlay.texture = texture
            self.overlay.data = (corners, FACES)

    def _prepare(self) -> None:
        """Add the quad layer now, hidden and blank: napari's creation of a layer (its controls, its visual; 0.6 s
        on this machine's software OpenGL) then happens on the click of the switch, not while pictures arrive."""
        from napari_gridmip._jobs.live_render import ViewState, canvas_corners

        state = ViewState.of(self._viewer, self._layer(), canvas=canvas_size(self._viewer))
        self._place(canvas_corners(state), np.zeros((1, 1, 4), np.uint8))

    def _show_overlay(self) -> None:
        if self.overlay is not None and self.overlay in self._viewer.layers and not self.overlay.visible:
            self.overlay.visible = True  # a refresh (one upload of the texture); none when it is shown already

    def _hide(self) -> None:
        self._shown_state = None
        self._final_state = None
        if self.overlay is not None and self.overlay in self._viewer.layers:
            self.overlay.visible = False

    # -- the end -------------------------------------------------------------------------------------------------
    def stop(self, *, keep_overlay: bool = False) -> Any:
        """Stop the worker, disconnect every event, remove the quad layer (or, with ``keep_overlay``, hide it and
        return it for the next live view), drop the caches and pictures and hand the freed pages back."""
        if not self.active:
            return None
        self.active = False
        self._timer.stop()
        self._cancel()
        for emitter, callback in self._connections:
            emitter.disconnect(callback)
        self._connections = []
        overlay, self.overlay = self.overlay, None
        self._drop_sources()
        self.pictures.clear()
        from napari_gridmip._jobs.live_render import release_free_memory

        release_free_memory()  # the pools and pictures dropped (a render under way trims again as it ends)
        from napari_gridmip._widgets.runner import viewer_closed

        if viewer_closed(self._viewer):
            # the window is gone and its layers go with it: removing or hiding the quad now would only ask napari
            # to update a canvas whose GL context Qt is tearing down
            return None
        if overlay is not None and overlay in self._viewer.layers:
            if keep_overlay:
                overlay.visible = False
                return overlay
            _remove_drawn_last(self._viewer, overlay)
        self._on_status("Full resolution in 3D: off")
        return None


def _remove_drawn_last(viewer: Any, quad: Any) -> None:
    """Remove the quad layer right after a frame that drew it last (blank, on top of the layer list).

    Mesa 22.3's llvmpipe (the software OpenGL of Debian 12) segfaults in a later frame once a layer that was not
    the last one drawn is deleted and the camera or the canvas size then changes: napari alone shows it (of two
    layers, deleting the lower one crashes the next frame of a moved camera; deleting the upper one does not). The
    quad is hidden whenever the camera moves and until its first picture, so switching the live view off deleted a
    layer that was not drawn last: a live view switched off, on again, its source layer closed and another opened
    crashed the process there; removed this way, it does not. Elsewhere this costs one frame.
    """
    with quad.events.texture.blocker():
        quad.texture = np.zeros((1, 1, 4), np.uint8)  # fully transparent: that frame shows the layers under it
    layers = viewer.layers
    if layers.index(quad) != len(layers) - 1:
        layers.move(layers.index(quad), len(layers))
    if quad.visible:
        quad.refresh()  # the blank texture uploaded (napari does not refresh on a blocked texture event)
    else:
        quad.visible = True  # a refresh
    _draw_canvases_now()
    layers.remove(quad)


def _draw_canvases_now() -> None:
    """Draw every shown OpenGL canvas now (Qt's synchronous repaint), not at a later turn of the event loop.

    Qt's own widgets, found from the top-level windows: napari's Qt canvas is not public API."""
    from qtpy.QtWidgets import QApplication, QWidget

    for window in QApplication.topLevelWidgets():
        if not window.isVisible():
            continue
        for child in window.findChildren(QWidget):
            if child.inherits("QOpenGLWidget") and child.isVisible():
                child.repaint()
