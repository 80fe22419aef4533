"""Reading volumes and stacks lazily, and writing the occupancy pyramid as OME-Zarr.

- :func:`read_array`: .npy (memory-mapped), .tif/.tiff (through tifffile's Zarr
  view) and Zarr (a plain array, or level 0 of an OME-Zarr image, found through
  ome-zarr's reader) as a dask array: nothing is loaded until computed.
- :func:`read_tiles`: a folder of TIFF tiles named by a pattern
  (``tile_{row}_{col}.tif``, ``img_{index:03}.tif``) as one lazy tile stack.
- :func:`write_mipmap`: the occupancy pyramid of a volume as an OME-Zarr
  multiscale image, written with ome-zarr-py (NGFF metadata from the library),
  block by block, under a temporary name and renamed into place when complete.
"""

from napari_gridmip.io._read import read_array
from napari_gridmip.io._tiles import read_tiles
from napari_gridmip.io._write import write_array, write_mipmap

__all__ = ["read_array", "read_tiles", "write_mipmap", "write_array"]
