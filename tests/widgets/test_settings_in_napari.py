"""The widgets remember their choices in napari's plugin settings (Preferences), whose defaults are the widgets'."""

import pytest

from napari_gridmip._jobs import settings as _settings
from napari_gridmip._widgets.correlation_widget import CorrelationWidget
from napari_gridmip._widgets.mipmap_widget import MipmapWidget
from napari_gridmip._widgets.patches_widget import PatchesWidget
from napari_gridmip._widgets.stitch_widget import StitchWidget
from napari_gridmip._widgets.tiled_widget import TiledWidget
from tests.test_settings import MANIFEST

WIDGETS = (MipmapWidget, PatchesWidget, StitchWidget, TiledWidget, CorrelationWidget)


@pytest.fixture
def napari_settings_here(tmp_path, monkeypatch):
    """napari's own plugin settings (``get_plugin_settings``), saved under tmp_path instead of the user's folder."""
    import napari.settings

    if not hasattr(napari.settings, "get_plugin_settings"):
        pytest.skip("this napari has no plugin configurations")
    monkeypatch.delenv("NAPARI_GRIDMIP_CONFIG_DIR")
    monkeypatch.setattr(_settings, "settings_file", lambda: tmp_path / "old" / _settings.FILE_NAME)
    monkeypatch.setattr(napari.settings, "_CFG_PATH", str(tmp_path / "settings.yaml"))
    napari.settings._clear_plugin_settings_cache()
    yield napari.settings.get_plugin_settings(_settings.PLUGIN)
    napari.settings._clear_plugin_settings_cache()


@pytest.mark.parametrize("widget_class", WIDGETS, ids=lambda c: c.settings_key)
def test_the_manifest_lists_each_remembered_field_with_the_widgets_default(docked, widget_class):
    from npe2 import PluginManifest

    section = PluginManifest.from_file(MANIFEST).contributions.configurations[widget_class.settings_key]
    _, widget = docked(widget_class)  # a fresh settings folder: every field at its default
    declared = {_settings.PROPERTY_NAMES.get(name, name): name for name in widget_class.persisted}
    assert sorted(section.properties) == sorted(declared)
    for prop, name in declared.items():
        assert section.properties[prop].default == getattr(widget, name).value, name


def test_choices_are_kept_in_napari_settings(docked, napari_settings_here):
    settings = napari_settings_here
    assert _settings.napari_settings() is settings
    _, widget = docked(CorrelationWidget)
    widget.window_rows.value = 15
    widget.subpixel.value = "refine"
    assert settings.correlation.window_rows == 15 and settings.correlation.subpixel == "refine"
    assert "window_rows: 15" in settings.config_path.read_text()
    _, stitch = docked(StitchWidget)
    stitch.max_shift.value = 40
    assert settings.stitch.max_shift == 40
    settings.correlation.step = 5  # as napari's Preferences would
    again = docked(CorrelationWidget)[1]
    assert (again.window_rows.value, again.subpixel.value, again.step.value) == (15, "refine", 5)
    assert docked(StitchWidget)[1].max_shift.value == 40
