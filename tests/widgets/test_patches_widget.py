"""The Reassemble patches widget in a real viewer, driven through its buttons."""

import numpy as np
import pytest

from napari_gridmip._widgets.patches_widget import FLAT_STACK, PatchesWidget
from napari_gridmip.core.patches.grid import extract_patches


@pytest.fixture
def viewer_and_widget(docked):
    return docked(PatchesWidget)


def test_tiles_sample_is_taken_as_is(viewer_and_widget, wait_idle):
    from skimage import data

    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "tiles")
    tiles = viewer.layers["astronaut tiles"]
    before = np.array(tiles.data)
    assert widget.layer.value is tiles
    assert widget.stride.value == "100, 100" and widget.image_shape.value == "3, 512, 512"
    widget.blend.value = "gaussian"
    widget.run_button.native.click()
    assert not widget.run_button.enabled
    wait_idle(widget)
    merged = viewer.layers["astronaut tiles merged"]
    assert merged.rgb  # a colour picture: channels moved last, not a grey stack with a slider
    np.testing.assert_allclose(merged.data, data.astronaut(), rtol=1e-6)
    assert merged.contrast_limits == [0, 255]
    np.testing.assert_array_equal(tiles.data, before)
    # the view was reset to take in the merged image, four times the size of one tile
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera  # napari 0.9 moved it
    centre = np.asarray(camera.center)[-2:]
    np.testing.assert_allclose(centre, [255.5, 255.5], atol=1.0)


def test_flat_stack_with_grid_shape_and_inferred_image_shape(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    image = np.random.default_rng(0).random((2, 22, 31), dtype=np.float32)
    patches = np.asarray(extract_patches(image, (6, 7), (4, 6)))  # grid (5, 5): 22 = 4*4+6, 31 = 4*6+7
    flat = patches.reshape((-1,) + patches.shape[2:])
    layer = viewer.add_image(flat, name="flat", scale=(1, 1, 0.5, 2.0))
    widget.layout_choice.value = FLAT_STACK
    widget.grid_shape.value = "5, 5"
    widget.stride.value = "4, 6"
    widget.blend.value = "overwrite"
    widget.run_button.native.click()
    wait_idle(widget)
    merged = viewer.layers["flat merged"]
    np.testing.assert_array_equal(merged.data, image)
    np.testing.assert_allclose(merged.scale, [1, 0.5, 2.0])  # pixel axes keep the patches' spacing
    assert layer.data.shape == flat.shape


def test_bad_input_is_a_notification(viewer_and_widget, wait_idle, monkeypatch):
    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    viewer, widget = viewer_and_widget
    viewer.add_image(np.zeros((3, 3, 4, 4)), name="grid")
    widget.stride.value = "5, 4"  # larger than the patch
    widget.run_button.native.click()
    wait_idle(widget)
    assert "stride (5, 4) must not exceed patch_size (4, 4)" in shown[-1]
    widget.layout_choice.value = FLAT_STACK
    widget.grid_shape.value = "2, 2"
    widget.run_button.native.click()
    assert "needs 4 patches for grid (2, 2); got 3" in shown[-1]
    widget.stride.value = "a, b"
    widget.grid_shape.value = "3"
    widget.run_button.native.click()
    assert "grid shape must have 2 entries" in shown[-1]
    assert [layer.name for layer in viewer.layers] == ["grid"]
    assert widget.run_button.enabled
