"""Rays through an occupancy pyramid: the occupied voxels each ray crosses, skipping empty space.

Coordinates are level-0 voxel indices ``(z, y, x)``: voxel ``i`` covers ``[i, i + 1)`` along each axis, the volume
``[0, D) x [0, H) x [0, W)``. A ray is ``origin + t * direction``; ``t`` is in units of the direction's length.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import validate
from napari_gridmip.core.occupancy import _flat
from napari_gridmip.core.occupancy.pyramid import check_pyramid
from napari_gridmip.core.runtime import strategy
from napari_gridmip.core.runtime.precision import compute_dtype, precision_scope

__all__ = ["traverse_occupied"]

FRESH, UP, DOWN = 0, 1, 2  # what the next lookup is for: a new cell, a climb (level below empty), a descent (see step)


class Traversal(NamedTuple):
    """The occupied voxels the rays cross, packed like nerfacc's samples: flat arrays sorted by ray, then t.

    Entry ``i`` is voxel ``voxels[i]`` (level-0 ``(z, y, x)``), crossed by ray
    ``ray_indices[i]`` for ``t_starts[i] <= t < t_ends[i]``. ``lookups[r]`` is
    the number of cells ray ``r`` looked up (its steps).
    """

    ray_indices: np.ndarray
    t_starts: np.ndarray
    t_ends: np.ndarray
    voxels: np.ndarray
    lookups: np.ndarray


class RayState(NamedTuple):
    """One ray's place in the traversal (a batch of them under vmap)."""

    t: jax.Array  # where the ray stands (it entered ``cell`` at or before t)
    cell: jax.Array  # (3,) the level-0 voxel it stands in
    k: jax.Array  # the level of the next lookup
    mode: jax.Array  # FRESH, UP or DOWN
    ceiling: jax.Array  # every ancestor above this level is known to be occupied: climbing stops there
    active: jax.Array
    overflow: jax.Array  # stopped at an occupied voxel with no room left to record it
    lookups: jax.Array
    count: jax.Array  # voxels recorded in this pass


# ---------------------------------------------------------------------------------------------------------------------
# geometry: crossing times and the voxel a ray stands in, all from one formula


def reciprocal(d: jax.Array) -> jax.Array:
    """``1 / d`` per axis, correctly rounded on every backend, 0 where ``d == 0``.

    A TPU's float32 division is not correctly rounded: its ``1 / d`` can be an ulp off, and every crossing time
    with it (tests/core/occupancy/test_traverse.py's exact reference failed there by 2e-7 to 8e-6 on times of 1
    to 50, the voxels equal). One Newton step with the exact residual puts it right (:func:`rounded_reciprocal`).
    """
    safe = jnp.where(d == 0, jnp.ones_like(d), d)
    return jnp.where(d == 0, jnp.zeros_like(d), rounded_reciprocal(safe, 1 / safe))


