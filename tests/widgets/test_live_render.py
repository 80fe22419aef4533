"""Full resolution in 3D: the camera mapping against napari's own, and the live switch in a real viewer."""

import numpy as np
import pytest

from napari_gridmip import camera_rays


def _canvas_position(viewer, layer, world_point):
    """Where napari's vispy canvas draws a world point of ``layer`` (x, y canvas pixels)."""
    qt_viewer = viewer.window._qt_viewer
    visual = qt_viewer.canvas.layer_to_visual[layer]
    data = layer.world_to_data(world_point)
    mapped = visual.node.get_transform("visual", "canvas").map(np.asarray(data)[::-1])
    return mapped[:2] / mapped[3]


@pytest.mark.parametrize("perspective", [0.0, 35.0])
def test_camera_rays_pass_through_the_points_napari_draws(make_napari_viewer, qtbot, perspective):
    viewer = make_napari_viewer()
    scale, translate = np.array([2.0, 0.7, 1.1]), np.array([5.0, -3.0, 8.0])
    viewer.add_image(np.zeros((20, 30, 40), np.uint8), scale=scale, translate=translate)
    world = np.array([[10.0, 4.0, 20.0], [30.0, 12.0, 40.0], [22.0, -1.0, 15.0], [40.0, 18.0, 45.0]])
    points = viewer.add_points(world, scale=scale, translate=translate, size=1)
    points.data = (world - translate) / scale  # data coordinates of the same world points
    viewer.dims.ndisplay = 3
    camera = viewer.scene.camera
    camera.angles = (17.0, -31.0, 64.0)
    camera.center = (24.0, 7.0, 30.0)
    camera.zoom = 6.0
    camera.perspective = perspective
    qtbot.wait(50)
    viewer.window._qt_viewer.canvas._scene_canvas.native.update()
    qtbot.wait(50)
    height, width = viewer.canvas.size
    rays = camera_rays(
        camera.center, camera.view_direction, camera.up_direction, (height, width), zoom=camera.zoom,
        perspective=camera.perspective, handedness=str(camera.handedness), scale=scale, translate=translate,
    )  # fmt: skip
    for point in world:
        x, y = _canvas_position(viewer, points, point)
        assert 0 <= x < width and 0 <= y < height
        # the ray of the canvas pixel napari draws the point in passes within that pixel's footprint of it
        row, column = int(y), int(x)
        index = (point - translate) / scale + 0.5  # the layer's voxel index coordinates
        o, d = rays.origins[row, column], rays.directions[row, column]
        along = np.dot(index - o, d)
        miss_world = np.linalg.norm((o + along * d - index) * scale)
        footprint = 1 / camera.zoom
        if perspective:
            footprint *= (along * rays.world_per_t[row, column]) / np.linalg.norm(np.subtract(camera.center, rays.eye))
        assert miss_world <= 0.75 * footprint, (point, (x, y), miss_world, footprint)
        # and the neighbouring pixels' rays pass further away: the pixel is the right one, not just near
        for dr, dc in ((0, 2), (2, 0), (0, -2), (-2, 0)):
            o2, d2 = rays.origins[row + dr, column + dc], rays.directions[row + dr, column + dc]
            far = np.linalg.norm((o2 + np.dot(index - o2, d2) * d2 - index) * scale)
            assert far > miss_world


# -- the switch in a real viewer ----------------------------------------------------------------------------------

from napari_gridmip._widgets.live_render import PICTURES_KEPT  # noqa: E402
from napari_gridmip._widgets.mipmap_widget import MipmapWidget  # noqa: E402
from tests.core.occupancy.test_raycast import sparse_volume  # noqa: E402


def _final(widget, qtbot, count=1, timeout=60_000):
    """Wait for the live view's ``count``-th full-resolution picture since the last reset of its list."""
    qtbot.waitUntil(lambda: sum(p.final for p in widget._live.pictures) >= count, timeout=timeout)
    qtbot.waitUntil(lambda: widget._live.worker is None, timeout=timeout)
    return [p for p in widget._live.pictures if p.final][-1]


