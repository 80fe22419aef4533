"""Helpers shared by the test modules (imported from here, never from another test file)."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
from dask.callbacks import Callback

# The event JAX records each time it traces a function into a jaxpr: a new trace
# means a new compiled program (a cache hit records nothing).
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"


class TraceCount:
    """How many times JAX traced a function while the context was open."""

    def __init__(self) -> None:
        self.count = 0
        self.active = True

    def _listener(self, event: str, duration: float, **_: object) -> None:
        if self.active and event == TRACE_EVENT:
            self.count += 1


@contextlib.contextmanager
def count_traces() -> Iterator[TraceCount]:
    """Count traces through JAX's public monitoring API (no private cache sizes)."""
    import jax.monitoring

    counter = TraceCount()
    jax.monitoring.register_event_duration_secs_listener(counter._listener)
    try:
        yield counter
    finally:
        counter.active = False
        unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)  # JAX >= 0.4.36 or so
        if unregister is not None:
            unregister(counter._listener)


def two_balls(n: int = 64, radius: int = 4, dtype: type = np.float32) -> np.ndarray:
    """The probe volume: two small balls of ones in opposite corners of an ``n``-cube of zeros."""
    z, y, x = np.mgrid[:n, :n, :n]
    volume = np.zeros((n, n, n), dtype)
    for c in (radius + 1, n - radius - 2):
        volume[(z - c) ** 2 + (y - c) ** 2 + (x - c) ** 2 <= radius**2] = 1
    return volume


def reference_levels(volume, threshold=0.0):
    """Obviously right: level 0 by comparison, each coarser voxel an any() over its clipped block."""
    # Python numbers compare exactly (NumPy would round the threshold to the volume's dtype first)
    level = (np.asarray(volume).astype(object) > threshold).astype(bool)
    levels = [level]
    while any(n > 1 for n in level.shape):
        shape = tuple((n + 1) // 2 for n in level.shape)
        coarse = np.zeros(shape, dtype=bool)
        for z, y, x in itertools.product(*map(range, shape)):
            coarse[z, y, x] = level[2 * z : 2 * z + 2, 2 * y : 2 * y + 2, 2 * x : 2 * x + 2].any()
        levels.append(coarse)
        level = coarse
    return levels


class TaskCounter(Callback):
    """Counts the dask tasks that run (a lazy call runs none): ``with TaskCounter() as c: ...; c.count``."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def _posttask(self, key, result, dsk, state, worker_id):
        self.count += 1


# Hypothesis examples on an accelerator: each example of a new shape compiles a program, which takes 3 to 5x
# longer on a TPU than on the host (docs/accelerator.md), so that the suite's core would not fit the device's
# 10-minute runs. There, every property test keeps this many examples (its explicit cases always run); the CPU
# runs them all.
ACCELERATOR_EXAMPLES = 4


def examples(count: int) -> int:
    """``count`` hypothesis examples on the CPU; at most ``ACCELERATOR_EXAMPLES`` on an accelerator."""
    import jax

    return count if jax.default_backend() == "cpu" else min(count, ACCELERATOR_EXAMPLES)


def assert_one_line_error_and_nothing_written(done, message: str, folder) -> None:
    """A CLI run that failed as the CLI promises: exit 2, one error line naming ``message``, no traceback, and
    nothing left in ``folder`` (its working directory)."""
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert list(folder.iterdir()) == []


def run_cli(command: str, *args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m napari_gridmip COMMAND ARGS`` in ``cwd``, its output captured (a new process, as a user runs it)."""
    return subprocess.run([sys.executable, "-m", "napari_gridmip", command, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
