"""Files written whole or not at all. JAX-free, and a leaf: the settings, the rates, the preparation's marker and
the samples' cache all write through it."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, creating its folder: into a file of this process's and thread's
    own beside it, then renamed over ``path``, so that a reader, or another process writing the same file, never
    sees half of it. Raises OSError where the folder cannot be written (the partial file is removed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        if isinstance(data, str):
            partial.write_text(data, encoding="utf-8")
        else:
            partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
