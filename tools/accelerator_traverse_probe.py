"""How traverse_occupied records its crossings on an accelerator: a scatter into each ray's slots at every step
(the CPU's way), or a ring of steps written as whole rows and flushed into the slots every few steps, by a stable
sort or by compare-and-selects (issue 34: on a TPU v5e the scatters were 3.4 of the 4.4 s of device time of the
512^3, 1M-ray case). Prints warm seconds (best of ``--repeats``) per variant and whether each gives the scatters'
records exactly.

    python tools/accelerator_traverse_probe.py [--quick] [--rings 16,32,64]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]


def select_flush(planes, empty, ring):
    """The ring's crossings moved after each column's held ones by compare-and-select: slot ``c`` takes the ring
    row whose rank among the column's new crossings is ``c - held`` (one term kept, so the sum is that value)."""
    rows, batch = empty.shape
    capacity = rows - ring
    held = jnp.sum(empty[:capacity] == 0, axis=0, dtype=jnp.int32)
    new = empty[capacity:] == 0
    target = jnp.where(new, held[None] + jnp.cumsum(new, axis=0, dtype=jnp.int32) - 1, -1)
    slots = jnp.arange(capacity, dtype=jnp.int32)[:, None]
    hit = target[None] == slots[:, None]  # (capacity, ring, batch)
    kept = slots < held[None]
    out = []
    for p in planes:
        picked = jnp.sum(jnp.where(hit, p[capacity:][None], 0), axis=1).astype(p.dtype)
        out.append(jnp.concatenate([jnp.where(kept, p[:capacity], picked), p[capacity:]]))
    filled = slots < (held + jnp.sum(new, axis=0, dtype=jnp.int32))[None]
    empty = jnp.concatenate([(~filled).astype(jnp.int8), jnp.ones((ring, batch), jnp.int8)])
    return tuple(out), empty


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rings", default="16,32,64")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import bench_accelerator

    from napari_gridmip import traverse_occupied
    from napari_gridmip.core import _backend
    from napari_gridmip.core.occupancy import traverse

    options = bench_accelerator.Options(quick=args.quick, render_size=0, sample_dir=None)
    inputs, label = bench_accelerator._traverse(options)
    print(f"{jax.default_backend()}: {label}", flush=True)
    sort_flush = traverse._flush_ring
    variants = [("scatter", 0, sort_flush)] + [(f"ring {r}, sort", int(r), sort_flush) for r in args.rings.split(",")]
    variants.append(("ring 32, selects", 32, functools.partial(select_flush, ring=32)))
    reference = None
    for name, ring, flush in variants:
        _backend.step_record_ring = lambda ring=ring: ring
        traverse._flush_ring = flush
        t0 = time.perf_counter()
        hits = traverse_occupied(inputs["levels"], inputs["origins"], inputs["directions"], t_near=-np.inf)
        first = time.perf_counter() - t0
        best = np.inf
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            hits = traverse_occupied(inputs["levels"], inputs["origins"], inputs["directions"], t_near=-np.inf)
            best = min(best, time.perf_counter() - t0)
        if reference is None:
            reference = hits
        same = all(np.array_equal(a, b) for a, b in zip(hits, reference))
        print(
            f"{name:18s} first {first:7.2f} s  warm {best:7.3f} s  crossings {len(hits.t_starts)}  "
            f"same as the scatters: {same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
