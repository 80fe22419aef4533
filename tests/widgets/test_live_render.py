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
