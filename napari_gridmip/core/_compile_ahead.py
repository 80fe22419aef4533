"""Compiling a program in a thread while the calling thread prepares its inputs (first calls only).

XLA compiles a large program mostly on one core (the subset kernel: 1.5 to 2.5 s on a first call,
docs/benchmarks.md, "First calls"), while the call around it compiles and runs smaller programs of its
own. :func:`compile_ahead` starts ``build`` (a ``jit(...).lower(shapes...).compile()``) in a thread;
JAX shares compiled programs between threads, so the call, which first joins the thread, finds its
program ready instead of compiling it after the rest.

- Once per key and process: every later call with that key gets the same thread (already finished, or
  still compiling: it then waits for it rather than compiling the program a second time).
- The thread runs under the caller's x64 setting (JAX keeps it per thread), so the program it compiles is
  the one the call asks for.
- The thread is not a daemon: a program still compiling when the interpreter exits (a call that did not
  need it) is finished first, never killed inside XLA (which aborts the process).
- A failure in the thread is dropped: the call compiles the program itself and reports any error there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import jax

from napari_gridmip.core._precision import x64_scope

_THREADS: dict[Hashable, threading.Thread] = {}
_LOCK = threading.Lock()


def compile_ahead(key: Hashable, build: Callable[[], object]) -> threading.Thread:
    """The thread compiling ``key``'s program: started now with ``build``, or the one started before.

    Parameters
    ----------
    key
        What identifies the program (its static arguments and argument shapes); the caller's x64 setting
        is added to it here.
    build
        Traces, lowers and compiles the program (``jitted.lower(...).compile()``), from shapes alone.

    Returns
    -------
    threading.Thread
        Join it before the first call of the program.
    """
    x64 = bool(jax.config.jax_enable_x64)
    full_key = (key, x64)
    with _LOCK:
        thread = _THREADS.get(full_key)
        if thread is None:

            def run() -> None:
                try:
                    with x64_scope(x64):
                        build()
                except Exception:  # noqa: BLE001, S110 - the call compiles the program itself and reports errors
                    pass

            thread = threading.Thread(target=run, name="napari-gridmip compile ahead", daemon=False)
            _THREADS[full_key] = thread
            thread.start()
    return thread
