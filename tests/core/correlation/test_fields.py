"""integrate_gradient, phase_from_displacement and strain_field against float64 references and analytic fields."""

import dask.array as da
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from napari_gridmip import integrate_gradient, phase_from_displacement, strain_field
from tests.core.correlation import reference_fields as ref
from tests.helpers import TaskCounter, examples


def host(a):
    """A result as NumPy float64 (read under x64 so that float64 results are not narrowed)."""
    with jax.enable_x64(True):
        return np.asarray(a, np.float64)


def forward_differences(z):
    gy, gx = np.zeros_like(z), np.zeros_like(z)
    gy[:-1], gx[:, :-1] = z[1:] - z[:-1], z[:, 1:] - z[:, :-1]
    return gy, gx


def smooth_surface(rows, cols):
    """Non-periodic, not a polynomial: exp, sin, a cross term."""
    y, x = np.mgrid[:rows, :cols] / max(rows, cols)
    return np.exp(1.5 * x) * np.sin(2.5 * y + 0.3) + x * y


# -- integrate_gradient ---------------------------------------------------------------------


# few shapes, reused: each new one compiles the solvers again
SMALL, MID, BIG = (9, 11), (33, 17), (64, 80)


@pytest.mark.parametrize(
    ("shape", "sampling"),
    [((1, 1), "centred"), ((1, 6), "forward"), ((5, 1), "centred"), (SMALL, "centred"), (SMALL, "forward")],
)
def test_least_squares_equals_a_dense_solve(shape, sampling):
    rng = np.random.default_rng(sum(shape))
    gy, gx = rng.normal(size=shape), rng.normal(size=shape)  # not integrable: a real least-squares problem
    expected = ref.least_squares_surface(gy, gx, sampling)
    out = host(integrate_gradient(gy, gx, sampling=sampling, dtype=np.float64))
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)
    out32 = host(integrate_gradient(gy.astype(np.float32), gx.astype(np.float32), sampling=sampling))
    np.testing.assert_allclose(out32, expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float64, 1e-12), (np.float32, 1e-6)])
@pytest.mark.parametrize("shape", [BIG, MID])
def test_forward_differences_of_any_surface_come_back(shape, dtype, tolerance):
    z = smooth_surface(*shape)
    out = host(integrate_gradient(*forward_differences(z), sampling="forward", dtype=dtype))
    expected = z - z.mean()
    assert np.abs(out - expected).max() <= tolerance * np.abs(expected).max()
    assert abs(out.mean()) <= tolerance * np.abs(expected).max()


@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float64, 1e-12), (np.float32, 1e-6)])
def test_centred_sampling_is_exact_for_a_quadratic(dtype, tolerance):
    y, x = np.mgrid[: BIG[0], : BIG[1]] * 0.1
    z = 0.7 * y**2 - 0.5 * x * y + 0.2 * x**2 + x - 3 * y
    out = host(integrate_gradient(1.4 * y - 0.5 * x - 3, -0.5 * y + 0.4 * x + 1, spacing=0.1, dtype=dtype))
    expected = z - z.mean()
    assert np.abs(out - expected).max() <= tolerance * np.abs(expected).max()


@pytest.mark.slow
def test_centred_sampling_converges_at_second_order():
    errors = []
    for n in (16, 32, 64):
        y, x = np.mgrid[:n, :n] / n
        z = np.exp(1.5 * x) * np.sin(2.5 * y + 0.3)
        gy, gx = 2.5 * np.exp(1.5 * x) * np.cos(2.5 * y + 0.3), 1.5 * z
        out = host(integrate_gradient(gy, gx, spacing=1 / n, dtype=np.float64))
        errors.append(np.abs(out - (z - z.mean())).max())
    assert 3.5 < errors[0] / errors[1] < 4.5 and 3.5 < errors[1] / errors[2] < 4.5


