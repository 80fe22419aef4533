"""The widgets' remembered choices: in napari's plugin settings (the manifest's configurations), the old JSON file
migrated into them once, and the file itself where napari's are not available (Qt-free)."""

import json
from pathlib import Path

import pytest

import napari_gridmip
from napari_gridmip._jobs import settings as _settings

MANIFEST = Path(napari_gridmip.__file__).parent / "napari.yaml"


@pytest.fixture
def store(tmp_path):
    """napari's settings model of this plugin, built from its manifest as napari builds it, saved under tmp_path."""
    from npe2 import PluginManager, PluginManifest

    try:
        from napari.settings import plugin_configuration_generator
    except ImportError:
        pytest.skip("this napari has no plugin configurations")
    manager = PluginManager()
    manager.register(PluginManifest.from_file(MANIFEST))
    model = plugin_configuration_generator(manager)[_settings.PLUGIN]
    return model(config_path=tmp_path / "napari-gridmip.yaml")


def test_the_manifest_declares_every_widget_section():
    from npe2 import PluginManifest

    configurations = PluginManifest.from_file(MANIFEST).contributions.configurations
    assert sorted(configurations) == ["correlation", "general", "mipmap", "patches", "stitch", "tiled"]
    assert configurations["general"].properties["start_early"].default is True
    assert configurations["correlation"].properties["window_rows"].default == 9


def test_the_file_is_the_store_without_napari_settings():
    assert _settings.napari_settings() is None  # NAPARI_GRIDMIP_CONFIG_DIR is set for the tests
    _settings.save("tiled", {"tile": 128, "blend": "hann"})
    assert _settings.load("tiled") == {"tile": 128, "blend": "hann"}
    assert json.loads(_settings.settings_file().read_text())["tiled"] == {"tile": 128, "blend": "hann"}


def test_the_early_start_is_a_napari_setting(store):
    assert _settings.load("general", store=store) == {"start_early": True, "compute_on": "auto", "device_layers": 50}
    _settings.save("general", {"start_early": False}, store=store)
    assert store.general.start_early is False
    assert "start_early: false" in store.config_path.read_text()


def test_the_share_kept_on_the_accelerator_is_a_napari_setting(store):
    assert _settings.device_layers_percent(store=store) == 50  # half the device's memory by default
    store.general.device_layers = 0  # as napari's Preferences would: nothing kept
    assert _settings.device_layers_percent(store=store) == 0
    _settings.save("general", {"device_layers": 120})  # out of napari's range: the file keeps it, clipped on reading
    assert _settings.device_layers_percent(store=None) == 90


def test_values_go_to_napari_settings(store):
    _settings.save("correlation", {"window_rows": 15, "subpixel": "refine"}, store=store)
    assert store.correlation.window_rows == 15 and store.correlation.subpixel == "refine"
    assert "window_rows: 15" in store.config_path.read_text()  # napari saved its file
    loaded = _settings.load("correlation", store=store)
    assert loaded["window_rows"] == 15 and loaded["subpixel"] == "refine" and loaded["step"] == 2
    _settings.save("stitch", {"source": "a folder of TIFF tiles"}, store=store)  # a renamed property
    assert store.stitch.tiles_from == "a folder of TIFF tiles"
    assert _settings.load("stitch", store=store)["source"] == "a folder of TIFF tiles"
    # a value napari's section refuses, or does not declare, stays in the file
    _settings.save("tiled", {"blend": "no such blend", "later_field": 3}, store=store)
    assert store.tiled.blend == "gaussian"
    assert json.loads(_settings.settings_file().read_text())["tiled"] == {"blend": "no such blend", "later_field": 3}


def test_old_settings_move_into_napari_once(store):
    old = {"mipmap": {"threshold": 0.25, "per_level": True}, "patches": {"blend": "hann", "retired": 1}}
    _settings.settings_file().parent.mkdir(parents=True, exist_ok=True)
    _settings.settings_file().write_text(json.dumps(old))
    assert _settings.load("mipmap", store=store)["threshold"] == 0.25
    assert store.mipmap.threshold == 0.25 and store.mipmap.per_level and store.patches.blend == "hann"
    left = json.loads(_settings.settings_file().read_text())
    assert left == {"patches": {"retired": 1}, _settings.MIGRATED: True}
    store.mipmap.threshold = 0.5  # changed in napari's Preferences later: the old file never wins again
    assert _settings.load("mipmap", store=store)["threshold"] == 0.5
    assert _settings.load("patches", store=store)["retired"] == 1
