"""A short soak in the suite (benchmarks/probes/soak.py runs the long one): every widget, a few runs with random
parameters, cancels, vanishing inputs and re-docking, then the viewer closed during a run."""

import importlib.util
import sys
from pathlib import Path

SOAK = Path(__file__).parents[2] / "benchmarks" / "probes" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_short_soak_leaves_no_error_and_no_thread(make_napari_viewer):
    soak = load_soak()
    viewer = make_napari_viewer()
    report = soak.soak(viewer, iterations=3, seed=1, size="small")
    assert report.runs == 2 * 3 * 5  # two rounds of three runs of five widgets
    assert len(report.actions) >= 3  # waits, cancels, deleted inputs, re-docks
    assert not report.errors, report.errors
    assert not report.threads_left, report.threads_left