def _split(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Veltkamp's split: ``a = hi + lo`` exactly, each with half of the significand's bits."""
    factor = 4097.0 if a.dtype == jnp.float32 else 134217729.0  # 2**12 + 1, 2**27 + 1
    c = a * jnp.asarray(factor, a.dtype)
    hi = c - (c - a)
    return hi, a - hi


def rounded_reciprocal(d: jax.Array, r: jax.Array) -> jax.Array:
    """``1 / d`` correctly rounded, from an estimate ``r`` within an ulp of it (``d`` nonzero and normal).

    The residual ``e = 1 - d r`` is computed exactly with Dekker's product (no fused multiply-add needed, only
    IEEE products and sums, which every backend has); ``r + r e`` then rounds to the nearest float of ``1 / d``,
    and is ``r`` itself where ``r`` already was (the CPU's division). Large estimates (``|r|`` over 2**64, whose
    split would overflow) are worked on scaled by 2**-64, ``d`` by 2**64: exact, powers of two.

    References
    ----------
    T. J. Dekker, "A floating-point technique for extending the available precision", Numer. Math. 18, 224-242
    (1971).
    """
    scale = jnp.asarray(2.0**64, r.dtype)
    big = jnp.abs(r) > scale
    d, r = jnp.where(big, d * scale, d), jnp.where(big, r / scale, r)
    d_hi, d_lo = _split(d)
    r_hi, r_lo = _split(r)
    p = d * r
    p_err = ((d_hi * r_hi - p) + d_hi * r_lo + d_lo * r_hi) + d_lo * r_lo  # d r = p + p_err exactly
    e = (1 - p) - p_err  # 1 - p is exact: p is within a few ulps of 1 (Sterbenz)
    corrected = r + r * e
    return jnp.where(big, corrected * scale, corrected)


def crossing(o: jax.Array, inv: jax.Array, plane: jax.Array) -> jax.Array:
    """``T(b) = (b - o) * (1 / d)`` per axis (inf where ``d == 0``): the one formula every decision compares.

    (A multiplication by the reciprocal, computed once per ray, costs less than a
    division in every step; exactness only needs one formula, used everywhere.)
    """
    return jnp.where(inv == 0, jnp.inf, (plane.astype(o.dtype) - o) * inv)


def locate(o: jax.Array, d: jax.Array, inv: jax.Array, t: jax.Array, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """The voxel index ``i`` per axis with ``T(i) <= t < T(i + 1)`` (``T(i+1) <= t < T(i)`` for ``d < 0``),
    clipped to ``[lo, hi]``; ``floor(o)`` where ``d == 0``."""
    kind = lo.dtype
    guess = jnp.floor(o + t * d)
    guess = jnp.clip(jnp.nan_to_num(guess), lo.astype(o.dtype) - 1, hi.astype(o.dtype) + 1).astype(kind)
    below, above = crossing(o, inv, guess), crossing(o, inv, guess + 1)
    forward = jnp.where(below > t, guess - 1, jnp.where(above <= t, guess + 1, guess))
    backward = jnp.where(above > t, guess + 1, jnp.where(below <= t, guess - 1, guess))
    index = jnp.where(d > 0, forward, backward)
    index = jnp.where(d == 0, jnp.floor(o).astype(kind), index)
    return jnp.clip(index, lo, hi)


def exit_cell(o: jax.Array, d: jax.Array, inv: jax.Array, cell: jax.Array, j: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Leave the level-``j`` cell around ``cell``: (exit time, the level-0 voxel entered there).

    Along the axes whose crossing time is the exit time (several at an edge or
    a corner), the new voxel is the one past the plane; along the others the
    ray is located at the exit time within the cell it leaves.
    """
    one = jnp.ones_like(cell)
    size = one << j
    base = (cell >> j) << j
    plane = jnp.where(d > 0, base + size, base)
    times = crossing(o, inv, plane)
    t_exit = times.min()
    crossed = (times == t_exit) & (d != 0)
    stepped = jnp.where(d > 0, plane, plane - 1)
    lo = jnp.where(d > 0, cell, base)
    hi = jnp.where(d > 0, base + size - 1, cell)
    located = locate(o, d, inv, t_exit, lo, hi)
    return t_exit, jnp.where(crossed, stepped, jnp.where(d == 0, cell, located))


