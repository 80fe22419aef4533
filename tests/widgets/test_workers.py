"""Our own worker threads (_widgets/workers.py): lanes bound what runs at once, newer early and render jobs replace
waiting ones, an adopted early job moves to the Run lane, every outcome reaches the GUI thread, and no thread is
left once the jobs are over. Qt's global pool is never used."""

import threading
import time

import pytest

from napari_gridmip._widgets.workers import Workers


@pytest.fixture
def pool(qtbot):
    workers = Workers({"run": 2, "early": 1, "render": 1})
    yield workers
    workers.cancel_all()
    qtbot.waitUntil(lambda: not workers.busy(), timeout=10_000)


def _gate():
    """A job that runs until its event is set, recording that it started and on which thread."""
    release, started, threads = threading.Event(), threading.Event(), []

    def job():
        threads.append(threading.current_thread())
        started.set()
        release.wait(10)
        return "done"

    return job, release, started, threads


def test_outcomes_reach_the_gui_thread_in_order(pool, qtbot):
    events = []
    gui = threading.current_thread()

    def record(kind):
        return lambda *value: events.append((kind, value, threading.current_thread() is gui))

    def gen():
        yield 1
        yield 2

    pool.submit(lambda: 42, on_returned=record("returned"), on_finished=record("finished"))
    pool.submit(gen, on_yielded=record("yielded"), on_finished=record("finished"))
    pool.submit(lambda: 1 / 0, on_errored=record("errored"), on_finished=record("finished"))
    qtbot.waitUntil(lambda: sum(e[0] == "finished" for e in events) == 3, timeout=10_000)
    assert all(on_gui for _, _, on_gui in events)
    assert ("returned", (42,), True) in events
    assert [e[1] for e in events if e[0] == "yielded"] == [(1,), (2,)]
    (errored,) = [e for e in events if e[0] == "errored"]
    assert isinstance(errored[1][0], ZeroDivisionError)


def test_a_lane_runs_at_most_its_limit_and_then_the_next(pool, qtbot):
    gates = [_gate() for _ in range(3)]
    for job, *_ in gates:
        pool.submit(job, lane="run")
    qtbot.waitUntil(lambda: gates[0][2].is_set() and gates[1][2].is_set(), timeout=10_000)
    time.sleep(0.2)
    assert not gates[2][2].is_set()  # the third waits for a slot
    gates[0][1].set()
    qtbot.waitUntil(gates[2][2].is_set, timeout=10_000)
    for _, release, _, _ in gates:
        release.set()
    qtbot.waitUntil(lambda: not pool.busy(), timeout=10_000)
    assert all(threads[0].name.startswith("napari-gridmip") for _, _, _, threads in gates)


def test_a_newer_early_job_replaces_the_waiting_one_and_never_runs_it(pool, qtbot):
    running, release, started, _ = _gate()
    finished = []
    pool.submit(running, lane="early")
    qtbot.waitUntil(started.is_set, timeout=10_000)
    ran = []
    old = pool.submit(lambda: ran.append("old"), lane="early", on_finished=lambda: finished.append("old"))
    new = pool.submit(lambda: ran.append("new"), lane="early", on_finished=lambda: finished.append("new"))
    assert old.cancelled and not new.cancelled
    release.set()
    qtbot.waitUntil(lambda: sorted(finished) == ["new", "old"], timeout=10_000)
    assert ran == ["new"]  # the replaced job finished without running


def test_a_newer_render_replaces_only_the_waiting_jobs_of_its_group(pool, qtbot):
    """One viewer's live view does not drop another's waiting render, nor an early warm-up's (render lane)."""
    running, release, started, _ = _gate()
    pool.submit(running, lane="render", group="a")
    qtbot.waitUntil(started.is_set, timeout=10_000)
    ran = []
    mine = pool.submit(lambda: ran.append("a old"), lane="render", group="a")
    theirs = pool.submit(lambda: ran.append("b"), lane="render", group="b")
    newer = pool.submit(lambda: ran.append("a new"), lane="render", group="a")
    assert mine.cancelled and not theirs.cancelled and not newer.cancelled
    release.set()
    qtbot.waitUntil(lambda: not pool.busy(), timeout=10_000)
    assert ran == ["b", "a new"]


def test_an_early_job_adopted_while_waiting_moves_to_the_run_lane(pool, qtbot):
    blocker, release, started, _ = _gate()
    pool.submit(blocker, lane="early")  # a stale early job that cannot be interrupted
    qtbot.waitUntil(started.is_set, timeout=10_000)
    returned = []
    waiting = pool.submit(lambda: "adopted", lane="early", on_returned=returned.append)
    pool.promote(waiting)  # the user's Run takes it over: it must not wait for the stale one
    qtbot.waitUntil(lambda: returned == ["adopted"], timeout=10_000)
    assert waiting.lane == "run"
    release.set()


def test_cancel_drops_the_outcome_but_still_finishes(pool, qtbot):
    job, release, started, _ = _gate()
    got, finished = [], []
    task = pool.submit(job, on_returned=got.append, on_finished=lambda: finished.append(True))
    qtbot.waitUntil(started.is_set, timeout=10_000)
    task.cancel()
    release.set()
    qtbot.waitUntil(lambda: finished == [True], timeout=10_000)
    assert got == [] and task.done


