"""correlate_volumes and volume_strain: digital volume correlation against known fields, NumPy references for its
interpolation and its criterion, and the reasons a point is lost.

The default cases share one volume shape and subset (48^3, subset 15, step 8), so that the few programs compile
once for the file; the rotation and the full-size subsets are marked slow (benchmarks/bench_volumes.py holds the
200^3 figures).
"""

import dataclasses
from types import SimpleNamespace

import dask.array as da
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

import napari_gridmip as gm
from napari_gridmip._sample_data.dvc import make_dvc_pair, true_displacement
from napari_gridmip.core.correlation import _volume_icgn as kernels
from napari_gridmip.core.correlation import volumes
from napari_gridmip.core.correlation.status import Status

SHAPE = (48, 48, 48)
OPTIONS = dict(subset=15, step=8)


def _errors(result, truth):
    truth_field = true_displacement(truth, result.z, result.y, result.x)
    found = np.stack([result.dz, result.dy, result.dx])
    return np.sqrt(np.sum((found - truth_field) ** 2, 0))


def _rms(errors, ok):
    return float(np.sqrt(np.mean(errors[ok] ** 2)))


@pytest.fixture(scope="module")
def affine_uint8():
    reference, deformed, truth = make_dvc_pair(SHAPE, dtype=np.uint8, seed=3)
    return reference, deformed, truth, gm.correlate_volumes(reference, deformed, **OPTIONS)


# -- NumPy references --------------------------------------------------------------------------------------------


def _cubic_bspline(x):
    """The textbook cubic B-spline beta^3(x)."""
    x = np.abs(x)
    return np.where(x < 1, 2 / 3 - x**2 + x**3 / 2, np.where(x < 2, (2 - x) ** 3 / 6, 0.0))


def test_tricubic_interpolation_matches_the_textbook_sum_and_scipy():
    rng = np.random.default_rng(0)
    volume = ndimage.gaussian_filter(rng.random((12, 13, 14)), 1.0)
    coefficients, _ = kernels.prepared_volumes(jnp.asarray(volume, jnp.float32), jnp.asarray(volume, jnp.float32),
                                               sigma=0.0)  # fmt: skip
    coefficients = np.asarray(coefficients, np.float64)
    points = rng.uniform(0, np.array(volume.shape) - 1, (200, 3))
    points[:3] = [[0, 0, 0], [11, 12, 13], [3, 4.5, 13]]  # corners and an edge: the padding's values
    ours = np.asarray(kernels.interpolate(jnp.asarray(coefficients, jnp.float32), *jnp.asarray(points.T, jnp.float32)))
    # the textbook sum over the 4^3 coefficients around each position (padded by 2: index + 2)
    textbook = np.zeros(len(points))
    for i, (z, y, x) in enumerate(points):
        base = np.floor([z, y, x]).astype(int)
        for a, b, c in np.ndindex(4, 4, 4):
            knot = base + np.array([a, b, c]) - 1
            weight = _cubic_bspline(z - knot[0]) * _cubic_bspline(y - knot[1]) * _cubic_bspline(x - knot[2])
            textbook[i] += weight * coefficients[knot[0] + 2, knot[1] + 2, knot[2] + 2]
    np.testing.assert_allclose(ours, textbook, atol=2e-6)
    # and scipy's cubic spline with edge-extended borders; at the voxels, the volume itself
    scipy = ndimage.map_coordinates(volume, points.T, order=3, mode="nearest")
    np.testing.assert_allclose(ours, scipy, atol=2e-5)
    voxels = jnp.asarray(np.indices(volume.shape).reshape(3, -1), jnp.float32)
    at_voxels = np.asarray(kernels.interpolate(jnp.asarray(coefficients, jnp.float32), *voxels))
    np.testing.assert_allclose(at_voxels, volume.ravel(), atol=2e-6)


