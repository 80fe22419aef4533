"""Images from patches: patch grids cut and merged back, any function run tile by tile (``tiled``), and (on
dask) the same block by block."""
