"""``napari-gridmip`` and ``python -m napari_gridmip``: see :mod:`napari_gridmip._cli`."""

from napari_gridmip._cli import PLUGIN, SAMPLE_KEYS, WIDGET_NAMES, main

__all__ = ["PLUGIN", "SAMPLE_KEYS", "WIDGET_NAMES", "main"]

if __name__ == "__main__":
    main()
