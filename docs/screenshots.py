"""Make the README's screenshots from a real napari viewer (run under a virtual display on a headless machine).

    xvfb-run -a --server-args="-screen 0 1600x1000x24" python docs/screenshots.py

``--mipmap-tools`` makes only the mipmap widget's slider, crop and render pictures (mipmap_slider_3d,
mipmap_crop_3d, mipmap_render: napari's own 3D MIP, our render from the same camera, our depth image).
``--flat-field`` makes only the Stitch tiles widget's mosaics of vignetted camera tiles without and with
Flat-field correction (stitch_flat_field_before, stitch_flat_field_after, and stitch_flat_field: the two
canvases side by side) and prints how uneven each is. ``--microscope-file`` makes only the Stitch tiles widget's
picture of a mosaic stitched from an OME-TIFF, in micrometres (stitch_microscope_file).

For each widget: a 1400x900 window with the widget docked, its sample opened, Run
clicked, and the window grabbed once the result is in. The occupancy mipmap is
shown in 3D; the correlation once more with its full 4D map (offsets first), on
its own, at the offset nearest the median displacement; then in each of its modes on
its samples (DIC with strain, the speckle pair with transmission, dark-field and phase,
the calcium movie's correlation image, shown side by side in napari's grid), a
clicked pixel's correlation surface, and the DIC series mode on the rotation series (its time slider on frame 3);
the Digital volume correlation widget on the DVC pair in 3D, a grid point clicked (dvc_widget). Name pictures to
make only those (``python docs/screenshots.py dvc_widget``; ``--help`` lists them).
Prints each image's size and how much of the window's width the
canvas kept; each PNG must stay under 300 KB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).parent / "images"
# the widgets of this checkout, whichever napari-gridmip is installed (``python docs/screenshots.py`` puts docs/, not
# the checkout, on the path)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
WINDOW = (1400, 900)
MAX_BYTES = 300_000
FLAT_PHOTONS, FLAT_DARK = 2000.0, 100.0  # the flat-field shots' camera (bench_stitch.py's camera case)
# the pictures of a widget on its sample, in the order they are made (main's cases)
PICTURES = ("mipmap_3d", "mipmap_2d", "patches", "stitch", "tiled", "correlation", "correlation_map",
            "correlation_dic", "correlation_speckle", "correlation_calcium", "correlation_surface", "dic_series",
            "dvc_widget")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Make the README's and docs' screenshots from a real napari viewer, into docs/images/.",
        epilog="examples:\n  xvfb-run -a python docs/screenshots.py dvc_widget dic_series\n"
        "  xvfb-run -a python docs/screenshots.py --flat-field",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "pictures", nargs="*", metavar="NAME",
        help=f"only these pictures (default: all of them, then the three sets below): {', '.join(PICTURES)}",
    )  # fmt: skip
    parser.add_argument("--mipmap-tools", action="store_true", help="only the mipmap widget's slider, crop and render")
    parser.add_argument("--flat-field", action="store_true", help="only the Stitch tiles widget's flat-field pictures")
    parser.add_argument("--microscope-file", action="store_true", help="only the Stitch tiles widget on an OME-TIFF")
    args = parser.parse_args(argv)
    unknown = [name for name in args.pictures if name not in PICTURES]
    if unknown:
        parser.error(f"no picture named {', '.join(map(repr, unknown))}; the pictures: {', '.join(PICTURES)}")
    return args


def wait_for(app, widget, timeout_s: float = 300.0) -> None:
    import time

    start = time.perf_counter()
    while widget.runner.busy:
        app.processEvents()
        time.sleep(0.02)
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError(f"{type(widget).__name__} did not finish in {timeout_s} s")
    for _ in range(20):
        app.processEvents()


def shoot(viewer, name: str, colors: int = 256) -> None:
    """Grab the window; a PNG over ``MAX_BYTES`` is saved again with a palette of ``colors``."""
    from napari._qt.dialogs.qt_notification import NapariQtNotification
    from PIL import Image

    window = viewer.window._qt_window
    for toast in window.findChildren(NapariQtNotification):  # e.g. a deprecation notice of the Qt backend
        toast.close()
    image = viewer.screenshot(canvas_only=False, flash=False)
    canvas = viewer.window._qt_viewer.canvas.native.width()
    path = OUT / f"{name}.png"
    picture = Image.fromarray(np.asarray(image)[..., :3])
    picture.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:  # a palette keeps text and colours sharp at a third of the size
        picture.quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path.name}: {path.stat().st_size / 1000:.0f} KB, canvas {canvas} of {window.width()} px wide")
    if path.stat().st_size > MAX_BYTES:
        sys.exit(f"{path} is over {MAX_BYTES} bytes")


def show_map_at_median_offset(viewer) -> None:
    """Only the 4D map (and the input under it), its offset sliders at the median displacement."""
    (full,) = [layer for layer in viewer.layers if layer.name.endswith("correlation map")]
    (dy,) = [layer for layer in viewer.layers if layer.name.endswith(" dy")]
    (dx,) = [layer for layer in viewer.layers if layer.name.endswith(" dx")]
    for layer in viewer.layers:
        layer.visible = layer is full
    offsets = (np.nanmedian(dy.data), np.nanmedian(dx.data))
    # the map is (wm, wn, 1, M', N'): its offsets are the first two axes, in pixels from -m and -n
    for axis, offset in zip((0, 1), offsets):
        viewer.dims.set_point(axis, float(np.round(offset)))


def canvas_picture(viewer, app) -> np.ndarray:
    for _ in range(20):
        app.processEvents()
    return np.asarray(viewer.screenshot(canvas_only=True, flash=False))[..., :3]


def save_picture(picture: np.ndarray, name: str) -> None:
    from PIL import Image

    path = OUT / f"{name}.png"
    image = Image.fromarray(picture)
    image.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path.name}: {path.stat().st_size / 1000:.0f} KB, {picture.shape[1]} x {picture.shape[0]} px")
    if path.stat().st_size > MAX_BYTES:
        sys.exit(f"{path} is over {MAX_BYTES} bytes")


def mipmap_tools(app) -> None:
    """The mipmap widget's threshold slider (moved), Crop to occupied, and the full-resolution render beside
    napari's own 3D view of the same camera."""
    import napari

    from napari_gridmip._widgets.mipmap_widget import MipmapWidget

    viewer = napari.Viewer(title="napari-gridmip", show=True)
    viewer.window._qt_window.resize(*WINDOW)
    widget = MipmapWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Occupancy mipmap")
    viewer.open_sample("napari-gridmip", "occupancy")
    (volume,) = [layer for layer in viewer.layers]
    widget.run_button.native.click()
    wait_for(app, widget)
    widget.threshold_slider.value = 0.55  # as a drag sets it: the dimmer specks and the helix drop out
    viewer.dims.ndisplay = 3
    viewer.reset_view()
    viewer.camera.angles = (-20, 30, 145)
    viewer.camera.zoom *= 0.75
    for _ in range(20):
        app.processEvents()
    shoot(viewer, "mipmap_slider_3d")

    # Crop to occupied: a sparse scan (a piece of the sample placed off-centre, anisotropic voxels)
    from napari_gridmip._sample_data import make_occupancy_volume

    scan = np.zeros((80, 160, 200), np.float32)
    scan[20:60, 70:130, 110:180] = make_occupancy_volume()[40:80, 20:80, 20:90]
    scan_layer = viewer.add_image(scan, name="scan", scale=(2.0, 1.0, 1.0), colormap="gray", opacity=0.4)
    for layer in viewer.layers:
        layer.visible = layer is scan_layer
    scan_layer.bounding_box.visible = True
    widget.layer.value = scan_layer
    widget.run_button.native.click()
    wait_for(app, widget)
    widget.threshold.value = 0.3
    widget.crop_button.native.click()
    wait_for(app, widget)
    crop = viewer.layers["scan crop"]
    crop.colormap, crop.bounding_box.visible = "magma", True
    viewer.layers["scan occupancy"].visible = False
    viewer.dims.ndisplay = 3
    viewer.reset_view()
    viewer.camera.angles = (-20, 30, 145)
    for _ in range(20):
        app.processEvents()
    shoot(viewer, "mipmap_crop_3d")
    for name in ("scan crop", "scan occupancy", "scan"):
        viewer.layers.remove(name)
    volume.visible = True
    widget.layer.value = volume
    widget.run_button.native.click()
    wait_for(app, widget)

    # the render: napari's own MIP of the volume from an oblique camera, then ours from the same camera
    viewer.dims.ndisplay = 3
    volume.rendering, volume.colormap = "mip", "inferno"
    viewer.camera.angles = (-25, 35, 150)
    native = canvas_picture(viewer, app)
    pictures = []
    for mode in ("MIP", "depth (first hit)"):
        state = viewer.camera.model_dump() if hasattr(viewer.camera, "model_dump") else viewer.camera.dict()
        widget.render_mode.value = mode
        widget.render_button.native.click()
        wait_for(app, widget)
        viewer.camera.update(state)
        for _ in range(20):
            app.processEvents()
    print(widget.view_info.value)
    for layer in viewer.layers:
        layer.visible = False
    viewer.dims.ndisplay = 2
    for mode in ("MIP", "depth"):
        layer = viewer.layers[f"{volume.name} render ({mode})"]
        layer.visible = True
        viewer.reset_view()
        pictures.append(canvas_picture(viewer, app))
        layer.visible = False
    height = min(p.shape[0] for p in (native, *pictures))
    gap = np.full((height, 8, 3), 255, np.uint8)
    panels = [native[:height], gap, pictures[0][:height], gap, pictures[1][:height]]
    save_picture(np.concatenate(panels, axis=1)[:, :, :], "mipmap_render")
    viewer.close()