@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float64, 1e-12), (np.float32, 1e-6)])
@pytest.mark.parametrize("shape", [BIG, MID])
def test_frankot_chellappa_is_exact_for_a_periodic_band_limited_surface(shape, dtype, tolerance):
    rows, cols = shape
    y, x = np.mgrid[:rows, :cols].astype(float)
    wy, wx = 2 * np.pi / rows, 2 * np.pi / cols
    z = np.sin(wy * y) * np.cos(2 * wx * x) + 0.3 * np.cos(3 * wy * y + 1)
    gy = wy * np.cos(wy * y) * np.cos(2 * wx * x) - 0.9 * wy * np.sin(3 * wy * y + 1)
    gx = -2 * wx * np.sin(wy * y) * np.sin(2 * wx * x)
    out = host(integrate_gradient(gy, gx, method="frankot-chellappa", dtype=dtype))
    assert np.abs(out - (z - z.mean())).max() <= tolerance * np.abs(z).max()
    in_float64 = host(integrate_gradient(gy, gx, method="frankot-chellappa", dtype=np.float64))
    np.testing.assert_allclose(in_float64, ref.frankot_chellappa(gy, gx), atol=1e-12)


@pytest.mark.slow
def test_frankot_chellappa_mirror_helps_a_non_periodic_surface():
    y, x = np.mgrid[: BIG[0], : BIG[1]] / 64
    z = np.exp(1.5 * x) * np.sin(2.5 * y + 0.3)
    gy, gx = 2.5 * np.exp(1.5 * x) * np.cos(2.5 * y + 0.3) / 64, 1.5 * z / 64
    expected = z - z.mean()
    plain = np.abs(host(integrate_gradient(gy, gx, method="frankot-chellappa")) - expected).max()
    mirrored = np.abs(host(integrate_gradient(gy, gx, method="frankot-chellappa", mirror=True)) - expected).max()
    least_squares = np.abs(host(integrate_gradient(gy, gx)) - expected).max()
    assert mirrored < plain / 4 and least_squares < mirrored


@pytest.mark.parametrize("method", ["least-squares", pytest.param("frankot-chellappa", marks=pytest.mark.slow)])
def test_noise_does_not_blow_up(method):
    """White noise of std s on each slope gives a surface error of the order of s (it grows only like the
    logarithm of the image size), not a drift across the image."""
    n = BIG[0]
    z = smooth_surface(*BIG) * 20
    gy, gx = forward_differences(z)
    clean = host(
        integrate_gradient(gy, gx, method=method, sampling="forward" if method == "least-squares" else "centred")
    )
    rng = np.random.default_rng(0)
    s = 0.05
    noisy_y, noisy_x = gy + rng.normal(0, s, gy.shape), gx + rng.normal(0, s, gx.shape)
    sampling = "forward" if method == "least-squares" else "centred"
    out = host(integrate_gradient(noisy_y, noisy_x, method=method, sampling=sampling))
    error = out - clean
    assert np.std(error) < 0.5 * s * np.log(n) and np.abs(error).max() < 2 * s * np.log(n)


# -- NaN holes ---------------------------------------------------------------------------------


