"""Joining a driver's row bands into its outputs in one compiled program (a leaf: it imports no sibling).

The drivers of :mod:`.maps`, :mod:`.subsets` and :mod:`.affine` run their kernel band by band, then keep each
band's rows, join them, restore the batch axes and (``track_speckles``) flip the displacement's sign: done
eagerly, each step was its own tiny program, compiled on a first call for 10 to 100 ms apiece.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from functools import partial

import jax
import jax.numpy as jnp

# what compile_ahead_once started in this process, by key and device: its thread
_COMPILED_AHEAD: dict[Hashable, threading.Thread] = {}
_AHEAD_LOCK = threading.Lock()


def compile_ahead_once(key: Hashable, prepare: Callable[[], Sequence[Callable[[], object]]], *, name: str
                       ) -> threading.Thread | None:  # fmt: skip
    """Compile a driver's programs ahead of its calls, once per process, ``key`` and device: ``prepare()``, in
    the calling thread (what must share the calls' trace cache, such as an ``eval_shape`` of a program they
    call next), gives the compiles that a daemon thread named ``name`` then runs on the caller's default device
    (JAX's ahead-of-time ``lower(...).compile()``, which fills the cache the calls read), each after the first
    in a thread of its own beside it (XLA's compile releases the GIL). The thread, which ends after all of
    them; the same thread to a second caller while it runs (two calls of the same shapes in two threads, such
    as a sample's run ahead and a widget's, wait for one compile rather than making the program twice on the
    same cores); None once it has ended. A failure is logged at debug level only: the calls compile their
    programs themselves and report what fails. The caller joins the thread before it calls those programs (a
    program compiling in the thread is not waited for by a call)."""
    device = jax.config.jax_default_device
    with _AHEAD_LOCK:
        started = _COMPILED_AHEAD.get((key, device))
        if started is not None:
            return started if started.is_alive() else None
        # held until the thread exists: a second caller never runs prepare() beside this one
        thread = _start_ahead(prepare, name, device)
        _COMPILED_AHEAD[key, device] = thread
    return thread


def _start_ahead(prepare: Callable[[], Sequence[Callable[[], object]]], name: str, device: object
                 ) -> threading.Thread:  # fmt: skip
    first, *others = prepare()

    def quietly(compile_program: Callable[[], object]) -> None:
        try:
            with jax.default_device(device):  # the default device is per thread: the caller's, named
                compile_program()
        except Exception:  # noqa: BLE001 - see compile_ahead_once's docstring
            logging.getLogger(__name__).debug("%s failed", name, exc_info=True)

    def run() -> None:
        beside = [threading.Thread(target=quietly, args=(c,), name=f"{name} {i}", daemon=True)
                  for i, c in enumerate(others, 2)]  # fmt: skip
        for thread in beside:
            thread.start()
        quietly(first)
        for thread in beside:
            thread.join()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def kept_rows(starts: Sequence[int], rows: int) -> tuple[int, ...]:
    """Rows of each band of ``rows`` rows starting at ``starts`` to keep: the last band ends flush with the
    output and may overlap the one before it, so each row is kept once (the ``keep`` of :func:`join_bands`)."""
    return tuple((starts[i + 1] - starts[i]) if i + 1 < len(starts) else rows for i in range(len(starts)))


@partial(jax.jit, static_argnames=("keep", "batch", "negate"))
def join_bands(
    pieces: Sequence[Sequence[jax.Array]],
    *,
    keep: tuple[int, ...],
    batch: tuple[int, ...] | None = None,
    negate: tuple[int, ...] = (),
) -> tuple[jax.Array, ...]:
    """The outputs of the band programs, joined along the rows.

    Parameters
    ----------
    pieces
        One tuple of outputs per band, each ``(B, rows, ...)``; the bands in order. A driver that runs its
        batch items one by one (:mod:`.affine`) gives each item's bands in turn: the items are then joined
        along axis 0 as well (``len(pieces)`` a multiple of ``len(keep)``).
    keep
        Rows of each band to keep (the last band may overlap the one before it).
    batch
        The batch axes to restore in place of ``B`` (None: keep ``B``).
    negate
        Which outputs (by position) to negate.

    Returns
    -------
    tuple of jax.Array
        One per output: ``(*batch, sum(keep), ...)`` (or ``(B, sum(keep), ...)``, ``B`` summed over the items).
    """
    bands = len(keep)
    if len(pieces) % bands:
        raise ValueError(f"{len(pieces)} pieces are not whole items of {bands} bands")
    items = [pieces[i : i + bands] for i in range(0, len(pieces), bands)]
    out = []
    for part in range(len(pieces[0])):
        rows = [jnp.concatenate([piece[part][:, :n] for piece, n in zip(item, keep)], axis=1) for item in items]
        joined = rows[0] if len(rows) == 1 else jnp.concatenate(rows, axis=0)
        if part in negate:
            joined = -joined
        out.append(joined if batch is None else joined.reshape(batch + joined.shape[1:]))
    return tuple(out)
