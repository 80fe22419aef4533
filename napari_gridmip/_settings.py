"""The widgets' last choices, remembered across napari sessions (Qt-free).

One JSON file in the per-user config folder (``NAPARI_GRIDMIP_CONFIG_DIR``
overrides it), holding ``{widget key: {field name: value}}``. Only plain
parameters are stored (numbers, text, booleans), never layer choices. A
missing or unreadable file means defaults, never an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "widget-settings.json"


def settings_file() -> Path:
    override = os.environ.get("NAPARI_GRIDMIP_CONFIG_DIR")
    if override:
        return Path(override) / FILE_NAME
    import platformdirs

    return Path(platformdirs.user_config_dir("napari-gridmip")) / FILE_NAME


def _read_all() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(settings_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load(key: str) -> dict[str, Any]:
    """The stored values of widget ``key`` (empty when none were stored)."""
    values = _read_all().get(key, {})
    return values if isinstance(values, dict) else {}


def save(key: str, values: dict[str, Any]) -> None:
    """Store widget ``key``'s values (written to a temporary file, then renamed: never half a file)."""
    everything = _read_all()
    everything[key] = values
    path = settings_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(everything, indent=1, sort_keys=True))
        os.replace(temporary, path)
    except OSError:  # a read-only home: settings are a convenience, not worth an error
        pass