def holes(shape, seed=0, fraction=0.03, border=True):
    """Scattered NaN pixels and a disc hole, and a NaN pixel on the border (none there without ``border``)."""
    rng = np.random.default_rng(seed)
    rows, cols = shape
    y, x = np.mgrid[:rows, :cols]
    mask = rng.random(shape) < fraction
    mask |= (y - rows // 2) ** 2 + (x - cols // 3) ** 2 < (min(shape) // 6) ** 2
    if border:
        mask[0, cols // 2] = True
    else:
        mask[[0, -1], :] = mask[:, [0, -1]] = False
    return mask


@pytest.mark.parametrize(
    ("sampling", "dtype", "tolerance"),
    [("forward", np.float64, 1e-10), ("centred", np.float64, 1e-10), ("forward", np.float32, 2e-5)],
)
def test_holes_in_a_harmonic_surface_are_filled_exactly(sampling, dtype, tolerance):
    """A quadratic harmonic surface: its slopes are exact in both samplings, and the membrane across the
    holes is the surface itself (the 5-point Laplacian of x^2 - y^2 + xy is 0; not on the border, where
    the membrane's Neumann condition is not the surface's)."""
    y, x = np.mgrid[: BIG[0], : BIG[1]] * 0.1
    z = x**2 - y**2 + 0.5 * x * y
    if sampling == "forward":
        gy, gx = forward_differences(z)
    else:
        gy, gx = (-2 * y + 0.5 * x) * 0.1, (2 * x + 0.5 * y) * 0.1
    mask = holes(z.shape, border=False)
    gy[mask], gx[mask] = np.nan, np.nan
    out = host(integrate_gradient(gy, gx, sampling=sampling, dtype=dtype))
    assert np.isfinite(out).all()
    expected = z - z.mean()
    assert np.abs(out - expected).max() <= tolerance * np.abs(expected).max()


def test_holes_leave_the_known_region_exact():
    z = smooth_surface(*BIG)
    gy, gx = forward_differences(z)
    mask = holes(z.shape, seed=1)
    gy[mask] = np.nan  # only gy: the x slopes there are still known
    out = host(integrate_gradient(gy, gx, sampling="forward", dtype=np.float64))
    difference = out - z
    known = ~mask
    assert np.ptp(difference[known]) < 1e-10
    # inside the disc the membrane interpolates: close, not exact (the surface is not harmonic)
    assert np.abs(difference - difference[known].mean()).max() < 0.05 * np.ptp(z)


def test_frankot_chellappa_fills_holes():
    rows, cols = BIG
    y, x = np.mgrid[:rows, :cols].astype(float)
    z = np.sin(2 * np.pi * y / rows) * np.cos(2 * np.pi * x / cols)
    gy = 2 * np.pi / rows * np.cos(2 * np.pi * y / rows) * np.cos(2 * np.pi * x / cols)
    gx = -2 * np.pi / cols * np.sin(2 * np.pi * y / rows) * np.sin(2 * np.pi * x / cols)
    mask = holes(z.shape, fraction=0.01)
    gy[mask], gx[mask] = np.nan, np.inf
    out = host(integrate_gradient(gy, gx, method="frankot-chellappa"))
    assert np.isfinite(out).all()
    error = np.abs(out - (z - z.mean()))
    assert error[~mask].max() < 0.02 and error[mask].max() < 0.1  # the holes: a membrane


@pytest.mark.parametrize("method", ["least-squares", pytest.param("frankot-chellappa", marks=pytest.mark.slow)])
def test_all_nan_gives_nan_and_one_pixel_gives_zero(method):
    nan = np.full((2, *SMALL), np.nan)
    nan[1] = 1.0  # the second image is complete
    out = host(integrate_gradient(nan, nan, method=method))
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
    assert host(integrate_gradient([[2.0]], [[3.0]], method=method)).tolist() == [[0.0]]


# -- batches, jit, dtypes, dask -----------------------------------------------------------------


def test_batch_axes_are_independent_images(method="least-squares"):
    rng = np.random.default_rng(3)
    gy, gx = rng.normal(size=(2, 2, *SMALL)), rng.normal(size=(2, 2, *SMALL))
    gy[1, 1, 4, 4] = np.nan  # holes in one image only
    out = host(integrate_gradient(gy, gx, method=method, dtype=np.float64))
    for index in np.ndindex(2, 2):
        single = host(integrate_gradient(gy[index], gx[index], method=method, dtype=np.float64))
        np.testing.assert_allclose(out[index], single, atol=1e-10)


def test_under_jit_and_for_integer_and_half_inputs():
    rng = np.random.default_rng(4)
    gy, gx = rng.normal(size=SMALL).astype(np.float32), rng.normal(size=SMALL).astype(np.float32)
    eager = host(integrate_gradient(gy, gx))
    traced = host(jax.jit(lambda a, b: integrate_gradient(a, b))(gy, gx))
    np.testing.assert_allclose(traced, eager, atol=1e-6)
    ints = rng.integers(-5, 5, SMALL).astype(np.int16)
    np.testing.assert_allclose(host(integrate_gradient(ints, ints)), ref.least_squares_surface(ints, ints), atol=1e-5)
    half = gy.astype(np.float16)
    np.testing.assert_allclose(host(integrate_gradient(half, half)), ref.least_squares_surface(half, half), atol=1e-5)
    assert integrate_gradient(gy, gx).dtype == np.float32
    assert integrate_gradient(gy, gx, dtype=np.float64).dtype == np.float64
    assert not jax.config.jax_enable_x64


@pytest.mark.parametrize("method", ["least-squares", pytest.param("frankot-chellappa", marks=pytest.mark.slow)])
def test_dask_is_lazy_and_equal(method):
    rng = np.random.default_rng(5)
    gy, gx = rng.normal(size=(3, *SMALL)), rng.normal(size=(3, *SMALL))
    gy[0, 3, 3] = np.nan
    lazy_y, lazy_x = da.from_array(gy, chunks=(1, 4, 5)), da.from_array(gx, chunks=(1, *SMALL))
    with TaskCounter() as counter:
        out = integrate_gradient(lazy_y, lazy_x, method=method)
    assert counter.count == 0 and isinstance(out, da.Array)
    np.testing.assert_allclose(out.compute(), host(integrate_gradient(gy, gx, method=method)), atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"gy": np.zeros((3, 4)), "gx": np.zeros((4, 3))}, ValueError, "same shape"),
        ({"gy": np.zeros(5), "gx": np.zeros(5)}, ValueError, "at least 2 axes"),
        ({"gy": np.zeros((0, 3)), "gx": np.zeros((0, 3))}, ValueError, "zero-length"),
        ({"method": "poisson"}, ValueError, "method must be one of"),
        ({"sampling": "backward"}, ValueError, "sampling must be one of"),
        ({"method": "frankot-chellappa", "sampling": "forward"}, ValueError, "least-squares discretisation"),
        ({"mirror": True}, ValueError, "mirror is a Frankot-Chellappa option"),
        ({"mirror": "yes"}, TypeError, "mirror must be True or False"),
        ({"spacing": -1.0}, ValueError, "spacing must be positive"),
        ({"spacing": (1.0, 2.0, 3.0)}, ValueError, "(y, x) pair"),
        ({"dtype": np.int32}, ValueError, "dtype must be float32 or float64"),
        ({"gy": np.zeros((3, 3), complex), "gx": np.zeros((3, 3))}, ValueError, "gy must have a bool, integer"),
        ({"gy": "text", "gx": np.zeros((3, 3))}, TypeError, "gy must be an array"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, error, message):
    arguments = {"gy": np.zeros((3, 3)), "gx": np.zeros((3, 3)), **kwargs}
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        integrate_gradient(arguments.pop("gy"), arguments.pop("gx"), **arguments)


# -- phase ----------------------------------------------------------------------------------------


def test_phase_from_displacement_follows_the_speckle_tracking_formula():
    """A known phase, the speckle shift it makes, and back: d = distance * (wavelength / 2 pi) grad(phi) / pixel."""
    pixel, distance, wavelength = 0.65e-6, 0.5, 0.5e-10  # 0.65 um pixels, 50 cm, 24.8 keV
    y, x = np.mgrid[: BIG[0], : BIG[1]] * pixel
    phi = 8 * np.exp(-((x - 20e-6) ** 2 + (y - 22e-6) ** 2) / (2 * (8e-6) ** 2))  # radians
    dphi_dy = -phi * (y - 22e-6) / (8e-6) ** 2
    dphi_dx = -phi * (x - 20e-6) / (8e-6) ** 2
    to_pixels = distance * wavelength / (2 * np.pi) / pixel
    dy, dx = dphi_dy * to_pixels, dphi_dx * to_pixels
    assert 0.05 < np.abs(dx).max() < 5  # a realistic shift, in pixels
    geometry = {"pixel_size": pixel, "distance": distance, "wavelength": wavelength}
    out = host(phase_from_displacement(dy, dx, **geometry, dtype=np.float64))
    np.testing.assert_allclose(out, phi - phi.mean(), atol=2e-3 * phi.max())
    magnified = host(phase_from_displacement(dy, dx, **geometry, magnification=2.0, dtype=np.float64))
    np.testing.assert_allclose(magnified, out / 2, atol=1e-9)
    lazy = phase_from_displacement(da.from_array(dy), da.from_array(dx), **geometry)
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), out, atol=1e-4 * phi.max())
    with pytest.raises(ValueError, match="distance must be positive"):
        phase_from_displacement(dy, dx, pixel_size=pixel, distance=0, wavelength=wavelength)
    with pytest.raises(TypeError, match="wavelength must be a real number"):
        phase_from_displacement(dy, dx, pixel_size=pixel, distance=1, wavelength="1e-10")


