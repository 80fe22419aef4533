"""LayerChanges without Qt: a run's layers added to napari's ViewerModel, a re-run's put in place of the same
outputs (the user's own display choices kept), and undone."""

import subprocess
import sys

import numpy as np

from napari_gridmip._jobs.plan import KEY


def result_layers(run: int, *, inputs: str = "img"):
    from napari.layers import Image

    def provenance(role):
        return {"widget": "w", "role": role, "inputs": {"image": inputs}, "sources": [], "calls": [], "expression": ""}

    first = Image(np.full((4, 5), run, np.float32), name=f"a {run}", colormap="gray", metadata={KEY: provenance("a")})
    second = Image(np.zeros((4, 5)), name=f"b {run}", colormap="magma", metadata={KEY: provenance("b")})
    return [first, second]


def test_a_rerun_replaces_its_outputs_and_keeps_the_users_choices():
    from napari.components import ViewerModel

    from napari_gridmip._jobs.layer_changes import LayerChanges

    viewer = ViewerModel()
    viewer.add_image(np.zeros((4, 5)), name="other")
    shown = LayerChanges(viewer).apply(result_layers(1), replace=True)
    assert [layer.name for layer in viewer.layers] == ["other", "a 1", "b 1"]
    shown[0].colormap = "viridis"  # the user's choice
    changes = LayerChanges(viewer)
    again = changes.apply(result_layers(2), replace=True)
    assert [layer.name for layer in viewer.layers] == ["other", "a 1", "b 1"]  # the same layers, in place
    assert again[0] is shown[0] and float(again[0].data[0, 0]) == 2
    assert again[0].colormap.name == "viridis" and again[1].colormap.name == "magma"
    changes.undo()
    assert float(shown[0].data[0, 0]) == 1 and shown[0].colormap.name == "viridis"
    LayerChanges(viewer).apply(result_layers(3, inputs="another image"), replace=True)  # other inputs: new layers
    assert [layer.name for layer in viewer.layers] == ["other", "a 1", "b 1", "a 3", "b 3"]
    added = LayerChanges(viewer)
    added.apply(result_layers(4), replace=False)
    assert len(viewer.layers) == 7
    added.undo()
    assert len(viewer.layers) == 5


def test_layer_changes_load_no_qt():
    code = (
        "import sys\n"
        "from napari.components import ViewerModel\n"
        "from napari_gridmip._jobs.layer_changes import LayerChanges\n"
        "from tests.jobs.test_layer_changes import result_layers\n"
        "viewer = ViewerModel()\n"
        "LayerChanges(viewer).apply(result_layers(1), replace=True)\n"
        "LayerChanges(viewer).apply(result_layers(2), replace=True)\n"
        "assert len(viewer.layers) == 2\n"
        "loaded = [m for m in ('qtpy', 'PyQt5', 'PyQt6', 'PySide2', 'PySide6') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
