"""One record of each public call, serving four readers (Qt-free).

A job knows which public function it calls and with what. It keeps that as a
:class:`Call`, and the same record gives:

1. a layer's provenance, ``layer.metadata["napari_gridmip"]`` (:func:`layer_provenance`): the calls, the
   input layers, the package and JAX versions and the time, plus which output of which widget the layer is;
2. the "Copy as Python" script (:func:`python_script`), which reproduces the layers from the input layers
   with the public API;
3. the command line's output attributes (:func:`file_provenance`: OME-Zarr and Zarr attributes, a TIFF
   description), where the inputs are paths;
4. the re-run's "is this my layer?" test (:func:`same_output`): the widget, its input layers and the
   output's role, never the layer's name alone.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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

    def code(self) -> str:
        parts = [*self.data, *map(_literal, self.args), *(f"{k}={_literal(v)}" for k, v in self.kwargs.items())]
        return f"{self.result} = gm.{self.function}({', '.join(parts)})"

    def record(self) -> dict[str, Any]:
        return {
            "function": f"napari_gridmip.{self.function}",
            "data": list(self.data),
            "args": [_plain(a) for a in self.args],
            "kwargs": {k: _plain(v) for k, v in self.kwargs.items()},
            "result": self.result,
        }


def versions() -> dict[str, str]:
    """The package's and JAX's versions, read from the installed metadata (JAX is not imported)."""
    from importlib import metadata

    import napari_gridmip

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {"napari_gridmip": napari_gridmip.__version__, "jax": installed("jax"), "jaxlib": installed("jaxlib")}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
    ``stamp`` (versions and time) is shared by the layers of one run.
    """
    stamp = dict(stamp) if stamp is not None else {**versions(), "time": now()}
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
    """What the command line writes into its outputs: the calls, the input paths, versions, time and script."""
    return {
        "sources": [s.record() for s in sources],
        "calls": [c.record() for c in calls],
        **versions(),
        "time": now(),
        "python": python_script(sources, calls, outputs),
    }


def python_script(sources: Sequence[Source], calls: Sequence[Call], outputs: Mapping[str, str]) -> str:
    """A short script that recomputes ``outputs`` (name -> expression over the calls' results).

    Layer sources read from ``viewer`` (napari's current viewer, or the one in napari's console); file
    sources from their paths. The script ends with ``results``, the outputs' arrays by name.
    """
    from napari_gridmip._provenance import versions as _versions

    lines = [f'"""Made by napari-gridmip {_versions()["napari_gridmip"]}: reproduces {len(outputs)} result(s)."""']
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
            record = ("call", c["function"], data, repr(c["args"]), repr(sorted(c["kwargs"].items())))
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
    )


def same_output(metadata: Mapping[str, Any], provenance: Mapping[str, Any]) -> bool:
    """Whether a layer's metadata marks it as the same output (widget, input layers, role) as ``provenance``."""
    own = metadata.get(KEY) if isinstance(metadata, Mapping) else None
    if not isinstance(own, Mapping):
        return False
    return all(own.get(k) == provenance.get(k) for k in ("widget", "inputs", "role"))


def _plain(value: Any) -> Any:
    """JSON-able: tuples become lists, NumPy scalars Python numbers, dtypes their names."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "name") and type(value).__name__.startswith("dtype"):
        return value.name
    json.dumps(value)  # anything else must already be plain (raises TypeError otherwise)
    return value


def _from_plain(value: Any) -> Any:
    """Lists back to tuples (the API's sizes and windows are tuples)."""
    return tuple(_from_plain(v) for v in value) if isinstance(value, list) else value


def _literal(value: Any) -> str:
    value = _from_plain(_plain(value))
    return repr(value)
