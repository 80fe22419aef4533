"""The benchmarks' one harness: times each case, records its first call, its warm times, its peak memory and the
machine, and writes one JSON file per run (``$NAPARI_GRIDMIP_BENCH_RESULTS``, default ``benchmarks/results/``).

Times alone mean little on a shared machine; the ratios between cases of one run are the figures to read. A case's
``ratio`` is its best warm time over its group's reference case's (``x ours``: 3.0 means three times slower).

How to add a benchmark, ``benchmarks/bench_NAME.py`` (``python -m benchmarks run NAME [--quick]`` runs it)::

    from _harness import alternate, measure, note, record, start_run, table

    def main() -> None:
        args = parser.parse_args()          # every benchmark takes --quick: tiny sizes, seconds
        start_run("NAME", args)             # the run: machine, arguments; its JSON file is written at exit
        rows = alternate([("ours", lambda: ours(x)), ("peer", lambda: peer(x), "a note")], rounds=3)
        print(table("What the rows compute", rows, "ours"))    # one group; each row's ratio against "ours"
        measure("ours alone", lambda: ours(x), group="single")  # one case: first call, best of 5, memory
        record("cold process", first_s=t, group="cold")         # a figure measured elsewhere (a child, a GUI)
        note("max error", err)                                   # any other result, into the run's info

One function per case (a zero-argument callable): :func:`measure` and :func:`alternate` call it, wait for JAX
(:func:`block`), time the first call (compiles included) apart from the warm calls (best and median), and take the
peak resident memory of one more call. Every :class:`Row` they make joins the open run; :func:`record` adds figures
measured another way, and :func:`device` the device its children used. ``with Run("NAME", args): ...`` is
:func:`start_run` for a block (the file written at its end). Outside a run nothing is recorded: probes and tests
import these functions freely. JSON fields: ``benchmark``, ``argv``, ``quick``, ``params``, ``started``, ``wall_s``,
``error``, ``machine`` (platform, processor, cores, memory, JAX device, versions), ``cases`` (name, group, first_s,
best_s, median_s, times_s, peak_mb, reference, ratio, note, extra) and ``info``.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import gc
import json
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = 1
RESULTS_ENV = "NAPARI_GRIDMIP_BENCH_RESULTS"
DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"
# Distributions whose versions a run records when they are imported by then: ours, JAX, and the peers.
VERSIONED = (
    "napari-gridmip", "jax", "jaxlib", "numpy", "scipy", "numba", "dask", "zarr", "tifffile", "napari", "vispy",
    "torch", "monai", "m2stitch", "ashlar", "mbipy", "pyvale", "tiler", "mudic", "caiman", "psutil", "scikit-image",
)  # fmt: skip
_MODULE_OF = {"napari-gridmip": "napari_gridmip", "scikit-image": "skimage", "jaxlib": "jaxlib"}

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
    """Wait for JAX's asynchronous work inside any nest of results (no JAX imported: nothing to wait for)."""
    if "jax" in sys.modules:
        return sys.modules["jax"].block_until_ready(result)
    return result


