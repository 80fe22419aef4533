"""First calls: how many programs each public workflow compiles, and the persistent compilation cache.

A first call's time is mostly compiling (``benchmarks/bench_first_run.py``): each program JAX traces
costs 10 ms to 3 s on this project's 2-core reference machine. These tests pin the number of programs a
routine call traces in a new process, so that a change that adds one (an eager op on a device array,
a second shape where a padded one would do) fails here rather than slowing every user's first click.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Programs traced by the first call of each workflow in a new process, called in this order, at the sizes
# below (a later row reuses what an earlier one compiled); the second call traces none. Lower a figure
# when a change removes a program; never raise one without saying why in the commit.
BUDGET = {
    "occupancy_mipmap": 1,
    "find_displacement": 3,
    "find_displacement refine": 6,
    "find_displacement subset refine": 4,  # the prefilter, padding and spline coefficients in one program
    # after the subset refine call: its search is the Hessian step's (its own inputs program, band and join), then each
    # item's images, the IC-GN band and the join
    "find_displacement subset affine": 6,
    "track_speckles": 3,
    "local_correlation_image": 3,
    "traverse_occupied": 3,
    "register_tiles": 0,  # small mosaics take the NumPy engine
    "fuse_tiles": 2,
    "filter_tiled": 0,  # SciPy's filters, tile by tile
    "strain_field": 0,  # small fields are fitted in NumPy
}

COUNT = textwrap.dedent(
    """
    import json
    import numpy as np
    import jax, jax.monitoring
    import napari_gridmip as gm
    from napari_gridmip._sample_data.mosaic import make_mosaic, microscope_tiles

    TRACE = "/jax/core/compile/jaxpr_trace_duration"
    n = [0]
    jax.monitoring.register_event_duration_secs_listener(lambda e, d, **_: n.__setitem__(0, n[0] + (e == TRACE)))
    rng = np.random.default_rng(0)
    vol = np.zeros((40, 48, 56), np.float32)
    vol[5:9, 10:20, 30:33] = 1
    a, b = rng.random((2, 6, 48, 64), dtype=np.float32)
    pair = rng.random((2, 1, 96, 96), dtype=np.float32)
    mosaic = make_mosaic(grid_shape=(2, 3), tile_shape=(64, 80), overlap=0.15, noise=0)
    tiles = microscope_tiles(mosaic)
    origins, directions = rng.uniform(0, 40, (3000, 3)), rng.normal(size=(3000, 3)) + 0.1
    calls = {
        "occupancy_mipmap": lambda: gm.occupancy_mipmap(vol),
        "find_displacement": lambda: gm.find_displacement(a, b, (7, 7)),
        "find_displacement refine": lambda: gm.find_displacement(a, b, (7, 7), subpixel="refine"),
        "find_displacement subset refine": lambda: gm.find_displacement(
            pair[0], pair[1], (9, 9), subset=(15, 15), step=4, subpixel="refine"),
        "find_displacement subset affine": lambda: gm.find_displacement(
            pair[0], pair[1], (9, 9), subset=(15, 15), step=4, subpixel="refine", shape="affine"),
        "track_speckles": lambda: gm.track_speckles(a, b, (7, 7), subset=(3, 3)),
        "local_correlation_image": lambda: gm.local_correlation_image(a),
        "traverse_occupied": lambda: gm.traverse_occupied(gm.occupancy_mipmap(vol), origins, directions),
        "register_tiles": lambda: gm.register_tiles(tiles, mosaic.stage_positions, max_shift=8),
        "fuse_tiles": lambda: gm.fuse_tiles(tiles, mosaic.true_positions),
        "filter_tiled": lambda: gm.filter_tiled(a[0], (32, 32), name="gaussian", sigma=1.0),
        "strain_field": lambda: gm.strain_field(a[0], a[1], window=11),
    }
    out = {}
    for name, call in calls.items():
        before = n[0]
        jax.block_until_ready(call())
        first = n[0] - before
        jax.block_until_ready(call())
        out[name] = [first, n[0] - before - first]
    print(json.dumps(out))
    """
)


def test_routine_first_calls_compile_no_more_programs_than_budgeted(tmp_path):
    env = {**os.environ, "NAPARI_GRIDMIP_COMPILE_CACHE": "0"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", COUNT], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(counts) == set(BUDGET)
    over = {name: (first, BUDGET[name]) for name, (first, _) in counts.items() if first > BUDGET[name]}
    assert over == {}, f"first calls trace more programs than budgeted (traced, budget): {over}"
    again = {name: second for name, (_, second) in counts.items() if second}
    assert again == {}, f"second calls traced programs again: {again}"


CACHE_PROBE = textwrap.dedent(
    """
    import numpy as np, jax
    import napari_gridmip as gm
    rng = np.random.default_rng(0)
    a, b = rng.random((2, 4, 24, 24), dtype=np.float32)
    np.asarray(gm.find_displacement(a, b, (5, 5))[0])
    print("DIR", jax.config.jax_compilation_cache_dir)
    """
)


def _probe(env_extra: dict[str, str]) -> str:
    ours = ("JAX_COMPILATION_CACHE_DIR", "NAPARI_GRIDMIP_COMPILE_CACHE")
    env = {k: v for k, v in os.environ.items() if k not in ours}
    done = subprocess.run(
        [sys.executable, "-c", CACHE_PROBE], env={**env, **env_extra}, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def test_library_calls_keep_compiled_programs_in_the_per_user_cache(tmp_path):
    line = _probe({"NAPARI_GRIDMIP_CACHE_DIR": str(tmp_path)})
    assert line == f"DIR {tmp_path / 'jax'}"
    assert len(_files(tmp_path / "jax")) >= 1  # the search program took well over 0.05 s to compile


def test_the_users_own_cache_folder_wins(tmp_path):
    theirs = tmp_path / "theirs"
    line = _probe({"NAPARI_GRIDMIP_CACHE_DIR": str(tmp_path / "ours"), "JAX_COMPILATION_CACHE_DIR": str(theirs)})
    assert line == f"DIR {theirs}"
    assert _files(tmp_path / "ours") == []


@pytest.mark.parametrize("value", ["0", "off"])
def test_the_cache_can_be_left_off(tmp_path, value):
    line = _probe({"NAPARI_GRIDMIP_CACHE_DIR": str(tmp_path), "NAPARI_GRIDMIP_COMPILE_CACHE": value})
    assert line == "DIR None"
    assert _files(tmp_path) == []
