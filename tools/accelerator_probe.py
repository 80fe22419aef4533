"""Where the accelerator's float32 differs from the CPU's: each primitive the kernels use, then each pipeline
stage, run on the default backend and on the CPU device of the same process, against a float64 NumPy value.

    python tools/accelerator_probe.py [--quick]

Prints one line per probe: the largest relative error of each backend against float64, and their largest
difference. Used to find why DIC and speckle tracking went wrong on a TPU (docs/accelerator.md).
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

CPU = jax.devices("cpu")[0]
ACC = jax.devices()[0]


def on(device, fn, *args):
    with jax.default_device(device):
        moved = [jax.device_put(a, device) if isinstance(a, np.ndarray) else a for a in args]
        return jax.tree.map(lambda x: np.asarray(x, dtype=np.float64) if hasattr(x, "dtype") else x, fn(*moved))


def report(name, fn, args, reference=None):
    try:
        a = on(ACC, fn, *args)
        c = on(CPU, fn, *args)
    except Exception as error:  # noqa: BLE001
        print(f"{name:48s} FAILED {type(error).__name__}: {str(error)[:200]}", flush=True)
        return None, None
    a_l, c_l = jax.tree.leaves(a), jax.tree.leaves(c)
    ref_l = jax.tree.leaves(reference) if reference is not None else [None] * len(a_l)
    for i, (x, y, r) in enumerate(zip(a_l, c_l, ref_l)):
        scale = np.nanmax(np.abs(y)) if np.size(y) else 1.0
        diff = np.nanmax(np.abs(x - y)) / max(scale, 1e-30) if np.size(y) else 0.0
        nan_a, nan_c = np.isnan(x).mean(), np.isnan(y).mean()
        label = name + (f"[{i}]" if len(a_l) > 1 else "")
        line = f"{label:48s} acc-cpu rel {diff:9.2e}  nan acc {nan_a:.3f} cpu {nan_c:.3f}"
        if r is not None:
            rs = np.nanmax(np.abs(r))
            line += f"  err acc {np.nanmax(np.abs(x - r)) / rs:9.2e} cpu {np.nanmax(np.abs(y - r)) / rs:9.2e}"
        print(line, flush=True)
    return a, c


def primitives(rng):
    x = rng.normal(size=(512, 512)).astype(np.float32) + 3
    y = rng.normal(size=(512, 512)).astype(np.float32)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    report("add", lambda a, b: a + b, (x, y), x64 + y64)
    report("mul", lambda a, b: a * b, (x, y), x64 * y64)
    report("div", lambda a, b: a / b, (y, x), y64 / x64)
    report("rsqrt", lambda a: lax.rsqrt(a), (x * x,), 1 / np.sqrt(x64 * x64))
    report("sqrt", jnp.sqrt, (x * x,), np.sqrt(x64 * x64))
    report("pow -1.5", lambda a: a**-1.5, (x * x,), (x64 * x64) ** -1.5)
    report("exp", jnp.exp, (y,), np.exp(y64))
    report("log", jnp.log, (x * x,), np.log(x64 * x64))
    report("sin", jnp.sin, (y * 10,), np.sin(y64 * 10))
    report("sum axis0 512", lambda a: jnp.sum(a, axis=0), (x,), x64.sum(0))
    report("sum all", jnp.sum, (x,), x64.sum())
    report("mean all", jnp.mean, (x,), x64.mean())
    box = np.ones(31)

    def rw(a):
        return lax.reduce_window(a, 0.0, lax.add, (31, 1), (1, 1), "VALID")

    ref_rw = np.apply_along_axis(lambda c: np.convolve(c, box, "valid"), 0, x64)
    report("reduce_window 31 rows", rw, (x,), ref_rw)
    report("cumsum axis0", lambda a: jnp.cumsum(a, axis=0), (x,), np.cumsum(x64, 0))
    report("matmul default", lambda a, b: a @ b, (x, y), x64 @ y64)
    report("matmul highest", lambda a, b: jnp.matmul(a, b, precision=lax.Precision.HIGHEST), (x, y), x64 @ y64)
    report("einsum highest", lambda a, b: jnp.einsum("ij,jk->ik", a, b, precision="highest"), (x, y), x64 @ y64)
    sig = rng.normal(size=(4, 256)).astype(np.float32)
    k = rng.normal(size=(4, 9)).astype(np.float32)
    report("conv1d default", lambda a, b: jnp.convolve(a[0], b[0], mode="same"), (sig, k),
           np.convolve(sig[0].astype(float), k[0].astype(float), "same"))  # fmt: skip
    report("fft2", lambda a: jnp.abs(jnp.fft.fft2(a)), (x,), np.abs(np.fft.fft2(x64)))
    report("rfft2 irfft2", lambda a: jnp.fft.irfft2(jnp.fft.rfft2(a), s=a.shape), (x,), x64)

    def running(a):  # the sweep's running sums: add the row entering, remove the row leaving
        def body(i, c):
            v = c + (a[i + 31] - a[i])
            return v

        return lax.fori_loop(0, a.shape[0] - 31, body, jnp.sum(a[:31], axis=0))

    report("running sum 481 steps", running, (x,), x64[-31:].sum(0))

    def fma_like(a, b):
        return a * b - a * (b + 1e-3)

    report("cancellation a*b - a*(b+1e-3)", fma_like, (x, y), x64 * y64 - x64 * (y64 + np.float32(1e-3)))
    report("where/isfinite", lambda a: jnp.where(jnp.isfinite(a), a, 0).sum(), (x,), x64.sum())
    tiny = np.full((8,), 1e-39, np.float32)
    report("denormal passthrough", lambda a: a * 1.0, (tiny,), tiny.astype(np.float64))
    report("x64 off: float64 input", lambda a: a.dtype.itemsize, (x64,))
    with jax.enable_x64(True):
        report("x64: float64 add", lambda a, b: a + b, (x64, y64), x64 + y64)
        report("x64: float64 sum", jnp.sum, (x64,), x64.sum())
        report("x64: float64 fft2", lambda a: jnp.abs(jnp.fft.fft2(a)), (x64,), np.abs(np.fft.fft2(x64)))
        report("x64: float64 matmul", lambda a, b: a @ b, (x64, y64), x64 @ y64)
        report("x64: float64 div", lambda a, b: a / b, (y64, x64), y64 / x64)


def pipelines(rng, quick):
    import napari_gridmip as gm
    from napari_gridmip._sample_data import make_speckle_pair
    from napari_gridmip._sample_data.dic import make_dic_pair
    from napari_gridmip.core.correlation import subsets

    size = 256 if quick else 512
    ref, deformed, field = make_dic_pair((size, size))
    img1, img2 = deformed[None].astype(np.float32), ref[None].astype(np.float32)
    w, sub, st = (11, 11), (31, 31), 4
    m = 5 + 15
    truth_dy = np.asarray(np.broadcast_to(field["dy"], (size, size)))[m : size - m : st, m : size - m : st]
    truth_dx = np.asarray(np.broadcast_to(field["dx"], (size, size)))[m : size - m : st, m : size - m : st]
    report("DIC map subset", lambda a, b: gm.windowed_pearson(a, b, w, subset=sub, step=st), (img1, img2))
    for subpixel, prefilter in (("hessian", None), ("refine", None), ("refine", "auto")):
        name = f"DIC {subpixel} prefilter={prefilter}"
        a, c = report(
            name,
            lambda a, b, subpixel=subpixel, prefilter=prefilter: tuple(
                gm.find_displacement(a, b, w, subset=sub, step=st, subpixel=subpixel, prefilter=prefilter)
            )[:2],
            (img1, img2),
            (truth_dy, truth_dx),
        )
        if a is not None:
            for label, v in (("acc", a), ("cpu", c)):
                e = np.hypot(
                    v[0] - truth_dy[: v[0].shape[0], : v[0].shape[1]], v[1] - truth_dx[: v[1].shape[0], : v[1].shape[1]]
                )
                print(f"    {label}: median error {np.nanmedian(e):.4f} px, nan {np.isnan(e).mean():.3f}", flush=True)
    x = rng.normal(size=(1, 1, 128, 160)).astype(np.float32)
    report("spline coefficients", lambda a: subsets._spline_coefficients(a), (x,))
    from napari_gridmip.core.correlation.prefilter import smooth_frames

    report("gaussian prefilter", lambda a: smooth_frames(a, sigma=0.8), (x,))
    sample, reference, (dy, dx) = make_speckle_pair(frames=10 if quick else 20, shape=(256, 256))
    a, c = report(
        "track_speckles",
        lambda s, r: (lambda t: (t.dy, t.dx, t.transmission, t.dark_field))(
            gm.track_speckles(s, r, (11, 11), subset=(5, 5))
        ),
        (sample, reference),
    )
    if a is not None:
        for label, v in (("acc", a), ("cpu", c)):
            print(
                f"    {label}: dark-field median {np.nanmedian(v[3]):.4f} "
                f"transmission {np.nanmedian(v[2]):.4f} nan {np.isnan(v[0]).mean():.3f}",
                flush=True,
            )
    gy, gx = rng.normal(size=(2, 200, 180)).astype(np.float32)
    for method in ("least-squares", "frankot-chellappa"):
        report(
            f"integrate_gradient {method}",
            lambda a, b, method=method: gm.integrate_gradient(a, b, method=method),
            (gy, gx),
        )
    report(
        "local_correlation_image",
        lambda a: gm.local_correlation_image(a),
        (rng.normal(size=(300, 64, 64)).astype(np.float32),),
    )
    small_ref, small_def, _ = make_dic_pair((128, 128))
    report(
        "DIC affine 128^2",
        lambda a, b: tuple(
            gm.find_displacement(a, b, (7, 7), subset=(21, 21), step=8, subpixel="refine", shape="affine")
        )[:2],
        (small_def[None].astype(np.float32), small_ref[None].astype(np.float32)),
    )
    report(
        "find_displacement refine dense",
        lambda a, b: tuple(gm.find_displacement(a, b, (15, 15), subpixel="refine"))[:2],
        (sample[:5], reference[:5]),
    )


if __name__ == "__main__":
    print("JAX", jax.__version__, ACC, flush=True)
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    primitives(rng)
    print(f"primitives {time.perf_counter() - t:.1f} s", flush=True)
    pipelines(rng, "--quick" in sys.argv)
    print(f"all {time.perf_counter() - t:.1f} s", flush=True)
