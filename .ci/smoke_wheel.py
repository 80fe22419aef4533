"""Smoke test of an installed wheel (not a pytest module: .ci/run runs it with a fresh venv's python).

    python -m build --outdir dist && python -m venv /tmp/wheelenv
    /tmp/wheelenv/bin/pip install "dist/napari_gridmip-<version>-py3-none-any.whl[all]"
    xvfb-run -a /tmp/wheelenv/bin/python .ci/smoke_wheel.py

Checks that napari_gridmip is imported from the venv (not this checkout), that ``npe2 validate`` passes, that a
napari viewer docks every widget of the installed manifest and opens every sample of it (each adding layers, made
afresh in an empty cache folder), that the JAX core runs, and that the installed ``napari-gridmip`` script writes
OME-Zarr (``mipmap`` and ``stitch`` on tiny inputs: the wheel's dependencies must bring ome-zarr). Exits 0, or 1
with one line saying what failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

PLUGIN = "napari-gridmip"


def log(message: str) -> None:
    print(f"smoke_wheel: {message}", flush=True)


def check(cache: Path) -> None:
    os.environ["NAPARI_GRIDMIP_CACHE_DIR"] = str(cache)  # every sample made by the wheel's code, none read back
    checkout = Path(__file__).resolve().parent.parent
    import napari_gridmip

    where = Path(napari_gridmip.__file__).resolve()
    assert where.is_relative_to(Path(sys.prefix).resolve()), f"napari_gridmip imported from {where}, not {sys.prefix}"
    assert not where.is_relative_to(checkout), f"napari_gridmip imported from the checkout: {where}"
    log(f"napari_gridmip {napari_gridmip.__version__} from {where.parent}")

    npe2_cli = Path(sys.executable).parent / "npe2"
    done = subprocess.run([str(npe2_cli), "validate", PLUGIN], capture_output=True, text=True)
    assert done.returncode == 0, f"npe2 validate {PLUGIN}: {(done.stdout + done.stderr).strip()[-300:]}"

    from importlib import metadata

    distribution = metadata.distribution(PLUGIN)
    licenses = [f for f in distribution.files or [] if f.name.startswith("LICENSE")]
    assert licenses, f"the wheel holds no LICENSE file: {[str(f) for f in distribution.files or []][:10]}"
    assert "BSD 3-Clause" in licenses[0].read_text(), f"{licenses[0]} is not the BSD 3-Clause license"
    log(f"license file: {licenses[0]}")

    import npe2

    manifest = npe2.PluginManifest.from_distribution(PLUGIN)
    assert manifest.package_metadata.name == PLUGIN, manifest.package_metadata.name
    widgets = [w.display_name for w in manifest.contributions.widgets or []]
    samples = [s.key for s in manifest.contributions.sample_data or []]
    # The installed manifest must dock what the checkout's manifest declares (a widget lost in packaging fails here).
    declared = npe2.PluginManifest.from_file(checkout / "napari_gridmip" / "napari.yaml")
    expected = [w.display_name for w in declared.contributions.widgets or []]
    assert widgets == expected, f"the installed manifest contributes {widgets}, the checkout's {expected}"
    assert samples, "the manifest contributes no samples"

    import napari
    from qtpy.QtWidgets import QApplication

    viewer = napari.Viewer(show=False)
    try:
        for name in widgets:
            dock, widget = viewer.window.add_plugin_dock_widget(PLUGIN, name)
            assert widget is not None, f"widget {name!r}: nothing docked"
        docked = " ".join(viewer.window.dock_widgets.keys())
        missing = [name for name in widgets if name not in docked]
        assert not missing, f"widgets not docked: {missing} (docked: {docked})"
        log(f"{len(widgets)} widgets docked: {', '.join(widgets)}")

        for key in samples:
            start, before = time.perf_counter(), len(viewer.layers)
            viewer.open_sample(PLUGIN, key)
            QApplication.processEvents()
            added = [layer.name for layer in viewer.layers[before:]]
            assert added, f"sample {key!r} added no layers"
            log(f"sample {key}: {len(added)} layers in {time.perf_counter() - start:.1f} s ({', '.join(added)})")

        import numpy as np

        volume = np.asarray(viewer.layers["occupancy volume"].data)
        levels = napari_gridmip.occupancy_mipmap(volume)
        assert len(levels) > 1 and bool(np.asarray(levels[-1]).any()), "occupancy_mipmap gave an empty pyramid"
        log(f"occupancy_mipmap (JAX): {len(levels)} levels")
    finally:
        viewer.close()
        QApplication.processEvents()
        settle()


def settle(timeout: float = 600.0) -> None:
    """Wait for the jobs the widgets and samples started in the background (runs ahead, JAX's early start): a
    compile under way ends before its job can stop, and writes into the cache folder, which is removed next."""
    from qtpy.QtWidgets import QApplication

    from napari_gridmip._widgets.workers import workers_if_made
    from napari_gridmip.core.runtime.executables import wait_for_writes

    pool = workers_if_made()
    if pool is not None:
        pool.cancel_all()
        end = time.monotonic() + timeout
        while pool.busy():
            assert time.monotonic() < end, f"background jobs still running after {timeout:.0f} s: {pool.busy()}"
            QApplication.processEvents()
            time.sleep(0.05)
    wait_for_writes(timeout)


def check_cli(folder: Path) -> None:
    """The installed script's OME-Zarr writers on tiny inputs, each output read back through the package."""
    import numpy as np

    import napari_gridmip

    script = Path(sys.executable).parent / "napari-gridmip"
    assert script.is_file(), f"the wheel installed no napari-gridmip script in {script.parent}"
    volume = np.zeros((8, 8, 8), np.uint8)
    volume[2:4, 3:6, 1:2] = 1
    np.save(folder / "vol.npy", volume)
    rng = np.random.default_rng(0)
    picture = rng.random((96, 96)).astype(np.float32)
    tiles = np.stack([picture[r : r + 64, c : c + 64] for r in (0, 32) for c in (0, 32)])  # 2x2 grid, 50% overlap
    np.save(folder / "tiles.npy", tiles)
    runs = {
        "mipmap": ["mipmap", "vol.npy", "out.ome.zarr", "--quiet"],
        "stitch": ["stitch", "tiles.npy", "mosaic.ome.zarr", "--grid", "2", "2", "--overlap", "0.5", "--quiet"],
    }
    for name, args in runs.items():
        done = subprocess.run([str(script), *args], cwd=folder, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"napari-gridmip {name}: {(done.stdout + done.stderr).strip()[-300:]}"
    occupancy = napari_gridmip.read_array(folder / "out.ome.zarr").compute()
    assert np.array_equal(occupancy, volume > 0), "napari-gridmip mipmap: level 0 is not the volume's occupancy"
    mosaic = napari_gridmip.read_array(folder / "mosaic.ome.zarr").compute()
    # the registered positions are sub-pixel: the fused mosaic may take one pixel more
    assert all(96 <= n <= 97 for n in mosaic.shape), f"napari-gridmip stitch: a mosaic of shape {mosaic.shape}"
    assert (folder / "mosaic.ome.zarr.positions.csv").is_file(), "napari-gridmip stitch wrote no positions file"
    log(f"napari-gridmip mipmap and stitch wrote OME-Zarr (mosaic {mosaic.shape})")


def main() -> int:
    try:
        with tempfile.TemporaryDirectory(prefix="smoke-wheel-cache-") as cache:
            check(Path(cache))
        with tempfile.TemporaryDirectory(prefix="smoke-wheel-cli-") as folder:
            check_cli(Path(folder))
    except AssertionError as error:
        log(f"FAILED: {error}")
        return 1
    except Exception as error:  # any other failure: its traceback, then the same one line
        traceback.print_exc()
        log(f"FAILED: {type(error).__name__}: {error}")
        return 1
    log("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
