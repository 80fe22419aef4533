"""Helpers shared by the test modules (imported from here, never from another test file)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
