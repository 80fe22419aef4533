"""A whole-image estimate of the rigid motion (rotation, scale, translation) between two frames, on the host
(NumPy and SciPy, once per frame pair): a DIC series' guess where the motion outruns the subsets' search.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import fft, ndimage

MAX_SIZE = 160  # px a side of the reduced frames the estimate works on (the guess needs a few px: 0.5 px here)
MIN_OVERLAP = 0.2  # shifts whose overlap holds fewer than this share of the smaller frame's valid pixels: none
ANGLES = 360  # log-polar samples over 180 degrees (0.5 degree apart; the peak's fit goes below)


class Motion(NamedTuple):
    """A frame-to-frame motion: ``matrix`` ``(2, 3)`` maps a position ``(y, x, 1)`` of the first frame to the
    second's (float64, full-resolution pixels); ``score`` is the masked NCC of the two frames under it, in
    [-1, 1]."""

    matrix: np.ndarray
    score: float


def _reduced(frame: np.ndarray, factor: int) -> np.ndarray:
    """``frame`` ``(M, N)`` as block means of ``factor`` x ``factor`` (a cropped remainder dropped), float64."""
    frame = np.asarray(frame, dtype=np.float64)
    if factor == 1:
        return frame
    rows, cols = (s // factor * factor for s in frame.shape)
    blocks = frame[:rows, :cols].reshape(rows // factor, factor, cols // factor, factor)
    return blocks.mean(axis=(1, 3))


def _log_polar_magnitude(image: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, float]:
    """The high-passed Fourier magnitude of ``image`` (mean removed, Hann-windowed) on log-polar axes:
    ``(ANGLES, radii)`` over angles [0, 180) degrees, and the logarithm's base per radius sample."""
    rows, cols = image.shape
    windowed = (image - image.mean()) * np.outer(np.hanning(rows), np.hanning(cols))
    magnitude = np.abs(fft.fftshift(fft.fft2(windowed, s=shape)))
    fy = fft.fftshift(fft.fftfreq(shape[0]))[:, None]
    fx = fft.fftshift(fft.fftfreq(shape[1]))[None, :]
    emphasis = 1 - np.cos(np.pi * fy) * np.cos(np.pi * fx)  # Reddy and Chatterji's high-pass: the low frequencies
    magnitude *= emphasis * (2 - emphasis)  # carry the frame's outline, not its texture
    centre = np.array(shape) // 2
    radii = min(shape) // 2
    base = np.exp(np.log(radii) / radii)
    theta = np.pi * np.arange(ANGLES) / ANGLES
    radius = base ** np.arange(radii)
    ys = centre[0] + radius[None, :] * np.sin(theta)[:, None]
    xs = centre[1] + radius[None, :] * np.cos(theta)[:, None]
    return ndimage.map_coordinates(magnitude, [ys, xs], order=1, mode="constant"), base