def _connected(emitter, live):
    return any(getattr(ref, "__self__", None) is live or (isinstance(ref, tuple) and ref[0]() is live)
               for ref in emitter.callbacks)  # fmt: skip


@pytest.fixture
def shown(docked):
    """``shown()`` -> ``(viewer, widget)``: a shown viewer (a hidden one's vispy view keeps a stale size) with the
    Occupancy mipmap widget docked; its live view is stopped at the end (``docked`` releases the widget)."""
    return lambda: docked(MipmapWidget, show=True)


@pytest.fixture
def live_viewer(shown, qtbot):
    viewer, widget = shown()
    layer = viewer.add_image(sparse_volume(), scale=(2.0, 0.7, 1.0), colormap="magma", contrast_limits=(0, 1200))
    viewer.dims.ndisplay = 3
    camera = viewer.scene.camera
    camera.angles = (12.0, -28.0, 61.0)
    camera.zoom = 9.0
    widget.layer.value = layer
    return viewer, widget, layer


def test_the_switch_shows_full_resolution_in_the_3d_canvas(live_viewer, qtbot):
    viewer, widget, layer = live_viewer
    assert widget.live_3d.text == "Full resolution in 3D"
    widget.live_3d.native.click()
    live = widget._live
    assert live is not None
    picture = _final(widget, qtbot)
    overlay = live.overlay
    assert overlay in viewer.layers and overlay.visible and overlay.blending == "translucent_no_depth"
    assert viewer.layers.selection.active is not overlay  # the user's selection is kept
    from napari_gridmip._widgets.live_render import canvas_size

    height, width = canvas_size(viewer)
    assert picture.rgba.shape == (height, width, 4)
    # what the canvas shows is our picture, pixel for pixel (aligned with the volume)
    shot = viewer.screenshot(canvas_only=True, flash=False)[..., :3].astype(int)
    ours = np.round(picture.rgba[..., :3] * 255).astype(int)
    assert np.mean(np.abs(shot - ours).max(axis=-1) > 8) < 0.01
    # the picture is the core render of the same camera, colourised as the layer
    from napari_gridmip import colorize_view, render_view
    from napari_gridmip._jobs.live_render import occupancy_cells

    camera, state = viewer.scene.camera, live._final_state  # the camera as the render read it (rounded to 1e-9)
    np.testing.assert_allclose(state.center, camera.center[-3:], atol=1e-6)
    np.testing.assert_allclose(state.view, camera.view_direction, atol=1e-6)
    rays = camera_rays(state.center, state.view, state.up, (height, width), zoom=state.zoom, scale=layer.scale,
                       translate=layer.translate, handedness=state.handedness)  # fmt: skip
    step = state.display.step  # napari's sample spacing (0.8 voxels)
    values = render_view(layer.data, occupancy_cells(layer.data, 0.0), rays.origins, rays.directions, step=step).values
    expected = colorize_view(values, colormap=layer.colormap, contrast_limits=layer.contrast_limits)
    np.testing.assert_allclose(picture.rgba, expected, atol=1e-6)
    # the coarse pass came first
    assert not live.pictures[0].final and live.pictures[0].rgba.shape[0] < height
    assert len(live.pictures) <= live.pictures.maxlen == PICTURES_KEPT  # a session of moves keeps only the last


def test_each_picture_is_uploaded_once(live_viewer, qtbot, monkeypatch):
    from vispy.visuals.filters.mesh import TextureFilter

    uploads = []
    texture = TextureFilter.texture  # napari's surface visual sets its filter's texture: one upload to the GPU

    def counted(self, value):
        uploads.append(value.shape)
        texture.fset(self, value)

    monkeypatch.setattr(TextureFilter, "texture", property(texture.fget, counted))
    viewer, widget, layer = live_viewer
    widget.live_3d.native.click()
    _final(widget, qtbot)
    live = widget._live
    shown = []
    show = live._show
    monkeypatch.setattr(live, "_show", lambda state, picture: (shown.append(picture), show(state, picture)))
    uploads.clear()
    viewer.scene.camera.angles = (40.0, 10.0, 20.0)  # hides the picture; the coarse one, then the final one
    live.pictures.clear()
    _final(widget, qtbot)
    assert [p.final for p in shown] == [False, True]
    assert uploads == [p.texture.shape for p in shown]  # one upload each, the final one over the coarse one shown


