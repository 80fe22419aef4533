"""Images from patches and tiles: patch grids cut and merged back, any function run tile by tile (``tiled``),
mosaics registered (``stitch``) and fused (``fuse``), and (on dask) the same block by block."""