def start_state(lo: jax.Array, hi: jax.Array, full: jax.Array, o, d, t_near, t_far, kind) -> tuple[RayState, jax.Array]:
    """Clip a ray to the box ``[lo, hi)`` and ``[t_near, t_far)``: its first state and its stop time.

    The box is the occupied bounding box: nothing outside it is occupied, so a
    ray that misses it costs nothing and one that meets it starts where it enters.
    """
    inv = reciprocal(d)
    t0, tn = crossing(o, inv, lo), crossing(o, inv, hi)
    inside = (o >= lo.astype(o.dtype)) & (o < hi.astype(o.dtype))
    entry = jnp.where(d != 0, jnp.minimum(t0, tn), jnp.where(inside, -jnp.inf, jnp.inf))
    leave = jnp.where(d != 0, jnp.maximum(t0, tn), jnp.where(inside, jnp.inf, -jnp.inf))
    t_start = jnp.maximum(entry.max(), t_near)
    t_stop = jnp.minimum(leave.min(), t_far)
    active = t_start < t_stop
    cell = locate(o, d, inv, jnp.where(active, t_start, 0), lo, jnp.maximum(hi - 1, lo))
    false = jnp.array(False)
    start = jnp.maximum(full - 1, 0).astype(kind)  # every cell of level ``full`` is occupied: start below it
    state = RayState(
        t_start,
        cell,
        start,
        jnp.array(DOWN, kind),
        start,
        active,
        false,
        jnp.array(0, kind),
        jnp.array(0, kind),
    )
    return state, t_stop


def step(flat: _flat.FlatPyramid, top, capacity, o, d, inv, t_stop, s: RayState):
    """One lookup and what follows from it. Returns (state, emitted?, (voxel, t_in, t_out)).

    The lookup at level ``k`` is for one of three things. FRESH: a cell not
    seen yet; occupied, descend (or record the voxel at level 0); empty, climb
    while below ``ceiling`` (every ancestor above it is known to be occupied),
    else jump out of it. UP: climbing, the cell below known empty; occupied,
    jump out of the one below; empty, climb on (or jump at the ceiling).
    DOWN: descending, the parent known occupied; occupied, descend on;
    empty, jump out of it. A jump or a recorded voxel moves the ray to the
    next cell; the ancestors above the highest level whose ancestor changed
    (``changed``) are the old ones, occupied, so the new ceiling is that level,
    and the search restarts one level above the jump (next to the voxel after
    a recorded one).
    """
    kind = s.cell.dtype
    occupied = _flat.lookup(flat, s.k, s.cell >> s.k)
    up = s.mode == UP
    at_voxel = occupied & (s.k == 0) & ~up
    overflow = at_voxel & (s.count >= capacity) & s.active
    emit = at_voxel & ~overflow & s.active
    descend = occupied & (s.k > 0) & ~up & s.active
    climb = ~occupied & (s.mode != DOWN) & (s.k < s.ceiling) & s.active
    move = (~at_voxel & ~descend & ~climb & s.active) | emit  # an inactive ray changes nothing
    j = jnp.where(emit, 0, jnp.where(up & occupied, s.k - 1, s.k))  # jump out of the coarsest empty cell
    t_exit, cell = exit_cell(o, d, inv, s.cell, j)
    differ = (cell ^ s.cell).astype(jnp.int32)
    changed = jnp.clip(jnp.max(jnp.where(differ > 0, 31 - lax.clz(differ), 0)), j, top).astype(kind)
    restart = jnp.where(emit, 0, jnp.minimum(changed, j + 1))
    outside = jnp.any((cell < 0) | (cell >= flat.shapes[0]))
    finished = move & ((t_exit >= t_stop) | outside)
    new = RayState(
        jnp.where(move, t_exit, s.t),
        jnp.where(move, cell, s.cell),
        jnp.where(move, restart, jnp.where(descend, s.k - 1, jnp.where(climb, s.k + 1, s.k))),
        jnp.where(move, FRESH, jnp.where(descend, DOWN, jnp.where(climb, UP, s.mode))).astype(kind),
        jnp.where(move, changed, s.ceiling),
        s.active & ~overflow & ~finished,
        s.overflow | overflow,
        s.lookups + s.active.astype(kind),
        s.count + emit.astype(kind),
    )
    return new, emit, (s.cell, s.t, jnp.minimum(t_exit, t_stop))


