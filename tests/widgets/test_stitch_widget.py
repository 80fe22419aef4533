"""The Stitch tiles widget in a real viewer, driven through its buttons."""

import numpy as np
import pytest
from qtpy.QtWidgets import QApplication

from napari_gridmip._jobs.plan import KEY
from napari_gridmip._widgets.stitch_widget import FROM_FOLDER, StitchWidget


@pytest.fixture
def viewer_and_widget(docked):
    return docked(StitchWidget)


def test_mosaic_sample_end_to_end(viewer_and_widget, wait_idle):
    viewer, widget = viewer_and_widget
    viewer.open_sample("napari-gridmip", "mosaic")
    tiles = viewer.layers["mosaic tiles"]
    truth = tiles.metadata["gridmip_mosaic"]
    assert widget.layer.value is tiles
    assert widget.grid_shape.value == ", ".join(map(str, truth["grid_shape"]))  # read from the sample
    assert "metadata" in widget.stage_note.value  # its stage positions are used
    before = np.array(tiles.data)
    widget.run_button.native.click()
    assert not widget.run_button.enabled
    wait_idle(widget, timeout=600_000)
    assert widget.status.value.startswith("Done"), widget.status.value

    mosaic = viewer.layers["mosaic tiles mosaic"]
    outlines = viewer.layers["mosaic tiles tile placement"]
    pairs = viewer.layers["mosaic tiles pairs"]
    registration_positions = np.array([shape[0] for shape in outlines.data])  # each rectangle's first corner
    true = np.asarray(truth["true_positions"], float)
    error = (registration_positions - registration_positions[0]) - (true - true[0])
    placed = ~np.isin(
        np.arange(len(true)), [int(t) for t, lbl in enumerate(outlines.features["label"]) if "stage" in lbl]
    )
    assert np.sqrt(np.mean(error[placed] ** 2)) < 0.2  # registered tiles land on the truth
    assert "pairs used" in widget.summary.value and "median residual" in widget.summary.value
    # each tile's label (its number and confidence) is shown once the run is done (a turn after its layer)
    assert outlines.text.visible and list(outlines.text.values) == list(outlines.features["label"])
    assert "placed from the stage" in widget.summary.value
    # the blank corner's pairs are rejected and drawn as such
    reasons = list(pairs.features["reason"])
    assert any(r != "accepted" for r in reasons) and "accepted" in reasons
    rejected = [i for i, r in enumerate(reasons) if r != "accepted"]
    # how each used pair's sub-pixel shift was found rides along
    refinements = list(pairs.features["refinement"])
    assert all(refinements[i] in ("refined", "peak-fit") for i, r in enumerate(reasons) if r == "accepted")
    assert all(np.allclose(pairs.edge_color[i][:3], (1.0, 0.25, 0.25)) for i in rejected)
    # the mosaic sits where the tiles are, in one frame with the outlines
    names = [layer.name for layer in viewer.layers]
    assert names.index(mosaic.name) < names.index(outlines.name) < names.index(pairs.name)
    assert mosaic.data.ndim == 2 and mosaic.data.shape[0] > tiles.data.shape[1]
    np.testing.assert_array_equal(tiles.data, before)
    for layer in (mosaic, outlines, pairs):
        functions = [call["function"] for call in layer.metadata[KEY]["calls"]]
        assert functions[-2:] == ["napari_gridmip.register_tiles", "napari_gridmip.fuse_tiles"]

    widget.copy_button.native.click()
    namespace = {}
    exec(QApplication.clipboard().text(), namespace)
    np.testing.assert_allclose(namespace["results"][mosaic.name], mosaic.data, atol=1e-6)
    np.testing.assert_allclose(np.asarray(namespace["results"][outlines.name]), np.asarray(outlines.data), atol=1e-9)
    # the pairs are (start, step) segments between tile centres: a Vectors layer, quicker to show than Shapes
    assert type(pairs).__name__ == "Vectors" and pairs.vector_style == "line"
    np.testing.assert_allclose(namespace["results"][pairs.name], pairs.data, atol=1e-9)
    ends = pairs.data[:, 0] + pairs.data[:, 1]
    centres = registration_positions + np.asarray(tiles.data.shape[-2:]) / 2
    gaps = [np.min(np.linalg.norm(centres - end, axis=1)) for end in [*pairs.data[:, 0], *ends]]
    assert max(gaps) < 1e-3, gaps  # each starts and ends at a tile centre (the outlines are kept in float32)


def test_folder_of_tiles_and_bad_input(viewer_and_widget, wait_idle, tmp_path, monkeypatch):
    import tifffile

    from napari_gridmip._sample_data.mosaic import make_mosaic

    shown = []
    monkeypatch.setattr("napari.utils.notifications.show_error", shown.append)
    viewer, widget = viewer_and_widget
    sample = make_mosaic(grid_shape=(2, 2), tile_shape=(96, 96), overlap=0.25, stage_error=0)
    for t, (row, col) in enumerate(np.ndindex(2, 2)):
        tifffile.imwrite(tmp_path / f"tile_{row}_{col}.tif", np.asarray(sample.tiles[t]))
    widget.source.value = FROM_FOLDER
    widget.folder.value = str(tmp_path)
    widget.pattern.value = "tile_{row}_{col}.tif"
    widget.overlap.value = 0.25
    widget.max_shift.value = 4
    widget.run_button.native.click()
    wait_idle(widget, timeout=600_000)
    assert widget.status.value.startswith("Done"), widget.status.value
    assert "pairs used" in widget.summary.value and "0 tiles placed from the stage" in widget.summary.value
    mosaic = [layer for layer in viewer.layers if layer.name.endswith("mosaic")]
    assert len(mosaic) == 1 and mosaic[0].name == f"{tmp_path.name} mosaic"
    # sub-pixel origins: the fused extent may round up by a pixel at each end
    assert all(0 <= n - (2 * 96 - 24) <= 2 for n in mosaic[0].data.shape), mosaic[0].data.shape

    widget.pattern.value = "img_{index:03}.tif"
    widget.run_button.native.click()
    assert "no file" in shown[-1].lower() or "match" in shown[-1].lower()


