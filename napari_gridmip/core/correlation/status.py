"""Why a point of a DIC series has no value in a frame: a leaf (the CSV writer reads the names without the
kernels)."""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(enum.IntEnum):
    """Why a point of a series has no value in a frame (``ok``: it has one)."""

    ok = 0
    out_of_view = 1
    """Its subset, carried by its warp, leaves the frame (or its key frame)."""
    not_significant = 2
    """The match is not good enough: the warp did not converge, or its ZNCC is under ``min_zncc``, or its subset
    (clipped to the ROI) has too little texture for ``max_sigma``."""
    ambiguous = 3
    """It converged, but disagrees with its found neighbours by more than ``max_disagreement`` px: a second
    position matched as well."""
    no_guess = 4
    """There was nothing to start it from: lost in the previous frame, no neighbour found, and no whole-image
    motion."""
    outside_roi = 5
    """Its centre is outside the region of interest, or too little of its subset is inside."""
