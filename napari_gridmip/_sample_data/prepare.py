"""``napari-gridmip --prepare``: compile the widgets' programs for their samples once per machine, ahead of the
first Run.

A first Run on a new machine compiles its programs: on a TPU v5e, 29 s for DIC 2048^2 and 33 s for the affine DIC
(docs/accelerator.md). JAX's persistent cache (:mod:`napari_gridmip.core.runtime.compile_cache`) and the kept
executables
(:mod:`napari_gridmip.core.runtime.executables`) keep what one process compiled for the next, so a machine needs this
once. :func:`prepare` runs, in this process, each widget's job on its sample's input (:data:`JOBS`): the request
the widget captures when the sample is opened and Run is clicked with the options a new user has (the widget's
defaults and the sample's suggestion; ``tests/widgets/test_prepare_requests.py`` holds the two equal), made into
the widget's own job (``make_*_job``) and run as the widget's worker runs it (:func:`napari_gridmip._jobs.placed`,
the inputs sent to the accelerator as the widget sends its layers). Its programs, with their shapes and static
options, are then those of the widget's first Run.

A marker beside the cache folder (:func:`marker_path`) records what was prepared, keyed by the device (platform
and kind), the setting ``compute_on``, JAX's and jaxlib's versions, the package's version and its core's sources:
a second call on the same machine says so and returns, unless ``force``. :func:`start_in_background` runs the
same in a detached process that writes to a log beside the marker.

This module imports neither JAX nor napari: the command line's start stays cheap, and the parent of a background
run never takes the accelerator that its child needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from napari_gridmip.core.runtime.files import write_atomically

PROG = "napari-gridmip --prepare"
MARKER_NAME = "prepared.json"
LOG_NAME = "prepare.log"
LOCK_NAME = "prepare.lock"


class PrepareError(Exception):
    """A reason why this machine cannot be prepared: one line, exit status 2."""


@dataclass(frozen=True)
class SampleJob:
    """One widget's first Run on one sample: ``request(cache)`` is the widget's request for the sample's layers
    (its device inputs in ``cache``), ``make(request)`` the widget's job."""

    name: str
    widget: str
    sample: str
    request: Callable[..., Any]
    make: Callable[[Any], Any]
    #: the key of the sample (File > Open Sample) whose opening in napari runs this job ahead, in the background
    #: (:mod:`napari_gridmip._sample_data.ahead`); "" for none. ``request(cache, layers)`` then takes its layers.
    ahead_of_sample: str = ""

    @property
    def title(self) -> str:
        return f"{self.widget}, {self.sample} sample"


# -- the widgets' requests for their samples (the widget's defaults and the sample's suggestion) ---------------------


def _layers(sample: Callable[[], list[tuple]]) -> list[tuple[Any, dict, str]]:
    return [tuple(layer) for layer in sample()]


def _frame(data: Any) -> Any:
    """A new layer's transform: unit pixels at the origin (the samples set no scale or translate)."""
    from napari_gridmip._jobs.world import Frame

    return Frame.unit(np.ndim(data))


def _device(cache: Any, data: Any, name: str, index: str = "") -> Any:
    """The widget's :class:`~napari_gridmip._jobs.device_layers.DeviceInput` of a layer (``JobWidget.device_input``):
    the job sends ``data`` to the accelerator where its kernels run there, as the widget's first Run does."""
    from napari_gridmip._jobs.device_layers import DeviceInput

    if cache is None or not isinstance(data, np.ndarray):
        return None
    return DeviceInput((f"prepare:{name}", index), 0, data, name, None, cache)


def mipmap_request(cache: Any = None) -> Any:
    """The Occupancy mipmap widget on the occupancy volume: threshold 0, no per-level layers."""
    from napari_gridmip._jobs.mipmap import MipmapRequest
    from napari_gridmip._sample_data import occupancy_sample

    ((data, meta, _),) = _layers(occupancy_sample)
    return MipmapRequest(
        name=meta["name"],
        data=data,
        frame=_frame(data),
        threshold=0.0,
        per_level=False,
        index="",
        device=_device(cache, data, meta["name"]),
    )


def patches_request(cache: Any = None) -> Any:
    """The Reassemble patches widget on the image tiles: the sample's tiling (grid axes first), blend "mean"."""
    from napari_gridmip._jobs.patches import MergeRequest
    from napari_gridmip._sample_data import tiles_sample

    ((data, meta, _),) = _layers(tiles_sample)
    tiling = meta["metadata"]["gridmip_tiling"]
    stride = tuple(int(s) for s in tiling["stride"])
    d, shape = len(stride), tuple(data.shape)
    lead = len(shape) - 2 * d
    return MergeRequest(
        name=meta["name"],
        patches=data,
        image_shape=tuple(int(n) for n in tiling["image_shape"]),
        stride=stride,
        blend="mean",
        frame=_frame(data),
        placement_axes=tuple(range(len(shape) - d - lead, len(shape))),
        index="",
    )


