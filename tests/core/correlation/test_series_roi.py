"""correlate_series' conformal subsets: a subset is its window's pixels inside the ROI, kept where they carry
texture enough, on separate parts (one of them 20 x 20 px) turning about a centre with a known field."""

import numpy as np
import pytest
from scipy import ndimage

import napari_gridmip as gm
from napari_gridmip._sample_data.dic import _dots, camera, render_speckle
from napari_gridmip._sample_data.dic_series import _inverse
from napari_gridmip.core.correlation import series as series_module
from napari_gridmip.core.correlation.prefilter import DEFAULT_SIGMA, radius
from napari_gridmip.core.correlation.series import Status

SHAPE = (128, 128)
CENTRE = np.array([(SHAPE[0] - 1) / 2, (SHAPE[1] - 1) / 2])
OPTIONS = dict(subset=21, step=4)
FLAT = 4  # the label of the part with no speckle
NOISE = 0.004  # of the 8-bit range: 1 grey level


def _labels(y, x):
    """The parts' labels at reference positions: a disc, a square, a 20 x 20 square (textured) and a flat one."""
    labels = np.zeros(np.broadcast(y, x).shape, np.uint8)
    labels[np.hypot(y - 36, x - 36) <= 22] = 1
    labels[(y >= 76) & (y < 112) & (x >= 20) & (x < 56)] = 2
    labels[(y >= 26) & (y < 46) & (x >= 84) & (x < 104)] = 3
    labels[(y >= 80) & (y < 104) & (x >= 80) & (x < 104)] = FLAT
    return labels


def _rotation(degrees):
    a = np.deg2rad(degrees)
    c, s = np.cos(a), np.sin(a)

    def phi(y, x):
        dy, dx = y - CENTRE[0], x - CENTRE[1]
        return CENTRE[0] + c * dy - s * dx, CENTRE[1] + s * dy + c * dx

    return phi


def make_parts(angles, seed=0):
    """Frames ``(T, M, N)`` uint8 of the parts turned by ``angles`` (degrees) about the centre, their label image
    on the reference, and the maps."""
    rng = np.random.default_rng(seed)
    centres, amplitudes = _dots(SHAPE, rng, margin=8.0)
    qy, qx = np.meshgrid(np.arange(SHAPE[0], dtype=np.float64), np.arange(SHAPE[1], dtype=np.float64), indexing="ij")
    maps, out = [_rotation(a) for a in angles], []
    for phi in maps:
        py, px = _inverse(phi, qy, qx)
        landing = np.stack(phi(centres[:, 0], centres[:, 1]), axis=1)
        labels = _labels(py, px)
        intensity = render_speckle(py, px, centres, amplitudes, landing)
        intensity = np.where((labels > 0) & (labels != FLAT), intensity, 0.0)
        out.append(camera(np.where(labels == FLAT, 0.5, intensity), rng, NOISE))
    return np.stack(out), _labels(qy, qx), maps


@pytest.fixture(scope="module")
def parts():
    frames, labels, maps = make_parts([0.0, 3.0, 6.0, 9.0])
    return frames, labels, maps, gm.correlate_series(frames, roi=labels, **OPTIONS)


def _window_counts(mask, result):
    """The pixels of ``mask`` in each grid point's subset window ``(R, C)``."""
    half = OPTIONS["subset"] // 2
    table = np.pad(np.cumsum(np.cumsum(mask, 0, dtype=np.int64), 1), ((1, 0), (1, 0)))
    y, x = np.meshgrid(result.y.astype(int), result.x.astype(int), indexing="ij")
    return (
        table[y + half + 1, x + half + 1]
        - table[y - half, x + half + 1]
        - table[y + half + 1, x - half]
        + table[y - half, x - half]
    )


