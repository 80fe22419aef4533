"""napari dock widgets: thin magicgui layers over :mod:`napari_gridmip.core`, one per job a user runs on layers.

Each widget maps its fields to a request, hands the Qt-free job made from it (:mod:`napari_gridmip._jobs`) to a
background runner and shows the result as layers. :mod:`.base`, :mod:`.runner` and :mod:`.workers` are the
package's internal API, which other packages of napari_gridmip may use (the samples' run ahead does); the widget
modules are reached through napari.yaml.
"""