@dataclass
class Row:
    """One case of a run: its first call apart, the warm calls' times, and the peak extra memory of one call.

    ``best_s``/``median_s`` are the warm calls' minimum and median (``nan`` where only a first call was timed);
    ``group`` and ``reference`` (the group's reference case) are set by :func:`table` or given to
    :func:`record`; ``extra`` holds the case's other figures (JSON values).
    """

    name: str
    best_s: float
    median_s: float
    peak_mb: float | None = None
    note: str = ""
    first_s: float | None = None
    times_s: list[float] = field(default_factory=list)
    group: str = ""
    reference: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Run:
    """One run of one benchmark: collects its rows, the machine and the arguments, and writes the JSON file.

    Parameters
    ----------
    benchmark
        The benchmark's name, as ``python -m benchmarks run`` takes it (``bench_NAME.py``'s NAME).
    args
        The parsed command line (recorded as ``params``; ``args.quick`` as ``quick``).
    folder
        Where the file goes; default ``$NAPARI_GRIDMIP_BENCH_RESULTS`` or ``benchmarks/results/``.
    """

    active: Run | None = None

    def __init__(
        self, benchmark: str, args: argparse.Namespace | dict[str, Any] | None = None, *, folder: Path | None = None
    ) -> None:
        self.benchmark = benchmark
        self.args = args
        self.folder = Path(folder or os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS)
        self.rows: list[Row] = []
        self.info: dict[str, Any] = {}
        self.device: dict[str, Any] | None = None
        self.path: Path | None = None
        self.error: str | None = None

    @property
    def params(self) -> dict[str, Any]:
        """The arguments as they are when the file is written (after a benchmark's ``--quick`` changed them)."""
        args = self.args
        return dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))

    def __enter__(self) -> Run:
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self._clock = time.perf_counter()
        self._outer, Run.active = Run.active, self
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        Run.active = self._outer
        if kind is KeyboardInterrupt:
            return
        if error is not None and not (isinstance(error, SystemExit) and not error.code):
            self.error = f"{kind.__name__}: {error}"
        self.finish()

    def finish(self) -> None:
        """Write the file, once, and say where."""
        if self.path is None:
            self.path = self.write()
            print(f"\nresults: {self.path}", file=sys.stderr)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        if self.device is None:  # the first row's device: JAX's backend is started by now where the case used it
            self.device = _jax_device()
        return row

    def to_dict(self) -> dict[str, Any]:
        """The run as the JSON file holds it."""
        by_group: dict[str, dict[str, Row]] = {}
        for row in self.rows:
            by_group.setdefault(row.group, {})[row.name] = row
        cases = []
        for row in self.rows:
            case = asdict(row)
            reference = by_group[row.group].get(row.reference) if row.reference else None
            case["ratio"] = row.best_s / reference.best_s if reference and reference.best_s > 0 else None
            cases.append(case)
        finished = datetime.datetime.now(datetime.timezone.utc)
        return {
            "schema": SCHEMA,
            "benchmark": self.benchmark,
            "argv": sys.argv,
            "quick": bool(self.params.get("quick", False)),
            "params": self.params,
            "started": self.started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "wall_s": time.perf_counter() - self._clock,
            "error": self.error,
            "machine": machine_info(self.device),
            "cases": cases,
            "info": self.info,
        }

    def write(self) -> Path:
        """Write the run's JSON file, ``BENCHMARK-YYYYmmddTHHMMSSZ-PID.json``, and return its path."""
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
        path = self.folder / f"{self.benchmark}-{stamp}-{os.getpid()}.json"
        path.write_text(json.dumps(_jsonable(self.to_dict()), indent=1, allow_nan=False) + "\n", encoding="utf-8")
        return path


