"""napari's Preferences, napari-gridmip, "All widgets", "Compute on" reach each widget run, and its result layers
record where their calls ran. This machine has no accelerator: a pretended TPU
(``runtime.strategy._on_tpu``) shows the rule that moves the pyramid to the host, and the setting that turns it off."""

from __future__ import annotations

import jax
import pytest

from napari_gridmip._jobs.plan import KEY
from napari_gridmip._widgets.mipmap_widget import MipmapWidget
from napari_gridmip.core.runtime import strategy
from tests.widgets.test_settings_in_napari import napari_settings_here  # noqa: F401 - a fixture


def ran_on(viewer, name: str) -> dict:
    return viewer.layers[name].metadata[KEY]["ran_on"]


def run(widget, wait_idle) -> None:
    widget.run_button.native.click()
    wait_idle(widget)
    assert widget.status.value.startswith("Done"), widget.status.value


@pytest.fixture
def sample(docked, napari_settings_here):  # noqa: F811 - the fixture imported above
    """The mipmap widget on the occupancy sample, with napari's own plugin settings (as Preferences shows them)."""
    settings = napari_settings_here
    settings.general.start_early = False  # runs only when Run is pressed, unless a test asks
    viewer, widget = docked(MipmapWidget)
    viewer.open_sample("napari-gridmip", "occupancy")
    widget.threshold.value = 0.5
    return settings, viewer, widget, f"{widget.layer.value.name} occupancy"


def test_the_preference_reaches_the_run_and_its_provenance(sample, wait_idle, monkeypatch):
    settings, viewer, widget, result = sample
    cpu_kind = jax.devices("cpu")[0].device_kind
    settings.general.compute_on = "host CPU"  # as napari's Preferences would
    run(widget, wait_idle)
    assert ran_on(viewer, result) == {
        "compute_on": "host",
        "calls": [{"function": "napari_gridmip.occupancy_mipmap", "platform": "cpu", "device_kind": cpu_kind}],
    }

    monkeypatch.setattr(strategy, "_on_tpu", lambda: True)  # a TPU machine: the rule moves the pyramid to the host
    settings.general.compute_on = "auto"
    run(widget, wait_idle)
    (call,) = ran_on(viewer, result)["calls"]
    assert ran_on(viewer, result)["compute_on"] == "auto" and call["moved_to_host"] == ["memory_bound_place"]

    settings.general.compute_on = "accelerator"  # the rule is off
    run(widget, wait_idle)
    (call,) = ran_on(viewer, result)["calls"]
    assert ran_on(viewer, result)["compute_on"] == "accelerator" and "moved_to_host" not in call

    monkeypatch.setenv("NAPARI_GRIDMIP_COMPUTE_ON", "host")  # the variable, where set, wins
    run(widget, wait_idle)
    assert ran_on(viewer, result)["compute_on"] == "host"

    monkeypatch.setenv("NAPARI_GRIDMIP_COMPUTE_ON", "gpu")  # a bad one fails the run, which says why
    failures = []
    monkeypatch.setattr("napari_gridmip._widgets.runner.notify_error", failures.append)
    widget.run_button.native.click()
    wait_idle(widget)
    assert "NAPARI_GRIDMIP_COMPUTE_ON must be one of" in widget.status.value and len(failures) == 1


def test_a_run_started_early_under_another_setting_is_not_taken_over(sample, qtbot, wait_idle):
    settings, viewer, widget, result = sample
    settings.general.start_early = True
    widget.threshold.value = 0.6  # a change of the inputs: the run starts early, under "auto"
    qtbot.waitUntil(lambda: widget.runner.prefetched, timeout=60_000)
    settings.general.compute_on = "host CPU"  # changed before Run: its result is not the one asked for
    run(widget, wait_idle)
    assert ran_on(viewer, result)["compute_on"] == "host"
