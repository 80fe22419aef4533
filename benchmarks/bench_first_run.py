"""First-run time of each widget's job, in a fresh process, with and without the persistent compile cache.

    python benchmarks/bench_first_run.py

Each row runs the job that the widget runs (napari_gridmip._jobs, on the
widget's sample) in a new Python process, timing its first call (compile
included) and then a second call (compiled):

- "no cache": JAX's persistent compilation cache off (what every napari start paid before);
- "first session": the cache on and empty (the first napari start pays the compile and fills it);
- "second session": the cache on and filled by the session before.

A last table times the first call of find_displacement for growing window sizes
in one process, to show that compile time stays bounded as a user tries windows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from napari_gridmip import _jobs, _sample_data
    from napari_gridmip._jobs import correlation, mipmap, patches
    from napari_gridmip._placement import Frame

    kind, use_cache = sys.argv[1], sys.argv[2] == "1"
    if use_cache:
        _jobs.prepare_jax()
    else:
        import jax
    def frame(ndim):
        n = ndim
        return Frame(n, np.ones(n), np.zeros(n), np.eye(n), np.zeros(n * (n - 1) // 2), np.eye(n + 1))
    if kind == "mipmap":
        volume = _sample_data.make_occupancy_volume()
        job = mipmap.make_mipmap_job(mipmap.MipmapRequest("v", volume, frame(3), 0.0))
    elif kind == "merge":
        patches, tiling = _sample_data.make_image_tiles()
        job = patches.make_merge_job(patches.MergeRequest(
            "t", patches, tiling["image_shape"], tiling["stride"], "gaussian", frame(5), (2, 3, 4)))
    else:
        window = int(kind.split("-")[1])
        img1, img2, _ = _sample_data.make_speckle_pair()
        request = correlation.CorrelationRequest("a", "b", img1, img2, frame(3), (window, window))
        job = correlation.make_correlation_job(request)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        job.run(lambda done, total: None)
        times.append(time.perf_counter() - start)
    print(json.dumps(times))
    """
)

SWEEP = textwrap.dedent(
    """
    import json, time
    import numpy as np
    from napari_gridmip import find_displacement
    rng = np.random.default_rng(0)
    a, b = rng.random((2, 10, 96, 96), dtype=np.float32)
    out = []
    for w in (5, 9, 15, 21, 31):
        start = time.perf_counter()
        np.asarray(find_displacement(a, b, (w, w))[0])
        first = time.perf_counter() - start
        start = time.perf_counter()
        np.asarray(find_displacement(a, b, (w, w))[0])
        out.append((w, first, time.perf_counter() - start))
    print(json.dumps(out))
    """
)


def child(kind: str, cache: bool, cache_dir: str) -> list[float]:
    env = {"NAPARI_GRIDMIP_CACHE_DIR": cache_dir, "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, "1" if cache else "0"], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="+", default=["mipmap", "merge", "correlation-9", "correlation-15"])
    args = parser.parse_args()
    import jax

    print(f"first run of each widget's job in a fresh process; JAX {jax.__version__} on {jax.default_backend()}\n")
    print("| job (widget sample) | no cache: first s | first session: first s | second session: first s | compiled s |")
    print("|---|---:|---:|---:|---:|")
    for kind in args.jobs:
        with tempfile.TemporaryDirectory() as cache_dir:
            plain = child(kind, False, cache_dir)
            cold = child(kind, True, cache_dir)
            warm = child(kind, True, cache_dir)
        print(f"| {kind} | {plain[0]:.2f} | {cold[0]:.2f} | {warm[0]:.2f} | {min(plain[1], cold[1], warm[1]):.2f} |")

    done = subprocess.run([sys.executable, "-c", SWEEP], capture_output=True, text=True, check=True)
    print("\nfind_displacement, K=10, 96x96, float32, one process, a new window each row (no persistent cache)\n")
    print("| window | first call s (compile included) | second call s |")
    print("|---|---:|---:|")
    for w, first, second in json.loads(done.stdout.strip().splitlines()[-1]):
        print(f"| {w}x{w} | {first:.2f} | {second:.3f} |")


if __name__ == "__main__":
    main()