# -- strain_field ---------------------------------------------------------------------------------


@pytest.fixture(params=["numpy", "jax"])
def strain_path(request, monkeypatch):
    """Every strain test on both paths: NumPy (small fields, the default for these sizes) and JAX (larger ones;
    windows over 63, done by runs, always take it)."""
    from napari_gridmip.core.correlation import fields

    monkeypatch.setattr(fields, "NUMPY_STRAIN_MAX", 2**62 if request.param == "numpy" else 0)
    return request.param


@pytest.mark.parametrize(
    ("shape", "window", "kind"),
    [
        (SMALL, (3, 3), "small"),
        ((7, 5), (5, 3), "green-lagrange"),
        ((4, 13), (7, 9), "small"),
        (SMALL, (65, 5), "small"),
    ],
)
@pytest.mark.usefixtures("strain_path")
def test_strain_equals_a_plane_fit_loop(shape, window, kind):
    """Awkward shapes, windows wider than the image (65: the runs of 1, 2, 4, ... samples rather than direct
    sums), NaN at an edge and inside."""
    rng = np.random.default_rng(shape[0] * 7 + window[1])
    dy, dx = rng.normal(size=shape), rng.normal(size=shape)
    dy[1, 2] = np.nan
    dx[shape[0] - 1, 0] = np.nan
    expected = ref.strain(dy, dx, window, kind, spacing=(0.5, 2.0))
    out = strain_field(dy, dx, window=window, kind=kind, spacing=(0.5, 2.0), dtype=np.float64)
    for got, want in zip(out, expected):
        np.testing.assert_allclose(host(got), want, rtol=0, atol=1e-11)
    out32 = strain_field(dy.astype(np.float32), dx.astype(np.float32), window=window, kind=kind, spacing=(0.5, 2.0))
    for got, want in zip(out32, expected):
        np.testing.assert_allclose(host(got), want, rtol=0, atol=2e-5 * max(1.0, np.nanmax(np.abs(want))))


