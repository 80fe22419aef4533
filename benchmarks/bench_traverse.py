"""Empty-space skipping: steps per ray and wall time of our hierarchical DDA against a flat DDA and dense sampling.

Peers: a flat Amanatides-Woo DDA over level 0 and dense sampling every 0.5 voxel, all in JAX, same MIP; volumes at
0.1%, 1% and 10% occupancy, clustered and uniform.

    python -m benchmarks run traverse [--quick] [--size 256 --rays 256 --repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine, measure, start_run, table  # noqa: E402

from napari_gridmip import (  # noqa: E402
    occupancy_mipmap,
    occupied_bbox,
    orthographic_rays,
    render_volume,
    traverse_occupied,
)

# ---------------------------------------------------------------------------------------------------------------------
# volumes


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
Volumes of ``size``^3 at 0.1%, 1% and 10% occupancy, made of three solid balls
and three thin spherical shells spread through the volume ("clustered"), and the
same fractions as uniform random voxels. ``rays``^2 orthographic rays through the whole volume along an
oblique direction. The three methods compute the same thing, the maximum
intensity projection of the occupied voxels (nearest voxel), all in JAX, one
jitted program per batch, after a warm-up:

- ours: ``render_volume`` (hierarchical DDA over the occupancy pyramid, the
  volume read inside the traversal); steps = cells looked up (``lookups``);
- flat DDA: Amanatides-Woo over level 0 only, one voxel per step (tMax/tDelta
  increments), the same MIP; steps = voxels of the path inside the box;
- dense sampling: a sample every 0.5 voxel along the path, nearest voxel,
  masked by level 0; steps = samples.

All three clip the rays to the occupied bounding box first (ours finds it in
the pyramid; the baselines are handed it). ``traverse_occupied`` (the packed
list of every occupied voxel crossed, moved to the host) is timed too. Steps
per ray are means over all rays (rays that miss the box count 0 for everyone).
"""


def clustered(size: int, fraction: float, seed: int = 0) -> np.ndarray:
    """Three solid balls and three spherical shells 1.5 voxels thick, spread through the volume, all scaled
    together (by bisection) until ``fraction`` of the voxels are occupied: clustered occupancy whose bounding
    box is most of the volume at every fraction.

    Kept in the temporary folder (bits packed): 512^3 takes over a minute to make, and bench_accelerator's two
    workers make the same one."""
    kept = Path(tempfile.gettempdir()) / f"napari-gridmip-clustered-{size}-{fraction}-{seed}.npy"
    if kept.exists():
        return np.unpackbits(np.load(kept), count=size**3).reshape((size,) * 3).astype(bool)
    volume = _clustered(size, fraction, seed)
    np.save(kept, np.packbits(volume))
    return volume


def _clustered(size: int, fraction: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.15, 0.85, (6, 3)) * size
    z, y, x = np.ogrid[:size, :size, :size]
    distances = [np.sqrt((z - c[0]) ** 2 + (y - c[1]) ** 2 + (x - c[2]) ** 2) for c in centres]

    def make(scale: float) -> np.ndarray:
        volume = np.zeros((size,) * 3, bool)
        for i, r in enumerate(distances):
            if i % 2 == 0:
                volume |= r <= 0.08 * size * scale
            else:
                volume |= np.abs(r - 0.15 * size * scale) < 0.75
        return volume

    low, high = 0.0, 4.0
    for _ in range(20):
        middle = (low + high) / 2
        volume = make(middle)
        if abs(volume.mean() / fraction - 1) < 0.05:
            break
        low, high = (middle, high) if volume.mean() < fraction else (low, middle)
    return volume


