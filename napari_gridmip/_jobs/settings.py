"""The widgets' last choices, remembered between napari runs (Qt-free), where napari keeps plugin settings (its
Preferences, from the manifest's ``configurations``), else in a JSON file of our own. Only plain parameters are
stored, never layer choices; a missing or unreadable store means defaults, never an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import platformdirs

from napari_gridmip._jobs.device_layers import DEFAULT_PERCENT, MAX_PERCENT
from napari_gridmip.core.options import COMPUTE_ON
from napari_gridmip.core.runtime import choice
from napari_gridmip.core.runtime.files import write_atomically

PLUGIN = "napari-gridmip"
FILE_NAME = "widget-settings.json"
MIGRATED = "migrated_to_napari"  # set in the JSON file once its values moved into napari's settings
# widget fields whose property in napari.yaml has another name: napari's settings models keep "source" for
# themselves (their event emitter's attribute)
PROPERTY_NAMES = {"source": "tiles_from"}
_DEFAULT: Any = object()
# "All widgets", "Compute on" (general.compute_on): the Preferences' words for napari_gridmip.compute_on's settings
COMPUTE_ON_CHOICES = {"auto": "auto", "accelerator": "accelerator", "host CPU": "host"}


def settings_file() -> Path:
    override = os.environ.get("NAPARI_GRIDMIP_CONFIG_DIR")
    if override:
        return Path(override) / FILE_NAME
    return Path(platformdirs.user_config_dir("napari-gridmip")) / FILE_NAME


def napari_settings() -> Any | None:
    """The plugin's settings in napari (``get_plugin_settings("napari-gridmip")``), or ``None`` where the JSON file
    is the store: ``NAPARI_GRIDMIP_CONFIG_DIR`` set, a napari without plugin configurations, or a manifest
    without ours."""
    if os.environ.get("NAPARI_GRIDMIP_CONFIG_DIR"):
        return None
    try:
        from napari.settings import get_plugin_settings  # napari takes seconds to import: not for the CLI
    except ImportError:  # napari before 0.9: no plugin configurations
        return None
    try:
        return get_plugin_settings(PLUGIN)
    except Exception:  # noqa: BLE001 - settings are a convenience: the file serves when napari's cannot
        return None


def load(key: str, *, store: Any = _DEFAULT) -> dict[str, Any]:
    """The stored values of widget ``key`` (empty when none were stored). ``store``: napari's settings of the
    plugin (default: :func:`napari_settings`; ``None``: the JSON file alone)."""
    store = napari_settings() if store is _DEFAULT else store
    if store is not None:
        migrate(store)
    values = _read_all().get(key, {})
    values = dict(values) if isinstance(values, dict) else {}
    section = getattr(store, key, None) if store is not None else None
    if section is not None:
        names = {prop: name for name, prop in PROPERTY_NAMES.items()}
        values.update({names.get(prop, prop): getattr(section, prop) for prop in type(section).model_fields})
    return values


def save(key: str, values: dict[str, Any], *, store: Any = _DEFAULT) -> None:
    """Store widget ``key``'s values: in napari's settings where they declare them (napari writes its file on each
    change), the rest in the JSON file (written to a temporary file, then renamed: never half a file)."""
    store = napari_settings() if store is _DEFAULT else store
    rest = dict(values) if store is None else _put(store, key, values)
    everything = _read_all()
    if not rest and key not in everything:
        return
    everything[key] = rest
    _write_all(everything)


def migrate(store: Any) -> None:
    """Move the JSON file's values into napari's settings, once (the file is then marked, keeping only values that
    napari's sections do not declare).

    napari 0.9 and later keep a plugin's settings in its own file beside napari's, from the ``configurations`` of
    the plugin's manifest (``napari.yaml``: one section per widget, ``mipmap``, ``patches``, ``stitch``, ``tiled``,
    ``correlation``, and ``general`` for what all widgets share), shown in napari's Preferences and read with
    ``napari.settings.get_plugin_settings("napari-gridmip").<widget>.<field>``.

    Before those, the choices lived in a JSON file of our own (``widget-settings.json`` in the per-user config
    folder). Its values move into napari's settings once, the first time they are read there; the file then keeps
    only what napari's sections do not declare, marked as migrated. The file stays the store wherever napari has no
    plugin configurations (an older napari), and when ``NAPARI_GRIDMIP_CONFIG_DIR`` names a folder of our own
    (the tests use one, so that they never touch the user's settings). Only plain parameters are stored (numbers,
    text, booleans), never layer choices; a missing or unreadable store means defaults, never an error.
    """
    everything = _read_all()
    if not everything or everything.get(MIGRATED):
        return
    leftover: dict[str, Any] = {key: _put(store, key, values) for key, values in everything.items()
                                if isinstance(values, dict)}  # fmt: skip
    _write_all({**{key: values for key, values in leftover.items() if values}, MIGRATED: True})


def _put(store: Any, key: str, values: dict[str, Any]) -> dict[str, Any]:
    """Set ``values`` in section ``key`` of napari's settings; return those it does not declare or accept."""
    section = getattr(store, key, None)
    rest = {}
    for name, value in values.items():
        prop = PROPERTY_NAMES.get(name, name)
        if section is None or prop not in type(section).model_fields:
            rest[name] = value
            continue
        try:
            if getattr(section, prop) != value:
                setattr(section, prop, value)
        except ValueError:  # pydantic's ValidationError: a value outside the property's type, range or choices
            rest[name] = value
    return rest


def _read_all() -> dict[str, Any]:
    try:
        data = json.loads(settings_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_all(everything: dict[str, Any]) -> None:
    path = settings_file()
    try:
        write_atomically(path, json.dumps(everything, indent=1, sort_keys=True))
    except OSError:  # a read-only home: settings are a convenience, not worth an error
        pass


def compute_on(*, store: Any = _DEFAULT) -> str:
    """Where the widgets' runs compute (:func:`napari_gridmip.compute_on`'s ``"auto"``, ``"accelerator"`` or
    ``"host"``): ``NAPARI_GRIDMIP_COMPUTE_ON`` where it is set (for the process, as it is for the library and the
    command line), else napari's Preferences, napari-gridmip, "All widgets", "Compute on" (``general.compute_on``);
    a stored value that is none of its choices (nor the library's own words) means ``"auto"``. Raises ValueError for
    a bad variable."""
    if os.environ.get(choice.VARIABLE, "").strip():
        return choice.default()
    chosen = load("general", store=store).get("compute_on", "auto")
    return COMPUTE_ON_CHOICES.get(chosen, chosen if chosen in COMPUTE_ON else "auto")


def device_layers_percent(*, store: Any = _DEFAULT) -> int:
    """The share of the accelerator's memory (percent) that keeps the widgets' input layers there between runs
    (:mod:`napari_gridmip._jobs.device_layers`): napari's Preferences, napari-gridmip, "All widgets", "Keep input layers
    on the accelerator" (``general.device_layers``); 0 keeps none. A stored value that is not a number means the
    default; others are clipped to 0 to ``MAX_PERCENT``."""
    value = load("general", store=store).get("device_layers", DEFAULT_PERCENT)
    try:
        percent = int(value)
    except (TypeError, ValueError):
        return DEFAULT_PERCENT
    return min(max(percent, 0), MAX_PERCENT)