@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float64, 1e-15), (np.float32, 1e-8)])
@pytest.mark.usefixtures("strain_path")
def test_linear_displacement_is_exact_everywhere(dtype, tolerance):
    y, x = np.mgrid[: BIG[0], : BIG[1]].astype(float)
    dx = 30.3 + 1e-3 * x + 2e-3 * y  # a large rigid offset too
    dy = -12.2 + 3e-3 * x - 1e-3 * y
    exx, eyy, exy = (host(e) for e in strain_field(dy, dx, window=7, dtype=dtype))
    np.testing.assert_allclose(exx, 1e-3, rtol=0, atol=tolerance * 1e3)
    np.testing.assert_allclose(eyy, -1e-3, rtol=0, atol=tolerance * 1e3)
    np.testing.assert_allclose(exy, 2.5e-3, rtol=0, atol=tolerance * 1e3)
    g = strain_field(dy, dx, window=7, kind="green-lagrange", dtype=dtype)
    np.testing.assert_allclose(host(g.exx), 1e-3 + (1e-6 + 9e-6) / 2, rtol=0, atol=tolerance * 1e3)


@pytest.mark.usefixtures("strain_path")
def test_quadratic_displacement_is_exact_where_the_window_is_whole():
    y, x = np.mgrid[: MID[0], : MID[1]].astype(float)
    dx = 1e-3 * x**2 + 2e-4 * x * y - 3e-4 * y**2
    dy = 5e-4 * y**2 - 1e-4 * x * y
    exx, eyy, exy = (host(e) for e in strain_field(dy, dx, window=(7, 5), dtype=np.float64))
    true_exx, true_eyy = 2e-3 * x + 2e-4 * y, 1e-3 * y - 1e-4 * x
    true_exy = (2e-4 * x - 6e-4 * y - 1e-4 * y) / 2
    inner = (slice(3, -3), slice(2, -2))
    for got, want in ((exx, true_exx), (eyy, true_eyy), (exy, true_exy)):
        np.testing.assert_allclose(got[inner], want[inner], rtol=0, atol=1e-15)
    # at the borders the window is one-sided: biased by the curvature, as the plane-fit loop is
    assert np.abs(exx - true_exx).max() > 1e-4
    np.testing.assert_allclose(exx, ref.strain(dy, dx, (7, 5))[0], atol=1e-14)


@pytest.mark.usefixtures("strain_path")
def test_nan_pixels_and_windows_without_three_points():
    dy, dx = np.zeros(SMALL), np.tile(np.arange(SMALL[1]) * 0.01, (SMALL[0], 1))
    dy[2, 3] = np.nan
    exx = host(strain_field(dy, dx, window=3).exx)
    assert np.isnan(exx[2, 3]) and np.isfinite(np.delete(exx.ravel(), 2 * SMALL[1] + 3)).all()
    np.testing.assert_allclose(exx[np.isfinite(exx)], 0.01, atol=1e-7)
    line = np.full(SMALL, np.nan)
    line[2] = 1.0  # valid pixels on one line: no plane
    assert np.isnan(host(strain_field(line, line, window=3).exx)).all()
    single_row = host(strain_field(np.zeros((1, 8)), np.arange(8.0)[None], window=3).exx)
    assert np.isnan(single_row).all()


