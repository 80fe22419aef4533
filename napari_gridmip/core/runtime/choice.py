"""Where the kernels run, as the user chose it, and the log of where a job's calls ran: JAX-free, a leaf that the
widgets, the provenance and :mod:`.strategy` all read.

The setting is a context variable, not a thread's state: dask's threaded scheduler runs its tasks in copies of
the computing thread's context, so a lazy result computed inside a :func:`napari_gridmip.compute_on` block is
placed as the block says in whichever thread runs it (:func:`.strategy.placed` enters it again there).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator
from typing import Any

from napari_gridmip.core.options import COMPUTE_ON

VARIABLE = "NAPARI_GRIDMIP_COMPUTE_ON"

_SETTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("napari_gridmip_compute_on", default=None)
_LOG: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar("napari_gridmip_log", default=None)
_CALL: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("napari_gridmip_call", default=None)
_INPUTS: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "napari_gridmip_inputs", default=None
)
_LOCK = threading.Lock()  # dask's threads add to one call's entry at once


def check(where: Any, *, name: str = "compute_on") -> str:
    """``where`` if it is one of :data:`COMPUTE_ON`; else a ValueError that names it and the choices."""
    if not isinstance(where, str) or where not in COMPUTE_ON:
        choices = ", ".join(repr(c) for c in COMPUTE_ON)
        raise ValueError(f"{name} must be one of {choices}; got {where!r}")
    return where


def default() -> str:
    """The process's setting outside any :func:`napari_gridmip.compute_on` block: ``NAPARI_GRIDMIP_COMPUTE_ON``
    (any case, spaces ignored; unset or empty: ``"auto"``). Raises ValueError for any other value."""
    text = os.environ.get(VARIABLE, "").strip().lower()
    return check(text, name=VARIABLE) if text else COMPUTE_ON[0]


def setting() -> str:
    """The setting in effect here: the innermost :func:`scoped` block's, else :func:`default`."""
    where = _SETTING.get()
    return default() if where is None else where


@contextlib.contextmanager
def scoped(where: str) -> Iterator[str]:
    """The setting ``where`` (checked) for the block, and for the dask tasks it computes."""
    token = _SETTING.set(check(where))
    try:
        yield where
    finally:
        _SETTING.reset(token)


@contextlib.contextmanager
def recording() -> Iterator[dict[str, Any]]:
    """Log, in the block, where each call of a plan ran (:func:`calling`); yields the record (:func:`record`),
    whose ``"calls"`` fill in as they run."""
    log: list[dict[str, Any]] = []
    tokens = _LOG.set(log), _CALL.set(None), _INPUTS.set([])
    try:
        yield record()
    finally:
        _INPUTS.reset(tokens[2])
        _CALL.reset(tokens[1])
        _LOG.reset(tokens[0])


def record() -> dict[str, Any] | None:
    """The provenance's ``"ran_on"`` of the job being recorded, or None outside :func:`recording`.

    ``{"compute_on": the setting, "calls": [entry, ...]}``, one entry per call in the order they ran:
    ``{"function": "napari_gridmip.<name>", "platform": ..., "device_kind": ...}``, JAX's device that the setting
    placed the call on (``"cpu"``, ``"tpu"``, ``"gpu"``, and its kind, such as ``"TPU v5 lite"``), with
    ``"moved_to_host": [rule, ...]`` where rules moved the call's work (all of it, or a part: the series' IC-GN,
    float64 work) to the host CPU. A rule that acts after the calls (a lazy result's blocks computed later) adds
    an entry with ``"function": None``. The list is the log itself: a record taken before the calls ran (the
    command line's ``mipmap`` hands its record to the call that writes it) lists them once they have.

    ``"device_inputs": [entry, ...]`` only where a widget's run consulted the device copies of its layers
    (:func:`note_input`; never on a machine without an accelerator): per input, ``{"source": variable, "layer":
    name, "cache": "hit" | "miss" | "skipped", "bytes": ..., "platform": ..., "device_kind": ...}``, and ``"why"``
    for a skipped one.
    """
    log = _LOG.get()
    if log is None:
        return None
    out: dict[str, Any] = {"compute_on": setting(), "calls": log}
    inputs = _INPUTS.get()
    if inputs:
        out["device_inputs"] = inputs
    return out


def is_recording() -> bool:
    """Whether a :func:`recording` block is open here."""
    return _LOG.get() is not None


@contextlib.contextmanager
def calling(function: str, **device: str) -> Iterator[None]:
    """One call of a job, for the log (nothing outside :func:`recording`): an entry for ``function`` on
    ``device`` (``platform=..., device_kind=...``), which the rules acting in the block name themselves in."""
    log = _LOG.get()
    if log is None:
        yield
        return
    entry: dict[str, Any] = {"function": function, **device}
    with _LOCK:
        log.append(entry)
    token = _CALL.set(entry)
    try:
        yield
    finally:
        _CALL.reset(token)


def moved_to_host(rule: str) -> None:
    """Note in the current call's entry that ``rule`` moved its work to the host CPU (once per rule and call)."""
    log = _LOG.get()
    if log is None:
        return
    entry = _CALL.get()
    with _LOCK:
        if entry is None:  # after the calls: a lazy result's blocks, computed later
            entry = next((e for e in log if e["function"] is None), None)
            if entry is None:
                entry = {"function": None, "platform": "cpu"}
                log.append(entry)
        rules = entry.setdefault("moved_to_host", [])
        if rule not in rules:
            rules.append(rule)


def note_input(entry: dict[str, Any]) -> None:
    """Note, for the job being recorded, where one of its inputs came from (``napari_gridmip._jobs.device_layers``: the
    device copy kept from an earlier run, or sent now); nothing outside :func:`recording`."""
    inputs = _INPUTS.get()
    if inputs is not None:
        with _LOCK:
            inputs.append(dict(entry))
