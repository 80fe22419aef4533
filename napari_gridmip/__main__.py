"""``napari-gridmip`` and ``python -m napari_gridmip``: see :mod:`napari_gridmip.cli`."""

from napari_gridmip.cli import PLUGIN, SAMPLE_KEYS, WIDGET_NAMES, main

__all__ = ["PLUGIN", "SAMPLE_KEYS", "WIDGET_NAMES", "main"]

if __name__ == "__main__":
    main()
