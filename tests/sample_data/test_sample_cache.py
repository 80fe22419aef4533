"""Samples made once and read back from disk (napari runs sample functions on its GUI thread)."""

import pickle

import numpy as np
import pytest

from napari_gridmip._sample_data import _cache, speckle_sample, tiles_sample
from napari_gridmip._sample_data.calcium import calcium_sample
from napari_gridmip._sample_data.dic import dic_sample
from napari_gridmip._sample_data.dic_series import dic_series_sample


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    return a == b


@pytest.mark.parametrize("sample", [tiles_sample, speckle_sample, dic_sample, calcium_sample, dic_series_sample])
def test_the_cached_sample_is_the_recipe_s(sample, tmp_path, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    first = sample()  # made, and written
    files = list((tmp_path / "samples").glob(f"{sample.__name__}-*.pickle"))
    assert len(files) == 1
    again = sample()  # read back: new arrays, equal to the recipe's
    assert _equal(first, again) and _equal(sample.uncached(), again)
    assert all(x[0] is not y[0] for x, y in zip(first, again))


def test_a_broken_cache_file_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    speckle_sample()
    (path,) = (tmp_path / "samples").glob("speckle_sample-*.pickle")
    path.write_bytes(b"not a pickle")
    assert _equal(speckle_sample(), speckle_sample.uncached())
    assert isinstance(pickle.loads(path.read_bytes()), list)  # written afresh


def test_the_key_follows_the_recipe_s_source(monkeypatch):
    key = _cache._key(tiles_sample.uncached)
    monkeypatch.setattr(_cache.inspect, "getsource", lambda module: "another recipe")
    assert _cache._key(tiles_sample.uncached) != key