def test_the_reference_gradient_is_the_splines_derivative():
    rng = np.random.default_rng(1)
    volume = ndimage.gaussian_filter(rng.random((10, 11, 12)), 1.0)
    _, prepared = kernels.prepared_volumes(jnp.asarray(volume, jnp.float32), jnp.asarray(volume, jnp.float32),
                                           sigma=0.0)  # fmt: skip
    coefficients = ndimage.spline_filter(np.pad(volume, 8, mode="edge"), order=3, mode="nearest")
    for axis in range(3):
        # scipy's spline, differentiated by a central difference of +-1e-3 voxel at every voxel of the interior
        grid = np.indices(volume.shape).reshape(3, -1).astype(np.float64) + 8
        step = np.zeros((3, 1))
        step[axis] = 1e-3
        slope = (ndimage.map_coordinates(coefficients, grid + step, order=3, prefilter=False)
                 - ndimage.map_coordinates(coefficients, grid - step, order=3, prefilter=False)) / 2e-3  # fmt: skip
        np.testing.assert_allclose(np.asarray(prepared[axis + 1]).ravel(), slope, atol=1e-4)


def test_the_zncc_of_one_subset_matches_numpy():
    reference, deformed, _ = make_dvc_pair((32, 32, 32), dtype=np.float32, seed=5)
    coefficients, prepared = kernels.prepared_volumes(jnp.asarray(reference), jnp.asarray(deformed), sigma=0.0)
    half = 5
    centre = np.array([[15, 16, 14]], np.int32)
    p = np.array([[0.3, 0.01, -0.02, 0.005, -0.4, 0.0, 0.02, 0.01, 0.7, -0.01, 0.0, 0.015]], np.float32)
    mask = jnp.ones(reference.shape, jnp.float32)
    _, _, zncc, _, view = kernels.step(coefficients, prepared, mask, centre, p, np.eye(12, dtype=np.float32)[None],
                                       np.float32(-1), half=half)  # fmt: skip
    offsets = np.stack(np.meshgrid(*[np.arange(-half, half + 1)] * 3, indexing="ij")).reshape(3, -1)
    gradient = np.array([p[0, 1:4], p[0, 5:8], p[0, 9:12]], np.float64)
    positions = centre[0][:, None] + offsets + p[0, [0, 4, 8]][:, None] + gradient @ offsets
    f = reference[tuple(centre[0][:, None] + offsets)].astype(np.float64)
    g = ndimage.map_coordinates(deformed.astype(np.float64), positions, order=3, mode="nearest")
    fc, gc = f - f.mean(), g - g.mean()
    expected = np.sum(fc * gc) / np.sqrt(np.sum(fc * fc) * np.sum(gc * gc))
    assert bool(view[0])
    np.testing.assert_allclose(float(zncc[0]), expected, atol=2e-5)


# -- known fields --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("translation", [(3.0, -2.0, 1.0), (0.3, -0.45, 0.2)], ids=["integer", "subpixel"])
def test_a_known_translation_is_found(translation):
    reference, deformed, truth = make_dvc_pair(SHAPE, strain=0.0, shear=0.0, translation=translation, seed=1)
    result = gm.correlate_volumes(reference, deformed, **OPTIONS)
    ok = result.status == Status.ok
    errors = _errors(result, truth)
    np.testing.assert_allclose(result.translation, translation, atol=0.5)
    # the subsets the translation carries out of the volume are lost as out of view, the rest found
    half = OPTIONS["subset"] // 2
    in_view = np.ones(result.status.shape, bool)
    for axis, (coordinate, shift) in enumerate(zip((result.z, result.y, result.x), translation)):
        moved = coordinate + shift
        inside = (moved - half >= -0.5) & (moved + half <= SHAPE[axis] - 0.5)
        in_view &= np.expand_dims(inside, [a for a in range(3) if a != axis])
    assert ok[in_view].mean() >= 0.95
    assert np.all(result.status[~in_view] == Status.out_of_view)
    assert _rms(errors, ok) <= 0.01 and errors[ok].max() <= 0.03
    assert np.all(np.abs(result.gradient[ok]) < 0.005)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_a_known_affine_field_is_recovered(dtype, affine_uint8):
    # 1% strain, 0.4% shear, 0.4 voxel translation, 1% noise in both volumes, quantised
    if dtype == np.uint8:
        reference, deformed, truth, result = affine_uint8
    else:
        reference, deformed, truth = make_dvc_pair(SHAPE, dtype=dtype, seed=4)
        result = gm.correlate_volumes(reference, deformed, **OPTIONS)
    ok = result.status == Status.ok
    errors = _errors(result, truth)
    assert ok.mean() >= 0.8
    assert _rms(errors, ok) <= 0.01
    gradient_errors = np.abs(result.gradient[ok] - (truth["matrix"] - np.eye(3)))
    assert np.median(gradient_errors) <= 5e-4 and gradient_errors.max() <= 5e-3
    # the predicted sigma is small and of the errors' order (no noise-free claim of zero)
    assert np.all(np.isfinite(result.sigma[ok])) and np.all(result.sigma[ok] < 0.02)
    assert np.all(result.zncc[ok] > 0.9)
    # lost points are NaN, never a plausible number
    for name in ("dz", "dy", "dx"):
        assert np.all(np.isnan(getattr(result, name)[~ok]))
    assert np.all(np.isnan(result.gradient[~ok]))


