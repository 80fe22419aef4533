"""One record of each public call, which is also what runs (Qt-free).

A job is a :class:`Plan`: its inputs (:class:`Source`), the public calls that compute it (:class:`Call`) and its
outputs. Executing it is how the widgets and the command line compute, and the same record gives a layer's
provenance (:func:`layer_provenance`), the "Copy as Python" script (:func:`python_script`), the command line's
file attributes (:func:`file_provenance`) and the re-run's "is this my layer?" test (:func:`same_output`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import inspect
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import napari_gridmip
from napari_gridmip.core.runtime import choice

KEY = "napari_gridmip"  # the layer.metadata entry, and the attribute name in files


@dataclass(frozen=True)
class Source:
    """Where a data argument comes from: a layer (``viewer.layers[name].data``) or a file (``read_array``).

    ``index`` is Python code applied to the data, such as ``"[3]"`` (one time point) or
    ``".reshape(4, 5, 128, 128)"``.
    """

    variable: str
    layer: str | None = None
    path: str | None = None
    index: str = ""
    expression: str | None = None  # any other binding, as code (e.g. a function found by its import path)

    def take(self, raw: Any) -> Any:
        """The value this source binds from its layer's (or file's) data: ``raw`` with :attr:`index` applied, the
        same code the script runs."""
        return _evaluate(f"_raw{self.index}", {"_raw": raw}) if self.index else raw

    def code(self) -> str:
        if self.expression is not None:
            return f"{self.variable} = {self.expression}"
        if self.path is not None:
            return f"{self.variable} = gm.read_array({self.path!r}){self.index}"
        return f"{self.variable} = viewer.layers[{self.layer!r}].data{self.index}"

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"variable": self.variable}
        if self.expression is not None:
            out["expression"] = self.expression
        elif self.path is not None:
            out["path"] = self.path
        else:
            out["layer"] = self.layer
        if self.index:
            out["index"] = self.index
        return out


@dataclass(frozen=True)
class Ref:
    """A keyword value that is code over earlier results (``Ref("field.dy_y")``), not a literal: the script prints
    the code, the record keeps ``{"ref": code}``, and evaluating the call evaluates it."""

    expression: str


@dataclass(frozen=True)
class Call:
    """``result = napari_gridmip.function(*data, *args, **kwargs)``, with the data named by variable.

    ``data`` are variable names (bound by :class:`Source` lines or by earlier calls' results), ``args``
    further positional values, ``kwargs`` the keyword options, ``result`` the assignment target
    (``"levels"``, ``"dy, dx, peak"``). Values are plain Python (numbers, text, tuples, lists).
    """

    function: str
    data: tuple[str, ...]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    result: str = "result"
    index: str = ""  # applied to the function's value, as code (``"[[0, 2, 1, 3]]"``: the stage in file order)

    def evaluate(self, namespace: Mapping[str, Any], **runtime: Any) -> dict[str, Any]:
        """Run the call on the values in ``namespace``; return its result's names bound to their values.

        The arguments are the ones :meth:`code` prints (tuples where the record holds lists), so what runs is
        what the script and the provenance say; ``runtime`` adds keywords that change how, never what, it
        computes (``progress``).
        """
        function = getattr(napari_gridmip, self.function)
        data = [_evaluate(name, namespace) for name in self.data]
        args = [_from_plain(_plain(a)) for a in self.args]
        kwargs = {
            k: _evaluate(v.expression, namespace) if isinstance(v, Ref) else _from_plain(_plain(v))
            for k, v in self.kwargs.items()
        }
        value = function(*data, *args, **kwargs, **runtime)
        return self.bind(_evaluate(f"_value{self.index}", {"_value": value}) if self.index else value)

    def bind(self, value: Any) -> dict[str, Any]:
        """``{name: value}`` for the assignment ``result = value`` (``"dy, dx, peak"`` unpacks)."""
        targets = [t.strip() for t in self.result.split(",")]
        if len(targets) == 1:
            return {targets[0]: value}
        values = tuple(value)
        if len(values) != len(targets):
            raise ValueError(f"{self.function} returned {len(values)} values; {self.result!r} takes {len(targets)}")
        return dict(zip(targets, values))

    def accepts(self, keyword: str) -> bool:
        """Whether the public function takes ``keyword`` (``progress``, for the runners)."""
        return keyword in _parameters(self.function)

    def code(self) -> str:
        parts = [*self.data, *map(_literal, self.args), *(f"{k}={_literal(v)}" for k, v in self.kwargs.items())]
        return f"{self.result} = gm.{self.function}({', '.join(parts)}){self.index}"

    def record(self) -> dict[str, Any]:
        out = {
            "function": f"napari_gridmip.{self.function}",
            "data": list(self.data),
            "args": [_plain(a) for a in self.args],
            "kwargs": {k: _plain(v) for k, v in self.kwargs.items()},
            "result": self.result,
        }
        if self.index:
            out["index"] = self.index
        return out


@functools.cache
def _parameters(function: str) -> frozenset[str]:
    """The parameter names of ``napari_gridmip.<function>`` (read once: ``inspect.signature`` is slow)."""
    return frozenset(inspect.signature(getattr(napari_gridmip, function)).parameters)


def versions() -> dict[str, str]:
    """The package's and JAX's versions, read from the installed metadata (JAX is not imported)."""
    from importlib import metadata  # 10 ms to import: only once a run stamps its results

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {"napari_gridmip": napari_gridmip.__version__, "jax": installed("jax"), "jaxlib": installed("jaxlib")}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def ran_on() -> dict[str, Any]:
    """``{"ran_on": ...}`` inside a job (the widgets' runs and the command line's record where their calls ran:
    :func:`napari_gridmip.core.runtime.choice.record`), else nothing: the setting ``compute_on`` and, for each call
    that ran, JAX's platform and device kind and the rules that moved its work to the host CPU."""
    record = choice.record()
    return {} if record is None else {"ran_on": record}


def _call_scope(call: Call) -> Any:
    """The scope of one call of a plan in a job's log of where its calls ran (nothing outside a job)."""
    if not choice.is_recording():
        return contextlib.nullcontext()
    device: dict[str, str] = {}
    if "jax" in sys.modules:  # a job's scope imports it (napari_gridmip.compute_on); a plan of files alone needs none
        from napari_gridmip.core.runtime import strategy  # imports JAX: only where it is loaded already

        device = strategy.current_device()
    return choice.calling(f"napari_gridmip.{call.function}", **device)


def layer_provenance(
    *,
    widget: str,
    role: str,
    sources: Sequence[Source],
    calls: Sequence[Call],
    expression: str,
    display: Mapping[str, Any] | None = None,
    stamp: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``metadata["napari_gridmip"]`` entry of one result layer.

    ``expression`` is the layer's data as Python code over the calls' results (``"levels[3]"``);
    ``display`` the display settings the widget chose (the runner fills it in from the new layer: a re-run
    replaces only those the user left alone).
    ``stamp`` (versions, time and where the calls ran) is shared by the layers of one run.
    """
    stamp = dict(stamp) if stamp is not None else {**versions(), "time": now(), **ran_on()}
    return {
        "widget": widget,
        "role": role,
        "inputs": {s.variable: s.layer for s in sources if s.layer is not None and s.expression is None},
        "sources": [s.record() for s in sources],
        "calls": [c.record() for c in calls],
        "expression": expression,
        "display": dict(display or {}),
        **stamp,
    }


def file_provenance(sources: Sequence[Source], calls: Sequence[Call], outputs: Mapping[str, str]) -> dict[str, Any]:
    """What the command line writes into its outputs: the calls, the input paths, versions, time, where the calls
    ran (:func:`ran_on`) and script."""
    return {
        "sources": [s.record() for s in sources],
        "calls": [c.record() for c in calls],
        **versions(),
        "time": now(),
        **ran_on(),
        "python": python_script(sources, calls, outputs),
    }


def python_script(sources: Sequence[Source], calls: Sequence[Call], outputs: Mapping[str, str]) -> str:
    """A short script that recomputes ``outputs`` (name -> expression over the calls' results).

    Layer sources read from ``viewer`` (napari's current viewer, or the one in napari's console); file
    sources from their paths. The script ends with ``results``, the outputs' arrays by name.
    """
    lines = [f'"""Made by napari-gridmip {versions()["napari_gridmip"]}: reproduces {len(outputs)} result(s)."""']
    uses_layers = any(s.layer is not None for s in sources)
    lines += ["import numpy as np", ""]
    if uses_layers:
        lines.insert(1, "import napari")
    lines += ["import napari_gridmip as gm", ""]
    if uses_layers:
        lines.append("viewer = napari.current_viewer()")
    lines += [s.code() for s in sources]
    lines += [c.code() for c in calls]
    lines += ["", "# the arrays of the results, by name", "results = {"]
    lines += [f"    {name!r}: {expression}," for name, expression in outputs.items()]
    lines += ["}", ""]
    return "\n".join(lines)


def script_from_layers(layers: Sequence[Any]) -> str:
    """The "Copy as Python" text: one script that remakes ``layers``, each from its own provenance.

    Their sources and calls in order, each once where two layers share it (the layers of one run); a name that
    two layers bind differently (``levels`` at two thresholds, a run and a later click's surface) gets a suffix.
    """
    sources: list[Source] = []
    calls: list[Call] = []
    outputs: dict[str, str] = {}
    bound: dict[str, Any] = {}  # variable -> the record that binds it

    def bind(variable: str, record: Any, rename: dict[str, str]) -> tuple[str, bool]:
        """The variable's name in the script, and whether its line is new."""
        name, n = variable, 1
        while name in bound and bound[name] != record:
            n += 1
            name = f"{variable}_{n}"
        new = name not in bound
        bound[name] = record
        rename[variable] = name
        return name, new

    def renamed(code: str, rename: dict[str, str]) -> str:
        for old, new in rename.items():
            if old != new:
                code = re.sub(rf"\b{re.escape(old)}\b", new, code)
        return code

    for layer in layers:
        provenance = getattr(layer, "metadata", {}).get(KEY)
        if provenance is None:
            continue
        rename: dict[str, str] = {}
        for record in provenance["sources"]:
            record = {k: renamed(v, rename) if k in ("expression", "index") else v for k, v in record.items()}
            name, new = bind(record["variable"], ("source", tuple(sorted(record.items()))), rename)
            if new:
                sources.append(Source(**{**record, "variable": name}))
        for c in provenance["calls"]:
            data = tuple(rename.get(d, d) for d in c["data"])
            record = ("call", c["function"], data, repr(c["args"]), repr(sorted(c["kwargs"].items())), c.get("index"))
            targets = [t.strip() for t in c["result"].split(",")]
            names = [bind(t, (record, i), rename) for i, t in enumerate(targets)]
            if any(new for _, new in names):
                calls.append(call_from_record({**c, "data": data, "result": ", ".join(name for name, _ in names)}))
        outputs[layer.name] = renamed(provenance["expression"], rename)
    if not outputs:
        raise ValueError("no napari-gridmip result to reproduce yet: run the widget first")
    return python_script(sources, calls, outputs)


def call_from_record(record: Mapping[str, Any]) -> Call:
    """A :class:`Call` back from its provenance record (lists back to tuples)."""
    return Call(
        function=record["function"].removeprefix("napari_gridmip."),
        data=tuple(record["data"]),
        args=tuple(_from_plain(a) for a in record["args"]),
        kwargs={k: _from_plain(v) for k, v in record["kwargs"].items()},
        result=record["result"],
        index=record.get("index", ""),
    )


def same_output(metadata: Mapping[str, Any], provenance: Mapping[str, Any]) -> bool:
    """Whether a layer's metadata marks it as the same output (widget, input layers, role) as ``provenance``."""
    own = metadata.get(KEY) if isinstance(metadata, Mapping) else None
    if not isinstance(own, Mapping):
        return False
    return all(own.get(k) == provenance.get(k) for k in ("widget", "inputs", "role"))


def _plain(value: Any) -> Any:
    """JSON-able: tuples become lists, NumPy scalars Python numbers, dtypes their names, a :class:`Ref`
    ``{"ref": code}``."""
    if isinstance(value, Ref):
        return {"ref": value.expression}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "name") and type(value).__name__.startswith("dtype"):
        return value.name
    json.dumps(value)  # anything else must already be plain (raises TypeError otherwise)
    return value


def _from_plain(value: Any) -> Any:
    """Lists back to tuples (the API's sizes and windows are tuples), ``{"ref": code}`` back to a :class:`Ref`."""
    if isinstance(value, dict) and set(value) == {"ref"}:
        return Ref(value["ref"])
    return tuple(_from_plain(v) for v in value) if isinstance(value, list) else value


def _literal(value: Any) -> str:
    if isinstance(value, Ref):
        return value.expression
    value = _from_plain(_plain(value))
    return repr(value)


def _evaluate(expression: str, namespace: Mapping[str, Any]) -> Any:
    """The value of ``expression`` (code a plan wrote: a result's name, ``"tracked.dy"``, ``"levels[3]"``) as the
    script computes it, with ``np`` and ``gm`` bound as the script binds them."""
    # one dict of globals: a comprehension in the expression sees only globals
    return eval(expression, {"np": np, "gm": napari_gridmip, **namespace})  # noqa: S307 - our own code


Extras = Callable[[int, Call], Mapping[str, Any]]  # (call index, call) -> runtime keywords (progress)
After = Callable[[int, Call, Any], Any]  # (call index, call, its value) -> the value kept (e.g. computed)
Evaluator = Callable[[Call, Mapping[str, Any], Mapping[str, Any]], Any]  # (call, namespace, runtime) -> value


@dataclass(frozen=True)
class Plan:
    """One job as data: its inputs, the public calls that compute it, and its outputs.

    ``sources`` bind the inputs (layers, files, or code such as a function found by its import path),
    ``calls`` run in order, each on the values bound before it, and ``outputs`` name each result as an expression
    over the calls' results (``{"dy": "tracked.dy", "merged": "merged"}``).

    Executing the plan (:meth:`run`) is how the widgets and the command line compute; :meth:`script` prints the
    same calls as Copy as Python, :meth:`record` is what the command line writes into its files,
    :meth:`provenance` a layer's ``metadata["napari_gridmip"]`` and :meth:`matches` the re-run's "is this my
    layer" test. A value that differs between the record and the computation cannot be written.

    Examples
    --------
    >>> plan = Plan(
    ...     (Source("patches", layer="tiles"),),
    ...     (Call("merge_patches", ("patches",), ((4, 4), (2, 2)), {"blend": "mean"}, "merged"),),
    ...     {"merged": "merged"},
    ... )
    >>> import numpy as np
    >>> plan.run({"patches": np.ones((1, 1, 4, 4))})["merged"].shape
    (4, 4)
    >>> print(plan.script().splitlines()[-6])
    merged = gm.merge_patches(patches, (4, 4), (2, 2), blend='mean')
    """

    sources: tuple[Source, ...]
    calls: tuple[Call, ...]
    outputs: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "calls", tuple(self.calls))
        object.__setattr__(self, "outputs", dict(self.outputs))

    def execute(
        self,
        inputs: Mapping[str, Any],
        *,
        extras: Extras | None = None,
        after: After | None = None,
        evaluators: Mapping[str, Evaluator] | None = None,
    ) -> dict[str, Any]:
        """Bind the sources and run the calls in order; return every bound name's value.

        ``inputs`` holds the value of each layer or file source, by variable (what its line in the script binds:
        the layer's data with the source's index applied, :meth:`Source.take`); code sources are evaluated.
        ``extras`` adds runtime keywords to a call (its progress); ``after`` may replace a call's value (compute a
        lazy one, with progress); ``evaluators`` (by the call's ``result``) compute a call another way that gives
        the same value from the same recorded arguments (the widget's band-by-band full map).
        """
        namespace: dict[str, Any] = {}
        for source in self.sources:
            if source.variable in inputs:
                namespace[source.variable] = inputs[source.variable]
            elif source.expression is not None:
                namespace[source.variable] = _evaluate(source.expression, namespace)
            else:
                raise ValueError(f"no value given for the input {source.variable!r} ({source.record()})")
        for i, call in enumerate(self.calls):
            runtime = dict(extras(i, call)) if extras is not None else {}
            evaluator = (evaluators or {}).get(call.result)
            with _call_scope(call):  # a job's log of where each call ran (its lazy result computed by after too)
                if evaluator is not None:
                    bound = call.bind(evaluator(call, namespace, runtime))
                else:
                    bound = call.evaluate(namespace, **runtime)
                if after is not None:
                    values = tuple(bound.values())
                    value = after(i, call, values if len(values) > 1 else values[0])
                    bound = dict(zip(bound, value)) if len(values) > 1 else {next(iter(bound)): value}
            namespace.update(bound)
        return namespace

    def outputs_of(self, namespace: Mapping[str, Any]) -> dict[str, Any]:
        """Each output's value, its expression evaluated over an executed namespace."""
        return {name: _evaluate(expression, namespace) for name, expression in self.outputs.items()}

    def run(self, inputs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """``{output name: value}``: :meth:`execute`, then each output's expression (same options)."""
        return self.outputs_of(self.execute(inputs, **options))

    def script(self) -> str:
        """The Copy as Python text of this plan (ends with ``results``, the outputs by name)."""
        return python_script(self.sources, self.calls, self.outputs)

    def record(self) -> dict[str, Any]:
        """What the command line writes into its outputs: ``{KEY: the calls, sources, versions, time, script}``."""
        return {KEY: file_provenance(self.sources, self.calls, self.outputs)}

    def provenance(self, *, widget: str, role: str, stamp: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``metadata["napari_gridmip"]`` of the layer showing output ``role``."""
        return layer_provenance(
            widget=widget, role=role, sources=self.sources, calls=self.calls, expression=self.outputs[role], stamp=stamp
        )

    def matches(self, metadata: Mapping[str, Any], *, widget: str, role: str) -> bool:
        """Whether a layer with ``metadata`` shows output ``role`` of an earlier run of this plan (same widget and
        input layers): a re-run's target."""
        return same_output(metadata, self.provenance(widget=widget, role=role, stamp={}))

    def extended(self, *, sources: Sequence[Source] = (), calls: Sequence[Call] = (), outputs=None) -> Plan:
        """This plan with more sources, calls and outputs (replacing its outputs when ``outputs`` is given)."""
        return Plan(
            (*self.sources, *sources), (*self.calls, *calls), dict(self.outputs) if outputs is None else outputs
        )
