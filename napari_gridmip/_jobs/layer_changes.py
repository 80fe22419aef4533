"""How a job's layers enter the viewer: added, or put in place of the same outputs of an earlier run; undoable
(Qt-free: it needs only napari's layer list, so it is tested on a ``ViewerModel``)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from napari_gridmip._jobs import DISPLAY_KEYS
from napari_gridmip._jobs.plan import KEY, same_output


class LayerChanges:
    """Adds result layers to a viewer, or puts them in place of the same outputs of an earlier run; undoable.

    A replaced layer keeps its identity, name and position; its data, placement and provenance are
    the new ones; each display setting the widget chose (colormap, contrast limits, opacity,
    visibility, ...) takes the new choice only where the user left the old one as it was chosen.
    """

    PLACEMENT = ("scale", "translate", "rotate", "shear", "affine", "units", "axis_labels")

    def __init__(self, viewer: Any) -> None:
        self._viewer = viewer
        self._added: list[Any] = []
        self._replaced: list[tuple[Any, dict[str, Any]]] = []

    def apply(self, layers: list[Any], *, replace: bool) -> list[Any]:
        """Show ``layers`` (bottom first); return the layers that show them (earlier ones where replaced).

        A new layer goes just below the next output that replaced an earlier layer, or else above the
        previous output, so that a run's layers keep their order among themselves.
        """
        steps = self.apply_stepwise(layers, replace=replace)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def apply_stepwise(self, layers: list[Any], *, replace: bool) -> Generator[None, None, list[Any]]:
        """:meth:`apply` as a generator that pauses after each layer it inserts (replacing is cheap)."""
        for layer in layers:
            provenance = layer.metadata.get(KEY)
            if provenance is not None:
                provenance["display"] = display_state(layer)  # what the widget chose, as the new layer shows it
        olds: list[Any] = []
        for layer in layers:
            olds.append(self._earlier(layer, taken=olds) if replace else None)
        shown: list[Any] = []
        for i, (layer, old) in enumerate(zip(layers, olds)):
            if old is not None:
                self._replaced.append((old, _snapshot(old)))
                _move_into(layer, old)
                shown.append(old)
                continue
            after = next((o for o in olds[i + 1 :] if o is not None), None)
            if after is not None:
                self._viewer.layers.insert(self._viewer.layers.index(after), layer)
            elif shown:
                self._viewer.layers.insert(self._viewer.layers.index(shown[-1]) + 1, layer)
            else:
                self._viewer.add_layer(layer)
            self._added.append(layer)
            shown.append(layer)
            if i + 1 < len(layers):
                yield
        return shown

    def _earlier(self, layer: Any, *, taken: list[Any]) -> Any:
        """The viewer's layer of the same output as ``layer`` from an earlier run, if any (by provenance)."""
        provenance = layer.metadata.get(KEY)
        if provenance is None:
            return None
        for candidate in self._viewer.layers:
            if (
                type(candidate) is type(layer)
                and not any(candidate is t for t in taken)
                and same_output(candidate.metadata, provenance)
            ):
                return candidate
        return None

    def undo(self) -> None:
        for layer in self._added:
            if layer in self._viewer.layers:
                self._viewer.layers.remove(layer)
        for layer, state in reversed(self._replaced):
            _restore(layer, state)


def display_state(layer: Any) -> dict[str, Any]:
    """The layer's display settings (:data:`~napari_gridmip._jobs.DISPLAY_KEYS` it has) as plain values."""
    state: dict[str, Any] = {}
    for key in DISPLAY_KEYS:
        if not hasattr(layer, key):
            continue
        value = getattr(layer, key)
        if key == "colormap":
            if type(value).__name__.endswith("LabelColormap"):  # labels: the colours of 0 and 1
                value = np.round(np.asarray(value.map(np.array([0, 1])), dtype=float), 4).ravel().tolist()
            else:
                value = getattr(value, "name", str(value))
        elif isinstance(value, (tuple, list, np.ndarray)):
            value = [float(v) for v in np.asarray(value, dtype=float).ravel()]
        elif isinstance(value, (np.generic,)):
            value = value.item()
        elif not isinstance(value, (bool, int, float, str)):
            value = str(value)
        state[key] = value
    return state


def _snapshot(layer: Any) -> dict[str, Any]:
    keys = ("data", "metadata", *LayerChanges.PLACEMENT, *DISPLAY_KEYS)
    return {key: getattr(layer, key) for key in keys if hasattr(layer, key)}


def _restore(layer: Any, state: dict[str, Any]) -> None:
    layer.data = state.pop("data")
    for key, value in state.items():
        setattr(layer, key, value)


def _move_into(new: Any, old: Any) -> None:
    """``old`` takes ``new``'s data, placement and provenance, and its display where the user kept ours.

    Only what differs is set: each setting napari is given refreshes the layer.
    """
    chosen_before = old.metadata.get(KEY, {}).get("display", {})
    current = display_state(old)
    untouched = {key for key, value in chosen_before.items() if _same(current.get(key), value)}
    old.data = new.data
    for key in LayerChanges.PLACEMENT:
        if hasattr(new, key) and not _equal(getattr(old, key), getattr(new, key)):
            setattr(old, key, getattr(new, key))
    chosen_now = display_state(new)
    for key in DISPLAY_KEYS:
        if not hasattr(new, key) or (key in chosen_before and key not in untouched):
            continue  # the user's own setting stays
        if not _same(current.get(key), chosen_now.get(key)):
            setattr(old, key, getattr(new, key))
    old.metadata = dict(new.metadata)


def _equal(a: Any, b: Any) -> bool:
    try:
        if hasattr(a, "affine_matrix"):
            return bool(np.array_equal(a.affine_matrix, b.affine_matrix))
        return bool(np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))
    except (TypeError, ValueError):
        return False


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float)))
    return a == b