def test_flat_field_checkbox_evens_out_vignetted_tiles(viewer_and_widget, wait_idle):
    from napari_gridmip._sample_data.mosaic import make_mosaic, microscope_tiles

    viewer, widget = viewer_and_widget
    sample = make_mosaic(grid_shape=(3, 3), tile_shape=(96, 128), overlap=0.15, stage_error=0, noise=0.0, seed=41)
    tiles = microscope_tiles(sample, photons=20000, dark=0, vignetting=0.9, seed=41)
    metadata = {"gridmip_mosaic": {"grid_shape": (3, 3), "overlap": 0.15, "stage_positions": sample.true_positions}}
    viewer.add_image(tiles, name="vignetted", metadata=metadata)
    widget.layer.value = viewer.layers["vignetted"]
    widget.max_shift.value = 4
    ratios = {}
    for flat in (False, True):
        widget.flat_field.value = flat
        widget.run_button.native.click()
        wait_idle(widget, timeout=600_000)
        assert widget.status.value.startswith("Done"), widget.status.value
        layer = viewer.layers["vignetted mosaic"]
        fuse = layer.metadata[KEY]["calls"][-1]
        assert fuse["function"] == "napari_gridmip.fuse_tiles"
        assert ("flat_field" in str(fuse)) == flat
        image = np.asarray(layer.data, float)[20:-20, 20:-20]
        ratios[flat] = float(image.std() / image.mean())
        viewer.layers.remove(layer)
        for name in ("vignetted tile placement", "vignetted pairs"):
            viewer.layers.remove(viewer.layers[name])
    # the vignetting's periodic dimming adds to the picture's own variation; corrected, only the picture's is left
    assert ratios[True] < ratios[False] - 0.05, ratios


def test_text_labels_are_shown_a_turn_after_their_layer(make_napari_viewer):
    from napari.layers import Points

    from napari_gridmip._jobs.layer_changes import LayerChanges
    from napari_gridmip._widgets.runner import _text_after_insert

    viewer = make_napari_viewer()
    labelled = Points(np.zeros((2, 2)), features={"name": ["a", "b"]}, text="{name}", name="labelled")
    quiet = Points(
        np.ones((2, 2)), features={"name": ["c", "d"]}, text={"string": "{name}", "visible": False}, name="quiet"
    )
    plain = Points(np.ones((1, 2)), name="plain")
    steps = _text_after_insert(LayerChanges(viewer).apply_stepwise([labelled, quiet, plain], replace=False),
                               [labelled, quiet, plain])  # fmt: skip
    seen = []
    try:
        while True:
            next(steps)
            seen.append(([layer.name for layer in viewer.layers], labelled.text.visible))
    except StopIteration as done:
        added = done.value
    assert added == [labelled, quiet, plain]
    # inserted one per turn with the labels hidden; the labels come after the last insert
    assert seen == [(["labelled"], False), (["labelled", "quiet"], False), (["labelled", "quiet", "plain"], False)]
    assert labelled.text.visible and not quiet.text.visible  # a layer's own hidden text stays hidden


def test_text_labels_come_back_when_an_insert_fails(make_napari_viewer):
    from napari.layers import Points

    from napari_gridmip._widgets.runner import _text_after_insert

    def failing():
        yield
        raise RuntimeError("the viewer refused")

    labelled = Points(np.zeros((2, 2)), features={"name": ["a", "b"]}, text="{name}")
    steps = _text_after_insert(failing(), [labelled])
    next(steps)
    assert not labelled.text.visible
    with pytest.raises(RuntimeError, match="refused"):
        next(steps)
    assert labelled.text.visible


def test_the_first_result_of_a_process_is_shown_after_a_full_collection_of_its_own(monkeypatch):
    import gc

    from napari_gridmip._widgets import runner

    order = []
    monkeypatch.setattr(runner, "_COLLECTED", {"done": False})
    monkeypatch.setattr(gc, "collect", lambda *a: order.append("collect") or 0)

    def inserts():
        order.append("insert 1")
        yield
        order.append("insert 2")
        return ["a", "b"]

    for expected in (["collect", "turn", "insert 1", "turn", "insert 2"], ["insert 1", "turn", "insert 2"]):
        order.clear()
        steps = runner._collect_first(inserts())
        try:
            while True:
                next(steps)
                order.append("turn")
        except StopIteration as done:
            assert done.value == ["a", "b"]
        assert order == expected  # a turn between the collection and napari's first insert; later results: none
