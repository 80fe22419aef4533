"""Occupancy pyramids of 3D volumes and what they answer: the pyramid, and (on dask) its block-by-block twin."""