@pytest.mark.slow  # five renders; the switch test above keeps the default run covered
def test_it_follows_the_camera_and_the_layer_display(live_viewer, qtbot):
    viewer, widget, layer = live_viewer
    widget.live_3d.native.click()
    live = widget._live
    first = _final(widget, qtbot)
    camera = viewer.scene.camera
    camera.angles = (40.0, 10.0, 20.0)  # the camera moves: napari's own view shows at once
    assert not live.overlay.visible
    live.pictures.clear()
    second = _final(widget, qtbot)
    assert live.overlay.visible
    assert not np.allclose(second.corners, first.corners)  # the quad faces the new camera
    # perspective
    camera.perspective = 30.0
    live.pictures.clear()
    _final(widget, qtbot)
    # the layer's rendering mode and colour settings
    layer.rendering = "minip"
    live.pictures.clear()
    minip = _final(widget, qtbot)
    assert live._final_state.display.mode == "minip"
    layer.rendering = "iso"
    layer.iso_threshold = 450
    live.pictures.clear()
    iso = _final(widget, qtbot)
    assert live._final_state.display.iso_threshold == 450
    from napari_gridmip._widgets.live_render import canvas_size

    # under PyQt5 napari's iso threshold control makes the window, and so the canvas, 16 px taller: each picture is
    # the canvas's size at its render, and pictures of two sizes differ anyway
    assert iso.rgba.shape[:2] == canvas_size(viewer)
    if iso.rgba.shape == minip.rgba.shape:
        assert not np.allclose(iso.rgba, minip.rgba)
    layer.data = sparse_volume(seed=2)  # new data: a new source and picture
    live.pictures.clear()
    swapped = _final(widget, qtbot)
    assert not np.allclose(swapped.values[np.isfinite(swapped.values)], iso.values[np.isfinite(swapped.values)])
    layer.colormap = "gray"
    live.pictures.clear()
    gray = _final(widget, qtbot)
    opaque = gray.rgba[..., 3] > 0
    np.testing.assert_allclose(gray.rgba[opaque][:, 0], gray.rgba[opaque][:, 1], atol=1e-6)  # gray: r == g


def test_off_layer_closed_and_widget_closed_stop_everything(live_viewer, qtbot):
    viewer, widget, layer = live_viewer
    camera = viewer.scene.camera
    widget.live_3d.native.click()
    live = widget._live
    qtbot.waitUntil(lambda: live.worker is not None or bool(live.pictures), timeout=30_000)
    assert _connected(camera.events.zoom, live) and _connected(layer.events.contrast_limits, live)
    widget.live_3d.native.click()  # off, maybe mid-render
    assert widget._live is None and not live.active and live.worker is None
    assert not _connected(camera.events.zoom, live) and not _connected(layer.events.contrast_limits, live)
    assert not _connected(viewer.dims.events.current_step, live)
    assert not any(lyr.metadata.get("gridmip_live_render") for lyr in viewer.layers)
    # on again, then the source layer is closed
    widget.live_3d.native.click()
    live = widget._live
    _final(widget, qtbot)
    viewer.layers.remove(layer)
    assert not live.active and live.worker is None
    assert not _connected(camera.events.zoom, live)
    assert not any(lyr.metadata.get("gridmip_live_render") for lyr in viewer.layers)
    # on again with a new layer, then the widget is closed
    other = viewer.add_image(sparse_volume(seed=1))
    widget.layer.value = other
    if not widget.live_3d.value:
        widget.live_3d.native.click()
    live = widget._live
    assert live is not None and live.active
    qtbot.waitUntil(lambda: live.worker is not None or bool(live.pictures), timeout=30_000)
    # the widget closed (its Close event)
    widget.native.close()
    assert widget.released
    assert not live.active and live.worker is None and not _connected(camera.events.zoom, live)