def march(flat, o, d, t_stop, state, limit, keep, capacity, consume, carry):
    """Step a batch of rays until at most ``keep`` are active, or ``limit`` steps were taken.

    ``consume(carry, emitted, records, state) -> (carry, stop)`` takes each step's
    emitted voxels (a ``(B,)`` mask and records); ``stop`` ends rays (first hit).
    Every lane of the batch is computed at every step, so the caller stops
    early (``keep`` > 0) and goes on with the few rays left in a smaller batch:
    the work then follows the rays' own steps, not the batch's longest ray.
    """
    top = _flat.top_level(flat)
    stepper = jax.vmap(functools.partial(step, flat, top, capacity))
    inv = jax.vmap(reciprocal)(d)

    def cond(loop):
        i, state, _ = loop
        return (i < limit) & (jnp.sum(state.active, dtype=keep.dtype) > keep)

    def body(loop):
        i, state, carry = loop
        new, emitted, records = stepper(o, d, inv, t_stop, state)
        carry, stop = consume(carry, emitted, records, new)
        return i + 1, new._replace(active=new.active & ~stop), carry

    _, state, carry = lax.while_loop(cond, body, (jnp.array(0, state.k.dtype), state, carry))
    return state, carry


@jax.jit
def _start(flat, o, d, t_near, t_far):
    kind = flat.offsets.dtype
    return jax.vmap(lambda o, d, a, b: start_state(flat.lo, flat.hi, flat.full, o, d, a, b, kind))(o, d, t_near, t_far)


def keep_active(size: int) -> int:
    """Rays left active at which a batch of ``size`` stops and the rest go on in a smaller batch."""
    return size // 4 if size > MIN_BATCH else 0


def compact(arrays, index: np.ndarray, size: int, fills):
    """Rows ``index`` of each array, padded to ``size`` rows with its fill value, as JAX arrays."""
    # device_put, not jnp.asarray: the latter compiles a copy program per shape on a first call
    return [jax.device_put(_pad(np.asarray(a)[index], size, fill)) for a, fill in zip(arrays, fills)]


@functools.partial(jax.jit, static_argnames=("capacity", "ring"))
def _record(flat, o, d, t_stop, state, limit, keep, capacity, ring=0):
    """One pass: each ray records up to ``capacity`` voxels; returns (state, voxels, t_in, t_out).

    ``ring=0``: each step scatters its rays' crossings into their next slots (the CPU's way). ``ring > 0``:
    each step writes its crossings into row ``capacity + step % ring`` of a ring of steps, whole rows and no
    scatter, and every ``ring`` steps a stable sort down each ray's column moves the ring's crossings after the
    ones kept (``strategy.step_record_ring``). Both give the same records, slot for slot; unused slots hold 0.
    """
    state = state._replace(count=jnp.zeros_like(state.count))
    if ring:
        return _record_in_ring(flat, o, d, t_stop, state, limit, keep, capacity, ring)
    batch = o.shape[0]
    kind = state.k.dtype
    rows = jnp.arange(batch)
    buffers = (
        jnp.zeros((batch, capacity, 3), kind),
        jnp.zeros((batch, capacity), o.dtype),
        jnp.zeros((batch, capacity), o.dtype),
    )

    def consume(carry, emitted, records, new):
        slot = jnp.where(emitted, new.count - 1, capacity)  # out of range: dropped
        cell, t_in, t_out = records
        voxels, starts, ends = carry
        voxels = voxels.at[rows, slot].set(cell, mode="drop")
        starts = starts.at[rows, slot].set(t_in, mode="drop")
        ends = ends.at[rows, slot].set(t_out, mode="drop")
        return (voxels, starts, ends), jnp.zeros(batch, bool)

    state, (voxels, starts, ends) = march(flat, o, d, t_stop, state, limit, keep, capacity, consume, buffers)
    return state, voxels, starts, ends


def _flush_ring(planes, empty):
    """Each column's held crossings first, in order (a stable sort on ``empty``): the slots, then the ring's."""
    empty, *planes = lax.sort((empty, *planes), dimension=0, is_stable=True, num_keys=1)
    return tuple(planes), empty


