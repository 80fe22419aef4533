"""A calcium-imaging-like movie with known cells, generated from code (deterministic seed): the sample for the local
correlation image.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from napari_gridmip._sample_data._cache import on_disk

CALCIUM_SHAPE = (128, 128)
CALCIUM_FRAMES = 400
CALCIUM_CELLS = 36
FRAME_RATE = 10.0  # Hz, for the spike rate and the calcium kernel's time constants


class CalciumMovie(NamedTuple):
    """What :func:`make_calcium_movie` returns."""

    movie: np.ndarray
    """``(T, Y, X)`` float32 fluorescence (photon counts)."""
    footprints: np.ndarray
    """``(cells, Y, X)`` float32 spatial footprints, each with peak 1."""
    traces: np.ndarray
    """``(cells, T)`` float32 calcium traces (dF/F of each cell, 0 at rest)."""
    centres: np.ndarray
    """``(cells, 2)`` float64 ``(y, x)`` centre of each cell."""


def _soma(shape: tuple[int, int], centre: np.ndarray, radius: float, elongation: float, angle: float) -> np.ndarray:
    """A soma footprint: a soft-edged ellipse whose centre (the nucleus) is dimmer than its ring, peak 1."""
    y, x = np.mgrid[: shape[0], : shape[1]].astype(np.float64)
    dy, dx = y - centre[0], x - centre[1]
    c, s = np.cos(angle), np.sin(angle)
    u, v = (c * dx + s * dy) / (radius * elongation), (-s * dx + c * dy) / (radius / elongation)
    r = np.sqrt(u * u + v * v)
    body = 1 / (1 + np.exp((r - 1) / 0.12))  # soft edge at r = 1
    nucleus = 0.55 * np.exp(-((r / 0.45) ** 2))
    footprint = np.clip(body - nucleus, 0, None)
    footprint[footprint < 1e-3] = 0
    return footprint / footprint.max()


def _calcium_trace(frames: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson spikes (0.2 to 1 Hz) through a calcium kernel (rise 0.1 s, decay 0.5 to 1.2 s), in dF/F."""
    rate = rng.uniform(0.2, 1.0) / FRAME_RATE
    spikes = rng.poisson(rate, frames).astype(np.float64) * rng.uniform(0.6, 1.4, frames)
    t = np.arange(int(6 * FRAME_RATE)) / FRAME_RATE
    decay = rng.uniform(0.5, 1.2)
    kernel = (1 - np.exp(-t / 0.1)) * np.exp(-t / decay)
    return np.convolve(spikes, kernel)[:frames] * rng.uniform(0.8, 2.0)


def make_calcium_movie(
    frames: int = CALCIUM_FRAMES, shape: tuple[int, int] = CALCIUM_SHAPE, cells: int = CALCIUM_CELLS, seed: int = 0
) -> CalciumMovie:
    """A ``(frames, *shape)`` float32 movie of ``cells`` flickering cells, with the truth behind it.

    Cells are 4 to 6.5 pixels in radius, placed at random without much
    overlap. Fluorescence is ``background * (1 + bleaching) + sum of
    footprint * brightness * trace + shared neuropil flicker``, in photon
    counts (a resting cell about 1.5x the background), with Poisson shot noise.

    A few dozen cells with soma-shaped footprints (a bright cytoplasm ring around a dimmer nucleus), each flickering
    with its own spike train (Poisson spikes through a calcium kernel: fast rise, exponential decay), on a smooth
    background with slow bleaching and a weak shared neuropil flicker, plus shot noise. The known footprints and traces
    come back with the movie, for the layer's metadata and for tests.
    """
    rng = np.random.default_rng(seed)
    rows, cols = shape
    centres: list[np.ndarray] = []
    radii: list[float] = []
    attempts = 0
    while len(centres) < cells and attempts < 100 * cells:
        attempts += 1
        radius = rng.uniform(4.0, 6.5)
        centre = rng.uniform([radius + 2, radius + 2], [rows - radius - 2, cols - radius - 2])
        if all(np.hypot(*(centre - c)) > 0.8 * (radius + r) for c, r in zip(centres, radii)):
            centres.append(centre)
            radii.append(radius)
    footprints = np.stack(
        [_soma(shape, c, r, rng.uniform(0.8, 1.25), rng.uniform(0, np.pi)) for c, r in zip(centres, radii)]
    )
    traces = np.stack([_calcium_trace(frames, rng) for _ in centres])

    y, x = np.mgrid[:rows, :cols] / max(rows, cols)
    background = 60 + 25 * np.sin(2.1 * x + 0.4) * np.cos(1.7 * y) + 15 * y  # smooth, 20 to 100 counts
    bleaching = 1 - 0.15 * (1 - np.exp(-np.arange(frames) / (0.6 * frames)))  # slow decay over the movie
    neuropil = 1 + 0.02 * np.convolve(rng.normal(size=frames), np.ones(15) / np.sqrt(15), mode="same")
    brightness = rng.uniform(50, 90, len(centres))  # resting counts at a footprint's peak
    resting = np.einsum("c,cyx->yx", brightness, footprints)
    active = np.einsum("c,ct,cyx->tyx", brightness, traces, footprints)
    expected = (background + resting)[None] * (bleaching * neuropil)[:, None, None] + active
    movie = rng.poisson(expected).astype(np.float32)
    return CalciumMovie(movie, footprints.astype(np.float32), traces.astype(np.float32), np.asarray(centres))


@on_disk
def calcium_sample() -> list[tuple]:
    """File > Open Sample > Calcium movie: the movie, with its known cells as a labels layer."""
    movie, footprints, traces, centres = make_calcium_movie()
    labels = np.where(footprints.max(axis=0) > 0.3, footprints.argmax(axis=0) + 1, 0).astype(np.int32)
    truth = {"gridmip_role": "movie", "true_footprints": footprints, "true_traces": traces, "true_centres": centres}
    truth["gridmip_correlation"] = {"mode": "time series", "neighbours": 8}  # the Correlation widget's mode
    return [
        (movie, {"name": "calcium movie", "colormap": "gray", "metadata": truth}, "image"),
        (labels, {"name": "true cells", "opacity": 0.3, "visible": False}, "labels"),
    ]
