"""The DIC pair and the speckle pair with transmission and dark-field: known fields that hold."""

import numpy as np
import pytest

from napari_gridmip._sample_data import (
    contrast_maps,
    make_speckle_pair,
    make_speckle_pair_with_contrast,
    speckle_contrast_sample,
)
from napari_gridmip._sample_data.dic import dic_field, dic_sample, make_dic_pair


def test_speckle_pair_with_contrast_follows_umpa_model_over_the_unchanged_pair():
    moved, reference, _ = make_speckle_pair(frames=4, shape=(64, 72))
    sample, reference2, truth = make_speckle_pair_with_contrast(frames=4, shape=(64, 72))
    np.testing.assert_array_equal(reference2, reference)  # the existing sample's data, untouched
    mean = reference.mean(dtype=np.float64)
    expected = truth["transmission"] * (mean + truth["dark_field"] * (moved.astype(np.float64) - mean))
    np.testing.assert_allclose(sample, expected.astype(np.float32), rtol=1e-6)
    t, d = contrast_maps((64, 72))
    assert 0.45 < t.min() < 0.6 and t.max() == pytest.approx(1, abs=1e-6)
    assert 0.5 < d.min() < 0.65 and np.all(d <= 1)
    assert sorted(truth) == ["dark_field", "dx", "dy", "transmission"]


def test_speckle_contrast_sample_layers():
    layers = speckle_contrast_sample()
    assert [layer[2] for layer in layers] == ["image", "image"]
    assert layers[0][1]["metadata"]["gridmip_role"] == "sample"
    assert {"true_transmission", "true_dark_field", "true_dy", "true_dx"} <= set(layers[0][1]["metadata"])


def test_dic_field_strain_is_its_gradient():
    field = dic_field((96, 128))
    gy_uy, gx_uy = np.gradient(field["dy"])
    gy_ux, gx_ux = np.gradient(field["dx"])
    inner = (slice(2, -2), slice(2, -2))
    np.testing.assert_allclose(field["exx"][inner], gx_ux[inner], atol=2e-4)
    np.testing.assert_allclose(field["eyy"][inner], gy_uy[inner], atol=2e-4)
    np.testing.assert_allclose(field["exy"][inner], 0.5 * (gy_ux + gx_uy)[inner], atol=2e-4)


def test_dic_pair_is_8_bit_deterministic_and_moved_by_its_field():
    from napari_gridmip import find_displacement

    reference, deformed, field = make_dic_pair((80, 96), field={"dy": 0.35, "dx": -0.6}, seed=3)
    again, _, _ = make_dic_pair((80, 96), field={"dy": 0.35, "dx": -0.6}, seed=3)
    assert reference.dtype == deformed.dtype == np.uint8 and reference.shape == (80, 96)
    np.testing.assert_array_equal(reference, again)
    assert 40 < reference.std() < 90 and reference.min() < 40 and reference.max() > 200  # contrast, no clipping
    out = find_displacement(deformed[None], reference[None], (5, 5), subset=(21, 21), step=6, subpixel="refine")
    assert abs(np.nanmedian(np.asarray(out.dy)) - 0.35) < 0.02
    assert abs(np.nanmedian(np.asarray(out.dx)) + 0.6) < 0.02


def test_dic_sample_layers():
    layers = dic_sample()
    assert layers[0][0].dtype == np.uint8 and layers[0][0].ndim == 2
    assert layers[0][1]["metadata"]["gridmip_role"] == "img1"
    assert {"true_dy", "true_dx", "true_exx", "true_eyy", "true_exy"} <= set(layers[0][1]["metadata"])
