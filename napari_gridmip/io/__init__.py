"""Reading volumes and stacks lazily, and writing the occupancy pyramid as OME-Zarr.

- :func:`read_array`: .npy (memory-mapped), .tif/.tiff (through tifffile's Zarr
  view) and Zarr (a plain array, or level 0 of an OME-Zarr image, found through
  ome-zarr's reader) as a dask array: nothing is loaded until computed.
- :func:`read_tiles`: a folder of TIFF tiles named by a pattern
  (``tile_{row}_{col}.tif``, ``img_{index:03}.tif``) as one lazy tile stack.
- :func:`read_mosaic`: a microscope mosaic with its stage positions in pixels (OME-TIFF series, an
  OME-Zarr collection, Fiji's TileConfiguration, or a folder pattern on a grid), lazily;
  :func:`write_tile_configuration` writes positions back in Fiji's format.
- :func:`write_ome_zarr`: an image (a fused mosaic) as OME-Zarr with its pixel size and origin.
- :func:`write_series_csv`: a DIC series (:func:`~napari_gridmip.correlate_series`) as one CSV per frame,
  DICe's columns.
- :func:`write_vtk_image`: fields on a 3D grid (a DVC's) as a VTK ImageData file (.vti) for ParaView, through
  pyevtk (the ``vtk`` extra).
- :func:`write_mipmap`: the occupancy pyramid of a volume as an OME-Zarr
  multiscale image, written with ome-zarr-py (NGFF metadata from the library),
  block by block, under a temporary name and renamed into place when complete.
"""

from napari_gridmip.io._dic_csv import write_series_csv
from napari_gridmip.io._mosaic import TileMosaic, read_mosaic, write_tile_configuration
from napari_gridmip.io._read import read_array
from napari_gridmip.io._tiles import read_tiles
from napari_gridmip.io._vtk import write_vtk_image
from napari_gridmip.io._write import write_array, write_mipmap, write_ome_zarr

__all__ = [
    "read_array",
    "read_tiles",
    "read_mosaic",
    "TileMosaic",
    "write_mipmap",
    "write_array",
    "write_ome_zarr",
    "write_tile_configuration",
    "write_series_csv",
    "write_vtk_image",
]
