"""Opening the DIC pair (or the speckle pair with contrast) in napari starts that sample's first Run on stand-in
inputs of its shapes (napari_gridmip._sample_data.ahead): the widget's Run then compiles none of its large programs
again, whether it comes after the run ahead or while it still compiles, and nothing starts where early starts are
off."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from napari_gridmip._jobs import settings
from napari_gridmip._sample_data import ahead as _samples
from napari_gridmip._sample_data import dic as dic_module
from napari_gridmip._sample_data import prepare
from napari_gridmip._widgets.correlation_widget import CorrelationWidget
from napari_gridmip._widgets.workers import workers
from tests.widgets.test_prepare_requests import _same

_HEARD: list[list[str]] = []  # the running test's list of XLA compiles (one listener for the whole session)


def _heard(event, seconds, **kwargs):
    if _HEARD and event.endswith("backend_compile_duration"):
        _HEARD[-1].append(str(kwargs.get("fun_name", "")))


@pytest.fixture
def compiles():
    """The XLA compiles of this test, by program name (JAX's monitoring events, every thread)."""
    import jax.monitoring

    if not getattr(_heard, "registered", False):
        jax.monitoring.register_event_duration_secs_listener(_heard)
        _heard.registered = True
    seen: list[str] = []
    _HEARD.append(seen)
    yield seen
    _HEARD.remove(seen)


def _band_compiles(seen):
    """The band program's compiles: its own on one device, the sharded one on several (core/runtime/sharding.py)."""
    return sum(name in ("jit(_band)", "jit(on_each_device)") for name in seen)


@pytest.mark.parametrize("name", [job.name for job in prepare.JOBS if job.ahead_of_sample])
def test_a_stand_in_makes_the_samples_request_but_its_values(name, small_samples):
    """The stand-in's request is the sample's in every field, its arrays of the same shapes and dtypes: the same
    programs (the values differ, and no truth is made)."""
    job = next(j for j in prepare.JOBS if j.name == name)
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


def _wait_until_settled(widget, qtbot):
    """Until the run ahead and the widget's own early start are over: the latter waits for the layers to be still
    (a timer), which a run ahead read from a warm compile cache could end before."""
    qtbot.waitUntil(lambda: not _samples.running_ahead() and not widget.starting_early, timeout=120_000)


def _run(widget, qtbot):
    widget.run_button.native.click()
    qtbot.waitUntil(lambda: not widget.runner.busy and widget.run_button.enabled, timeout=120_000)


def test_the_widgets_run_after_the_run_ahead_compiles_no_band_program_again(docked, small_samples, monkeypatch, qtbot,
                                                                   compiles):  # fmt: skip
    _unique_dic(monkeypatch, (120, 140))
    viewer, widget = docked(CorrelationWidget)
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    viewer.layers.clear()
    viewer.open_sample("napari-gridmip", "dic")
    _wait_until_settled(widget, qtbot)
    # the run ahead's, on the stand-in: the widget's own early start on the real pair, after it, compiled none
    assert _band_compiles(compiles) == 1 and compiles.count("jit(_prepared)") == 1
    _run(widget, qtbot)
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
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    viewer, widget = docked(CorrelationWidget)
    viewer.layers.clear()
    viewer.open_sample("napari-gridmip", "dic")
    _wait_until_settled(widget, qtbot)
    assert _band_compiles(compiles) == 2  # the stand-in's, and the widget's own early start's on the real pair


def _hold_the_run_aheads_band_compile(monkeypatch):
    """``(compiling, go_on)``: the run ahead's thread, once it asks XLA for the band program (a compile, or a read of
    JAX's persistent cache, which a warm run's is), sets ``compiling`` and stays there until ``go_on`` is set; other
    threads pass. Without it the run ahead on a stand-in of a small pair, its program read from the cache, could end
    before the test looked for it (the GUI thread makes the sample meanwhile)."""
    import threading

    from jax._src import compiler

    compiling, go_on = threading.Event(), threading.Event()
    real = compiler.compile_or_get_cached

    def held(backend, computation, *args, **kwargs):
        name = str(computation.operation.attributes["sym_name"])
        ahead = threading.current_thread().name.startswith(f"napari-gridmip {_samples.NAME_PREFIX}")
        if ahead and ("_band" in name or "on_each_device" in name):
            compiling.set()
            go_on.wait(120)
        return real(backend, computation, *args, **kwargs)

    monkeypatch.setattr(compiler, "compile_or_get_cached", held)
    return compiling, go_on


def test_run_pressed_while_the_run_ahead_compiles_waits_for_it(docked, small_samples, monkeypatch, qtbot, compiles):
    """The bench's user (benchmarks/bench_session.py): the sample opened, the widget docked, Run at once. One
    compile of the band program in all: the Run waits for the run ahead's, and cancels the rest of it."""
    _unique_dic(monkeypatch, (128, 132))
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    compiling, go_on = _hold_the_run_aheads_band_compile(monkeypatch)
    viewer, widget = docked(CorrelationWidget)
    viewer.layers.clear()
    # the early lane idle (JAX's start, made by a process's first widget): a run ahead waiting there would be
    # replaced by the widget's own early start on the sample's layers, a newer job of that lane
    qtbot.waitUntil(lambda: not workers().busy(), timeout=120_000)
    viewer.open_sample("napari-gridmip", "dic")
    try:
        qtbot.waitUntil(compiling.is_set, timeout=120_000)  # the run ahead is compiling its band program
        (ahead,) = _samples.running_ahead()
        widget.run_button.native.click()  # Run pressed while that compile is under way
    finally:
        go_on.set()
    qtbot.waitUntil(lambda: not widget.runner.busy and widget.run_button.enabled, timeout=120_000)
    qtbot.waitUntil(lambda: not _samples.running_ahead(), timeout=120_000)
    assert _band_compiles(compiles) == 1
    assert ahead.cancelled  # the Run took the cores: the run ahead stopped at its next step
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


def test_no_run_ahead_for_remembered_options_that_change_the_programs(make_napari_viewer, monkeypatch):
    """A returning user's remembered subset shape, precision or full map would make other programs: no run ahead
    then. The defaults assumed are the widget's own."""

    viewer = make_napari_viewer()
    widget = CorrelationWidget(viewer)
    for name, default in _samples._PROGRAM_OPTIONS.items():
        assert getattr(widget, name).value == default, name
    widget.close()
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    stored = {"subset_shape": "translation", "precision": "float32", "full_map": False}
    monkeypatch.setattr(settings, "load", lambda key, **kwargs: dict(stored) if key == "correlation" else {})
    assert _samples._default_options()
    for name, other in (("subset_shape", "affine"), ("precision", "float64"), ("full_map", True)):
        monkeypatch.setattr(settings, "load", lambda key, n=name, o=other, **kwargs: {**stored, n: o})
        assert _samples.start_run_ahead("dic", dic_module.dic_stand_in) is None, name
    assert not _samples.running_ahead()


def test_napari_quitting_cancels_the_runs_ahead(make_napari_viewer, small_samples, monkeypatch, qtbot):
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    monkeypatch.setattr(_samples, "_imported", lambda: False)  # left pending for the next turn
    viewer = make_napari_viewer()
    viewer.open_sample("napari-gridmip", "dic")
    assert len(_samples.running_ahead()) == 1
    _samples.cancel_runs_ahead()  # what the application's aboutToQuit calls
    assert not _samples.running_ahead()
    qtbot.wait(50)  # the timer's turn: nothing is submitted
    assert not _samples.running_ahead()


def test_the_speckle_pair_with_contrast_runs_ahead_too(docked, small_samples, monkeypatch, qtbot, compiles):
    """Its tracking band program (transmission, dark-field) made once, by the run ahead on the stand-in."""
    from napari_gridmip import _sample_data

    monkeypatch.setattr(_sample_data, "SPECKLE_FRAMES", 5)  # sizes no other test compiles
    monkeypatch.setattr(_sample_data, "SPECKLE_SHAPE", (60, 68))
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "1")
    viewer, widget = docked(CorrelationWidget)
    viewer.layers.clear()
    viewer.open_sample("napari-gridmip", "speckle-contrast")
    _wait_until_settled(widget, qtbot)
    assert _band_compiles(compiles) == 1
    _run(widget, qtbot)
    assert widget.status.value.startswith("Done") and "speckle sample transmission" in viewer.layers
