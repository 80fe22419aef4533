"""Images from patches and tiles: patch grids cut and merged back, mosaics registered and fused, and (on dask) merges
and fusions chunk by chunk."""
