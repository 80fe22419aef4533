"""Every result layer says how it was made, "Copy as Python" remakes it, and a re-run replaces it."""

import numpy as np
import pytest
from qtpy.QtWidgets import QApplication

from napari_gridmip._jobs.plan import KEY
from napari_gridmip._widgets.correlation_widget import CorrelationWidget
from napari_gridmip._widgets.mipmap_widget import MipmapWidget
from napari_gridmip._widgets.patches_widget import FLAT_STACK, PatchesWidget


def ours(viewer):
    return [layer for layer in viewer.layers if KEY in layer.metadata]


def run(widget, wait_idle):
    widget.run_button.native.click()
    wait_idle(widget)
    assert widget.status.value.startswith("Done"), widget.status.value


def copied_results(widget, viewer):
    """Click "Copy as Python", run the clipboard's text beside the viewer and return its ``results``."""
    widget.copy_button.native.click()
    text = QApplication.clipboard().text()
    assert "import napari_gridmip as gm" in text
    namespace = {}
    exec(compile(text, "<copied>", "exec"), namespace)  # the script finds the viewer as napari's current one
    return namespace["results"], text


def assert_reproduces(widget, viewer, expected_names):
    results, text = copied_results(widget, viewer)
    assert sorted(results) == sorted(expected_names), text
    for name, array in results.items():
        np.testing.assert_array_equal(np.asarray(array), np.asarray(viewer.layers[name].data), err_msg=name)


def mipmap_setup(viewer, widget):
    rng = np.random.default_rng(0)
    volume = np.zeros((3, 20, 18, 17), np.float32)  # a time series: the time point shown is used
    volume[1, 4:9, 3:7, 10:15] = rng.random((5, 4, 5))
    viewer.add_image(volume, name="vol")
    viewer.dims.set_current_step(0, 1)
    widget.threshold.value = 0.3
    widget.per_level.value = True
    return ["vol occupancy", *(f"vol mipmap level {k}" for k in range(6))]


def patches_setup(viewer, widget):
    image = np.random.default_rng(1).random((3, 40, 50)).astype(np.float32)
    from napari_gridmip import extract_patches

    grid = np.asarray(extract_patches(image, (16, 20), (12, 15)))
    viewer.add_image(grid.reshape(-1, *grid.shape[2:]), name="tiles")  # a flat stack of 12 patches
    widget.layout_choice.value = FLAT_STACK
    widget.grid_shape.value = f"{grid.shape[0]}, {grid.shape[1]}"
    widget.stride.value = "12, 15"
    widget.image_shape.value = "3, 40, 50"
    widget.blend.value = "gaussian"
    return ["tiles merged"]


def correlation_setup(viewer, widget):
    from napari_gridmip._sample_data import make_speckle_pair

    img1, img2, _ = make_speckle_pair(frames=6, shape=(48, 40))
    viewer.add_image(img1, name="sample")
    viewer.add_image(img2, name="reference")
    widget.img1.value, widget.img2.value = viewer.layers["sample"], viewer.layers["reference"]
    widget.window_rows.value = widget.window_cols.value = 7
    widget.subpixel.value = "refine"
    widget.full_map.value = True
    kinds = ("peak", "dx", "dy", "correlation map", "displacement")
    return [f"reference {kind}" for kind in kinds]


CASES = {"mipmap": (MipmapWidget, mipmap_setup), "patches": (PatchesWidget, patches_setup)}
CASES["correlation"] = (CorrelationWidget, correlation_setup)


@pytest.mark.parametrize("case", sorted(CASES))
def test_layers_carry_provenance_and_copy_as_python_remakes_them(case, docked, wait_idle):
    widget_class, setup = CASES[case]
    viewer, widget = docked(widget_class)
    assert not widget.copy_button.enabled  # nothing to reproduce yet
    names = setup(viewer, widget)
    run(widget, wait_idle)
    made = ours(viewer)
    assert sorted(layer.name for layer in made) == sorted(names)
    for layer in made:
        record = layer.metadata[KEY]
        assert record["widget"] == case and record["role"]
        assert record["calls"] and all(c["function"].startswith("napari_gridmip.") for c in record["calls"])
        assert record["calls"][0]["kwargs"] or record["calls"][0]["args"]  # the parameters
        assert set(record["inputs"].values()) <= {lyr.name for lyr in viewer.layers}
        assert record["napari_gridmip"] and record["jax"] and record["time"].startswith("20")
    assert widget.copy_button.enabled
    assert_reproduces(widget, viewer, names)


def test_copy_follows_the_level_shown(docked, wait_idle):
    viewer, widget = docked(MipmapWidget)
    mipmap_setup(viewer, widget)
    widget.per_level.value = False
    run(widget, wait_idle)
    widget.level.value = 3
    results, text = copied_results(widget, viewer)
    assert "levels[3]" in text and "viewer.layers['vol'].data[1]" in text  # the time point shown
    np.testing.assert_array_equal(np.asarray(results["vol occupancy"]), viewer.layers["vol occupancy"].data)


def test_re_runs_replace_their_layers_and_keep_the_users_choices(docked, wait_idle):
    viewer, widget = docked(CorrelationWidget)
    correlation_setup(viewer, widget)
    widget.full_map.value = False
    widget.subpixel.value = "hessian"
    run(widget, wait_idle)
    names = [layer.name for layer in viewer.layers]
    dy = viewer.layers["reference dy"]
    dy.colormap = "viridis"  # the user's choices
    viewer.layers["reference peak"].visible = True
    limits = dy.contrast_limits
    for _ in range(2):
        widget.window_rows.value = widget.window_cols.value = 9
        run(widget, wait_idle)
    assert [layer.name for layer in viewer.layers] == names  # same layers, same places
    assert viewer.layers["reference dy"] is dy and dy.colormap.name == "viridis"
    assert viewer.layers["reference peak"].visible
    assert dy.data.shape == (48 - 8, 40 - 8)  # the new window's result
    assert dy.metadata[KEY]["calls"][0]["args"] == [[9, 9]]
    assert dy.contrast_limits != limits  # the limits the widget chose follow the new data

    widget.keep_previous.value = True
    run(widget, wait_idle)
    assert len(viewer.layers) == len(names) + 4  # a new set beside the old one
    assert [lyr.name for lyr in ours(viewer)].count("reference dy") == 1  # napari names the new one "... [1]"


def test_only_our_layers_are_replaced_never_one_that_merely_has_the_name(docked, wait_idle):
    viewer, widget = docked(MipmapWidget)
    volume = np.zeros((8, 8, 8), np.float32)
    volume[2, 3, 4] = 1
    viewer.add_image(volume, name="vol")
    impostor = viewer.add_labels(np.zeros((4, 4, 4), np.uint8), name="vol occupancy")  # the user's own layer
    for _ in range(3):
        run(widget, wait_idle)
    made = ours(viewer)
    assert len(made) == 1 and made[0] is not impostor
    assert impostor in viewer.layers and not impostor.data.any()
    assert len(viewer.layers) == 3
