import pytest


@pytest.fixture(autouse=True)
def _isolated_user_folders(tmp_path_factory, monkeypatch):
    """Widget settings and compiled programs go to temporary folders, never the user's."""
    monkeypatch.setenv("NAPARI_GRIDMIP_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