def tiled_request(cache: Any = None) -> Any:
    """The Process in tiles widget on the occupancy volume: its first filter with its defaults, 2 tiled axes, tiles
    of 256 px, no overlap."""
    from napari_gridmip._jobs.tiled import TiledRequest
    from napari_gridmip._sample_data import occupancy_sample
    from napari_gridmip.core.patches.tiled_filters import TILED_FILTER_NAMES, TILED_FILTERS

    ((data, meta, _),) = _layers(occupancy_sample)
    name = TILED_FILTER_NAMES[0]
    # as the widget's fields give them: a SpinBox an int, a FloatSpinBox a float (2 and 2.0 are two programs)
    kinds = {int: int, str: str}
    parameters = {p.name: kinds.get(p.kind, float)(p.default) for p in TILED_FILTERS[name].parameters}
    return TiledRequest(
        name=meta["name"],
        data=data,
        frame=_frame(data),
        filter=name,
        tile=(256, 256),
        parameters=parameters,
        overlap=0,
        blend="gaussian",
        import_path="",
        halo=0,
        labels=False,
    )


def stitch_request(cache: Any = None) -> Any:
    """The Stitch tiles widget on the mosaic tiles: the layer's stage positions and overlap, the other options the
    widget's defaults (order row-major, max shift auto, blend linear, no flat-field)."""
    from napari_gridmip._jobs.plan import Source
    from napari_gridmip._jobs.stitch import StitchRequest
    from napari_gridmip._sample_data.mosaic import mosaic_sample
    from napari_gridmip.core.options import FUSE_BLENDS, GRID_ORDERS

    ((data, meta, _),) = _layers(mosaic_sample)
    name, mosaic = meta["name"], meta["metadata"]["gridmip_mosaic"]
    positions = np.asarray(mosaic["stage_positions"], dtype=float)
    code = f"viewer.layers[{name!r}].metadata['gridmip_mosaic']['stage_positions']"
    return StitchRequest(
        name=name,
        tiles=data,
        frame=_frame(data),
        grid_shape=(len(positions),) + (1,) * (positions.shape[-1] - 1),
        positions=positions,
        source=Source("tiles", layer=name),
        positions_code=code,
        overlap=float(mosaic["overlap"]),
        order=GRID_ORDERS[0],
        max_shift="auto",
        blend=FUSE_BLENDS[0],
        flat_field=False,
    )


def _pair_request(sample: Callable[[], list[tuple]], cache: Any, layers: list[tuple] | None = None, **changes: Any
                  ) -> Any:  # fmt: skip
    """The Correlation map widget on a pair sample: the mode and options the sample suggests (its
    ``gridmip_correlation``), the rest the widget's defaults; ``changes`` as a user would set them after. ``layers``:
    the sample's layer data as napari was given it (else the sample is read again)."""
    from napari_gridmip._jobs.correlation import CorrelationRequest

    (data1, meta1, _), (data2, meta2, _) = _layers(sample if layers is None else lambda: layers)[:2]
    suggested = meta1["metadata"]["gridmip_correlation"]
    pair = suggested["mode"] != "stacks"
    subset = tuple(int(s) for s in suggested.get("subset", (21, 21))) if pair else (1, 1)
    names = ("transmission", "dark_field", "phase", "strain", "uncertainty")  # the widget's order
    index = "[None]" if pair and data1.ndim == 2 else ""
    name1, name2 = meta1["name"], meta2["name"]
    options = dict(
        name1=name1,
        name2=name2,
        data1=data1,
        data2=data2,
        frame=_frame(data2),
        window=tuple(int(w) for w in suggested.get("window", (9, 9))),
        subpixel=suggested.get("subpixel", "hessian"),
        dtype="float32",
        spacing=int(suggested.get("spacing", 8)),
        vector_scale=0.0,
        full_map=False,
        subset=subset,
        step=int(suggested.get("step", 2)) if pair else 1,
        outputs=tuple(n for n in names if n in suggested.get("outputs", ())),
        frame1=_frame(data1),
        index=index,
        strain_window=int(suggested.get("strain_window", 11)),
        physics=None,
        shape="translation",
        devices=(_device(cache, data1, name1), _device(cache, data2, name2)),
    )
    return CorrelationRequest(**{**options, **changes})