def test_switched_off_after_a_frame_without_the_quad_the_canvas_still_draws(live_viewer, qtbot):
    """The quad is hidden while the camera moves; a frame then draws the volume last, and the switch turned off
    deletes the quad layer. On Mesa 22.3's llvmpipe (Debian 12) deleting a layer that was not the last one drawn
    made the next frame of a moved camera segfault (this test's process crashed: its failure), unless the quad is
    drawn last before its deletion, as the live view does."""
    from napari_gridmip._widgets.live_render import _draw_canvases_now

    viewer, widget, layer = live_viewer
    widget.live_3d.native.click()
    _final(widget, qtbot)
    live = widget._live
    assert live.overlay.visible
    _draw_canvases_now()
    viewer.scene.camera.zoom *= 1.2
    assert not live.overlay.visible  # hidden until the camera rests
    _draw_canvases_now()  # a frame without the quad: the volume drawn last
    widget.live_3d.native.click()  # off
    assert list(viewer.layers) == [layer]
    viewer.scene.camera.zoom *= 1.2
    _draw_canvases_now()
    _, _, width, height = viewer.window.geometry()
    viewer.window.resize(width + 80, height + 60)
    _draw_canvases_now()
    shot = viewer.screenshot(canvas_only=True, flash=False)
    assert shot[..., :3].max() > 0  # the volume, drawn


def test_each_render_and_the_switch_off_hand_the_freed_pages_back(live_viewer, qtbot, monkeypatch):
    from napari_gridmip._jobs import live_render as jobs

    trims = []
    release = jobs.release_free_memory
    monkeypatch.setattr(jobs, "release_free_memory", lambda: (trims.append(1), release()))
    viewer, widget, layer = live_viewer
    widget.live_3d.native.click()
    _final(widget, qtbot)
    live = widget._live
    assert trims  # the render's worker, as it ended
    trims.clear()
    widget.live_3d.native.click()  # off: the pools and the pictures dropped
    assert trims and not live.pictures and live._source is None


@pytest.mark.slow
def test_a_4d_layer_follows_the_dims_slider(shown, qtbot):
    viewer, widget = shown()
    movie = np.stack([sparse_volume(seed=s) for s in (0, 1)])
    layer = viewer.add_image(movie, contrast_limits=(0, 1200))
    viewer.dims.ndisplay = 3
    viewer.scene.camera.zoom = 9.0
    widget.layer.value = layer
    widget.live_3d.native.click()
    first = _final(widget, qtbot)
    assert widget._live._final_state.index == (0,)
    viewer.dims.set_current_step(0, 1)
    widget._live.pictures.clear()
    second = _final(widget, qtbot)
    assert widget._live._final_state.index == (1,)
    assert not np.allclose(first.rgba, second.rgba)
    assert widget._live.overlay.ndim == 4


