"""Qt-free jobs: what each widget computes, as plain data and functions (a request captured on the GUI thread, the
job's :class:`~napari_gridmip._jobs.plan.Plan`, and a :class:`Job` that runs it in a worker; :class:`Job` says
how). One module per widget: ``mipmap``, ``patches``, ``tiled``, ``stitch``, ``correlation``, ``timeseries``,
``surface``; ``plan``, ``world``, ``device_layers``, ``live_render`` and ``settings`` are shared.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_gridmip._jobs.plan import KEY, Call, Plan, Source, now, ran_on, versions
from napari_gridmip.core.runtime import choice, compile_cache
from napari_gridmip.io.lazy import as_dask, is_lazy  # noqa: F401 - the jobs' shared helpers

ProgressCallback = Callable[[int, int], None]
LayerDataTuple = tuple[Any, dict, str]

# the layer settings a widget chooses and the user may change; a re-run replaces only those left as chosen
DISPLAY_KEYS = ("colormap", "contrast_limits", "opacity", "visible", "blending", "rendering", "length", "edge_width")


@dataclass(frozen=True)
class Output:
    """One result layer: napari's (data, keyword arguments, kind), and which output of the job's plan it shows
    (``role``: a name of :attr:`Plan.outputs <napari_gridmip._jobs.plan.Plan.outputs>`, whose expression is the
    layer's data as code over the calls' results). ``expression`` is only for a job that has no plan yet."""

    data: Any
    meta: dict
    kind: str
    role: str
    expression: str | None = None


def layer_tuples(
    outputs: list[Output],
    *,
    widget: str,
    plan: Plan | None = None,
    sources: list[Source] | None = None,
    calls: list[Call] | None = None,
) -> list[LayerDataTuple]:
    """napari layer-data tuples, each with its provenance (from ``plan``) in ``metadata["napari_gridmip"]``.

    (``sources`` and ``calls`` with each output's ``expression``, in place of a plan, make one from them.)
    """
    if plan is None:
        plan = Plan(sources or [], calls or [], {out.role: out.expression or "" for out in outputs})
    stamp = {**versions(), "time": now(), **copy.deepcopy(ran_on())}
    tuples = []
    for out in outputs:
        meta = dict(out.meta)
        provenance = plan.provenance(widget=widget, role=out.role, stamp=stamp)
        meta["metadata"] = {**meta.get("metadata", {}), KEY: provenance}
        tuples.append((out.data, meta, out.kind))
    return tuples


@dataclass(frozen=True)
class JobResult:
    """What a job hands back: layers to add (bottom first), a one-line summary and extra values for the widget."""

    layers: list[LayerDataTuple]
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """A description for the status line and activity dock, and the work itself.

    The model of the widget layer, in the manner of napari-animation's ``Animation``:

    1. On the GUI thread a widget captures a *request*: the arrays (never read
       there), the input layer's transform (:class:`~napari_gridmip._jobs.world.Frame`),
       the names and the parameters. Capturing reads layers; nothing later does.
    2. ``<job>_plan(request)`` makes the job's :class:`~napari_gridmip._jobs.plan.Plan`:
       its sources, the public calls and the outputs. The command line makes the
       same plan from the same options, with files for sources.
    3. ``make_*_job(request)`` turns it into a :class:`Job`: a description and a
       callable ``run(progress) -> JobResult``, which the widget's runner calls in a
       napari thread worker. It executes the plan there (JAX runs only there).
    4. The :class:`JobResult` holds napari layer-data tuples, in the order they are
       added (bottom first), and a one-line summary. The runner adds the layers on
       the GUI thread, all or none, or replaces the previous run's layers of the
       same output.

    Every layer a job makes carries its provenance in ``metadata["napari_gridmip"]``
    (:func:`layer_tuples`), read from the plan that computed it: the public calls
    (one :class:`~napari_gridmip._jobs.plan.Call` record each), the input layers,
    the versions and the time, where the calls ran (``"ran_on"``: the runner runs
    each job in :func:`placed`), and its data as the plan's output expression, from
    which the widget's "Copy as Python" writes a script.

    ``progress(done, total)`` may raise (the runner's Cancel does), which stops a job between steps; every job
    reports several steps.
    """

    description: str
    run: Callable[[ProgressCallback], JobResult]


# -- JAX set-up, run in the worker -------------------------------------------------------


def prepare_jax() -> str:
    """Turn on JAX's persistent compilation cache (unless the user chose one) and name the device.

    Runs in a worker before the first job: compiled programs then survive
    napari restarts: napari started again skips the compile (docs/benchmarks.md,
    "First calls"). Returns e.g. ``'JAX device: cpu (cpu, 1 available)'``.
    """
    import jax  # in the worker: the widgets' modules load without JAX

    compile_cache.enable()
    device = jax.devices()[0]
    return f"JAX device: {device.platform} ({device.device_kind}, {len(jax.devices())} available)"


@contextlib.contextmanager
def placed(where: str) -> Iterator[dict[str, Any]]:
    """Run a job's work in the block where the setting ``where`` says (:func:`napari_gridmip.compute_on`: "auto",
    "accelerator" or "host"), logging where each of its calls ran for its provenance; yields the log's record
    (``"ran_on"``, :func:`napari_gridmip.core.runtime.choice.record`). In the worker: it imports JAX."""
    from napari_gridmip.core import compute_on  # imports JAX: in the worker, not as the widgets load

    with compute_on(where), choice.recording() as record:
        yield record


# -- shared by the jobs ---------------------------------------------------------------------


def is_lazy_value(value: Any) -> bool:
    """A dask array, or a tuple (a named result) holding one."""
    if isinstance(value, tuple):
        return any(is_lazy_value(v) for v in value)
    return hasattr(value, "dask")


def staged(
    plan: Plan,
    progress: ProgressCallback,
    weights: dict[str, int],
    *,
    pass_progress: bool = True,
    always: tuple[str, ...] = (),
    keep: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The ``extras`` and ``after`` of :meth:`Plan.execute <napari_gridmip._jobs.plan.Plan.execute>` for a job
    in the worker: each call (by its ``result``) gets ``weights[result]`` of the progress steps; a function that
    reports progress is given its share (when ``pass_progress``; always to the calls named in ``always``, which
    an evaluator computes), a lazy result is computed with one step per dask
    task, and results come back as NumPy (as the layers hold them), except those named in ``keep``.
    """
    total = sum(weights.get(call.result, 0) for call in plan.calls)
    starts, first = {}, 0
    for call in plan.calls:
        starts[call.result] = first
        first += weights.get(call.result, 0)

    def share(call: Call) -> ProgressCallback:
        start, width = starts[call.result], weights.get(call.result, 0)
        return lambda done, steps: progress(start + round(width * done / max(steps, 1)), total)

    def extras(i: int, call: Call) -> dict[str, Any]:
        progress(starts[call.result], total)
        if call.result in always or (pass_progress and weights.get(call.result) and call.accepts("progress")):
            return {"progress": share(call)}
        return {}

    def after(i: int, call: Call, value: Any) -> Any:
        if call.result not in keep:
            value = computed(value, share(call))
        progress(starts[call.result] + weights.get(call.result, 0), total)
        return value

    return {"extras": extras, "after": after}


def computed(value: Any, progress: ProgressCallback) -> Any:
    """``value`` in memory: a dask array (or a named tuple of them) computed with one progress step per task,
    JAX arrays fetched to NumPy; anything else as it is."""
    if is_lazy_value(value):
        import dask  # a lazy value's job only (dask takes 0.1 s to import)

        with DaskProgress(progress):
            if isinstance(value, tuple):
                parts = dask.compute(*value, scheduler="threads")
                value = type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
            else:
                (value,) = dask.compute(value, scheduler="threads")
    if isinstance(value, tuple):
        for part in value:  # every part's transfer started at once: on an accelerator they overlap
            if hasattr(part, "copy_to_host_async"):
                part.copy_to_host_async()
        parts = [computed(v, progress) for v in value]
        return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
    if hasattr(value, "device") and hasattr(value, "shape"):  # a jax.Array
        return np.asarray(value)
    return value


class DaskProgress:
    """Reports each finished dask task as ``progress(done, total)``; an exception from it stops the compute."""

    def __init__(self, progress: ProgressCallback) -> None:
        from dask.callbacks import Callback  # as in computed: lazy values only

        outer = self

        class _Callback(Callback):
            def _start_state(self, dsk: Any, state: Any) -> None:
                outer.total = len(state["ready"]) + len(state["waiting"]) + len(state["running"])
                outer.done = 0
                progress(0, outer.total)

            def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
                outer.done += 1
                progress(outer.done, outer.total)

        self.total = self.done = 0
        self._callback = _Callback()

    def __enter__(self) -> DaskProgress:
        self._callback.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._callback.__exit__(*exc)