def test_the_result_is_documented_shapes_and_dtypes(affine_uint8):
    *_, result = affine_uint8
    grid = (5, 5, 5)
    for name in ("dz", "dy", "dx", "zncc"):
        value = getattr(result, name)
        assert value.shape == grid and value.dtype == np.float32, name
    assert result.sigma.shape == (*grid, 3) and result.gradient.shape == (*grid, 3, 3)
    assert result.status.shape == grid and result.status.dtype == np.uint8
    np.testing.assert_array_equal(result.z, np.arange(7, 41, 8))
    assert result.subset == 15 and result.step == 8 and result.shape == "affine"
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.dz = None


@pytest.mark.slow
def test_a_10_degree_rotation_is_recovered():
    reference, deformed, truth = make_dvc_pair((80, 80, 80), strain=0.0, shear=0.0, rotation=10.0,
                                               translation=(0.0, 0.0, 0.0), seed=6)  # fmt: skip
    result = gm.correlate_volumes(reference, deformed, subset=21, step=10)
    ok = result.status == Status.ok
    errors = _errors(result, truth)
    assert ok.mean() >= 0.5
    assert _rms(errors, ok) <= 0.02


def test_without_the_search_every_point_starts_from_the_whole_translation(affine_uint8):
    reference, deformed, truth, result = affine_uint8
    direct = gm.correlate_volumes(reference, deformed, search=0, **OPTIONS)
    ok = direct.status == Status.ok
    # the field moves the points by well under a voxel from the whole translation: the IC-GN alone gets there
    assert ok.mean() >= 0.8 and _rms(_errors(direct, truth), ok) <= 0.01
    both = ok & (result.status == Status.ok)
    np.testing.assert_allclose(direct.dz[both], result.dz[both], atol=2 * volumes.TOLERANCE)


def test_translation_only_subsets():
    reference, deformed, truth = make_dvc_pair(SHAPE, strain=0.0, shear=0.0, translation=(0.3, 0.6, -0.2), seed=2)
    result = gm.correlate_volumes(reference, deformed, shape="translation", **OPTIONS)
    ok = result.status == Status.ok
    assert ok.mean() >= 0.8 and _rms(_errors(result, truth), ok) <= 0.01
    assert np.all(np.isnan(result.gradient))
    with pytest.raises(ValueError, match="subsets' gradients"):
        gm.volume_strain(result)


# -- lost points ---------------------------------------------------------------------------------------------------


def test_a_subset_carried_out_of_the_volume_is_out_of_view():
    reference, deformed, truth = make_dvc_pair(SHAPE, strain=0.0, shear=0.0, translation=(6.0, 0.0, 0.0), seed=7)
    result = gm.correlate_volumes(reference, deformed, **OPTIONS)
    # the last plane (z = 39) moves to 45: its subsets (+-7) reach 52, past the volume's 47
    assert np.all(result.status[-1] == Status.out_of_view)
    assert np.all(np.isnan(result.dz[-1]))
    inside = result.status[:-1] == Status.ok
    assert inside.mean() >= 0.9
    assert _rms(_errors(result, truth)[:-1], inside) <= 0.01