@pytest.mark.usefixtures("strain_path")
@given(st.sampled_from([3, 5]), st.integers(0, 2**16))
@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_strain_of_a_transposed_field_is_transposed(w, seed):
    batch, rows, cols = 2, 7, 5
    rng = np.random.default_rng(seed)
    dy, dx = rng.normal(size=(batch, rows, cols)), rng.normal(size=(batch, rows, cols))
    out = strain_field(dy, dx, window=(w, 3), dtype=np.float64)
    swapped = strain_field(dx.swapaxes(-1, -2), dy.swapaxes(-1, -2), window=(3, w), dtype=np.float64)
    np.testing.assert_allclose(host(out.exx), host(swapped.eyy).swapaxes(-1, -2), atol=1e-10)
    np.testing.assert_allclose(host(out.exy), host(swapped.exy).swapaxes(-1, -2), atol=1e-10)


@pytest.mark.usefixtures("strain_path")
def test_strain_under_jit_and_on_dask():
    rng = np.random.default_rng(6)
    dy, dx = rng.normal(size=(2, *MID)), rng.normal(size=(2, *MID))
    dy[0, 10, 10] = np.nan
    eager = strain_field(dy, dx, window=5)
    traced = jax.jit(lambda a, b: strain_field(a, b, window=5))(dy.astype(np.float32), dx.astype(np.float32))
    for a, b in zip(eager, traced):
        np.testing.assert_allclose(host(a), host(b), atol=1e-6, equal_nan=True)
    with TaskCounter() as counter:
        lazy = strain_field(da.from_array(dy, chunks=(1, 17, 17)), da.from_array(dx, chunks=(2, 33, 9)), window=5)
    assert counter.count == 0 and all(isinstance(e, da.Array) for e in lazy)
    for a, b in zip(lazy, eager):
        np.testing.assert_allclose(a.compute(), host(b), atol=2e-6, equal_nan=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"window": 4}, ValueError, "window sizes must be odd"),
        ({"window": 1}, ValueError, "window entries must be >= 3"),
        ({"window": (3, 3, 3)}, ValueError, "window must have 2 entries"),
        ({"kind": "log"}, ValueError, "kind must be one of"),
        ({"spacing": 0}, ValueError, "spacing must be positive"),
    ],
)
def test_strain_bad_options(kwargs, error, message):
    with pytest.raises(error, match=message):
        strain_field(np.zeros(SMALL), np.zeros(SMALL), **kwargs)


def test_small_fields_are_fitted_in_numpy_equal_to_jax_and_compile_nothing(monkeypatch):
    """A DIC-like float32 field (smooth strain, noise, NaN holes): the NumPy path (what a small field takes)
    against the JAX path, and no program traced for it."""
    from napari_gridmip.core.correlation import fields
    from tests.helpers import count_traces

    rng = np.random.default_rng(11)
    y, x = np.mgrid[:120, :96].astype(np.float32)
    dx = (3e-3 * x + 1e-5 * x * y + 0.02 * rng.standard_normal(x.shape)).astype(np.float32)
    dy = (-2e-3 * y + 4e-6 * x**2 + 0.02 * rng.standard_normal(x.shape)).astype(np.float32)
    dx[40:44, 10:13] = np.nan
    dy[0, :] = np.nan
    with count_traces() as traced:
        small = strain_field(dy, dx, window=11, kind="green-lagrange", spacing=4.0)
    assert traced.count == 0 and all(isinstance(e, jax.Array) and e.dtype == np.float32 for e in small)
    monkeypatch.setattr(fields, "NUMPY_STRAIN_MAX", 0)
    big = strain_field(dy, dx, window=11, kind="green-lagrange", spacing=4.0)
    for a, b in zip(small, big):
        a, b = host(a), host(b)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        # float32 rounding in another order (NumPy's against XLA's fused loops): the plane-fit test's tolerance
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * np.nanmax(np.abs(b)))