def test_renders_of_one_source_take_turns_on_its_cache(live_viewer, qtbot, monkeypatch):
    """A cancelled render stops only between its calls: a newer one on the same source waits for it rather than
    load into (or lay out) the chunk cache it still reads (two at once could give two chunks one brick)."""
    import threading
    import time

    from napari_gridmip.core.occupancy import raycast

    viewer, widget, layer = live_viewer
    widget.live_3d.native.click()
    _final(widget, qtbot)
    live = widget._live
    source, state = live._source, live._final_state
    inside, most = [0], [0]
    render_view = raycast.render_view

    def watched(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.05)  # long enough for the other thread to arrive
        try:
            return render_view(*args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(raycast, "render_view", watched)
    pictures = []
    threads = [
        threading.Thread(target=lambda: pictures.append(source.render(state, level=0, image_shape=(16, 16))))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(pictures) == 2 and most[0] == 1
    np.testing.assert_array_equal(pictures[0].values, pictures[1].values)


def test_the_switch_warms_up_one_source_that_the_renders_then_use(live_viewer, qtbot, monkeypatch):
    """Turned on, the live view makes its source and compiles the render's programs in the render lane while the
    camera rests; the renders use that source, and one cancelled by a camera move leaves it to the next (a layer
    without stored cells pays a pass over its data for each source made)."""
    from napari_gridmip._jobs import live_render as jobs

    made, warmed = [], []
    source_for_layer, warm = jobs.source_for_layer, jobs.LiveSource.warm
    monkeypatch.setattr(jobs, "source_for_layer", lambda *a, **k: made.append(1) or source_for_layer(*a, **k))
    monkeypatch.setattr(jobs.LiveSource, "warm", lambda self, *a, **k: warmed.append(self) or warm(self, *a, **k))
    viewer, widget, layer = live_viewer
    widget.live_3d.native.click()
    live = widget._live
    qtbot.waitUntil(lambda: live.worker is not None, timeout=30_000)  # the first render, submitted
    viewer.scene.camera.zoom *= 1.3  # cancels it
    _final(widget, qtbot)
    assert warmed and warmed[0] is live._source
    assert len(made) == 1
    coarse = live._source.coarse_level  # None: one level, whose coarse pass renders level 0 at fewer pixels
    assert {key[2] for key in live._source._warmed} == ({0} if coarse is None else {0, coarse})


def test_a_new_source_layer_keeps_the_quad_layer(live_viewer, qtbot):
    """Choosing another volume re-targets the live view without removing and adding napari layers (each 0.3 to
    0.6 s of the GUI thread with many layers open): the same quad, renamed, shows the new source's render."""
    viewer, widget, layer = live_viewer
    widget.live_3d.native.click()
    _final(widget, qtbot)
    overlay = widget._live.overlay
    count = len(viewer.layers)
    other = viewer.add_image(sparse_volume()[::-1], scale=layer.scale, name="other volume")
    widget.layer.value = other
    assert widget._live.overlay is overlay and overlay in viewer.layers
    assert overlay.name == "other volume full resolution"
    assert len(viewer.layers) == count + 1  # the new volume only
    # above its new source (napari draws the list bottom up): the picture covers the volume's own render
    assert viewer.layers.index(overlay) > viewer.layers.index(other)
    _final(widget, qtbot)
    assert overlay.visible
    # a 4D source: a quad of its own dimensionality replaces the 3D one
    series = viewer.add_image(np.stack([sparse_volume()] * 2), scale=(1.0, *layer.scale), name="time series")
    widget.layer.value = series
    assert overlay not in viewer.layers and widget._live.overlay.ndim == 4
    _final(widget, qtbot)
    widget.live_3d.native.click()  # off: the quad goes
    assert widget._live is None
    assert not [lay for lay in viewer.layers if lay.name.endswith("full resolution")]


def test_closing_the_viewer_with_the_live_view_on_touches_none_of_its_layers(live_viewer, qtbot, monkeypatch):
    """napari's window goes before Qt deletes the docks: the live view then stops without removing anything from
    the closed viewer (napari's close has cleared its layers already; a removal from a closed canvas would be
    drawn by no one)."""
    viewer, widget, layer = live_viewer
    widget.live_3d.native.click()
    _final(widget, qtbot)
    live = widget._live
    removed = []
    monkeypatch.setattr(type(viewer.layers), "remove", lambda self, item: removed.append(item))
    viewer.close()
    widget.release()  # what the dock's deletion does, later
    qtbot.wait(100)
    assert not live.active and removed == []


def _layer_with_stored_cells(viewer, volume=None):
    """A two-level layer whose occupancy cells are stored with it, as this plugin's reader and sample give them:
    by default small bright cubes in every 64^3 chunk of both levels."""
    from napari_gridmip._jobs.live_render import CELL, occupancy_cells

    if volume is None:
        volume = np.zeros((140, 136, 132), np.uint16)
        for corner in np.ndindex(3, 3, 3):
            z, y, x = (np.array(corner) * 60 + 10).tolist()
            volume[z : z + 4, y : y + 4, x : x + 4] = 1000
    stored = {"cells": occupancy_cells(volume, 0.0), "cell": CELL, "threshold": 0.0}
    return viewer.add_image([volume, volume[::2, ::2, ::2]], multiscale=True, contrast_limits=(0, 1200),
                            metadata={"gridmip_cells": stored})  # fmt: skip


def test_a_layer_with_stored_cells_is_warmed_up_before_the_switch(shown, qtbot, monkeypatch):
    """Chosen with the switch off, a layer whose cells are stored gets its source made, its render programs
    compiled and its coarse pass's chunks read in the background; the switch then uses that source (its coarse
    pass reads no chunk), and reads level 0's chunks only once it is on. Turned off, the live view frees that
    source and nothing is warmed up again for the same layer; a threshold other than the stored cells', or
    early starts switched off, start nothing; closing the widget stops it."""
    from napari_gridmip._jobs import live_render as jobs

    made = []
    source_for_layer = jobs.source_for_layer
    monkeypatch.setattr(jobs, "source_for_layer", lambda *a, **k: made.append(1) or source_for_layer(*a, **k))
    viewer, widget = shown()
    layer = _layer_with_stored_cells(viewer)
    widget.layer.value = layer
    qtbot.waitUntil(lambda: widget._ahead is not None and widget._ahead.task.done, timeout=60_000)
    source = widget._ahead.source
    coarse = source.coarse_level
    assert coarse == 1 and {key[2] for key in source._warmed} == {0, coarse}
    occupied = source.caches[coarse].occupied()
    assert len(occupied) == 8 and sorted(source.caches[coarse].blocks) == sorted(occupied)  # read ahead
    assert source.preloading is None and len(source.caches[0].blocks) < 8  # level 0's wait for the switch
    viewer.dims.ndisplay = 3
    viewer.scene.camera.angles = (12.0, -28.0, 61.0)
    widget.live_3d.native.click()
    _final(widget, qtbot)
    live = widget._live
    assert live._source is source and made == [1] and source.preloading is not None
    assert live.pictures[0].level == coarse and live.pictures[0].chunks_read == 0
    widget.live_3d.native.click()  # off: the source is freed with the live view, and not made again
    qtbot.wait(600)
    assert widget._ahead is None and made == [1]
    widget.threshold.value = 5.0  # not the stored cells' threshold: a source would need a pass over the data
    qtbot.wait(600)
    assert widget._ahead is None
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")
    other = _layer_with_stored_cells(viewer)
    widget.threshold.value = 0.0
    widget.layer.value = other
    qtbot.wait(1000)
    assert widget._ahead is None
    monkeypatch.delenv("NAPARI_GRIDMIP_PREFETCH")
    widget.threshold.value = 1.0
    widget.threshold.value = 0.0
    qtbot.waitUntil(lambda: widget._ahead is not None, timeout=10_000)
    ahead = widget._ahead
    widget.release()
    assert ahead._token.cancelled and widget._ahead is None
    qtbot.waitUntil(lambda: ahead.task.done, timeout=60_000)


def test_a_warm_up_of_data_replaced_since_is_not_used(shown, qtbot):
    """The layer's data replaced after its early warm-up (no event of the widget's follows that): the switch makes
    a source of the new data rather than render the old."""
    viewer, widget = shown()
    layer = _layer_with_stored_cells(viewer)
    widget.layer.value = layer
    qtbot.waitUntil(lambda: widget._ahead is not None and widget._ahead.task.done, timeout=60_000)
    early = widget._ahead.source
    layer.data = [level * 0 for level in layer.data]  # all empty now (the stored cells are the old ones')
    viewer.dims.ndisplay = 3
    widget.live_3d.native.click()
    _final(widget, qtbot)
    assert widget._live._source is not early
    assert widget._live._source.levels[0] is layer.data[0]