@pytest.mark.parametrize("noisy", [False, True], ids=["constant", "noise"])
def test_a_flat_region_is_not_significant(noisy):
    reference, deformed, _ = make_dvc_pair(SHAPE, strain=0.0, shear=0.0, translation=(0.2, 0.1, 0.0), seed=8)
    rng = np.random.default_rng(0)
    for volume in (reference, deformed):  # the first 20 columns hold no texture (noise only, or nothing)
        flat = 128 + (rng.normal(0, 2.5, volume[..., :20].shape) if noisy else 0)
        volume[..., :20] = np.clip(np.rint(flat), 0, 255).astype(np.uint8)
    result = gm.correlate_volumes(reference, deformed, **OPTIONS)
    flat_points = result.status[..., 0]  # x = 7: its subset spans columns 0..14
    assert np.all(flat_points == Status.not_significant)
    assert np.all(np.isnan(result.dx[..., 0]))
    assert np.mean(result.status[..., 2:] == Status.ok) >= 0.9


def test_roi_points_and_voxels_outside_never_count():
    reference, deformed, truth = make_dvc_pair(SHAPE, strain=0.0, shear=0.0, translation=(0.3, -0.2, 0.4), seed=9)
    roi = np.zeros(SHAPE, np.uint16)
    roi[:, :, :30] = 2  # labels: > 0 inside
    result = gm.correlate_volumes(reference, deformed, roi=roi, **OPTIONS)
    x = result.x.astype(int)
    assert np.all(result.status[..., x >= 30] == Status.outside_roi)
    assert np.all(np.isnan(result.dz[..., x >= 30]))
    ok = result.status == Status.ok
    assert ok[..., x < 22].mean() >= 0.9 and _rms(_errors(result, truth), ok) <= 0.01
    # what lies beyond the ROI in either volume does not move a kept point
    scrambled_ref, scrambled_def = reference.copy(), deformed.copy()
    rng = np.random.default_rng(1)
    scrambled_ref[:, :, 30:] = rng.integers(0, 255, scrambled_ref[:, :, 30:].shape)
    scrambled_def[:, :, 31:] = rng.integers(0, 255, scrambled_def[:, :, 31:].shape)
    again = gm.correlate_volumes(scrambled_ref, scrambled_def, roi=roi, **OPTIONS)
    np.testing.assert_array_equal(again.status, result.status)
    # (to within the IC-GN's stop: a point stops where its last increment was under the tolerance, 2e-3 voxel at
    # a corner, and the spline prefilter's tail, 0.27**k of a value k voxels away, moves where that is)
    np.testing.assert_allclose(again.dz[ok], result.dz[ok], atol=5e-4)


# -- inputs --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(reference=np.zeros((8, 8))), ValueError, "reference must be 3D"),
        (dict(deformed=np.zeros((48, 48, 40))), ValueError, "deformed must have the reference's shape"),
        (dict(reference=np.zeros(SHAPE, np.complex64)), ValueError, "reference must have a bool, integer"),
        (dict(subset=14), ValueError, "subset must be odd"),
        (dict(subset=3), ValueError, "subset must be an integer >= 5"),
        (dict(subset=49), ValueError, "larger than the volumes"),
        (dict(subset=15.0), TypeError, "subset must be an integer"),
        (dict(step=0), ValueError, "step must be an integer >= 1"),
        (dict(roi=np.ones((4, 4, 4), bool)), ValueError, "roi must be a mask of the reference's shape"),
        (dict(roi=np.ones(SHAPE, np.float32)), TypeError, "roi must be a bool mask or integer labels"),
        (dict(shape="quadratic"), ValueError, "shape must be one of"),
        (dict(search=-1), ValueError, "search must be an integer >= 0"),
        (dict(min_zncc=1.5), ValueError, r"min_zncc must be in \[0, 1\]"),
        (dict(max_disagreement=0), ValueError, "max_disagreement must be positive"),
        (dict(prefilter="gauss"), ValueError, "prefilter must be 'auto'"),
        (dict(tolerance=-1.0), ValueError, "tolerance must be positive"),
        (dict(dtype=np.int32), ValueError, "dtype must be float32 or float64"),
    ],
)
def test_bad_input_is_named(kwargs, error, match):
    volumes = dict(reference=np.zeros(SHAPE, np.uint8), deformed=np.zeros(SHAPE, np.uint8))
    volumes.update({k: kwargs.pop(k) for k in list(kwargs) if k in volumes})
    with pytest.raises(error, match=match):
        gm.correlate_volumes(volumes["reference"], volumes["deformed"], **kwargs)


