"""Shared benchmark harness: warm-up, best of N, peak extra memory, ratio tables.

Times alone mean little on a shared machine; the ratios between rows of one
run are what the tables report.
"""

from __future__ import annotations

import gc
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class PeakMemory:
    """Peak resident memory above the level at entry, sampled every millisecond."""

    def __enter__(self) -> PeakMemory:
        gc.collect()
        self.base = _rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc: Any) -> None:
        self.peak = max(self.peak, _rss())
        self._stop.set()
        self._thread.join()

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def block(result: Any) -> Any:
    """Wait for JAX's asynchronous work inside any nest of results."""
    return jax.block_until_ready(result)


@dataclass
class Row:
    name: str
    best_s: float
    median_s: float
    peak_mb: float
    note: str = ""


def measure(name: str, fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1, note: str = "") -> Row:
    """Warm up (compiles), then the best and median of ``repeats`` timed calls; peak memory of one call."""
    for _ in range(warmup):
        block(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = block(fn())
        times.append(time.perf_counter() - start)
        del result
    with PeakMemory() as memory:
        result = block(fn())
        del result
    return Row(name, min(times), float(np.median(times)), memory.extra_mb, note)


def alternate(
    rows: list[tuple[str, Callable[[], Any]] | tuple[str, Callable[[], Any], str]], *, rounds: int = 3, warmup: int = 1
) -> list[Row]:
    """Time several methods in one process, alternating: ``rounds`` rounds, each calling every method once.

    On a shared machine the load changes within seconds; alternating spreads it
    over every row alike, so the ratios between rows (best against best) are
    what to trust. Each round starts from a different row so that no method
    always follows the same one. Warm-up (compiles) first; peak memory of one
    call per row after.
    """
    rows = [r if len(r) == 3 else (*r, "") for r in rows]
    for _, fn, _ in rows:
        for _ in range(warmup):
            block(fn())
    times: list[list[float]] = [[] for _ in rows]
    for r in range(rounds):
        for index in [(r + i) % len(rows) for i in range(len(rows))]:
            start = time.perf_counter()
            result = block(rows[index][1]())
            times[index].append(time.perf_counter() - start)
            del result
    out = []
    for (name, fn, note), t in zip(rows, times):
        with PeakMemory() as memory:
            result = block(fn())
            del result
        out.append(Row(name, min(t), float(np.median(t)), memory.extra_mb, note))
    return out


def ratio(rows: list[Row], slower: str, faster: str) -> float:
    """Best time of row ``slower`` over best time of row ``faster`` (how many times faster ``faster`` is)."""
    by_name = {r.name: r for r in rows}
    return by_name[slower].best_s / by_name[faster].best_s


def table(title: str, rows: list[Row], reference: str) -> str:
    """Markdown table; 'x ours' is each row's best time over the reference row's best time."""
    ref = next(r for r in rows if r.name == reference)
    lines = [
        f"#### {title}",
        "",
        "| method | best ms | median ms | x ours (best) | peak extra MiB | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {1e3 * r.best_s:.1f} | {1e3 * r.median_s:.1f} | {r.best_s / ref.best_s:.2f} "
            f"| {r.peak_mb:.0f} | {r.note} |"
        )
    return "\n".join(lines)


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"JAX {jax.__version__} on {jax.devices()[0].platform}, NumPy {np.__version__}"
    )