def speckle_request(cache: Any = None) -> Any:
    """The Correlation map widget on the speckle pair: stacks, window 9 x 9, Hessian peaks."""
    from napari_gridmip._sample_data import speckle_sample

    return _pair_request(speckle_sample, cache)


def speckle_contrast_request(cache: Any = None, layers: list[tuple] | None = None) -> Any:
    """The Correlation map widget on the speckle pair with contrast: subset 3, refine, transmission, dark-field and
    phase (track_speckles)."""
    from napari_gridmip._sample_data import speckle_contrast_sample

    return _pair_request(speckle_contrast_sample, cache, layers)


def dic_request(cache: Any = None, layers: list[tuple] | None = None) -> Any:
    """The Correlation map widget on the DIC pair: subset 31, step 4, refine, strain."""
    from napari_gridmip._sample_data.dic import dic_sample

    return _pair_request(dic_sample, cache, layers)


def dic_affine_request(cache: Any = None) -> Any:
    """The same with the subsets' shape "affine" (an advanced option: IC-GN, the largest program)."""
    from napari_gridmip._sample_data.dic import dic_sample

    return _pair_request(dic_sample, cache, shape="affine")


def dic_series_request(cache: Any = None) -> Any:
    """The Correlation map widget on the DIC series: subset 31, step 8, accumulated, the sample's ROI."""
    from napari_gridmip._jobs.correlation import SeriesRequest
    from napari_gridmip._jobs.plan import Source
    from napari_gridmip._sample_data.dic_series import dic_series_sample

    (frames, meta, _), (roi, roi_meta, _) = _layers(dic_series_sample)
    suggested = meta["metadata"]["gridmip_correlation"]
    return SeriesRequest(
        name=meta["name"],
        data=frames,
        frame=_frame(frames),
        subset=tuple(int(s) for s in suggested["subset"]),
        step=int(suggested["step"]),
        reference=suggested["reference"],
        roi=Source("roi", layer=roi_meta["name"], index=""),
        roi_data=np.array(roi, copy=True),
        spacing=int(suggested["spacing"]),
        vector_scale=0.0,
    )


def calcium_request(cache: Any = None) -> Any:
    """The Correlation map widget on the calcium movie: time series, 8 neighbours."""
    from napari_gridmip._jobs.timeseries import TimeSeriesRequest
    from napari_gridmip._sample_data.calcium import calcium_sample

    movie, meta, _ = _layers(calcium_sample)[0]
    neighbours = int(meta["metadata"]["gridmip_correlation"].get("neighbours", 8))
    return TimeSeriesRequest(
        meta["name"], movie, _frame(movie), neighbours, "float32", device=_device(cache, movie, meta["name"])
    )


def _job(module: str, name: str) -> Callable[[Any], Any]:
    def make(request: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(f"napari_gridmip._jobs.{module}"), name)(request)

    return make


#: Every widget's first Run on its sample, in the order they are prepared. Not the large sparse volume's: a Run on
#: it reads its 2048^3 level 0 from disk block by block, minutes that no compile ahead would shorten.
JOBS: tuple[SampleJob, ...] = (
    SampleJob(
        "dic",
        "Correlation map",
        "DIC pair",
        dic_request,
        _job("correlation", "make_correlation_job"),
        ahead_of_sample="dic",
    ),  # fmt: skip
    SampleJob(
        "dic-affine",
        "Correlation map, subset shape affine",
        "DIC pair",
        dic_affine_request,
        _job("correlation", "make_correlation_job"),
    ),
    SampleJob(
        "speckle", "Correlation map", "speckle pair", speckle_request, _job("correlation", "make_correlation_job")
    ),
    SampleJob(
        "speckle-contrast",
        "Correlation map",
        "speckle pair with contrast",
        speckle_contrast_request,
        _job("correlation", "make_correlation_job"),
        ahead_of_sample="speckle-contrast",
    ),
    SampleJob(
        "dic-series", "Correlation map", "DIC series", dic_series_request, _job("correlation", "make_series_job")
    ),
    SampleJob(
        "calcium", "Correlation map", "calcium movie", calcium_request, _job("timeseries", "make_timeseries_job")
    ),
    SampleJob("mipmap", "Occupancy mipmap", "occupancy volume", mipmap_request, _job("mipmap", "make_mipmap_job")),
    SampleJob("tiled", "Process in tiles", "occupancy volume", tiled_request, _job("tiled", "make_tiled_job")),
    SampleJob("patches", "Reassemble patches", "image tiles", patches_request, _job("patches", "make_merge_job")),
    SampleJob("stitch", "Stitch tiles", "mosaic tiles", stitch_request, _job("stitch", "make_stitch_job")),
)
JOB_NAMES = tuple(job.name for job in JOBS)