def test_non_finite_voxels_are_refused():
    volume = np.zeros(SHAPE, np.float32)
    volume[3, 4, 5] = np.nan
    with pytest.raises(ValueError, match="deformed has non-finite voxels"):
        gm.correlate_volumes(np.zeros(SHAPE, np.float32), volume, **OPTIONS)


def test_dask_and_float_volumes_give_uint8s_answer_and_inputs_are_kept(affine_uint8):
    reference, deformed, _, result = affine_uint8
    kept = reference.copy(), deformed.copy()
    as_float = gm.correlate_volumes(reference.astype(np.float32), da.from_array(deformed, chunks=16), **OPTIONS)
    np.testing.assert_array_equal(reference, kept[0])
    np.testing.assert_array_equal(deformed, kept[1])
    np.testing.assert_array_equal(as_float.status, result.status)
    np.testing.assert_allclose(as_float.dz, result.dz, atol=1e-5, equal_nan=True)


def test_float64_agrees_with_float32(affine_uint8):
    reference, deformed, truth, result = affine_uint8
    wide = gm.correlate_volumes(reference, deformed, dtype=np.float64, **OPTIONS)
    assert wide.dz.dtype == np.float32  # the result's dtype is the documented one; the work was float64
    np.testing.assert_array_equal(wide.status, result.status)
    ok = result.status == Status.ok
    for name in ("dz", "dy", "dx"):
        np.testing.assert_allclose(getattr(wide, name)[ok], getattr(result, name)[ok], atol=2 * volumes.TOLERANCE)
    assert _rms(_errors(wide, truth), ok) <= 0.01


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16), kind=st.sampled_from(["uint8", "uint16", "float32"]))
def test_identical_volumes_give_zero_displacement_at_every_valid_point(seed, kind):
    volume, _, _ = make_dvc_pair(SHAPE, dtype=np.dtype(kind), seed=seed)
    result = gm.correlate_volumes(volume, volume.copy(), **OPTIONS)
    ok = result.status == Status.ok
    assert ok.all()
    for name in ("dz", "dy", "dx"):  # 0 to within the IC-GN's stop (a predicted increment under the tolerance)
        assert np.all(np.abs(getattr(result, name)) < 2 * volumes.TOLERANCE)
    assert np.all(result.zncc > 0.9999)


# -- strain --------------------------------------------------------------------------------------------------------


def _analytic(matrix):
    green = 0.5 * (matrix.T @ matrix - np.eye(3))
    small = 0.5 * (matrix + matrix.T) - np.eye(3)
    pairs = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))
    return np.array([green[i, j] for i, j in pairs]), np.array([small[i, j] for i, j in pairs]), green


