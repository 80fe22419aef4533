"""``napari-gridmip``: napari with the plugin's widgets docked and a sample loaded."""

from __future__ import annotations

import argparse

PLUGIN = "napari-gridmip"
WIDGET_NAMES = ["Occupancy mipmap", "Reassemble patches", "Correlation map"]  # display names in napari.yaml
SAMPLE_KEYS = ["occupancy", "tiles", "speckle"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="napari-gridmip", description=__doc__)
    parser.add_argument(
        "--sample",
        choices=SAMPLE_KEYS,
        default="occupancy",
        help="which sample to open (default: %(default)s)",
    )
    parser.add_argument("--no-sample", action="store_true", help="open no sample")
    args = parser.parse_args(argv)

    import napari

    viewer = napari.Viewer(title="napari-gridmip")
    for widget_name in WIDGET_NAMES:
        viewer.window.add_plugin_dock_widget(PLUGIN, widget_name)
    if not args.no_sample:
        viewer.open_sample(PLUGIN, args.sample)
    napari.run()


if __name__ == "__main__":
    main()
