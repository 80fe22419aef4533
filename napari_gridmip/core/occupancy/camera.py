"""napari's 3D camera as rays: one per canvas pixel, orthographic or perspective, in a layer's voxel coordinates."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from napari_gridmip.core import validate

__all__ = ["camera_rays"]


class CameraRays(NamedTuple):
    """Rays in a layer's voxel index coordinates (voxel ``i`` covers ``[i, i + 1)``; napari's data coordinate
    ``x`` is index ``x + 0.5``).

    ``origins`` and ``directions``: float64 ``(rows, columns, 3)``; directions are unit vectors in index space,
    so ``t`` counts voxels along the ray. ``t_near``: where the rays start (0 for a perspective camera, at the
    eye; ``-inf`` for an orthographic one, whose rays are whole lines). ``world_per_t``: ``(rows, columns)``,
    world units per unit of ``t`` (an anisotropic scale makes it differ per ray). ``eye``: the perspective
    camera's position in world coordinates, or None.
    """

    origins: np.ndarray
    directions: np.ndarray
    t_near: float
    world_per_t: np.ndarray
    eye: np.ndarray | None


def _vector(name: str, value: Any, length: int = 3) -> np.ndarray:
    vector = np.asarray(validate.as_array(name, value), dtype=np.float64)
    if vector.shape != (length,) or not np.all(np.isfinite(vector)):
        raise ValueError(f"{name} must be {length} finite numbers (z, y, x); got {value!r}")
    return vector


def _unit(name: str, value: Any) -> np.ndarray:
    vector = _vector(name, value)
    norm = np.linalg.norm(vector)
    if norm == 0:
        raise ValueError(f"{name} must not be the zero vector")
    return vector / norm


def camera_rays(
    center: Any,
    view: Any,
    up: Any,
    canvas_size: Any,
    *,
    zoom: float,
    perspective: float = 0.0,
    handedness: str = "right",
    image_shape: Any = None,
    scale: Any = (1.0, 1.0, 1.0),
    translate: Any = (0.0, 0.0, 0.0),
) -> CameraRays:
    """The rays of napari's 3D camera through each pixel of an image covering the canvas.

    Parameters
    ----------
    center
        ``camera.center``: the world point at the canvas centre, ``(z, y, x)``.
    view, up
        ``camera.view_direction`` and ``camera.up_direction``, world ``(z, y, x)``; ``up`` is made
        perpendicular to ``view`` and must not be parallel to it.
    canvas_size
        ``viewer.canvas.size``: ``(height, width)`` in canvas pixels.
    zoom
        ``camera.zoom``: canvas pixels per world unit on the plane through ``center``.
    perspective
        ``camera.perspective``: the vertical field of view in degrees; 0 (default) is orthographic.
    handedness
        ``camera.handedness`` (``"right"`` for napari's default orientation, or ``"left"``): screen right
        is ``cross(view, up)`` for a right-handed orientation, ``cross(up, view)`` for a left-handed one.
    image_shape
        ``(rows, columns)`` of the rendered image covering the whole canvas (a coarser image has larger
        pixels); default the canvas size.
    scale, translate
        The layer's ``scale`` and ``translate`` over its three displayed axes (world = data * scale +
        translate); the rays come back in that layer's voxel index coordinates.

    Returns
    -------
    CameraRays
        ``origins``, ``directions`` (float64 ``(rows, columns, 3)``, index coordinates, unit directions),
        ``t_near`` (0 or ``-inf``), ``world_per_t`` (float64 ``(rows, columns)``) and ``eye``.

    Raises
    ------
    ValueError
        If a vector is not 3 finite numbers or is zero, ``up`` is parallel to ``view``, a size is not
        positive, ``zoom`` not positive, ``perspective`` outside ``[0, 180)``, a scale zero, or
        ``handedness`` neither ``"right"`` nor ``"left"``.

    Notes
    -----
    napari's model (``viewer.scene.camera``) holds the centre, the angles (as ``view_direction`` and
    ``up_direction``), the zoom and the perspective (the field of view in degrees, 0 for orthographic); vispy's
    ``ArcballCamera`` turns them into a projection (``vispy/scene/cameras/perspective.py``): the smaller canvas side
    spans ``min(h, w) / zoom`` world units on the plane through the centre, and a perspective camera sits
    ``(h / zoom) / (2 tan(fov / 2))`` before that plane along the view direction, so that the plane through the
    centre looks the same in both projections. A canvas pixel's centre is at ``(column + 0.5, row + 0.5)`` canvas
    pixels, the canvas centre at the camera's centre.

    Examples
    --------
    >>> from napari_gridmip import camera_rays
    >>> rays = camera_rays((8, 8, 8), (-1, 0, 0), (0, -1, 0), (2, 2), zoom=1.0)
    >>> rays.origins[0, 0].tolist(), rays.directions[0, 0].tolist()
    ([8.5, 8.0, 8.0], [-1.0, 0.0, 0.0])
    """
    center = _vector("center", center)
    view = _unit("view", view)
    up = _unit("up", up)
    up = up - np.dot(up, view) * view
    if np.linalg.norm(up) < 1e-9:
        raise ValueError("up must not be parallel to view (it gives the canvas's vertical direction)")
    up /= np.linalg.norm(up)
    handedness = validate.check_choice("handedness", str(handedness), ("right", "left"))
    right = np.cross(view, up) if handedness == "right" else np.cross(up, view)
    height, width = validate.int_tuple("canvas_size", canvas_size, 2)
    rows, columns = (height, width) if image_shape is None else validate.int_tuple("image_shape", image_shape, 2)
    zoom = validate.check_finite_scalar("zoom", zoom)
    if zoom <= 0:
        raise ValueError(f"zoom must be positive; got {zoom}")
    fov = validate.check_finite_scalar("perspective", perspective)
    if not 0 <= fov < 180:
        raise ValueError(f"perspective must be a field of view in [0, 180) degrees; got {fov}")
    scale, translate = _vector("scale", scale), _vector("translate", translate)
    if np.any(scale == 0):
        raise ValueError(f"scale must not have a zero component; got {tuple(scale)}")
    # pixel centres in canvas pixels from the canvas centre: x to the right, y down
    x = ((np.arange(columns) + 0.5) * (width / columns) - width / 2) / zoom
    y = ((np.arange(rows) + 0.5) * (height / rows) - height / 2) / zoom
    points = center + x[None, :, None] * right - y[:, None, None] * up  # world, on the plane through the centre
    if fov == 0:
        world_origins = points
        world_directions = np.broadcast_to(view, points.shape)
        t_near, eye = -np.inf, None
    else:
        distance = (height / zoom) / (2 * np.tan(np.radians(fov) / 2))
        eye = center - distance * view
        world_origins = np.broadcast_to(eye, points.shape)
        world_directions = points - eye
        world_directions = world_directions / np.linalg.norm(world_directions, axis=-1, keepdims=True)
        t_near = 0.0
    origins = (world_origins - translate) / scale + 0.5
    directions = world_directions / scale
    length = np.linalg.norm(directions, axis=-1)
    return CameraRays(origins, directions / length[..., None], t_near, 1.0 / length, eye)