def test_the_strain_of_an_exact_linear_field_is_the_analytic_tensor():
    matrix = np.array([[1.02, 0.01, -0.004], [0.003, 0.99, 0.008], [0.0, -0.006, 1.015]])
    axes = [np.arange(5, 60, 10.0)] * 3
    points = np.stack(np.meshgrid(*axes, indexing="ij"), -1)
    field = np.einsum("ij,...j->...i", matrix - np.eye(3), points) + [0.3, -0.1, 0.2]
    gradient = np.broadcast_to(matrix - np.eye(3), (*field.shape[:3], 3, 3))
    result = SimpleNamespace(dz=field[..., 0], dy=field[..., 1], dx=field[..., 2], gradient=gradient, step=10,
                             shape="affine")  # fmt: skip
    green, small, tensor = _analytic(matrix)
    for method in ("subsets", "smoothed"):
        strain = gm.volume_strain(result, method=method)
        assert strain.method == method
        np.testing.assert_allclose(
            strain.green_lagrange, np.broadcast_to(green, strain.green_lagrange.shape), atol=1e-12
        )
        np.testing.assert_allclose(strain.small, np.broadcast_to(small, strain.small.shape), atol=1e-12)
        np.testing.assert_allclose(strain.volumetric, np.linalg.det(matrix) - 1, atol=1e-12)
        np.testing.assert_allclose(strain.principal[0, 0, 0], np.sort(np.linalg.eigvalsh(tensor))[::-1], atol=1e-12)
        deviator = tensor - np.trace(tensor) / 3 * np.eye(3)
        np.testing.assert_allclose(strain.deviatoric, np.sqrt(2 / 3 * np.sum(deviator**2)), atol=1e-12)


def test_the_strain_of_a_correlated_affine_field(affine_uint8):
    *_, truth, result = affine_uint8
    green, _, _ = _analytic(truth["matrix"])
    ok = result.status == Status.ok
    for method, tolerance in (("subsets", 5e-3), ("smoothed", 4e-3)):  # the edge points: the largest errors
        strain = gm.volume_strain(result, method=method)
        finite = np.all(np.isfinite(strain.green_lagrange), -1)
        assert finite[ok].mean() >= 0.8
        assert np.all(np.isnan(strain.green_lagrange[~ok]))
        np.testing.assert_allclose(strain.green_lagrange[finite], np.broadcast_to(green, (finite.sum(), 6)),
                                   atol=tolerance)  # fmt: skip


def test_volume_strain_refuses_bad_options(affine_uint8):
    *_, result = affine_uint8
    with pytest.raises(ValueError, match="method must be one of"):
        gm.volume_strain(result, method="fem")
    with pytest.raises(ValueError, match="smoothing must be >= 0"):
        gm.volume_strain(result, method="smoothed", smoothing=-1)
    with pytest.raises(TypeError, match="result must be what correlate_volumes returns"):
        gm.volume_strain(np.zeros(3))


# -- progress, Cancel and volumes read by slabs ------------------------------------------------------------------


def test_progress_counts_up_to_its_total_and_a_raising_callback_stops_the_run(affine_uint8):
    reference, deformed, _, result = affine_uint8
    calls = []
    again = gm.correlate_volumes(reference, deformed, progress=lambda done, total: calls.append((done, total)),
                                 **OPTIONS)  # fmt: skip
    done, totals = np.array(calls).T
    assert set(totals) == {2 * result.dz.size}  # the points searched, then the points whose IC-GN stopped
    assert np.all(np.diff(done) >= 0) and done[-1] == totals[0] and len(np.unique(done)) > 3
    np.testing.assert_array_equal(again.status, result.status)  # reporting changes nothing
    np.testing.assert_array_equal(again.dz, result.dz)

    class Stop(Exception):
        pass

    seen = []

    def cancel(done, total):
        seen.append(done)
        if done > 0:  # Cancel pressed once the run is under way
            raise Stop

    kept = reference.copy()
    with pytest.raises(Stop):
        gm.correlate_volumes(reference, deformed, progress=cancel, **OPTIONS)
    assert seen[-1] < 2 * result.dz.size  # stopped at the first chunk after the press, not at the end
    np.testing.assert_array_equal(reference, kept)


