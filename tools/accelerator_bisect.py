"""Bisect the subset sweep's difference between the accelerator and the CPU (docs/accelerator.md)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import napari_gridmip as gm
from napari_gridmip._sample_data.dic import make_dic_pair
from napari_gridmip.core.correlation import subsets as S
from tools.accelerator_probe import report

ref, deformed, _ = make_dic_pair((160, 192))
img1 = np.stack([deformed, ref[::-1]])[:, :, :].astype(np.float32)
img2 = np.stack([ref, deformed[::-1]]).astype(np.float32)
for k in (1, 2):
    for window, subset, step in (
        ((11, 11), (31, 31), 4),
        ((11, 11), (31, 31), 1),
        ((11, 11), (31, 31), 16),
        ((11, 11), (5, 5), 8),
        ((5, 5), (3, 3), 1),
        ((11, 11), (1, 1), 1),
    ):
        report(
            f"map K={k} w={window[0]} subset={subset[0]} step={step}",
            lambda a, b, window=window, subset=subset, step=step: gm.windowed_pearson(
                a, b, window, subset=subset, step=step
            ),
            (img1[:k], img2[:k]),
        )

# the raw sweep of one item: every output row's H, running (step 4) and fresh (step 16)
for step in (4, 16, 1):
    plan = S.Plan(1, (160, 192), (11, 11), (31, 31), step, (0, 0), False, "map", (), False)
    rows = plan.out[0]
    wa, wb = plan.extended
    width = S._column_width(plan)
    a = np.pad(img1[:1] - img1.mean(), ((0, 0), (0, 0), (0, step)))
    b = np.pad(img2[:1] - img2.mean(), ((0, 0), (0, 0), (0, step)))

    def raw(a, b, plan=plan, rows=rows, wa=wa, wb=wb, width=width):
        def consume(t, h, carry):
            return lax.dynamic_update_slice(carry, jnp.stack(h)[None], (t, 0, 0, 0))

        boxed = S._row_box(jnp.zeros((wa, width)), plan).shape[-1]
        carry = jnp.zeros((rows, wb, wa, boxed), a.dtype)
        return jax.jit(
            lambda a, b: S._sweep(
                a, b, rows=rows, offsets=(wa, wb), origin=(0, 5), plan=plan, consume=consume, carry=carry
            )
        )(a, b)

    report(f"raw sweep step={step} running={plan.running}", raw, (a, b))

    def stats(a, b, plan=plan, rows=rows):
        return tuple(jax.jit(lambda a, b: S._stats(a, b, None, None, plan, rows))(a, b))

    report(f"stats step={step}", stats, (a, b))
    x = np.random.default_rng(1).normal(size=(11, width)).astype(np.float32)
    report(f"row_box step={step} compact={plan.compact}", lambda v, plan=plan: S._row_box(v, plan), (x,))