def _record_in_ring(flat, o, d, t_stop, state, limit, keep, capacity, ring):
    """``_record`` without scatters: rows ``[0, capacity)`` of each ``(capacity + ring, batch)`` plane hold the
    crossings kept so far, in order, rows ``capacity + j`` the ring's step ``j``; a flush sorts each column
    by "kept or emitted first" (stable: the slots' order, then the steps') and empties the ring. A ray stops
    recording at ``capacity`` (``step``'s overflow), so a flush never pushes a crossing out of the slots."""
    batch = o.shape[0]
    kind = state.k.dtype
    planes = tuple(jnp.zeros((capacity + ring, batch), t) for t in (kind, kind, kind, o.dtype, o.dtype))
    empty = jnp.ones((capacity + ring, batch), jnp.int8)  # the sort's key: 0 where a crossing is held

    def flush(carry):
        planes, empty, _ = carry
        planes, empty = _flush_ring(planes, empty)
        return planes, empty, jnp.zeros((), jnp.int32)

    def consume(carry, emitted, records, new):
        planes, empty, j = carry
        cell, t_in, t_out = records
        row = capacity + j
        values = (cell[:, 0], cell[:, 1], cell[:, 2], t_in, t_out)
        planes = tuple(lax.dynamic_update_index_in_dim(p, v, row, 0) for p, v in zip(planes, values))
        empty = lax.dynamic_update_index_in_dim(empty, (~emitted).astype(jnp.int8), row, 0)
        carry = lax.cond(j + 1 == ring, flush, lambda c: (c[0], c[1], c[2] + 1), (planes, empty, j))
        return carry, jnp.zeros(batch, bool)

    state, carry = march(flat, o, d, t_stop, state, limit, keep, capacity, consume,
                         (planes, empty, jnp.zeros((), jnp.int32)))  # fmt: skip
    planes, empty, _ = flush(carry)
    held = empty[:capacity] == 0
    z, y, x, starts, ends = (jnp.where(held, p[:capacity], 0).T for p in planes)
    return state, jnp.stack([z, y, x], axis=-1), starts, ends


# ---------------------------------------------------------------------------------------------------------------------
# inputs


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """Subnormal components become 0, as XLA's CPU and GPU backends treat them (so results never depend on it)."""
    tiny = np.finfo(x.dtype).tiny
    return np.where(np.abs(x) < tiny, np.zeros_like(x), x)


def ray_arguments(origins: Any, directions: Any, t_near: Any, t_far: Any, dtype: np.dtype):
    """Validated rays: origins and directions ``(n, 3)``, t_near/t_far ``(n,)`` in ``dtype``, and the batch shape."""
    origins = np.asarray(validate.as_array("origins", origins))
    directions = np.asarray(validate.as_array("directions", directions))
    for name, value in (("origins", origins), ("directions", directions)):
        if value.dtype == np.bool_ or not (np.issubdtype(value.dtype, np.number) and value.dtype.kind in "iuf"):
            raise ValueError(f"{name} must hold real numbers; got dtype {value.dtype}")
        if value.ndim == 0 or value.shape[-1] != 3:
            raise ValueError(f"{name} must have shape (..., 3): (z, y, x) per ray; got shape {value.shape}")
    if origins.shape != directions.shape:
        raise ValueError(f"origins and directions must have one shape; got {origins.shape} and {directions.shape}")
    batch = origins.shape[:-1]
    o = origins.reshape(-1, 3).astype(dtype)
    d = directions.reshape(-1, 3).astype(dtype)
    if not (np.all(np.isfinite(o)) and np.all(np.isfinite(d))):
        raise ValueError("origins and directions must be finite (a ray with NaN or inf has no path)")
    if np.any(np.abs(d) > 1e30):
        raise ValueError("directions must be at most 1e30 in magnitude (their reciprocals must stay normal floats)")
    bounds = []
    for name, value, default in (("t_near", t_near, -np.inf), ("t_far", t_far, np.inf)):
        value = default if value is None else value
        if isinstance(value, (str, bytes, bool, np.bool_)):
            raise TypeError(f"{name} must be a number or an array of one per ray; got {value!r}")
        array = np.asarray(value, dtype=np.float64)
        if np.any(np.isnan(array)):
            raise ValueError(f"{name} must not be NaN")
        try:
            array = np.broadcast_to(array, batch).reshape(-1)
        except ValueError:
            raise ValueError(f"{name} must be a number or have the rays' shape {batch}; got {array.shape}") from None
        bounds.append(array.astype(dtype))
    return flush_subnormals(o), flush_subnormals(d), flush_subnormals(bounds[0]), flush_subnormals(bounds[1]), batch