def _phase_peak(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The sub-sample shift ``(dy, dx)`` with ``b(p) = a(p - shift)``, from the phase correlation's peak (a
    parabola through it and its neighbours on each axis), each within half the axis."""
    cross = fft.fft2(b) * np.conj(fft.fft2(a))
    surface = np.real(fft.ifft2(cross / np.maximum(np.abs(cross), 1e-12)))
    peak = np.unravel_index(np.argmax(surface), surface.shape)
    shift = []
    for axis, index in enumerate(peak):
        size = surface.shape[axis]
        around = [surface[tuple((index + d) % size if a == axis else peak[a] for a in range(2))] for d in (-1, 0, 1)]
        denominator = around[0] - 2 * around[1] + around[2]
        fraction = 0.5 * (around[0] - around[2]) / denominator if denominator < 0 else 0.0
        value = index + fraction
        shift.append(value - size if value > size / 2 else value)
    return shift[0], shift[1]


def _masked_ncc(fixed, fixed_mask, moving, moving_mask) -> np.ndarray:
    """Padfield's masked NCC of ``moving`` against ``fixed`` for every shift ``s``: the correlation over the
    pixels ``p`` valid in both where ``moving(p - s)`` meets ``fixed(p)``; ``(2M - 1, 2N - 1)`` with shift
    ``(0, 0)`` at index ``(M - 1, N - 1)``; -inf where the overlap is under ``MIN_OVERLAP``."""
    rows, cols = fixed.shape
    shape = (2 * rows - 1, 2 * cols - 1)
    fast = tuple(fft.next_fast_len(s) for s in shape)
    f, g = fixed * fixed_mask, moving * moving_mask

    def spectrum(x):
        return fft.rfft2(x, s=fast)

    def flipped(x):
        return fft.rfft2(x[::-1, ::-1], s=fast)

    def correlate(a_spectrum, b_flipped):
        out = fft.irfft2(a_spectrum * b_flipped, s=fast)
        return out[: shape[0], : shape[1]]

    F, F2, MF = spectrum(f), spectrum(f * f), spectrum(fixed_mask)
    G, G2, MG = flipped(g), flipped(g * g), flipped(moving_mask)
    overlap = np.round(correlate(MF, MG))
    sum_f, sum_g = correlate(F, MG), correlate(MF, G)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.maximum(overlap, 1)
        numerator = correlate(F, G) - sum_f * sum_g / n
        var_f = correlate(F2, MG) - sum_f**2 / n
        var_g = correlate(MF, G2) - sum_g**2 / n
        ncc = numerator / np.sqrt(np.maximum(var_f, 0) * np.maximum(var_g, 0))
    floor = MIN_OVERLAP * min(fixed_mask.sum(), moving_mask.sum())
    tiny = 1e-6 * max(np.max(var_f), np.max(var_g), 1e-30)
    ncc[(overlap < max(floor, 16)) | ~np.isfinite(ncc) | (var_f <= tiny) | (var_g <= tiny)] = -np.inf
    # index i holds the shift i - (M - 1): index (M - 1, N - 1) is no shift
    return ncc


def _translation(fixed, fixed_mask, moving, moving_mask) -> tuple[float, float, float]:
    """The shift ``(dy, dx)`` that best lays ``moving`` on ``fixed`` (``fixed(p) ~ moving(p - shift)``), with the
    sub-pixel fit of the masked NCC's peak, and that peak's value."""
    ncc = _masked_ncc(fixed, fixed_mask, moving, moving_mask)
    peak = np.unravel_index(np.argmax(ncc), ncc.shape)
    score = float(ncc[peak])
    if not np.isfinite(score):
        return 0.0, 0.0, -np.inf
    shift = []
    for axis in range(2):
        index = peak[axis]
        around = []
        for d in (-1, 0, 1):
            at = list(peak)
            at[axis] = index + d
            inside = 0 <= at[axis] < ncc.shape[axis]
            around.append(ncc[tuple(at)] if inside else -np.inf)
        fraction = 0.0
        if np.all(np.isfinite(around)):
            denominator = around[0] - 2 * around[1] + around[2]
            if denominator < 0:
                fraction = float(np.clip(0.5 * (around[0] - around[2]) / denominator, -0.5, 0.5))
        shift.append(index + fraction - (fixed.shape[axis] - 1))
    return shift[0], shift[1], score


def _similarity(angle: float, scale: float, centre: np.ndarray) -> np.ndarray:
    """The ``(2, 3)`` map in (y, x) of a turn by ``angle`` (radians, counter-clockwise as x turns towards -y on
    the screen) and a ``scale`` about ``centre``."""
    c, s = np.cos(angle) * scale, np.sin(angle) * scale
    linear = np.array([[c, s], [-s, c]])  # (y, x): a point at +x goes to -y for a positive angle
    return np.concatenate([linear, (centre - linear @ centre)[:, None]], axis=1)


def estimate_motion(first: np.ndarray, second: np.ndarray, *, rotation: bool = True) -> Motion:
    """The rigid motion (with a uniform scale) that carries ``first`` onto ``second``, each ``(M, N)``.

    Parameters
    ----------
    first, second
        Two frames of one shape, any real dtype (non-finite values are not allowed).
    rotation
        Look for a rotation and scale (Fourier-Mellin); False: a translation only.

    Returns
    -------
    Motion
        ``matrix`` ``(2, 3)`` float64: a position ``(y, x)`` of ``first`` is at ``matrix @ (y, x, 1)`` in
        ``second``; ``score``: the masked NCC of the reduced frames under it.

    Notes
    -----
    A DIC series starts every point's search from a guess; between two frames the specimen may turn by tens of
    degrees or move by half the image, more than any subset's search reaches, and this estimate carries the previous
    frame's field over that motion. Rotation and scale come from the Fourier-Mellin transform: the magnitude of an
    image's Fourier transform does not move with a translation, and turns and scales with the image; resampled on
    log-polar axes, a rotation and a scale become a shift, found by phase correlation (Reddy and Chatterji 1996). The
    magnitude is the same for an angle and that angle plus 180 degrees, so both are tried. The translation is then
    the peak of the masked normalised cross-correlation over every shift (Padfield 2012), computed with FFTs on
    zero-padded frames: the correlation of the overlapping pixels only, normalised by their own statistics, so that a
    shift of half the image is found as surely as a small one. Both run on frames reduced by block means to at most
    ``MAX_SIZE`` px a side: the guess needs to be good to a few pixels, which the subsets' Gauss-Newton refines.

    References
    ----------
    B. S. Reddy, B. N. Chatterji, "An FFT-based technique for translation, rotation, and scale-invariant image
    registration", IEEE Trans. Image Process. 5(8), 1266-1271 (1996).
    D. Padfield, "Masked object registration in the Fourier domain", IEEE Trans. Image Process. 21(5), 2706-2718
    (2012).
    """
    first = np.asarray(first)
    factor = max(1, int(np.ceil(max(first.shape) / MAX_SIZE)))
    a, b = _reduced(first, factor), _reduced(second, factor)
    ones = np.ones_like(a)
    centre = (np.array(a.shape) - 1) / 2
    candidates = [(0.0, 1.0)]
    if rotation and min(a.shape) >= 16:
        shape = (max(a.shape),) * 2
        polar_a, base = _log_polar_magnitude(a, shape)
        polar_b, _ = _log_polar_magnitude(b, shape)
        d_angle, d_radius = _phase_peak(polar_a, polar_b)
        angle = d_angle * np.pi / ANGLES  # magnitude's angle axis runs with x towards +y: the other sense
        scale = float(base**d_radius)
        if not 0.5 < scale < 2:
            scale = 1.0
        candidates = [(angle, scale), (angle + np.pi, scale)]
        if abs(angle) > 1e-3 or abs(scale - 1) > 1e-3:
            candidates.append((0.0, 1.0))
    best = None
    for angle, scale in candidates:
        similarity = _similarity(angle, scale, centre)
        inverse = np.linalg.inv(np.vstack([similarity, [0, 0, 1]]))[:2]
        # ``a`` turned: its value at q is a's at similarity^-1 q; its mask says where that lies inside ``a``
        turned = ndimage.affine_transform(a, inverse[:, :2], offset=inverse[:, 2], order=1, mode="constant")
        mask = ndimage.affine_transform(ones, inverse[:, :2], offset=inverse[:, 2], order=0, mode="constant")
        dy, dx, score = _translation(b, ones, turned, mask)
        if best is None or score > best[0]:
            matrix = similarity.copy()
            matrix[:, 2] += (dy, dx)
            best = (score, matrix)
    score, matrix = best
    # back to full-resolution pixels: reduced pixel centres sit at (factor - 1) / 2 + factor * i
    half = (factor - 1) / 2
    full = matrix.copy()
    full[:, 2] = factor * (matrix[:, 2] + matrix[:, :2] @ np.array([-half / factor] * 2)) + half
    return Motion(full, float(score))