def flat_field_shots(app) -> None:
    """The Stitch tiles widget on camera-like tiles (cos^4 vignetting off-centre, shot noise, uint16), run without
    and with Flat-field correction: the two mosaics in grey at the same contrast limits, one window each and the
    two canvases side by side, and how uneven each is (the mosaic over the true picture, the blank corner)."""
    import napari
    from PIL import Image
    from scipy import ndimage

    from napari_gridmip._sample_data.mosaic import make_mosaic, microscope_tiles
    from napari_gridmip._widgets.stitch_widget import MOSAIC_KEY, StitchWidget

    grid, tile, overlap, photons, dark = (3, 4), (192, 192), 0.1, FLAT_PHOTONS, FLAT_DARK
    sample = make_mosaic(grid_shape=grid, tile_shape=tile, overlap=overlap, noise=0.0, blank_corner=True)
    tiles = microscope_tiles(sample, photons=photons, dark=dark)
    viewer = napari.Viewer(title="napari-gridmip", show=True)
    viewer.window._qt_window.resize(*WINDOW)
    widget = StitchWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Stitch tiles")
    stage = {"grid_shape": grid, "overlap": overlap, "stage_positions": sample.stage_positions}
    viewer.add_image(tiles, name="camera tiles", colormap="gray", metadata={MOSAIC_KEY: stage})
    widget.layer.value = viewer.layers["camera tiles"]
    widget.keep_previous.value = True  # the second run adds its mosaic beside the first
    mosaics = []
    for flat, label in ((False, "as recorded"), (True, "flat-field corrected")):
        widget.flat_field.value = flat
        widget.run_button.native.click()
        wait_for(app, widget)
        (mosaic,) = [layer for layer in viewer.layers if layer.name.startswith("camera tiles mosaic")]  # this run's
        mosaic.name = f"mosaic, {label}"
        mosaics.append(mosaic)
    # the positions the widget found (the outlines' first corners) against the truth: one common translation
    outlines = next(layer for layer in viewer.layers if layer.name.endswith("tile placement"))
    found = np.array([corners[0] for corners in outlines.data])
    shift = np.median((sample.true_positions - found)[:-1], axis=0)  # the last tile is blank (from the stage)
    corrected = np.asarray(mosaics[1].data, np.float64)
    limits = (dark, float(np.percentile(corrected, 99.5)))  # from the camera's offset: the background is grey
    print(f"flat field: {photons:g} photo-electrons at the maximum, dark offset {dark:g}; limits {np.round(limits)}")
    for mosaic in mosaics:
        image = np.asarray(mosaic.data, np.float64)
        coords = np.indices(image.shape, dtype=np.float64) + (np.asarray(mosaic.translate) + shift)[:, None, None]
        expected = photons * (0.05 + ndimage.map_coordinates(sample.image, coords, order=1)) + dark
        # the shading: the mosaic over what an evenly lit camera records, the shot noise smoothed out
        ratio = (ndimage.gaussian_filter(image, 4) / ndimage.gaussian_filter(expected, 4))[24:-24, 24:-24]
        corner = np.round(sample.true_positions[-1] - shift - np.asarray(mosaic.translate)).astype(int)
        blank = image[corner[0] + 16 : corner[0] + tile[0] - 16, corner[1] + 16 : corner[1] + tile[1] - 16]
        smooth = ndimage.gaussian_filter(blank, 6)[12:-12, 12:-12]  # the shading, the shot noise averaged out
        print(
            f"  {mosaic.name}: shading (mosaic / even light) CV {ratio.std() / ratio.mean():.3f}, "
            f"blank corner CV {blank.std() / blank.mean():.3f} (smoothed {smooth.std() / smooth.mean():.3f})"
        )
    for mosaic, flat, name in zip(mosaics, (False, True), ("stitch_flat_field_before", "stitch_flat_field_after")):
        for layer in viewer.layers:
            layer.visible = layer is mosaic
        mosaic.colormap, mosaic.contrast_limits = "gray", tuple(limits)
        viewer.layers.selection.active = mosaic
        widget.flat_field.value = flat  # the checkbox as it was for this mosaic's run
        viewer.reset_view()
        for _ in range(20):
            app.processEvents()
        shoot(viewer, name, colors=48)  # grey specimen noise: a smaller palette keeps it under MAX_BYTES
    # the two canvases side by side (before | after), cropped to the mosaic, to judge them at a glance
    pictures = []
    for mosaic in mosaics:
        for layer in viewer.layers:
            layer.visible = layer is mosaic
        viewer.reset_view()
        pictures.append(canvas_picture(viewer, app))
    rows, cols = np.nonzero(np.any(pictures[0] > 0, axis=2) | np.any(pictures[1] > 0, axis=2))
    box = (slice(rows.min(), rows.max() + 1), slice(cols.min(), cols.max() + 1))
    gap = np.full((rows.max() + 1 - rows.min(), 8, 3), 255, np.uint8)
    pair = Image.fromarray(np.concatenate([pictures[0][box], gap, pictures[1][box]], axis=1))
    # 920 px wide (the width a README shows anyway; the canvases' size depends on the docks): the shot noise is
    # what fills the bytes, the shading is broad
    scale = min(1.0, 920 / pair.width)
    pair = pair.resize((round(pair.width * scale), round(pair.height * scale)), Image.Resampling.LANCZOS)
    save_picture(np.asarray(pair), "stitch_flat_field")
    viewer.close()