def test_no_thread_is_left_and_the_global_pool_is_untouched(pool, qtbot):
    from qtpy.QtCore import QThreadPool

    busiest = []
    job, release, started, _ = _gate()
    pool.submit(job)
    qtbot.waitUntil(started.is_set, timeout=10_000)
    busiest.append(QThreadPool.globalInstance().activeThreadCount())
    release.set()
    qtbot.waitUntil(lambda: not pool.busy(), timeout=10_000)
    qtbot.waitUntil(lambda: not [t for t in threading.enumerate() if t.name.startswith("napari-gridmip")],
                    timeout=10_000)  # fmt: skip
    assert busiest == [0]


def test_an_unknown_lane_is_a_value_error(pool):
    with pytest.raises(ValueError, match="lane must be one of"):
        pool.submit(lambda: None, lane="fast")


class _Field:
    def __init__(self, value=""):
        self.value, self.enabled, self.tooltip = value, True, ""


def _held_job(name):
    """A job that waits for its release (10 s at most), then returns one image layer named ``name``; and the
    release."""
    import numpy as np

    from napari_gridmip._jobs import Job, JobResult

    release = threading.Event()

    def work(progress):
        release.wait(10)
        return JobResult(layers=[(np.zeros((4, 4)), {"name": name}, "image")], summary=name)

    return Job(name, work), release


def test_a_run_whose_early_job_was_replaced_runs_it_afresh(make_napari_viewer, qtbot):
    """Widget A's early job waits in the early lane; widget B's newer one replaces it (it never runs). A's Run
    with the same inputs must then run the job itself, not wait for the replaced one forever."""
    from napari_gridmip._jobs import Job, JobResult
    from napari_gridmip._widgets import workers
    from napari_gridmip._widgets.runner import BackgroundRunner

    viewer = make_napari_viewer()
    runners = [BackgroundRunner(run_button=_Field(), cancel_button=_Field(), status=_Field(), viewer=viewer)
               for _ in range(2)]  # fmt: skip
    blocker, release, started, _ = _gate()
    workers.workers().submit(blocker, lane="early")  # the early lane is busy
    qtbot.waitUntil(started.is_set, timeout=10_000)
    made = []

    def job(name):
        return Job(name, lambda progress: made.append(name) or JobResult(layers=[], summary=name))

    runners[0].prefetch(job("a"), key="a")
    runners[1].prefetch(job("b"), key="b")  # replaces a's, which waited
    assert runners[0]._prefetch["worker"].cancelled
    done = []
    runners[0].start(job("a"), key="a", on_done=lambda result, added: done.append(result.summary))
    release.set()
    qtbot.waitUntil(lambda: done == ["a"] and not runners[0].busy, timeout=20_000)
    qtbot.waitUntil(lambda: not runners[1].prefetching, timeout=20_000)
    assert made.count("a") == 1  # run once, by the Run


def test_a_result_arriving_after_the_viewer_closed_is_dropped(make_napari_viewer, qtbot):
    """The viewer is closed while a job runs (its docks are deleted later, by Qt): the result must not be added
    to the closed viewer, whose canvas is gone (napari crashed in add_layer then: benchmarks/probes/gui_soak.py)."""
    from napari_gridmip._widgets.runner import BackgroundRunner

    viewer = make_napari_viewer()
    runner = BackgroundRunner(run_button=_Field(), cancel_button=_Field(), status=_Field(), viewer=viewer)
    job, release = _held_job("late")
    added = []
    runner.start(job, on_done=lambda result, layers: added.extend(layers))
    viewer.close()
    release.set()
    qtbot.waitUntil(lambda: not runner.busy, timeout=20_000)
    qtbot.wait(50)
    assert added == [] and runner._detached
    assert "late" not in [layer.name for layer in viewer.layers]


def test_a_run_imports_what_its_layers_need_beside_the_job(make_napari_viewer, qtbot, monkeypatch):
    """pandas (napari's layer features, imported by a session's first Vectors layer) is imported in a thread of
    its own as a run starts, beside the job, not between its end and its layers; once per process."""
    import sys

    from napari_gridmip._jobs import Job, JobResult
    from napari_gridmip._widgets import runner as runner_module
    from napari_gridmip._widgets.runner import BackgroundRunner

    viewer = make_napari_viewer()
    runner = BackgroundRunner(run_button=_Field(), cancel_button=_Field(), status=_Field(), viewer=viewer)
    monkeypatch.setattr(runner_module, "_imports_started", threading.Event())
    started = []
    monkeypatch.setattr(threading.Thread, "start", lambda self, real=threading.Thread.start: started.append(
        self.name) or real(self))  # fmt: skip
    job, release = _held_job("slow")
    added = []
    runner.start(job, on_done=lambda result, layers: added.extend(layers))
    qtbot.waitUntil(runner_module._imports_started.is_set, timeout=10_000)  # as the job starts, before its end
    assert not added and "napari-gridmip layer imports" in started
    release.set()
    qtbot.waitUntil(lambda: not runner.busy, timeout=20_000)
    assert [layer.name for layer in added] == ["slow"]
    qtbot.waitUntil(lambda: "pandas" in sys.modules, timeout=20_000)
    count = started.count("napari-gridmip layer imports")
    runner.start(Job("again", lambda progress: JobResult(layers=[], summary="again")), on_done=lambda *a: None)
    qtbot.waitUntil(lambda: not runner.busy, timeout=20_000)
    assert started.count("napari-gridmip layer imports") == count == 1  # once per process