def start_run(benchmark: str, args: argparse.Namespace | dict[str, Any] | None = None) -> Run:
    """Open the run of ``benchmark`` for the rest of the process: the file is written when the process exits
    (an uncaught exception is recorded as the run's ``error``). The one line a benchmark's ``main`` needs, after
    its arguments are parsed and after any branch that serves a child process of its own."""
    run = Run(benchmark, args).__enter__()
    hook = sys.excepthook

    def record_error(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        run.error = f"{kind.__name__}: {error}"
        hook(kind, error, tb)

    sys.excepthook = record_error
    atexit.register(run.finish)
    return run


def _jsonable(value: Any) -> Any:
    """JSON values for anything a benchmark records: NaN and infinities as null, paths and the rest as text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.generic, np.ndarray)):
        return _jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def _join(row: Row) -> Row:
    if Run.active is not None:
        Run.active.add(row)
    return row


def record(
    name: str,
    *,
    best_s: float | None = None,
    times_s: Iterable[float] = (),
    first_s: float | None = None,
    peak_mb: float | None = None,
    group: str = "",
    reference: str | None = None,
    note: str = "",
    **extra: Any,
) -> Row:
    """A case measured another way (a child process, a GUI, a CLI): its figures as they are, joined to the run.

    ``best_s`` defaults to the minimum of ``times_s`` (``nan`` when neither is given: a case with only a first
    call); keyword arguments beyond these go to the case's ``extra``.
    """
    times = [float(t) for t in times_s]
    best = float(best_s) if best_s is not None else (min(times) if times else math.nan)
    median = float(np.median(times)) if times else best
    return _join(Row(name, best, median, peak_mb, note, first_s, times, group, reference, extra))


def device(platform: str, kind: str, count: int | None = None) -> None:
    """The device the cases ran on, where they ran in child processes (a parent must not start JAX itself:
    an accelerator serves one process at a time)."""
    if Run.active is not None:
        Run.active.device = {"platform": platform, "kind": kind, "count": count}


def note(key: str, value: Any) -> None:
    """A result that is no timing (an accuracy, a count, a table's text) into the open run's ``info``."""
    if Run.active is not None:
        Run.active.info[key] = value


def measure(
    name: str,
    fn: Callable[[], Any],
    *,
    repeats: int = 5,
    warmup: int = 1,
    note: str = "",
    group: str = "",
    memory: bool = True,
) -> Row:
    """One case: the first call timed apart (compiles), the rest of ``warmup``, then the best and median of
    ``repeats`` timed calls, and the peak extra memory of one more call (``memory=False``: none)."""
    first = None
    for index in range(warmup):
        start = time.perf_counter()
        block(fn())
        if index == 0:
            first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = block(fn())
        times.append(time.perf_counter() - start)
        del result
    if first is None and times:
        first = times[0]
    peak = _peak(fn) if memory else None
    return _join(Row(name, min(times), float(np.median(times)), peak, note, first, times, group))


def _peak(fn: Callable[[], Any]) -> float:
    with PeakMemory() as memory:
        result = block(fn())
        del result
    return memory.extra_mb


def alternate(
    rows: list[tuple[str, Callable[[], Any]] | tuple[str, Callable[[], Any], str]],
    *,
    rounds: int = 3,
    warmup: int = 1,
    group: str = "",
    memory: bool = True,
) -> list[Row]:
    """Time several cases in one process, alternating: ``rounds`` rounds, each calling every case once.

    On a shared machine the load changes within seconds; alternating spreads it over every case alike, so the
    ratios between cases (best against best) are what to trust. Each round starts from a different case so that
    none always follows the same one. The first call of each case is timed apart (compiles), then the rest of
    ``warmup``; peak memory of one call per case after.
    """
    rows = [r if len(r) == 3 else (*r, "") for r in rows]
    firsts: list[float | None] = []
    for _, fn, _ in rows:
        first = None
        for index in range(warmup):
            start = time.perf_counter()
            block(fn())
            if index == 0:
                first = time.perf_counter() - start
        firsts.append(first)
    times: list[list[float]] = [[] for _ in rows]
    for r in range(rounds):
        for index in [(r + i) % len(rows) for i in range(len(rows))]:
            start = time.perf_counter()
            result = block(rows[index][1]())
            times[index].append(time.perf_counter() - start)
            del result
    out = []
    for (name, fn, text), t, first in zip(rows, times, firsts):
        peak = _peak(fn) if memory else None
        first = t[0] if first is None else first
        out.append(_join(Row(name, min(t), float(np.median(t)), peak, text, first, t, group)))
    return out


def ratio(rows: list[Row], slower: str, faster: str) -> float:
    """Best time of row ``slower`` over best time of row ``faster`` (how many times faster ``faster`` is)."""
    by_name = {r.name: r for r in rows}
    return by_name[slower].best_s / by_name[faster].best_s


def group(title: str, rows: Iterable[Row], reference: str) -> list[Row]:
    """Make ``rows`` one group, ``title``, whose ratios are against the row named ``reference``."""
    rows = list(rows)
    for r in rows:
        r.group, r.reference = title, reference
    return rows


def table(title: str, rows: list[Row], reference: str) -> str:
    """Markdown table of ``rows``, which it makes one group (``title``, unless they have one) with ``reference``
    as the reference: 'x ours' is each row's best time over the reference row's, as the JSON file's ``ratio``."""
    for r in rows:
        r.group, r.reference = r.group or title, reference
    ref = next(r for r in rows if r.name == reference)
    lines = [
        f"#### {title}",
        "",
        "| method | first s | best ms | median ms | x ours (best) | peak extra MiB | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        first = "" if r.first_s is None else f"{r.first_s:.3g}"
        peak = "" if r.peak_mb is None else f"{r.peak_mb:.0f}"
        lines.append(
            f"| {r.name} | {first} | {1e3 * r.best_s:.1f} | {1e3 * r.median_s:.1f} | {r.best_s / ref.best_s:.2f} "
            f"| {peak} | {r.note} |"
        )
    return "\n".join(lines)


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in VERSIONED:
        module = _MODULE_OF.get(name, name)
        if name in ("napari-gridmip", "jax", "numpy") or module in sys.modules:
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
    return versions


def _jax_device() -> dict[str, Any] | None:
    """The default JAX device, only where this process has started a backend already: asking would start one,
    and a parent whose children use the accelerator must not hold it."""
    if "jax" not in sys.modules:
        return None
    try:
        from jax._src import xla_bridge

        if not getattr(xla_bridge, "_backends", None):
            return None
        import jax

        devices = jax.devices()
    except Exception:  # noqa: BLE001 - a private module moved, or no backend: the record says so
        return None
    return {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices)}


def _unasked_device() -> dict[str, Any]:
    """What a run says of the device where its cases ran in children and none reported it (asking would start JAX
    in this process)."""
    return {
        "platform": os.environ.get("JAX_PLATFORMS") or "default",
        "kind": None,
        "note": "not asked: JAX not started here",
    }


def machine_info(device: dict[str, Any] | None = None) -> dict[str, Any]:
    """The machine as a run records it: platform, processor, cores, memory, the JAX device and the versions.

    ``device`` is what a parent whose cases ran in children learnt from them (else this process's JAX device).
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    memory = None
    try:
        with open("/proc/meminfo") as f:
            memory = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": memory,
        "device": device or _jax_device() or _unasked_device(),
        "versions": _versions(),
    }


def machine() -> str:
    """The machine in one line, for a table's heading (starts JAX's backend)."""
    import jax

    device = jax.devices()[0]
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"JAX {jax.__version__} on {device.platform} ({device.device_kind}), NumPy {np.__version__}"
    )