def microscope_file_shot(app) -> None:
    """The Stitch tiles widget on a microscope file: the mosaic sample's tiles written as an OME-TIFF (one series a
    tile, each placed by its stage position in micrometres, 0.65 um pixels), stitched from the file; the mosaic
    and its tile outlines in micrometres, napari's scale bar on, Export... ready."""
    import tempfile

    import napari
    import tifffile

    from napari_gridmip._sample_data.mosaic import make_mosaic
    from napari_gridmip._widgets.stitch_widget import FROM_FILE, StitchWidget

    pixel = 0.65
    sample = make_mosaic(blank_corner=True)
    path = Path(tempfile.mkdtemp()) / "slide_scan.ome.tif"
    with tifffile.TiffWriter(path, ome=True) as tif:
        for k, (tile, (y, x)) in enumerate(zip(sample.tiles, sample.stage_positions)):
            metadata = {"axes": "YX", "Name": f"field {k}", "PhysicalSizeX": pixel, "PhysicalSizeY": pixel,
                        "Plane": {"PositionX": [x * pixel], "PositionY": [y * pixel]}}  # fmt: skip
            tif.write((tile * 60000).clip(0, 65535).astype(np.uint16), metadata=metadata)
    viewer = napari.Viewer(title="napari-gridmip", show=True)
    viewer.window._qt_window.resize(*WINDOW)
    widget = StitchWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Stitch tiles")
    widget.source.value = FROM_FILE
    widget.microscope_file.value = str(path)
    widget.run_button.native.click()
    wait_for(app, widget)
    viewer.layers["slide_scan pairs"].visible = False  # the mosaic and the outlines: what a first look needs
    mosaic = viewer.layers["slide_scan mosaic"]
    mosaic.colormap = "gray"
    mosaic.contrast_limits = tuple(np.percentile(mosaic.data, (1, 99.7)))  # the sparse bright texture, visible
    viewer.scale_bar.visible = True
    viewer.scale_bar.font_size = 14
    viewer.layers.selection.active = viewer.layers["slide_scan mosaic"]
    viewer.reset_view()
    for _ in range(20):
        app.processEvents()
    shoot(viewer, "stitch_microscope_file", colors=64)  # grey texture: a smaller palette keeps it under MAX_BYTES
    viewer.close()


