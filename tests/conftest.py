import gc
import os
from pathlib import Path

import pytest


def pytest_configure(config):
    """Compiled programs go to the checkout's own ``.test-cache`` (git-ignored) from the start, before any
    fixture: the library switches JAX's persistent cache on in its folder at its first use, once per process, and
    a test module that uses a kernel at import pointed it at the user's own ~/.cache/napari-gridmip for the whole
    run. Kept across runs, as that folder was (the README's command: 8.6 min with it warm, 16.3 min cold, 7a9fe54)."""
    folder = Path(config.rootpath) / ".test-cache"
    os.environ.setdefault("NAPARI_GRIDMIP_CACHE_DIR", str(folder))


@pytest.fixture(autouse=True)
def _isolated_user_folders(tmp_path_factory, monkeypatch):
    """Widget settings and compiled programs go to temporary folders, never the user's."""
    monkeypatch.setenv("NAPARI_GRIDMIP_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # kept executables are keyed without tracing, so a strategy a test replaces would not reach them
    # (core/_executables.py); tests/core/test_executables.py turns them on
    monkeypatch.setenv("NAPARI_GRIDMIP_EXECUTABLE_CACHE", "0")


@pytest.fixture(autouse=True)
def _earlier_objects_frozen():
    """Python's full garbage collections during a test scan only the objects made since it began.

    napari's ``make_napari_viewer`` runs a full ``gc.collect()`` after each test, which scans every object of
    the process: JAX's caches hold millions once a worker has run a few modules, and each of those
    collections then took 1.5 to 7 s (690 s of the suite's 1860, all in teardowns). Frozen, the objects that
    were there before the test are left out of them (``gc.freeze``), and are scanned again from its end on.
    """
    gc.freeze()
    yield
    gc.unfreeze()


# Parametrisations that each take many seconds on a 2-core CPU (measured with `--durations`), marked slow
# here so that the default run stays within its budget; each test keeps faster cases in the default run,
# and `python -m pytest -m slow` (which .ci/run runs too) runs these.
SLOW_CASES = {
    "tests/core/occupancy/test_max.py::test_dask_is_lazy_and_equal[shape1-chunks1-float16]",
    "tests/core/occupancy/test_render.py::test_compacted_batches_give_the_same_image",
    "tests/core/occupancy/test_render.py::test_dask_reads_only_the_chunks_with_occupied_voxels_on_the_rays",
    "tests/core/occupancy/test_render.py::test_dtypes[float64]",
    "tests/core/patches/test_stitch.py::test_3d_tiles_quadratic",
    "tests/core/test_chunked.py::test_correlation_equals_in_memory[chunks2]",
    "tests/core/test_chunked.py::test_merge_equals_in_memory[37-hann]",
    "tests/core/test_chunked.py::test_merge_equals_in_memory[37-max]",
    "tests/core/test_chunked.py::test_merge_equals_in_memory[37-overwrite]",
    "tests/core/test_chunked.py::test_mipmap_equals_in_memory[shape3-chunks3]",
    "tests/core/correlation/test_subsets.py::test_dask_is_lazy_and_equals_in_memory",
    "tests/core/correlation/test_subsets.py::test_with_and_without_jit[False]",
    "tests/io/test_cli.py::test_correlate_subset_step_and_tracking_outputs",
    "tests/io/test_cli.py::test_mipmap_packed_and_bbox[c]",
    "tests/io/test_cli.py::test_scheduler_address_runs_on_a_cluster",
}


@pytest.hookimpl(tryfirst=True)  # before the -m selection, which reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in SLOW_CASES:
            item.add_marker(pytest.mark.slow)
