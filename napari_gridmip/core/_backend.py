"""The one place that asks which backend runs, for the algorithms whose best strategy differs by backend.

Each function here names a strategy and says, with the measurement behind it, why it is chosen where it is.
Every branch stays under the same tests: ``tests/core/correlation/test_subsets.py`` and ``test_affine.py`` run
the kernels with each strategy forced on the CPU, and ``tools/accelerator_tests.sh`` runs the suite on a TPU
(docs/accelerator.md).
"""

from __future__ import annotations

import jax


def on_cpu() -> bool:
    """Whether JAX's default backend is the host CPU."""
    return jax.default_backend() == "cpu"


def running_row_sums() -> bool:
    """Whether the subset sweep carries its box sums down the image as running sums (each output row adds the
    ``s`` rows entering its subsets and subtracts the ``s`` leaving them), or sums the subset's ``sh`` rows afresh.

    Running sums on the CPU: O(s) instead of O(sh) work a row; the 1024^2 DIC pair (subset 31, step 4) runs
    2.2x faster warm with them, 0.342 against 0.748 s (docs/benchmarks.md, section 12). Fresh sums elsewhere:
    on a TPU v5e (JAX 0.10.2) the running sums' program returns sums up to 80% off
    (``tools/accelerator_bisect.py``, "raw sweep step=4": 8e-1 against the CPU, while every primitive it uses, a
    plain running sum among them, agrees within 2e-7), and the fresh sums agree within 1e-7; the speckle-tracking
    and DIC fields were wrong there for this alone.
    """
    return on_cpu()


def point_batches() -> bool:
    """Whether the affine IC-GN (:mod:`.correlation.affine`) moves each row's points still iterating, after the
    first steps, into small batches (gathered and scattered back), so that a row costs the sum of its points'
    iterations; or lets the whole row take each step until its last point stops.

    Batches on the CPU, where the work is the cost (a row costs its points' steps, not its slowest point's
    times the row). The whole row elsewhere: an accelerator runs a row's points in parallel, and each batch is a
    small gather, step and scatter in a loop of many tiny iterations, which is where an accelerator is slowest
    (the 1024^2 affine DIC ran over a minute on a TPU v5e). Each point takes the same steps either way.
    """
    return on_cpu()
