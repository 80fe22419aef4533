"""The live view's source without Qt: its warm-up compiles what a view's render needs, and changes no picture."""

import numpy as np

from napari_gridmip._jobs.live_render import Display, LiveSource, ViewState, occupancy_cells


def _source(volume: np.ndarray) -> LiveSource:
    levels = [volume, volume[::2, ::2, ::2], volume[::4, ::4, ::4]]
    return LiveSource(levels, occupancy_cells(volume, 0.0), 8, (1.0, 1.0, 1.0), (0.0, 0.0, 0.0))


def _state(shape, mode: str = "mip") -> ViewState:
    from napari.utils.colormaps import ensure_colormap

    display = Display(mode, ensure_colormap("magma"), "magma", (0.0, 100.0), 1.0, 50.0, 0.05)
    view = np.array([-0.6, 0.5, 0.62])
    view /= np.linalg.norm(view)
    centre = tuple(n / 2 for n in shape)
    return ViewState(centre, tuple(view), (0.3, -0.9, 0.2), 0.9, 0.0, "right", (40, 56), (), display)


def _volume(shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    volume = np.zeros(shape, np.float32)
    points = rng.integers(0, shape, size=(60, 3))
    volume[tuple(points.T)] = rng.uniform(10, 100, 60)
    return volume


def test_the_warm_up_makes_every_program_the_first_view_needs():
    import jax.monitoring

    # a shape no other test renders: the warm-up's programs are new to this process
    shape = (84, 68, 76)
    source = _source(_volume(shape, 3))
    state = _state(shape)
    compiles = []
    listener = lambda name, secs, **kw: compiles.append(name) if name.endswith("backend_compile_duration") else None  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        source.warm(state.display)
        warmed = len(compiles)
        compiles.clear()
        pictures = list(source.progressive(state))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert warmed >= 2  # both levels' programs
    assert not compiles  # the view's render compiled nothing more
    assert [p.level for p in pictures] == [2, 0] and pictures[1].final
    # and the same pictures as a source never warmed
    cold = list(_source(_volume(shape, 3)).progressive(state))
    for warm_picture, cold_picture in zip(pictures, cold):
        np.testing.assert_array_equal(warm_picture.values, cold_picture.values)


def test_a_cancelled_warm_up_leaves_the_programs_to_the_render():
    shape = (40, 48, 56)
    source = _source(_volume(shape, 4))
    state = _state(shape, "attenuated_mip")
    source.warm(state.display, cancel=lambda: True)
    assert not source._warmed  # nothing counted as made
    pictures = list(source.progressive(state))
    assert pictures[-1].final and np.isfinite(pictures[-1].values).any()
    assert {key[2] for key in source._warmed} == {0}  # the render's own warm-up of level 0, beside the coarse pass


def test_the_warm_up_reads_level_0s_occupied_chunks_and_the_first_view_reads_none():
    shape = (84, 68, 76)  # chunks of 64: 8, each with points in it
    source = _source(_volume(shape, 5))
    state = _state(shape)
    source.warm(state.display)
    source.preloading.join(timeout=60)
    cache = source.caches[0]
    occupied = cache.occupied()
    assert len(occupied) > 1 and sorted(cache.blocks) == sorted(occupied.tolist())
    reads = cache.reads
    pictures = list(source.progressive(state))
    assert pictures[-1].level == 0 and pictures[-1].chunks_read == 0 and cache.reads == reads
    cold = list(_source(_volume(shape, 5)).progressive(state))
    assert cold[-1].chunks_read > 0
    np.testing.assert_array_equal(pictures[-1].values, cold[-1].values)


def test_the_preload_keeps_to_its_bound_and_stops_when_cancelled(monkeypatch):
    from napari_gridmip._jobs import live_render

    shape = (84, 68, 76)
    state = _state(shape)
    monkeypatch.setattr(live_render, "PRELOAD_CHUNKS", 1)  # more occupied chunks than this: none read ahead
    source = _source(_volume(shape, 6))
    source.warm(state.display)
    source.preloading.join(timeout=60)
    assert len(source.caches[0].blocks) < len(source.caches[0].occupied())
    monkeypatch.setattr(live_render, "PRELOAD_CHUNKS", 1024)
    monkeypatch.setattr(live_render, "PRELOAD_BATCH", 1)
    source = _source(_volume(shape, 6))
    looks = []
    source._preload(0, cancel=lambda: looks.append(1) or len(looks) > 3)  # cancelled at its 4th look
    assert len(source.caches[0].blocks) == 3 < len(source.caches[0].occupied())
    source = _source(_volume(shape, 6))
    source.warm(state.display, cancel=lambda: True)  # a warm-up cancelled: no preload either
    assert source.preloading is None and not source.caches[0].blocks


def test_a_render_waits_for_one_batch_of_the_read_ahead_at_most(monkeypatch):
    """Python's lock is not fair: without the turns, the read ahead took the cache again batch after batch while a
    render waited (a review's reproduction: all 5 remaining batches)."""
    import threading
    import time

    from napari_gridmip._jobs import live_render

    monkeypatch.setattr(live_render, "PRELOAD_BATCH", 1)
    shape = (256, 256, 320)  # 80 chunks of 64^3
    rng = np.random.default_rng(0)
    volume = np.zeros(shape, np.float32)
    points = rng.integers(0, shape, size=(4000, 3))
    volume[tuple(points.T)] = rng.uniform(10, 100, len(points))
    source = _source(volume)
    state = _state(shape)
    cache = source.caches[0]
    log = []
    load, prepare = cache.load, cache.prepare

    def slow_load(ids):
        if threading.current_thread() is source.preloading:
            log.append(("batch", time.perf_counter()))
            time.sleep(0.02)
        return load(ids)

    def logged_prepare(*args):
        if threading.current_thread() is threading.main_thread():
            log.append(("render", time.perf_counter()))
        return prepare(*args)

    monkeypatch.setattr(cache, "load", slow_load)
    monkeypatch.setattr(cache, "prepare", logged_prepare)
    source.warm(state.display)
    time.sleep(0.2)  # the read ahead under way
    asked = time.perf_counter()
    log.append(("ask", asked))
    source.render(state, level=0, image_shape=state.canvas)
    source.preloading.join(timeout=60)
    got = next(t for kind, t in log if kind == "render" and t >= asked)
    during = [t for kind, t in log if kind == "batch" and asked <= t < got]
    assert len(during) <= 1
    assert any(kind == "batch" and t > got for kind, t in log)  # the read ahead went on after the render