def only_layers(*suffixes: str):
    """Hide every layer but those whose names end with one of ``suffixes`` (overlaid, no grid)."""

    def prepare(viewer, widget, app) -> None:
        for layer in viewer.layers:
            layer.visible = layer.name.endswith(suffixes)

    return prepare


def side_by_side(*suffixes: str):
    """Show only the layers whose names end with ``suffixes``, side by side in napari's grid (in that order)."""

    def prepare(viewer, widget, app) -> None:
        chosen = [next(layer for layer in viewer.layers if layer.name.endswith(s)) for s in suffixes]
        for layer in viewer.layers:
            layer.visible = layer in chosen
        for layer in chosen:  # the grid fills from the bottom layer: the first chosen ends lowest
            viewer.layers.move(viewer.layers.index(layer), len(viewer.layers))
        grid = viewer.canvas.grid if hasattr(viewer, "canvas") else viewer.grid
        grid.enabled = True
        grid.shape = (1, len(chosen)) if len(chosen) <= 3 else (2, (len(chosen) + 1) // 2)

    return prepare


def click_a_pixel(viewer, widget, app) -> None:
    """Click a result pixel (as the pan/zoom tool does): its correlation surface appears beside the data."""
    (dy,) = [layer for layer in viewer.layers if layer.name.endswith(" dy")]
    rows, cols = dy.data.shape
    widget.surface_at(dy.data_to_world((rows // 3, (2 * cols) // 3)))
    wait_for(app, widget)
    for layer in viewer.layers:
        layer.visible = layer.name.endswith((" dy", "surface", "surface peak", "clicked pixel", "(img1)"))
    viewer.layers.selection.active = dy


def at_frame(t: int):
    """The time slider on frame ``t`` (60 degrees into the rotation series: each arrow's head on its point there),
    the dy layer's controls shown."""

    def prepare(viewer, widget, app) -> None:
        viewer.dims.set_current_step(0, t)
        viewer.layers.selection.active = next(layer for layer in viewer.layers if layer.name.endswith(" dy"))

    return prepare


def dvc_clicked_point(viewer, widget, app) -> None:
    """The DVC result in 3D: the arrows (coloured by magnitude) and the lost points over the reference volume, the
    arrows' layer selected and a grid point clicked (its values in the widget)."""
    arrows = next(layer for layer in viewer.layers if layer.name.endswith(" displacement"))
    for layer in viewer.layers:
        layer.visible = layer is arrows or layer.name.endswith(" status") or layer.name == "DVC reference"
    viewer.layers.selection.active = arrows
    dz = next(layer for layer in viewer.layers if layer.name.endswith(" dz"))
    centre = tuple(n // 2 for n in dz.data.shape)
    widget.show_point(dz.data_to_world(centre))


def main() -> None:
    args = parse_args()  # before napari: --help and a misspelt name answer at once
    import os
    import tempfile

    import napari
    from qtpy.QtWidgets import QApplication

    from napari_gridmip._widgets.correlation_widget import CorrelationWidget
    from napari_gridmip._widgets.mipmap_widget import MipmapWidget
    from napari_gridmip._widgets.patches_widget import PatchesWidget
    from napari_gridmip._widgets.stitch_widget import StitchWidget
    from napari_gridmip._widgets.tiled_widget import TiledWidget
    from napari_gridmip._widgets.volume_widget import VolumeWidget

    os.environ.setdefault("NAPARI_GRIDMIP_CONFIG_DIR", tempfile.mkdtemp())  # leave the user's settings alone
    OUT.mkdir(exist_ok=True)
    app = QApplication.instance() or QApplication([])
    window = {"window_rows": 15, "window_cols": 15}
    if args.mipmap_tools:  # only the mipmap widget's tools
        mipmap_tools(app)
        return
    if args.flat_field:  # only the Stitch tiles widget without and with flat-field correction
        flat_field_shots(app)
        return
    if args.microscope_file:  # only the Stitch tiles widget on an OME-TIFF, in micrometres
        microscope_file_shot(app)
        return
    cases = [
        ("mipmap_3d", MipmapWidget, "Occupancy mipmap", "occupancy", {}, 3),
        ("mipmap_2d", MipmapWidget, "Occupancy mipmap", "occupancy", {}, 2),
        ("patches", PatchesWidget, "Reassemble patches", "tiles", {"blend": "gaussian"}, 2),
        ("stitch", StitchWidget, "Stitch tiles", "mosaic", {}, 2),
        ("tiled", TiledWidget, "Process in tiles", "occupancy", {"filter": "white_tophat"}, 3),
        ("correlation", CorrelationWidget, "Correlation map", "speckle", window, 2),
        ("correlation_map", CorrelationWidget, "Correlation map", "speckle", {**window, "full_map": True}, 2),
        ("correlation_dic", CorrelationWidget, "Correlation map", "dic", {}, 2),
        ("correlation_speckle", CorrelationWidget, "Correlation map", "speckle-contrast", {}, 2),
        ("correlation_calcium", CorrelationWidget, "Correlation map", "calcium", {}, 2),
        ("correlation_surface", CorrelationWidget, "Correlation map", "dic", {}, 2),
        ("dic_series", CorrelationWidget, "Correlation map", "dic-series", {}, 2),
        ("dvc_widget", VolumeWidget, "Digital volume correlation", "dvc", {}, 3),
    ]
    prepare = {
        "stitch": only_layers("mosaic", "tile placement", "pairs"),
        "tiled": only_layers("white_tophat", "white top-hat", "tiled"),
        "correlation_dic": side_by_side("(img2)", " dy", " exx", " exy"),
        "correlation_speckle": side_by_side("speckle sample", " transmission", " dark-field", " phase"),
        "correlation_calcium": side_by_side("calcium movie", "correlation image"),
        "correlation_surface": click_a_pixel,
        "dic_series": at_frame(3),
        "dvc_widget": dvc_clicked_point,
    }
    assert tuple(case[0] for case in cases) == PICTURES
    # a rotated cube's outline is up to sqrt(3) times its side: zoomed out further than the occupancy volume (which
    # fills less of its box), so that no corner is cut; a 3D speckle volume needs a smaller palette to stay small
    zoom, colors = {"dvc_widget": 0.5}, {"dvc_widget": 64}
    only = set(args.pictures)  # e.g. `python docs/screenshots.py correlation_dic`: those only
    for name, widget_class, title, sample, fields, ndisplay in cases:
        if only and name not in only:
            continue
        viewer = napari.Viewer(title="napari-gridmip", show=True)
        viewer.window._qt_window.resize(*WINDOW)
        widget = widget_class(viewer)
        viewer.window.add_dock_widget(widget, name=title)  # the display name napari.yaml gives it
        viewer.open_sample("napari-gridmip", sample)
        for field, value in fields.items():
            getattr(widget, field).value = value
        widget.run_button.native.click()
        wait_for(app, widget)
        viewer.dims.ndisplay = ndisplay
        if name == "correlation_map":
            show_map_at_median_offset(viewer)
        if name in prepare:
            prepare[name](viewer, widget, app)
        viewer.reset_view()
        if ndisplay == 3:
            camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera
            camera.angles = (-20, 30, 145)
            camera.zoom *= zoom.get(name, 0.75)
        for _ in range(20):
            app.processEvents()
        shoot(viewer, name, colors.get(name, 256))
        viewer.close()
    if not only:  # named pictures only: the others stay as they are
        mipmap_tools(app)
        flat_field_shots(app)
        microscope_file_shot(app)


if __name__ == "__main__":
    main()