def run_job(job: SampleJob, where: str, cache: Any = None, *, layers: list[tuple] | None = None,
            progress: Callable[[int, int], None] | None = None) -> float:  # fmt: skip
    """Run ``job`` as the widget's worker runs its first Run (JAX set up, in the placement ``where``); its seconds,
    from the request made to the job's result (the sample read or made before). ``layers``: the sample's layer
    data (a job with ``ahead_of_sample`` only), else the sample is read; ``progress(done, total)`` the job's
    reports, which may raise to stop it between its steps."""
    from napari_gridmip._jobs import placed, prepare_jax
    from napari_gridmip._jobs.device_layers import DeviceLayerCache

    prepare_jax()
    copies = DeviceLayerCache() if cache is None else cache
    request = job.request(copies) if layers is None else job.request(copies, layers)
    try:
        start = time.perf_counter()
        with placed(where):
            job.make(request).run(progress or (lambda done, total: None))
        return time.perf_counter() - start
    finally:
        copies.clear()  # the inputs' device copies: the next job has the device to itself


# -- where, and what was prepared ----------------------------------------------------------------------------------


def cache_root() -> Path:
    """The library's cache folder: JAX's programs in ``jax/``, the kept executables in ``executables/``."""
    from napari_gridmip.core.runtime.compile_cache import cache_dir

    return cache_dir().parent


def marker_path() -> Path:
    return cache_root() / MARKER_NAME


def log_path() -> Path:
    return cache_root() / LOG_NAME


def cache_problem() -> str | None:
    """Why the library's cache cannot keep what a prepare compiles (without importing JAX), or None."""
    from napari_gridmip.core.options import switched_off

    if switched_off("NAPARI_GRIDMIP_COMPILE_CACHE"):
        return (
            "preparing needs the library's compile cache, which NAPARI_GRIDMIP_COMPILE_CACHE=0 switches off: "
            "nothing compiled now would reach the next process"
        )
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return (
            "preparing needs the library's compile cache, and JAX_COMPILATION_CACHE_DIR chooses your own: there "
            "JAX keeps only programs over 1 s and no executables are kept; unset it to prepare"
        )
    return None


def machine_key(where: str) -> dict[str, str]:
    """What the prepared programs hold for: the device, the setting ``compute_on``, the versions and the core's
    sources (the kept executables' key has them too), the host's processor (a cache folder shared between machines),
    and how many devices share the band programs with XLA's flags (other counts compile other programs,
    ``core._sharding``). Imports JAX and starts its backend."""
    import jax
    import jaxlib

    from napari_gridmip import __version__
    from napari_gridmip.core import compute_on
    from napari_gridmip.core.runtime import sharding, strategy
    from napari_gridmip.core.runtime.executables import host_fingerprint, sources_hash

    with compute_on(where):
        device = strategy.current_device()
        devices = len(sharding.band_devices())
    return {
        "host": host_fingerprint()[:16],
        "band_devices": str(devices),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "platform": str(device["platform"]),
        "device_kind": str(device["device_kind"]),
        "compute_on": where,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "napari_gridmip": __version__,
        "sources": sources_hash()[:16],
        "default_backend": jax.default_backend(),
    }


def read_marker(path: Path | None = None) -> list[dict[str, Any]]:
    """The marker's entries (none where it is missing or unreadable)."""
    path = marker_path() if path is None else path
    try:
        entries = json.loads(path.read_text(encoding="utf-8")).get("prepared", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("key"), dict)]


def prepared_entry(key: dict[str, str], names: Sequence[str], path: Path | None = None) -> dict[str, Any] | None:
    """The marker's entry for ``key`` that holds every job of ``names``, or None."""
    for entry in read_marker(path):
        if entry["key"] == key and set(names) <= set(entry.get("jobs", {})):
            return entry
    return None