@pytest.mark.parametrize(("shape", "with_roi"), [((64, 64, 64), False), ((64, 64, 64), True), ((112, 40, 40), False)])
def test_dask_volumes_read_by_slabs_give_the_answers_in_memory(monkeypatch, shape, with_roi):
    translation = (2.6, -0.3, 0.4) if shape[0] > 64 else (0.4, -0.3, 0.25)  # the halo grows with it
    reference, deformed, _ = make_dvc_pair(shape, dtype=np.uint8, seed=5, translation=translation)
    options = dict(subset=9, step=6, search=2, prefilter="auto" if with_roi else None)
    if with_roi:
        zz, yy, xx = np.mgrid[:64, :64, :64]
        options["roi"] = (zz - 32) ** 2 + (yy - 30) ** 2 + (xx - 34) ** 2 < 30**2
    whole = gm.correlate_volumes(reference, deformed, **options)
    # slabs of 1 or 2 point planes, each reading 60 or 62 planes: at 64^3 they start on plane 0 or 2, at 112
    # planes on every sixth
    monkeypatch.setattr(volumes, "SLAB_VOXELS", shape[1] * shape[2] * 62)
    reads = []

    class Recorded:  # a lazy volume that records the planes each read asks for, and refuses a whole read
        def __init__(self, array):
            self.array, self.shape, self.dtype, self.ndim = array, array.shape, array.dtype, array.ndim

        def __getitem__(self, key):
            reads.append((key.start, key.stop))
            return self.array[key]

        def __array__(self, dtype=None, copy=None):
            raise AssertionError("the whole volume was read")

    lazy = Recorded(da.from_array(reference, chunks=8)), da.from_array(deformed, chunks=8)
    if shape[0] > 64:
        lazy = da.from_array(reference, chunks=8), Recorded(da.from_array(deformed, chunks=8))
    if with_roi:
        options["roi"] = Recorded(options["roi"])
    slabbed = gm.correlate_volumes(*lazy, **options)
    assert len(reads) > 4 and all(stop - start <= 62 for start, stop in reads)
    np.testing.assert_array_equal(slabbed.status, whole.status)
    assert np.count_nonzero(whole.status == Status.ok) > whole.status.size / 6  # (the ROI leaves a fifth)
    np.testing.assert_array_equal(slabbed.translation, whole.translation)
    for name in ("dz", "dy", "dx"):
        np.testing.assert_allclose(getattr(slabbed, name), getattr(whole, name), atol=1e-5, equal_nan=True)
    np.testing.assert_allclose(slabbed.zncc, whole.zncc, atol=1e-5, equal_nan=True)
    np.testing.assert_allclose(slabbed.sigma, whole.sigma, rtol=1e-4, equal_nan=True)

    # Cancel while the slabs are read: the run stops there, before the rest are
    full, calls = len(reads), []

    def cancel(done, total):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gm.correlate_volumes(*lazy, progress=cancel, **options)
    assert len(reads) - full < full / 2


def test_a_rotation_beyond_the_search_is_found_wherever_its_subsets_stay_in_the_volume():
    """25 degrees about z on 64^3: the far points move 15 voxels past the whole translation, beyond the search (4)
    and the propagation's reach; the affine map of the points found near the axis starts them."""
    n, angle = 64, np.deg2rad(25)
    rng = np.random.default_rng(3)
    reference = ndimage.gaussian_filter(rng.random((n, n, n)), 1.5)
    reference = ((reference - reference.min()) / np.ptp(reference) * 255).astype(np.float32)
    turn = np.array([[1, 0, 0], [0, np.cos(angle), -np.sin(angle)], [0, np.sin(angle), np.cos(angle)]])
    centre = np.full(3, (n - 1) / 2)
    deformed = ndimage.affine_transform(reference, turn.T, offset=centre - turn.T @ centre, order=5, mode="mirror")
    result = gm.correlate_volumes(reference, deformed.astype(np.float32), subset=11, step=8)
    points = np.stack(np.meshgrid(result.z, result.y, result.x, indexing="ij"), -1)
    truth = (points - centre) @ turn.T + centre - points
    ok = result.status == Status.ok
    # every point is found or its subset is carried out of the volume; none is left not significant
    assert set(np.unique(result.status[~ok])) <= {Status.out_of_view} and ok.mean() > 0.5
    error = np.linalg.norm(np.stack([result.dz, result.dy, result.dx], -1) - truth, axis=-1)
    assert np.sqrt(np.mean(error[ok] ** 2)) < 0.01
