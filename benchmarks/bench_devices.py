"""The band programs over every local device against the same calls on one device, in one process.

Peers: each case with ``NAPARI_GRIDMIP_SHARD_BANDS=0`` (one device), alternating; ``--first-calls`` adds each
mode's first call in a new process. Cases dic, maps, tracking, corrimage, mipmap.

    python -m benchmarks run devices [--quick] [--cases dic,corrimage] [--first-calls]
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/bench_devices.py   # 8 host devices
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

CASES = ("dic", "maps", "tracking", "corrimage", "mipmap")
SWITCH = "NAPARI_GRIDMIP_SHARD_BANDS"


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
``napari_gridmip/core/runtime/sharding.py``: the band programs of DIC, speckle tracking and the maps'
displacement search, the correlation image's chunks and the dask mipmap's blocks run on every local device of the
call's platform; ``NAPARI_GRIDMIP_SHARD_BANDS=0`` keeps them on the call's device. Each case runs both ways,
alternating (warm-up first, best of ``--repeats`` rounds), with NumPy inputs as a napari layer gives them, and
reports the ratio and how far the outputs differ. On a machine with one device both rows run the same code: the
table then shows that nothing is lost there. ``--first-calls`` adds each mode's first call in a new process with an
empty compile cache.

Cases: ``dic`` (a 1024^2 pair, window 11, subset 31, step 4, refine), ``maps`` (K=10 512^2 stacks, window 15,
hessian), ``tracking`` (K=10 512^2, window 7, subset 5), ``corrimage`` (1000 x 256^2 float32 movie), ``mipmap``
(the occupancy mipmap of a dask 256^3 float32 volume in 64^3 chunks).
"""


def _speckles(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Speckle-like frames: smoothed noise, quantised to 12 bits, with a vignette."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.random(shape), sigma=[0] * (len(shape) - 2) + [1.5, 1.5])
    yy, xx = np.mgrid[: shape[-2], : shape[-1]] / max(shape[-2:])
    vignette = 1 - 0.3 * ((yy - 0.5) ** 2 + (xx - 0.5) ** 2)
    return np.round((field - field.min()) / np.ptp(field) * 4095 * vignette).astype(np.float32)


def case(name: str, quick: bool) -> Callable[[], Any]:
    """The call of case ``name`` on its inputs (made once): NumPy (or dask) in, JAX out."""
    import napari_gridmip as gm

    side = 256 if quick else 1024
    if name == "dic":
        a = _speckles((side, side), 0)
        b = np.roll(a, (3, -2), (0, 1))
        return lambda: tuple(gm.find_displacement(a[None], b[None], (11, 11), subset=(31, 31), step=4,
                                                  subpixel="refine"))  # fmt: skip
    side //= 2
    if name in ("maps", "tracking"):
        a = _speckles((10, side, side), 1)
        b = np.roll(a, (2, 1), (1, 2))
        if name == "maps":
            return lambda: tuple(gm.find_displacement(a, b, (15, 15)))
        return lambda: tuple(vars(gm.track_speckles(b, a, (7, 7), subset=(5, 5))).values())
    if name == "corrimage":
        rng = np.random.default_rng(2)
        frames, side = (200, 64) if quick else (1000, 256)
        movie = rng.normal(size=(frames, side, side)).astype(np.float32)
        return lambda: gm.local_correlation_image(movie)
    if name == "mipmap":
        import dask.array as da

        side = 64 if quick else 256
        volume = da.from_array(np.random.default_rng(3).random((side,) * 3, np.float32), chunks=side // 4)
        return lambda: [level.compute() for level in gm.occupancy_mipmap(volume, threshold=0.99)]
    raise ValueError(f"unknown case {name!r}; choose from {', '.join(CASES)}")


def _leaves(result: Any) -> list[np.ndarray]:
    import jax

    return [np.asarray(x) for x in jax.tree_util.tree_leaves(result)]


def _in_mode(sharded: bool, call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        before = os.environ.pop(SWITCH, None)
        if not sharded:
            os.environ[SWITCH] = "0"
        try:
            return call()
        finally:
            os.environ.pop(SWITCH, None)
            if before is not None:
                os.environ[SWITCH] = before

    return run


def first_call(name: str, sharded: bool, quick: bool) -> float:
    """The first call of case ``name`` in a new process with an empty compile cache (seconds)."""
    code = (
        f"import time, sys; sys.path[:0] = {[str(HERE.parent), str(HERE)]!r}; import bench_devices as b; "
        f"call = b.case({name!r}, {quick!r}); start = time.perf_counter(); b._leaves(call()); "
        "print('FIRST', time.perf_counter() - start)"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NAPARI_GRIDMIP_CACHE_DIR=cache)
        env.pop(SWITCH, None)
        if not sharded:
            env[SWITCH] = "0"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(next(line for line in out.stdout.splitlines() if line.startswith("FIRST")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--first-calls", action="store_true", help="also each mode's first call in a new process")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    from _harness import alternate, group, machine, start_run

    start_run("devices", args)
    import jax

    from napari_gridmip.core.runtime import sharding

    devices = sharding.band_devices()
    print(machine())
    print(f"devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}); JAX {jax.__version__}")
    many = f"{len(devices)} devices"
    lines = [
        f"| case | one device, best s | {many}, best s | one / {many} | first call, one | first call, {many} "
        "| outputs: largest difference |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    rows_out = []
    for name in args.cases.split(","):
        call = case(name, args.quick)
        one, spread = _in_mode(False, call), _in_mode(True, call)
        a, b = _leaves(one()), _leaves(spread())
        gap = max((float(np.nanmax(np.abs(p.astype(float) - q.astype(float)), initial=0)) for p, q in zip(a, b)),
                  default=0.0)  # fmt: skip
        same = all(np.array_equal(p, q, equal_nan=True) for p, q in zip(a, b))
        rows = alternate([("one", one), ("many", spread)], rounds=args.repeats)
        firsts = ("", "")
        if args.first_calls:
            firsts = tuple(f"{first_call(name, s, args.quick):.2f}" for s in (False, True))
        group(name, rows, "many")
        rows[0].extra["outputs"] = rows[1].extra["outputs"] = "identical" if same else f"largest difference {gap:.2g}"
        if args.first_calls:
            rows[0].first_s, rows[1].first_s = (float(f) for f in firsts)  # a new process's, not this one's
        t1, tn = rows[0].best_s, rows[1].best_s
        note = "identical" if same else f"{gap:.2g}"
        lines.append(f"| {name} | {t1:.3f} | {tn:.3f} | {t1 / tn:.2f} | {firsts[0]} | {firsts[1]} | {note} |")
        rows_out.append(dict(case=name, one_s=t1, many_s=tn, devices=len(devices), first=firsts, outputs=note))
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(dict(when=time.strftime("%F %T"), rows=rows_out), indent=1))


if __name__ == "__main__":
    main()
