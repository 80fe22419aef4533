"""Where the affine DIC's first call spends its compile on the default device: each program's trace, lowering and
XLA compile from JAX's own log, then the IC-GN band program (``affine._band``) compiled again in variants, each
from a fresh trace (issue 34: the 1024^2 affine DIC's first call on a TPU v5e took 64 s, 62 s of it compiling).

    python tools/accelerator_affine_compile.py [--size 1024] [--variants current,windows,tiles-barrier,...]

Variants of the band program (the same arguments as the first call's first band):

- ``current``: as the library runs it on this backend;
- ``cond``: the gathers inside the program, as the other branch of each step's ``lax.cond`` (the form before
  the points the windows do not serve took a band of gathers of their own);
- ``gathers``: the gathers of every pixel (``windows=False``);
- ``grid-subsets``: the reference subsets read by the grid's rows and columns alone (``affine._grid_subsets``,
  ``affine.GRID_SUBSETS``; the tiles imply it);
- ``tiles``: those, and each step's windows picked by selects out of tiles read once per band
  (``affine._tile_windows``, ``affine.TILE_WINDOWS``; the library's on a TPU since 2026-12-06);
- ``windows``: one window per point for the reference subsets and each step (the library's form before);
- ``tiles-barrier``: ``tiles`` with the grid's reads kept whole (an optimization barrier: fused into none of
  their consumers);
- ``tiles-per-image``: ``tiles`` with the grid read once per image rather than all six at once.

Each variant's outputs are compared with the first one's (largest difference, NaN left out).

On a TPU v5e, 1024^2 (2026-12-06, docs/accelerator.md), the band program compiled in 40 s with the gathers
inside (``cond``), 19 s with no ``lax.cond`` at all and 11 s with the zeros as the other branch (now the
library's), and a band ran 0.175, 0.241 and 0.178 s; the no-cond and barrier variants of those runs were
this probe at 062081a and 4c4698f. Then (eleventh session): the grid's subsets 33.5 s (a slice per subset row
and column), the tiles 33.8 s and 0.037 s a band; with the grid read by blocks, the tiles 26.8 to 28.5 s, the
per-point windows 10.9 s. The tiles' compile is the grid's reads' (the tiles themselves added 0.3 s). The
twelfth session's answer (6ad5623, each program alone): the library's form 27.6 s, ``tiles-per-image`` 27.9 s,
``tiles-barrier`` 50.2 s, ``windows`` 10.7 s: neither the reads of all images at once nor their fusion into
the steps is the cost; the block unfolds themselves compile long there.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from functools import partial
from pathlib import Path

os.environ["NAPARI_GRIDMIP_COMPILE_CACHE"] = "0"  # every program compiles
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT), str(ROOT / "tools")]


STEP = 4  # the grid's spacing of the call (px), as bench_accelerator's dic_affine


class _Compiles(logging.Handler):
    """JAX's ``Finished ... in S sec`` log lines (``jax_log_compiles``), kept as (what, seconds)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = re.match(r"Finished (.*) in ([0-9.e-]+) sec", record.getMessage())
        if match:
            self.seen.append((match.group(1), float(match.group(2))))


