"""A short GUI soak in the suite (benchmarks/probes/gui_soak.py runs the long one, docs/benchmarks.md its figures):
random sequences of docking, samples, layer edits, option changes mid-run, Run / Cancel / Run again, 2D / 3D with
the full-resolution view on, and the viewer closed mid-job, in a process of its own under an outside watchdog,
with Qt's global pool limited to one thread."""

import importlib.util
from pathlib import Path

import pytest

SOAK = Path(__file__).parents[2] / "benchmarks" / "probes" / "gui_soak.py"


def load_gui_soak():
    spec = importlib.util.spec_from_file_location("gui_soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [1, 2])
def test_short_gui_soak_never_hangs_raises_or_leaves_a_thread(seed, tmp_path, capsys):
    soak = load_gui_soak()
    report = tmp_path / "report.json"
    status = soak.main(["--actions", "40", "--seed", str(seed), "--pool", "1", "--live", "--watchdog", "240",
                        "--json", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0, out[-6000:]
    assert report.exists()


def test_the_verdict_fails_each_target():
    soak = load_gui_soak()
    assert soak.verdict({}) == []
    assert soak.verdict({"hung": True, "watchdog_s": 5})
    assert soak.verdict({"uncaught": ["x"]})
    assert soak.verdict({"threads_left": ["t"]})
    assert soak.verdict({"ours_on_global_pool": 1})
    assert soak.verdict({"global_pool_busiest": 1}) == []  # Qt's own use of its pool
    napari_stack = 'Current thread 0x1 (most recent call first):\n  File "vispy/app/backends/_qt.py", line 705 in event'
    assert not soak._ours_crashed("Fatal Python error: Segmentation fault\n\n" + napari_stack)
    assert soak._ours_crashed(napari_stack + '\n  File "napari_gridmip/_widgets/runner.py", line 1 in _show_next')