def _pad(array: np.ndarray, size: int, value: float) -> np.ndarray:
    pad = [(0, size - array.shape[0])] + [(0, 0)] * (array.ndim - 1)
    return np.pad(array, pad, constant_values=value)


MAX_BATCH = 16384
MIN_BATCH = 1024  # small batches are padded to this: one compiled program serves them all


def padded_size(n: int) -> int:
    """Rays of a batch of ``n``, padded: ``MIN_BATCH`` or the next power of two (few distinct compiled programs)."""
    return max(MIN_BATCH, _flat.bucket(n, 1))


def _batches(n: int, batch_size: int):
    """(start, stop, padded size) of each batch of at most ``batch_size`` rays."""
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        yield start, stop, padded_size(stop - start)


def _step_limit(shape: tuple[int, ...], levels: int, capacity: int) -> int:
    """Steps one pass may take before it stops and resumes (bounds one program's run; never drops voxels)."""
    return (levels + 2) * (2 * sum(shape) + capacity) + 64


def traverse_occupied(
    levels: Any,
    origins: Any,
    directions: Any,
    *,
    t_near: Any = 0.0,
    t_far: Any = None,
    dtype: Any = None,
    capacity: int = 64,
    batch_size: int = MAX_BATCH,
) -> Traversal:
    """The occupied level-0 voxels each ray crosses, with where it enters and leaves each, skipping empty space.

    Parameters
    ----------
    levels
        Bool occupancy pyramid of one 3D volume, every level (level 0 first),
        NumPy or JAX, as from :func:`~napari_gridmip.occupancy_mipmap`. Any shape.
    origins, directions
        Rays ``origin + t * direction`` in level-0 voxel index coordinates
        ``(z, y, x)`` (voxel ``i`` covers ``[i, i + 1)``), shape ``(..., 3)``
        each. Directions need not be unit vectors (``t`` is in units of their
        length); zero components are allowed (a zero direction is a point).
        Components smaller than the smallest normal float count as 0.
    t_near, t_far
        Where each ray starts and stops: numbers or arrays of the rays'
        shape. Default ``[0, inf)`` (``t_far=None``). ``-inf`` is allowed.
    dtype
        float32 (default) or float64 (x64 for this call only), the precision
        of the crossing times.
    capacity
        Voxels one ray records per pass. A ray that crosses more is continued
        in further passes from where it stopped, so nothing is ever dropped;
        only speed depends on it.
    batch_size
        Rays per compiled program run (padded to a power of two, at least 1024).

    Returns
    -------
    Traversal
        NamedTuple of NumPy arrays, sorted by ray then ``t``, one entry per
        occupied voxel crossed: ``ray_indices`` (int64, index into the
        flattened rays), ``t_starts``, ``t_ends`` (``dtype``), ``voxels``
        (int, ``(n, 3)``), and ``lookups`` (int64, one per ray: cells looked
        up). A ray's intervals ``[t_starts, t_ends)`` tile exactly the ``t``
        at which it is inside an occupied voxel, within ``[t_near, t_far)``:
        the voxel along each axis changes where ``T_a(b) = (b - o_a) * (1 / d_a)``
        (the crossing time of plane ``b``, in ``dtype``) is reached, and a ray
        crossing an edge or corner changes several at once.

    Raises
    ------
    ValueError
        If ``levels`` is not a whole bool pyramid of one 3D volume; if
        ``origins``/``directions`` are not finite real ``(..., 3)`` arrays of
        one shape; if ``t_near``/``t_far`` are NaN or of another shape;
        ``dtype`` not float32/float64; ``capacity`` or ``batch_size`` < 1.
    TypeError
        If ``levels`` is not a sequence of arrays, or ``t_near``/``t_far`` is text.

    Notes
    -----
    The traversal is a hierarchical DDA. At each step it looks up one cell: from the voxel it stands in, it climbs to
    the coarsest empty cell around the current point and jumps to that cell's exit; in occupied cells it descends to
    level 0 and reports the voxel. So its steps grow with the occupied voxels a ray crosses, not with the length of
    its path. Unlike NanoVDB's HDDA and instant-ngp's marcher, which re-derive the cell from the floating-point
    position (and nudge ``t`` forward by an epsilon to stay out of loops), the current voxel is carried as integers
    and every cell change is decided by comparing the same crossing times ``T_a(b) = (b - o_a) / d_a``: the answer is
    exact for that arithmetic, with no epsilon, and each step provably moves on.

    Pure JAX (jit, vmap; CPU and GPU): a batch of rays is one ``while_loop``
    in which every active ray makes one lookup per iteration. The steps per
    ray grow with the occupied voxels it crosses, plus about two lookups per
    level for each run of empty space (climb, jump), against one per voxel of
    its path for a flat DDA (``benchmarks/bench_traverse.py``).

    References
    ----------
    J. Amanatides and A. Woo, "A fast voxel traversal algorithm for ray
    tracing", Eurographics 1987. K. Museth, "Hierarchical digital differential
    analyzer for efficient ray-marching in OpenVDB", SIGGRAPH 2014 talks.
    R. Li et al., "NerfAcc: efficient sampling accelerates NeRFs", ICCV 2023
    (the packed output).

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import occupancy_mipmap, traverse_occupied
    >>> volume = np.zeros((4, 4, 8), bool); volume[1, 2, 3:5] = True
    >>> hits = traverse_occupied(occupancy_mipmap(volume), [[1.5, 2.5, -1.0]], [[0.0, 0.0, 1.0]])
    >>> hits.voxels.tolist(), hits.t_starts.tolist(), hits.t_ends.tolist()
    ([[1, 2, 3], [1, 2, 4]], [4.0, 5.0], [5.0, 6.0])
    """
    levels = check_pyramid("levels", levels, allow_dask=False)
    dtype = compute_dtype(dtype)
    (capacity,) = validate.int_tuple("capacity", (capacity,))
    (batch_size,) = validate.int_tuple("batch_size", (batch_size,))
    o, d, near, far, _ = ray_arguments(origins, directions, t_near, t_far, dtype)
    shapes = [tuple(int(n) for n in level.shape) for level in levels]
    kind = _flat.index_dtype(shapes)
    pieces = []  # (ray indices, voxels, starts, ends) of each pass's recorded voxels
    lookups = np.zeros(o.shape[0], np.int64)
    with precision_scope(np.float64 if dtype == np.float64 or kind == np.int64 else np.float32):
        flat = _flat.flatten(levels)
        for start, stop, size in _batches(o.shape[0], batch_size):
            part = slice(start, stop)
            recorded, steps = record_batch(flat, shapes, o[part], d[part], near[part], far[part], size, capacity)
            pieces += [(rays + start, *rest) for rays, *rest in recorded]
            lookups[start:stop] = steps
    return _pack(pieces, lookups, dtype, kind)