def write_marker(key: dict[str, str], seconds: dict[str, float], path: Path | None = None) -> None:
    """Record ``key`` as prepared (jobs and seconds), beside the entries of other keys; whole or not at all."""
    path = marker_path() if path is None else path
    entries = [entry for entry in read_marker(path) if entry["key"] != key]
    entries.append(
        {"key": key, "jobs": {n: round(s, 2) for n, s in seconds.items()}, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    )
    write_atomically(path, json.dumps({"prepared": entries}, indent=1))


@contextlib.contextmanager
def _only_one(root: Path) -> Iterator[bool]:
    """Whether this process is the one preparing this cache folder now (an advisory lock; always, where the
    platform has none)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        yield True
        return
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_NAME, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _describe(key: dict[str, str]) -> str:
    return f"{key['platform']} ({key['device_kind']}), compute_on {key['compute_on']!r}, JAX {key['jax']}"


# -- the command ------------------------------------------------------------------------------------------------------


def prepare(
    where: str,
    *,
    force: bool = False,
    names: Sequence[str] | None = None,
    jobs: Sequence[SampleJob] | None = None,
    out: TextIO | None = None,
) -> int:
    """Compile and keep the widgets' programs for their samples in this process; the exit status.

    ``names``: only these jobs (default: all of :data:`JOBS`); ``jobs``: the jobs themselves (tests). A machine
    whose marker holds the same key and jobs is left as it is unless ``force``.

    Every job is tried: one that fails (a missing optional dependency, the device's memory) is reported in one
    line, its name and its error's first line, and the others still run, so that what can be prepared is. The
    exit status is then 1, and the marker is left unwritten: the machine is recorded as prepared only when every
    job was (a later call tries them all again, the prepared ones loading their programs from the cache).
    """
    out = sys.stdout if out is None else out
    problem = cache_problem()
    if problem:
        raise PrepareError(problem)
    jobs = list(JOBS if jobs is None else jobs)
    if names is not None:
        unknown = sorted(set(names) - {job.name for job in jobs})
        if unknown:
            raise PrepareError(f"unknown job {unknown[0]!r}; choose from {', '.join(job.name for job in jobs)}")
        jobs = [job for job in jobs if job.name in names]
    root = cache_root()
    with _only_one(root) as alone:
        if not alone:
            print(f"{PROG}: another process is preparing this machine now (log: {log_path()})", file=out, flush=True)
            return 0
        from napari_gridmip.core.runtime import compile_cache
        from napari_gridmip.core.runtime import executables as _executables

        folder = compile_cache.enable()
        if not compile_cache.is_ours():  # JAX's configuration was set in this process before (a user's script)
            raise PrepareError(f"preparing needs the library's compile cache; JAX's cache here is {folder}")
        key = machine_key(where)
        done = prepared_entry(key, [job.name for job in jobs])
        if done is not None and not force:
            print(
                f"{PROG}: already prepared for {_describe(key)} on {done.get('time', '?')} ({len(done['jobs'])} "
                f"jobs; {marker_path()}); --force prepares again",
                file=out,
                flush=True,
            )
            return 0
        kept = _executables.folder()
        print(
            f"{PROG}: compiling the widgets' first Runs for {_describe(key)} into {root}"
            + ("" if kept else " (kept executables off: NAPARI_GRIDMIP_EXECUTABLE_CACHE)"),
            file=out,
            flush=True,
        )
        seconds: dict[str, float] = {}
        failed: list[str] = []
        start = time.perf_counter()
        for job in jobs:
            try:
                seconds[job.name] = run_job(job, where)
            except Exception as error:  # noqa: BLE001 - reported in one line; the other jobs still run
                failed.append(job.name)
                print(f"{PROG}: failed: {job.name}: {_first_line(error)}", file=out, flush=True)
                continue
            print(f"  {job.name:<18} {seconds[job.name]:6.1f} s  ({job.title})", file=out, flush=True)
        _executables.wait_for_writes()
        total = time.perf_counter() - start
        if failed:
            print(
                f"{PROG}: prepared {len(seconds)} of {len(jobs)} jobs in {total:.1f} s; {len(failed)} failed "
                f"({', '.join(failed)}): the machine is not recorded as prepared",
                file=out,
                flush=True,
            )
            return 1
        write_marker(key, seconds)
        print(
            f"{PROG}: prepared {len(seconds)} jobs in {total:.1f} s; the first Run of each now loads its programs",
            file=out,
            flush=True,
        )
        return 0


def _first_line(error: BaseException) -> str:
    """``error``'s type and the first line of its message (a traceback's worth of text stays out of the report)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def start_in_background(where: str | None, *, force: bool = False) -> tuple[int, Path]:
    """Start ``napari-gridmip --prepare`` in a detached process (apart from the terminal: closing it does not stop the
    run) whose output goes to :func:`log_path`; its process id and the log. JAX is not imported here."""
    problem = cache_problem()
    if problem:
        raise PrepareError(problem)
    log = log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "napari_gridmip", "--prepare"]
    command += ["--force"] if force else []
    command += ["--compute-on", where] if where else []
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} napari-gridmip {' '.join(command[3:])}\n")
        handle.flush()
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    return process.pid, log