def test_points_at_the_parts_edges_are_kept_where_their_clipped_subset_has_texture(parts):
    frames, labels, maps, result = parts
    gy, gx = np.meshgrid(result.y, result.x, indexing="ij")
    centre_label = labels[gy.astype(int), gx.astype(int)]
    trimmed = ndimage.binary_erosion((labels > 0) & (labels != FLAT), iterations=radius(DEFAULT_SIGMA) + 2)
    textured = (centre_label > 0) & (centre_label != FLAT) & (_window_counts(trimmed, result) >= 64)
    ok = result.status == Status.ok
    truth = np.stack([np.stack(phi(gy, gx)) for phi in maps]) - np.stack([gy, gx])
    error = np.hypot(result.dy - truth[:, 0], result.dx - truth[:, 1])
    # the points whose square subset is less than half inside: a square-subset rule loses all of them
    edge = textured & (_window_counts(labels > 0, result) < 0.5 * OPTIONS["subset"] ** 2)
    assert edge.sum() >= 8
    for t in range(len(frames)):
        assert ok[t][textured].mean() >= 0.9, t
        assert ok[t][edge].mean() >= 0.9, t
        # the clipped subsets' precision is their texture's: the median within 0.02 px, the tail within max_sigma's
        # reach (subsets of 10 x 21 px at a part's edge: a predicted sigma of several hundredths of a px)
        assert np.median(error[t][ok[t]]) <= 0.02, t
        assert np.sqrt(np.mean(error[t][ok[t]] ** 2)) <= 0.05, t
    # the 20 x 20 part is followed
    assert np.all(ok[:, centre_label == 3].sum(1) >= 4)
    assert np.all(np.isnan(result.dx[~ok]))
    # nothing outside the parts; the flat part's points are NaN, their subsets too flat to match
    assert np.all(result.status[:, centre_label == 0] == Status.outside_roi)
    flat = (centre_label == FLAT) & (_window_counts(trimmed, result) == 0)
    assert flat.sum() >= 4
    assert np.all(result.status[:, flat] == Status.not_significant) and np.all(np.isnan(result.dy[:, flat]))


def test_the_masked_zncc_of_one_clipped_subset_is_numpys():
    frames, labels, maps = make_parts([0.0, 2.0])
    subset, step = OPTIONS["subset"], OPTIONS["step"]
    result = gm.correlate_series(frames, roi=labels, subset=subset, step=step, prefilter=None)
    # a point at the small part's corner: its subset clipped to the part
    r, c = np.searchsorted(result.y, 30), np.searchsorted(result.x, 88)
    assert result.status[1, r, c] == Status.ok
    y0, x0 = result.y[r], result.x[c]
    half = subset // 2
    eta, zeta = np.meshgrid(np.arange(-half, half + 1.0), np.arange(-half, half + 1.0), indexing="ij")
    trimmed = ndimage.binary_erosion(labels > 0, iterations=series_module.SPLINE_TAPS)
    m = trimmed[int(y0) + eta.astype(int), int(x0) + zeta.astype(int)].astype(np.float64)
    assert 0 < m.mean() < 0.5
    f = frames[0][int(y0) + eta.astype(int), int(x0) + zeta.astype(int)].astype(np.float64)
    # the deformed subset at the found warp, by the exact rotation's inverse: the reference's pixels carried
    py = y0 + result.dy[1, r, c] + (1 + result.dy_y[1, r, c]) * eta + result.dy_x[1, r, c] * zeta
    px = x0 + result.dx[1, r, c] + result.dx_y[1, r, c] * eta + (1 + result.dx_x[1, r, c]) * zeta
    g = ndimage.map_coordinates(frames[1].astype(np.float64), [py, px], order=3, mode="nearest")
    n = m.sum()
    fm, gm_ = (m * f).sum() / n, (m * g).sum() / n
    zncc = (m * (f - fm) * (g - gm_)).sum() / np.sqrt((m * (f - fm) ** 2).sum() * (m * (g - gm_) ** 2).sum())
    np.testing.assert_allclose(result.zncc[1, r, c], zncc, atol=2e-3)
