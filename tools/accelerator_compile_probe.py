"""How long XLA takes to compile one small program on this backend: the B-spline prefilter four ways, an edge pad.

    python tools/accelerator_compile_probe.py                  # sides 256, 1024 and 2048
    JAX_PLATFORMS=cpu python tools/accelerator_compile_probe.py

Issue 34 item 4 asks for first calls of at most 10 s on an accelerator. On a TPU v5e the DIC's input program
(``subsets._prepared``: the Gaussian prefilter, the edge padding and the B-spline coefficients) compiled in 9.7 s
and its band program in 25 s (``JAX_LOG_COMPILES=1 tools/first_call_split.py dic``). This probe asks whether a
different form of the prefilter compiles faster there: the library's 49 shifted slices added (``slices``), a
convolution (``conv``), a product with a banded Toeplitz matrix made inside the program (``matmul const``, a
constant of the program) or passed to it (``matmul arg``); and an edge pad alone, the least a program of that
size costs. For each: the compile (``lower().compile()``, the persistent cache off), one warm call, and the
largest difference from the library's coefficients. Results: docs/accelerator.md, "First calls".
"""

from __future__ import annotations

import math
import os
import time

os.environ["NAPARI_GRIDMIP_COMPILE_CACHE"] = "0"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from napari_gridmip.core.correlation import subsets  # noqa: E402

REACH = subsets.SPLINE_REACH
Z = math.sqrt(3) - 2


def taps() -> np.ndarray:
    return np.array([math.sqrt(3) * Z ** abs(k) for k in range(-REACH, REACH + 1)], np.float32)


def toeplitz(n_out: int) -> np.ndarray:
    """``(n_out + 2 REACH, n_out)``: column j holds the taps around row j + REACH."""
    k = np.arange(n_out + 2 * REACH)[:, None] - np.arange(n_out)[None, :] - REACH
    return np.where(np.abs(k) <= REACH, math.sqrt(3) * Z ** np.abs(k), 0.0).astype(np.float32)


def _edge(x: jax.Array, axis: int) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (REACH, REACH)
    return jnp.pad(x, widths, mode="edge")


@jax.jit
def conv(x: jax.Array) -> jax.Array:
    for axis, shape in ((2, (1, 1, 2 * REACH + 1, 1)), (3, (1, 1, 1, 2 * REACH + 1))):
        x = lax.conv_general_dilated(_edge(x, axis), jnp.asarray(taps()).reshape(shape), (1, 1), "VALID",
                                     precision=lax.Precision.HIGHEST)  # fmt: skip
    return x


@jax.jit
def matmul_const(x: jax.Array) -> jax.Array:
    y = jnp.einsum("...ij,ik->...kj", _edge(x, 2), jnp.asarray(toeplitz(x.shape[2])), precision=lax.Precision.HIGHEST)
    return jnp.matmul(_edge(y, 3), jnp.asarray(toeplitz(x.shape[3])), precision=lax.Precision.HIGHEST)


@jax.jit
def matmul_arg(x: jax.Array, ty: jax.Array, tx: jax.Array) -> jax.Array:
    y = jnp.einsum("...ij,ik->...kj", _edge(x, 2), ty, precision=lax.Precision.HIGHEST)
    return jnp.matmul(_edge(y, 3), tx, precision=lax.Precision.HIGHEST)


@jax.jit
def pad_only(x: jax.Array) -> jax.Array:
    return _edge(_edge(x, 2), 3)


def main() -> None:
    for n in (256, 1024, 2048):
        x = np.random.default_rng(0).random((1, 1, n + 60, n + 60), dtype=np.float32) * 255 - 128
        extra = (toeplitz(x.shape[2]), toeplitz(x.shape[3]))
        variants = {
            "slices": (subsets._spline_coefficients, ()),  # first: its output is the reference
            "conv": (conv, ()),
            "matmul const": (matmul_const, ()),
            "matmul arg": (matmul_arg, extra),
            "pad alone": (pad_only, ()),
        }
        library = None
        for name, (function, more) in variants.items():
            start = time.perf_counter()
            compiled = function.lower(x, *more).compile()
            compile_s = time.perf_counter() - start
            compiled(x, *more).block_until_ready()
            start = time.perf_counter()
            out = compiled(x, *more).block_until_ready()
            warm_s = time.perf_counter() - start
            if library is None:
                library = np.asarray(out, np.float64)
            diff = "" if name == "pad alone" else f"  largest difference {np.abs(np.asarray(out) - library).max():.1e}"
            line = f"{jax.default_backend()} {n}^2 {name:13s} compile {compile_s:6.2f} s  warm {warm_s * 1e3:7.1f} ms"
            print(line + diff, flush=True)


if __name__ == "__main__":
    main()
