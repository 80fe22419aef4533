"""Images from patches: patch grids cut and merged back, and (on dask) the merge chunk by chunk."""