def uniform(size: int, fraction: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((size,) * 3, dtype=np.float32) < fraction


def values_for(occupied: np.ndarray, seed: int = 1) -> np.ndarray:
    """float32 values: above 1 where occupied, below it elsewhere (so the levels are ``volume > 1``)."""
    values = np.random.default_rng(seed).random(occupied.shape, dtype=np.float32)
    return np.where(occupied, values + 1.0, values)


# ---------------------------------------------------------------------------------------------------------------------
# baselines, in JAX


def _box(o, d, lo, hi):
    """The ray's interval inside the box [lo, hi) (the occupied bounding box: the baselines clip to it as we do)."""
    lo, hi = lo.astype(o.dtype), hi.astype(o.dtype)
    safe = jnp.where(d == 0, 1.0, d)
    t0, t1 = (lo - o) / safe, (hi - o) / safe
    inside = (o >= lo) & (o < hi)
    entry = jnp.where(d != 0, jnp.minimum(t0, t1), jnp.where(inside, -jnp.inf, jnp.inf)).max()
    leave = jnp.where(d != 0, jnp.maximum(t0, t1), jnp.where(inside, jnp.inf, -jnp.inf)).min()
    return entry, leave


@jax.jit
def flat_dda_mip(volume, occupied, origins, directions, lo, hi):
    """Amanatides-Woo on level 0: per step, one voxel (look up, read if occupied), then the nearest plane."""
    limit = jnp.asarray(volume.shape)

    def one(o, d):
        entry, leave = _box(o, d, lo, hi)
        active = entry < leave
        t = jnp.where(active, entry, 0.0)
        cell = jnp.clip(jnp.floor(o + t * d).astype(jnp.int32), 0, limit - 1)
        step = jnp.where(d > 0, 1, -1).astype(jnp.int32)
        safe = jnp.where(d == 0, 1.0, d)
        delta = jnp.where(d == 0, jnp.inf, jnp.abs(1 / safe))
        t_max = jnp.where(d == 0, jnp.inf, ((cell + (d > 0)).astype(d.dtype) - o) / safe)

        def cond(s):
            return s[0]

        def body(s):
            go, cell, t_max, best, steps = s
            hit = occupied[cell[0], cell[1], cell[2]]
            best = jnp.where(hit, jnp.maximum(best, volume[cell[0], cell[1], cell[2]]), best)
            axis = jnp.argmin(t_max)
            cell = cell.at[axis].add(step[axis])
            t_next = t_max[axis]
            t_max = t_max.at[axis].add(delta[axis])
            go = (t_next < leave) & jnp.all((cell >= 0) & (cell < limit))
            return go, cell, t_max, best, steps + 1

        init = (active, cell, t_max, jnp.array(-jnp.inf, volume.dtype), jnp.int32(0))
        _, _, _, best, steps = lax.while_loop(cond, body, init)
        return best, steps

    return jax.vmap(one)(origins, directions)


@jax.jit
def dense_sampling_mip(volume, occupied, origins, directions, lo, hi):
    """A sample every 0.5 voxel (nearest voxel), all rays in step, masked by occupancy."""
    shape = volume.shape
    h = 0.5
    entry, leave = jax.vmap(lambda o, d: _box(o, d, lo, hi))(origins, directions)
    active = entry < leave
    entry = jnp.where(active, entry, 0.0)
    leave = jnp.where(active, leave, 0.0)
    count = jnp.ceil((leave - entry) / h).astype(jnp.int32)
    limit = jnp.asarray(shape) - 1

    def body(i, best):
        t = entry + (i + 0.5) * h
        cell = jnp.clip(jnp.floor(origins + t[:, None] * directions).astype(jnp.int32), 0, limit)
        hit = occupied[cell[:, 0], cell[:, 1], cell[:, 2]] & (i < count)
        value = volume[cell[:, 0], cell[:, 1], cell[:, 2]]
        return jnp.where(hit, jnp.maximum(best, value), best)

    best = lax.fori_loop(0, count.max(), body, jnp.full(origins.shape[0], -jnp.inf, volume.dtype))
    return best, count


def batched(fn, volume, occupied, origins, directions, box, batch=16384):
    starts = range(0, len(origins), batch)
    outs = [fn(volume, occupied, origins[i : i + batch], directions[i : i + batch], *box) for i in starts]
    return jnp.concatenate([o[0] for o in outs]), jnp.concatenate([o[1] for o in outs])


# ---------------------------------------------------------------------------------------------------------------------


def timings(vol_dev, occ_dev, levels, origins, directions, o_dev, d_dev, box, repeats, hits, same, agree):
    return [
        measure(
            "render_volume MIP (ours)",
            lambda: render_volume(vol_dev, levels, origins, directions, fill=-np.inf),
            repeats=repeats,
        ),
        measure(
            "traverse_occupied (ours, packed list)",
            lambda: traverse_occupied(levels, origins, directions, t_near=-np.inf),
            repeats=repeats,
            note=f"{len(hits.t_starts)} voxels",
        ),
        measure(
            "flat DDA MIP (JAX)",
            lambda: batched(flat_dda_mip, vol_dev, occ_dev, o_dev, d_dev, box),
            repeats=repeats,
            note=f"{same:.2%} of pixels equal to ours",
        ),
        measure(
            "dense sampling MIP, 0.5 voxel (JAX)",
            lambda: batched(dense_sampling_mip, vol_dev, occ_dev, o_dev, d_dev, box),
            repeats=repeats,
            note=f"{agree:.2%} of pixels equal to ours (samples miss voxel corners)",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rays", type=int, default=256, help="rays per image side")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64^3 and 64^2 rays, one repeat: a check in seconds")
    args = parser.parse_args()
    start_run("traverse", args)
    if args.quick:
        args.size, args.rays, args.repeats = 64, 64, 1
    size, m = args.size, args.rays
    view = np.array([0.8, 0.5, 0.33])
    rays = orthographic_rays(np.full(3, size / 2), view, (0, -1, 0), (m, m), pixel_size=1.8 * size / m)
    origins = rays.origins.reshape(-1, 3).astype(np.float32)
    directions = rays.directions.reshape(-1, 3).astype(np.float32)
    o_dev, d_dev = jnp.asarray(origins), jnp.asarray(directions)
    print(f"{size}^3 volumes, {m}^2 orthographic rays along {tuple(view.round(2))}; {machine()}\n")

    steps_rows = []
    for kind, make in (("clustered", clustered), ("uniform", uniform)):
        for fraction in (0.001, 0.01, 0.1):
            occupied = make(size, fraction)
            volume = values_for(occupied)
            levels = occupancy_mipmap(volume, threshold=1.0)
            vol_dev, occ_dev = jnp.asarray(volume), jnp.asarray(occupied)
            found = occupied_bbox(levels)
            box = (jnp.asarray(found.lo), jnp.asarray(found.hi))
            ours = render_volume(vol_dev, levels, origins, directions, fill=-np.inf)
            hits = traverse_occupied(levels, origins, directions, t_near=-np.inf)
            flat, flat_steps = batched(flat_dda_mip, vol_dev, occ_dev, o_dev, d_dev, box)
            whole = (jnp.zeros(3, jnp.int32), jnp.asarray(volume.shape, jnp.int32))  # no bounding box: the volume's
            _, whole_steps = batched(flat_dda_mip, vol_dev, occ_dev, o_dev, d_dev, whole)
            dense, dense_steps = batched(dense_sampling_mip, vol_dev, occ_dev, o_dev, d_dev, box)
            same = float(np.mean(np.asarray(flat) == ours))  # the same image (float rounding may move a rare pixel)
            agree = float(np.mean(np.asarray(dense) == ours))
            label = f"{kind} {fraction:.1%} ({occupied.mean():.2%})"
            ours_steps = hits.lookups.mean()
            steps_rows.append(
                (
                    label,
                    ours_steps,
                    float(np.asarray(flat_steps).mean()),
                    float(np.asarray(dense_steps).mean()),
                    float(np.asarray(whole_steps).mean()),
                )
            )
            rows = timings(vol_dev, occ_dev, levels, origins, directions, o_dev, d_dev, box, args.repeats, hits, same,
                           agree)  # fmt: skip
            print(table(f"Wall time, {label}", rows, "render_volume MIP (ours)"))
            print()

    print("#### Steps per ray (mean over all rays)\n")
    print("| volume (target, actual occupancy) | ours: lookups | flat DDA: voxels | dense: samples | "
          "flat / ours | dense / ours | flat DDA in the whole volume box / ours |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, ours_steps, flat_steps, dense_steps, whole_steps in steps_rows:
        print(
            f"| {label} | {ours_steps:.1f} | {flat_steps:.1f} | {dense_steps:.1f} | "
            f"{flat_steps / ours_steps:.1f} | {dense_steps / ours_steps:.1f} | {whole_steps / ours_steps:.1f} |"
        )


if __name__ == "__main__":
    main()
