"""``napari-gridmip --prepare`` compiles the programs of each widget's first Run on its sample: its requests
(napari_gridmip._sample_data.prepare, made without napari) are the ones the widget captures when the sample is opened
and Run
is clicked with a new user's options. A changed default or sample suggestion in a widget fails here, not silently
as a first Run that compiles again."""

import dataclasses

import numpy as np
import pytest

from napari_gridmip._jobs import Job
from napari_gridmip._jobs.device_layers import DeviceInput, DeviceLayerCache
from napari_gridmip._jobs.plan import Source
from napari_gridmip._jobs.world import Frame
from napari_gridmip._sample_data import prepare as _prepare

# each job: its widget's module and class, the job maker the widget calls there, the sample, what the user changes
WIDGETS = {
    "dic": ("correlation_widget", "CorrelationWidget", "make_correlation_job", "dic", {}),
    "dic-affine": ("correlation_widget", "CorrelationWidget", "make_correlation_job", "dic",
                   {"subset_shape": "affine"}),
    "speckle": ("correlation_widget", "CorrelationWidget", "make_correlation_job", "speckle", {}),
    "speckle-contrast": ("correlation_widget", "CorrelationWidget", "make_correlation_job", "speckle-contrast", {}),
    "dic-series": ("correlation_widget", "CorrelationWidget", "make_series_job", "dic-series", {}),
    "calcium": ("correlation_widget", "CorrelationWidget", "make_timeseries_job", "calcium", {}),
    "mipmap": ("mipmap_widget", "MipmapWidget", "make_mipmap_job", "occupancy", {}),
    "tiled": ("tiled_widget", "TiledWidget", "make_tiled_job", "occupancy", {}),
    "patches": ("patches_widget", "PatchesWidget", "make_merge_job", "tiles", {}),
    "stitch": ("stitch_widget", "StitchWidget", "make_stitch_job", "mosaic", {}),
}  # fmt: skip


def test_every_job_has_a_widget_here():
    assert set(WIDGETS) == set(_prepare.JOB_NAMES)


def _same(mine, theirs, where):
    """Equal as far as the job's programs and results go: arrays by value and dtype, frames by their transform
    (a layer's carries napari's "pixel" units where a sample's own frame says none), device inputs by their data."""
    if isinstance(mine, np.ndarray) or isinstance(theirs, np.ndarray):
        a, b = np.asarray(mine), np.asarray(theirs)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True), where
    elif isinstance(mine, Frame):
        assert isinstance(theirs, Frame) and mine.ndim == theirs.ndim, where
        for name in ("scale", "translate", "rotate", "shear", "affine"):
            assert np.array_equal(getattr(mine, name), getattr(theirs, name)), (where, name)
    elif isinstance(mine, DeviceInput):
        assert isinstance(theirs, DeviceInput), where
        _same(mine.array, theirs.array, f"{where}.array")
        assert mine.key[1] == theirs.key[1] and mine.layer == theirs.layer, where
    elif isinstance(mine, tuple | list) and not isinstance(mine, Source):
        assert isinstance(theirs, tuple | list) and len(mine) == len(theirs), (where, mine, theirs)
        for i, (a, b) in enumerate(zip(mine, theirs)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(mine, dict):
        assert isinstance(theirs, dict) and set(mine) == set(theirs), where
        for key in mine:
            _same(mine[key], theirs[key], f"{where}[{key!r}]")
    else:
        assert type(mine) is type(theirs) and mine == theirs, (where, mine, theirs)


@pytest.mark.parametrize("name", list(WIDGETS))
def test_the_prepared_request_is_the_widgets(name, docked, small_samples, monkeypatch):
    import importlib

    module_name, class_name, maker, sample, changes = WIDGETS[name]
    module = importlib.import_module(f"napari_gridmip._widgets.{module_name}")
    monkeypatch.setenv("NAPARI_GRIDMIP_PREFETCH", "0")  # no run started early: Run's request alone is captured
    captured = []
    monkeypatch.setattr(module, maker, lambda request: captured.append(request) or Job("", lambda progress: None))
    viewer, widget = docked(getattr(module, class_name))
    viewer.open_sample("napari-gridmip", sample)
    for field_name, value in changes.items():
        getattr(widget, field_name).value = value
    widget.make_job()  # what Run captures (the job itself is not run here)
    (theirs,) = captured
    job = next(job for job in _prepare.JOBS if job.name == name)
    mine = job.request(DeviceLayerCache())
    assert type(mine) is type(theirs)
    for field in dataclasses.fields(mine):
        _same(getattr(mine, field.name), getattr(theirs, field.name), field.name)
