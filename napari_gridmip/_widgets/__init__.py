"""napari dock widgets: thin magicgui layers over :mod:`napari_gridmip.core`."""