def _profile(compiled, a: tuple, k: dict, folder: Path) -> None:
    """One warm call of ``compiled`` under JAX's profiler into ``folder``; its summary by op printed
    (``tools/accelerator_profile.py``'s)."""
    import jax
    from accelerator_profile import _trace_events, summarise

    folder.mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(folder), create_perfetto_trace=True):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*a, **k))
        wall = time.perf_counter() - t0
    print("\n".join(summarise(_trace_events(folder), wall, 30)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--variants", default="current,grid-subsets,tiles,cond")
    parser.add_argument("--force-accelerator", action="store_true")
    parser.add_argument(
        "--compile-ahead",
        action="store_true",
        help="keep the library's compile-ahead threads (off: each program's compile alone)",
    )
    parser.add_argument("--profile", type=Path, help="a folder: each variant of --profile-variants profiled there")
    parser.add_argument("--profile-variants", default="current")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from bench_accelerator import _dic_pair

    from napari_gridmip import find_displacement
    from napari_gridmip.core import _backend
    from napari_gridmip.core.correlation import affine

    print("JAX", jax.__version__, jax.devices(), flush=True)
    if args.force_accelerator:  # the accelerators' strategies on this backend (a check of the probe on a CPU)
        _backend.spline_windows = _backend.ic_gn_rows_together = lambda: True
    if not args.compile_ahead:  # each compile timed alone, not beside the others (on by default off the CPU)
        affine.COMPILE_AHEAD = False
    handler = _Compiles()
    logging.getLogger("jax").addHandler(handler)  # its modules' records propagate to it
    logging.getLogger("jax").setLevel(logging.DEBUG)
    inputs = _dic_pair(args.size)
    captured: list[tuple[tuple, dict]] = []
    raw_band = affine._band.__wrapped__
    jitted_band = affine._band

    class Recording:
        """``affine._band`` that keeps its first call's arguments."""

        def __call__(self, *a, **k):
            if not captured:
                captured.append((a, k))
            return jitted_band(*a, **k)

        def __getattr__(self, name):
            return getattr(jitted_band, name)

    affine._band = Recording()
    jax.config.update("jax_log_compiles", True)
    t0 = time.perf_counter()
    out = find_displacement(inputs["img1"], inputs["img2"], (11, 11), subset=(31, 31), step=STEP, subpixel="refine",
                            shape="affine")  # fmt: skip
    jax.block_until_ready(out)
    first = time.perf_counter() - t0
    jax.config.update("jax_log_compiles", False)
    affine._band = jitted_band
    print(f"first call {first:.1f} s (windows {_backend.spline_windows()}, together {_backend.ic_gn_rows_together()})")
    for what, seconds in handler.seen:
        if seconds >= 0.05:
            print(f"  {seconds:7.2f} s  {what[:150]}")
    a, k = captured[0]
    statics = ("subset", "band", "windows", "together", "grid")
    original = {"_interpolate_windows": affine._interpolate_windows, "_grid_subsets": affine._grid_subsets}

    def cond(coefficients, py, px, *, subset, tiles=None, active=None):  # the gathers as the other branch (0120811)
        fit = jnp.all(affine._windows_fit(py, px, coefficients.shape[1:], subset))
        windowed = partial(original["_interpolate_windows"], subset=subset, tiles=tiles, active=active)
        return jax.lax.cond(fit, windowed,
                            lambda c, y, x: (affine._interpolate(c, y, x), jnp.ones(y.shape[0], bool)),
                            coefficients, py, px)  # fmt: skip

    def barrier(images, top, left, subset, *, grid):  # the grid's reads kept whole, fused into no consumer
        return jax.lax.optimization_barrier(original["_grid_subsets"](images, top, left, subset, grid=grid))

    def per_image(images, top, left, subset, *, grid):  # one read of the grid per image
        return tuple(original["_grid_subsets"]((img,), top, left, subset, grid=grid)[0] for img in images)

    tiles = {"grid": (STEP, 11 // 2 + affine.TILE_SLACK)}  # the call's search window: 11
    variants = {
        "current": ({}, {}),
        "windows": ({}, {"grid": None}),
        "cond": ({"_interpolate_windows": cond}, {}),
        "gathers": ({}, {"windows": False, "grid": None}),
        "grid-subsets": ({}, {"grid": (STEP, 0)}),
        "tiles": ({}, tiles),
        "tiles-barrier": ({"_grid_subsets": barrier}, tiles),
        "tiles-per-image": ({"_grid_subsets": per_image}, tiles),
    }
    reference = None
    unknown = set(args.variants.split(",")) - set(variants)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {sorted(variants)}")
    for name in args.variants.split(","):
        patch, options = variants[name]
        for key, value in patch.items():
            setattr(affine, key, value)
        try:
            fresh = jax.jit(lambda *x, **y: raw_band(*x, **y), static_argnames=statics)
            kw = {**k, **options}
            t0 = time.perf_counter()
            lowered = fresh.lower(*a, **kw)
            t1 = time.perf_counter()
            compiled = lowered.compile()
            t2 = time.perf_counter()
            ops = lowered.as_text().count("\n")
            fields, unserved = jax.block_until_ready(
                compiled(*a, **{key: v for key, v in kw.items() if key not in statics})
            )
            t3 = time.perf_counter()
            fields = [np.asarray(f) for f in fields]
            reference = fields if reference is None else reference
            apart = max(float(np.nanmax(np.abs(f - r), initial=0)) for f, r in zip(fields, reference))
            compiled(*a, **{key: v for key, v in kw.items() if key not in statics})
            jax.block_until_ready(compiled(*a, **{key: v for key, v in kw.items() if key not in statics}))
            t4 = time.perf_counter()
            if args.profile and name in args.profile_variants.split(","):
                _profile(compiled, a, {key: v for key, v in kw.items() if key not in statics}, args.profile / name)
            print(f"variant {name:12s}: trace+lower {t1 - t0:6.2f} s, compile {t2 - t1:6.2f} s, {ops} lines of "
                  f"StableHLO, first run {t3 - t2:.3f} s, warm {(t4 - t3) / 2:.3f} s; outputs within {apart:.1e} of "
                  f"the first variant's; {int(np.asarray(unserved).sum())} points not served (their outputs "
                  f"not the IC-GN's: the library runs the gathers' band for them)", flush=True)  # fmt: skip
        except Exception as error:  # a variant that cannot trace here: say so, go on
            print(f"variant {name}: {type(error).__name__}: {error}"[:300], flush=True)
        finally:
            for key, value in original.items():
                setattr(affine, key, value)


if __name__ == "__main__":
    main()