def record_batch(flat, shapes, o, d, near, far, size, capacity):
    """Every occupied voxel of a batch of rays (padded to ``size``), pass after pass until no ray is left.

    The rays left unfinished by a pass (out of room, or still going when most have stopped) go on, to
    their end, in batches of a quarter of the first batch (at least ``MIN_BATCH``): the rays a pass
    leaves active then fit one batch, and two compiled programs serve a whole call (a size per power of
    two compiled one per pass, 0.65 s each on a first call; bench_first_run.py). Batches of
    ``MIN_BATCH`` ran one after another, each as long as its longest ray: 1.5x slower warm
    (bench_traverse.py).

    Returns ([(ray indices within the batch, voxels, t_starts, t_ends) per pass], lookups per ray).
    Call inside the ``precision_scope`` that ``flat`` was made in.
    """
    n = o.shape[0]
    limit = _step_limit(shapes[0], len(shapes), capacity)
    ring = strategy.step_record_ring()
    ray_o, ray_d = jax.device_put(_pad(o, size, -1)), jax.device_put(_pad(d, size, 0))
    state, t_stop = _start(flat, ray_o, ray_d, jax.device_put(_pad(near, size, 0)), jax.device_put(_pad(far, size, 0)))
    pieces, lookups = [], np.zeros(n, np.int64)
    # (rays, their states, origins, directions, stops, rays left active when a pass stops); a ray's next pass is
    # queued by its last
    group_size = max(MIN_BATCH, size // 4)
    pending = [(np.arange(n), state, ray_o, ray_d, t_stop, keep_active(size))]
    while pending:
        rays, state, ray_o, ray_d, t_stop, keep = pending.pop()
        keep = np.asarray(keep, state.k.dtype)
        state, voxels, starts, ends = jax.device_get(
            _record(flat, ray_o, ray_d, t_stop, state, limit, keep, capacity=capacity, ring=ring)
        )
        count = state.count[: len(rays)]
        kept = np.arange(capacity)[None, :] < count[:, None]
        pieces.append((np.repeat(rays, count), *[a[: len(rays)][kept] for a in (voxels, starts, ends)]))
        lookups[rays] += state.lookups[: len(rays)]
        resume = np.nonzero((state.overflow | state.active)[: len(rays)])[0]
        for first in range(0, len(resume), group_size)[::-1]:  # popped in order: rays' passes stay in order
            group = resume[first : first + group_size]
            pending.append(
                (rays[group], _resumed(state, group, group_size),
                 *compact((ray_o, ray_d, t_stop), group, group_size, (-1, 0, 0)), 0)
            )  # fmt: skip
    return pieces, lookups


def _resumed(state: RayState, index: np.ndarray, size: int) -> RayState:
    """The states of rays ``index``, active again with nothing recorded yet, padded to ``size`` (inactive)."""
    picked = RayState(*[_pad(np.asarray(a)[index], size, 0) for a in state])
    active = np.zeros(size, bool)
    active[: len(index)] = True
    return jax.device_put(
        picked._replace(active=active, overflow=np.zeros(size, bool), lookups=np.zeros_like(picked.lookups))
    )


def _pack(pieces, lookups, dtype, kind) -> Traversal:
    if pieces:
        rays = np.concatenate([p[0] for p in pieces]).astype(np.int64)
        order = np.argsort(rays, kind="stable")  # passes in order, slots in order: sorted by ray, then t
        voxels = np.concatenate([p[1] for p in pieces])[order]
        starts = np.concatenate([p[2] for p in pieces])[order]
        ends = np.concatenate([p[3] for p in pieces])[order]
        rays = rays[order]
    else:
        rays, voxels = np.zeros(0, np.int64), np.zeros((0, 3), kind)
        starts = ends = np.zeros(0, dtype)
    return Traversal(rays, starts.astype(dtype), ends.astype(dtype), voxels.astype(kind), lookups)
