"""Opening the DIC pair (or the speckle pair with contrast) in napari starts that sample's first Run on stand-in
inputs of its shapes (napari_gridmip._widgets._samples): the widget's Run then compiles none of its large programs
again, whether it comes after the run ahead or while it still compiles, and nothing starts where early starts are
off."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from napari_gridmip import _prepare
from napari_gridmip._sample_data import dic as dic_module
from napari_gridmip._widgets import _samples
from napari_gridmip._widgets.correlation_widget import CorrelationWidget
from tests.widgets.test_prepare_requests import _same


@pytest.fixture
def compiles():
    """The XLA compiles of this test, by program name (JAX's monitoring events, every thread)."""
    import jax.monitoring

    seen: list[str] = []
    lock = threading.Lock()
    listening = {"on": True}

    def heard(event, seconds, **kwargs):
        if listening["on"] and event.endswith("backend_compile_duration"):
            with lock:
                seen.append(str(kwargs.get("fun_name", "")))

    jax.monitoring.register_event_duration_secs_listener(heard)
    yield seen
    listening["on"] = False


def _band_compiles(seen):
    return sum(name == "jit(_band)" for name in seen)


@pytest.mark.parametrize("name", [job.name for job in _prepare.JOBS if job.ahead_of_sample])
def test_a_stand_in_makes_the_samples_request_but_its_values(name, small_samples):
    """The stand-in's request is the sample's in every field, its arrays of the same shapes and dtypes: the same
    programs (the values differ, and no truth is made)."""
    job = next(j for j in _prepare.JOBS if j.name == name)
    stand_ins = {"dic": dic_module.dic_stand_in}
    from napari_gridmip import _sample_data

    stand_ins["speckle-contrast"] = _sample_data.speckle_contrast_stand_in
    real, stand_in = job.request(None), job.request(None, stand_ins[job.ahead_of_sample]())
    for field in dataclasses.fields(real):
        mine, theirs = getattr(stand_in, field.name), getattr(real, field.name)
        if isinstance(theirs, np.ndarray):
            assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, field.name
            assert np.isfinite(mine).all() and np.ptp(mine) > 0, field.name  # textured: no flat subset, no NaN
        else:
            _same(mine, theirs, field.name)


def _unique_dic(monkeypatch, shape):
    """The DIC sample at a size no other test compiles (its band program new to this process)."""
    monkeypatch.setattr(dic_module, "DIC_SHAPE", shape)


def _run(widget, qtbot):
    widget.run_button.native.click()
    qtbot.waitUntil(lambda: not widget.runner.busy and widget.run_button.enabled, timeout=120_000)


def test_the_widgets_run_after_the_run_ahead_compiles_nothing_large(docked, small_samples, monkeypatch, qtbot,
                                                                   compiles):  # fmt: skip
    _unique_dic(monkeypatch, (120, 140))
    viewer, widget = docked(CorrelationWidget)
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    viewer.layers.clear()
    viewer.open_sample("napari-gridmip", "dic")
    qtbot.waitUntil(lambda: not _samples.running_ahead() and not widget.runner.prefetching, timeout=120_000)
    assert _band_compiles(compiles) == 1  # the run ahead's, on the stand-in
    before = len(compiles)
    _run(widget, qtbot)
    assert _band_compiles(compiles[before:]) == 0 and "jit(_prepared)" not in compiles[before:]
    assert widget.status.value.startswith("Done") and "DIC reference (img2) exx" in viewer.layers


def test_a_stand_in_of_other_shapes_would_not_do(docked, small_samples, monkeypatch, qtbot, compiles):
    """The control of the test above: a run ahead on the wrong shapes leaves the band program to the Run."""
    _unique_dic(monkeypatch, (124, 136))
    real_stand_in = dic_module.dic_stand_in
    wrong = (116, 132)

    def other_shapes():
        monkeypatch.setattr(dic_module, "DIC_SHAPE", wrong)
        try:
            return real_stand_in()
        finally:
            monkeypatch.setattr(dic_module, "DIC_SHAPE", (124, 136))

    layers = other_shapes()  # made here, on the test's thread: the worker is given the layers
    monkeypatch.setattr(dic_module, "dic_stand_in", lambda: layers)
    viewer, widget = docked(CorrelationWidget)
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")  # the widget's own early start would compile it first
    monkeypatch.setattr(_samples, "prefetch_enabled", lambda: True)
    viewer.open_sample("napari-gridmip", "dic")
    qtbot.waitUntil(lambda: not _samples.running_ahead(), timeout=120_000)
    assert _band_compiles(compiles) == 1
    _run(widget, qtbot)
    assert _band_compiles(compiles) == 2


def test_run_pressed_while_the_run_ahead_compiles_waits_for_it(docked, small_samples, monkeypatch, qtbot, compiles):
    """The bench's user (benchmarks/bench_session.py): the sample opened, the widget docked, Run at once. One
    compile of the band program in all: the Run waits for the run ahead's."""
    _unique_dic(monkeypatch, (128, 132))
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    viewer, widget = docked(CorrelationWidget)
    viewer.layers.clear()
    viewer.open_sample("napari-gridmip", "dic")
    assert _samples.running_ahead()
    _run(widget, qtbot)
    qtbot.waitUntil(lambda: not _samples.running_ahead(), timeout=120_000)
    assert _band_compiles(compiles) == 1
    assert widget.status.value.startswith("Done") and "DIC reference (img2) exx" in viewer.layers
    truth = viewer.layers["DIC deformed (img1)"].metadata["true_dx"]
    dx = viewer.layers["DIC reference (img2) dx"].data
    assert np.isfinite(dx).any() and truth.shape == (128, 132)


def test_nothing_runs_ahead_where_early_starts_are_off(make_napari_viewer, small_samples, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")
    viewer = make_napari_viewer()
    viewer.open_sample("napari-gridmip", "dic")
    assert not _samples.running_ahead()
    assert _samples.start_run_ahead("dic", dic_module.dic_stand_in) is None
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    assert _samples.start_run_ahead("tiles", dic_module.dic_stand_in) is None  # no job runs ahead of that sample


def test_a_sessions_first_run_ahead_starts_after_napari_adds_the_sample(make_napari_viewer, small_samples,
                                                                       monkeypatch, qtbot):  # fmt: skip
    """Before JAX and the job are imported, their imports would hold the GIL beside the sample's making on the GUI
    thread (2.4 s instead of 0.7 s for the DIC pair): the run ahead is submitted at the event loop's next turn."""
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    monkeypatch.setattr(_samples, "_imported", lambda: False)
    submitted = []
    real_start = _samples._start_pending
    monkeypatch.setattr(_samples, "_start_pending", lambda: (submitted.append(len(viewer.layers)), real_start()))
    viewer = make_napari_viewer()
    viewer.open_sample("napari-gridmip", "dic")
    assert not submitted and len(_samples.running_ahead()) == 1  # waiting for the next turn, seen as running ahead
    qtbot.waitUntil(lambda: bool(submitted), timeout=10_000)
    assert submitted == [2]  # after napari added the pair
    qtbot.waitUntil(lambda: not _samples.running_ahead(), timeout=120_000)
