"""The per-machine rates model that places the memory-bound kernels (runtime.rates,
runtime.strategy.memory_bound_place): the estimate from rates and bytes, the rates file written once and read back,
and nothing measured where there is no accelerator.

This machine has no accelerator: a fake device (a platform and a kind) stands for one, and the measurements are
replaced by counters that return chosen rates, except in the last tests, which run the real probes on the CPU."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import types

import jax
import numpy as np
import pytest

import napari_gridmip as gm
from napari_gridmip.core.runtime import rates as _rates
from napari_gridmip.core.runtime import strategy

TPU = types.SimpleNamespace(platform="tpu", device_kind="Fake TPU")
GIGA = 1e9


def rates(*, link=1.0, latency=1e-4, host=1.0, chip=100.0, program="products"):
    """Rates as kept (GB/s, s): one program measured."""
    return {
        "to_device": link * GIGA,
        "to_host": link * GIGA,
        "latency_s": latency,
        "programs": {program: {"host": host * GIGA, "accelerator": chip * GIGA}},
    }


def where(kept, kernel, shape, dtype, sent_itemsize=None):
    n = math.prod(shape)
    host, chip = _rates.estimate(
        kept, _rates.KERNELS[kernel], elements=n, held_bytes=n * np.dtype(dtype).itemsize, sent_itemsize=sent_itemsize
    )
    return _rates.choose(host, chip)


MOVIE = (2000, 512, 512)


def test_a_slow_link_keeps_the_work_on_the_host():
    slow_link = rates(link=0.47, host=3.0, chip=400.0, program="max")  # a TPU v5e's 4 GiB transfer, a fast host
    assert where(slow_link, "max_mipmap", (512,) * 3, np.float32) == "host"
    assert where(slow_link, "max_mipmap", (512,) * 3, np.uint8) == "host"


def test_work_that_dominates_takes_the_accelerator():
    slow_host = rates(link=2.0, host=0.3, chip=50.0)  # the products run at 0.3 GB/s on the host, the link 2 GB/s
    assert where(slow_host, "local_correlation_image", MOVIE, np.float32) == "accelerator"
    host, chip = _rates.estimate(slow_host, _rates.KERNELS["local_correlation_image"], elements=1e9, held_bytes=4e9)
    assert host == pytest.approx(4e9 / 0.3e9) and chip == pytest.approx(1e-4 + 4e9 / 2e9 + 4e9 / 50e9)


def test_what_crosses_is_what_the_source_holds():
    """A uint16 movie crosses as held, at 2 bytes a pixel (timeseries.sent_as_held): the chip wins where float32
    (4 bytes) would not."""
    kept = rates(link=1.5, host=1.2, chip=50.0)
    assert where(kept, "local_correlation_image", MOVIE, np.float32) == "host"  # 2.75 against 3.33 ns: within margin
    assert where(kept, "local_correlation_image", MOVIE, np.uint16) == "accelerator"
    assert where(kept, "local_correlation_image", MOVIE, np.uint16, sent_itemsize=4) == "host"  # were it widened


def test_the_occupancy_pyramid_sends_bools_whatever_the_source():
    kept = rates(link=1.0, host=2.0, chip=100.0, program="any")
    kernel = _rates.KERNELS["occupancy_mipmap"]
    n = 256**3
    as_float = _rates.estimate(kept, kernel, elements=n, held_bytes=4 * n)
    as_uint8 = _rates.estimate(kept, kernel, elements=n, held_bytes=n)
    assert as_float == pytest.approx(as_uint8)
    assert as_float[1] == pytest.approx(1e-4 + n / 1e9 + (8 / 7) * n / 1e9 + (8 / 7) * n / 100e9)


def test_small_inputs_and_ties_stay_on_the_host():
    kept = rates(link=10.0, latency=1e-3, host=0.5, chip=1000.0)
    assert where(kept, "local_correlation_image", (8, 16, 16), np.float32) == "host"  # the latency dominates
    assert where(kept, "local_correlation_image", MOVIE, np.uint8) == "accelerator"
    assert _rates.choose(1.0, 1.0) == "host" and _rates.choose(1.0, 1.0 / _rates.MARGIN) == "host"
    assert _rates.choose(1.0, 0.99 / _rates.MARGIN) == "accelerator"


def test_sizes_are_the_sources_own():
    import dask.array as da

    assert _rates.sizes((np.zeros((4, 5), np.uint16), None, 3)) == (20, 40)
    assert _rates.sizes((da.zeros((10, 10), dtype=np.float32, chunks=5), np.zeros(2, bool))) == (102, 402)
    unknown = da.zeros(10, chunks=5)[da.arange(10, chunks=5) > 3]  # unknown chunks: NaN size
    assert all(math.isnan(x) for x in _rates.sizes((unknown,)))
    assert _rates.place(TPU, "max_mipmap", (unknown,)) == "host"  # nothing measured: a counter would raise here


# -- the kept rates -----------------------------------------------------------------------------------------


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """The rates file in a folder of this test's own, and measurements that count their calls."""
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    _rates.forget()
    calls = []

    def link(device):
        calls.append(("link", device.device_kind))
        return {"to_device": 1e9, "to_host": 2e9, "latency_s": 1e-4}

    def program(name, device):
        calls.append((name, device.device_kind))
        return {"host": 3e9, "accelerator": 300e9}

    monkeypatch.setattr(_rates, "measure_link", link)
    monkeypatch.setattr(_rates, "measure_program", program)
    yield calls
    _rates.forget()


def kept_file() -> dict:
    return json.loads(_rates.path().read_text())


def test_the_rates_are_measured_once_and_read_back(measured, tmp_path):
    first = _rates.rates_for(TPU, "max")
    assert measured == [("link", "Fake TPU"), ("max", "Fake TPU")]
    assert first["to_device"] == 1e9 and first["programs"] == {"max": {"host": 3e9, "accelerator": 300e9}}
    assert _rates.path() == tmp_path / "rates.json"  # the library's cache folder (NAPARI_GRIDMIP_CACHE_DIR)
    (key, entry), *others = kept_file()["machines"].items()
    assert not others and key == _rates.key_of(_rates.machine(TPU))
    assert entry["platform"] == "tpu" and entry["device_kind"] == "Fake TPU" and entry["jax"] == jax.__version__
    assert set(entry["cost_s"]) == {"link", "max"}
    assert _rates.rates_for(TPU, "max") == first and len(measured) == 2  # this process remembers
    _rates.forget()  # as a new process: the file
    assert _rates.rates_for(TPU, "max")["programs"] == first["programs"] and len(measured) == 2
    _rates.rates_for(TPU, "products")  # another kernel's program: that one alone
    assert measured[2:] == [("products", "Fake TPU")]
    _rates.forget()
    assert set(_rates.rates_for(TPU, "any")["programs"]) == {"max", "products", "any"}
    assert measured[3:] == [("any", "Fake TPU")]
    other = types.SimpleNamespace(platform="gpu", device_kind="Fake GPU")  # another device: its own entry
    _rates.rates_for(other, "max")
    assert measured[4:] == [("link", "Fake GPU"), ("max", "Fake GPU")] and len(kept_file()["machines"]) == 2


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        b"\x00\xff",
        json.dumps({"format": "someone else's", "machines": {}}),
        json.dumps(["a", "list"]),
        json.dumps({"format": _rates.FORMAT, "machines": "none"}),
    ],
    ids=["corrupt", "binary", "foreign format", "a list", "no machines"],
)
def test_a_corrupt_or_foreign_file_is_measured_again(measured, text):
    _rates.path().parent.mkdir(parents=True, exist_ok=True)
    _rates.path().write_bytes(text if isinstance(text, bytes) else text.encode())
    assert _rates.rates_for(TPU, "max")["to_host"] == 2e9
    assert [name for name, _ in measured] == ["link", "max"]
    assert kept_file()["format"] == _rates.FORMAT  # rewritten, sound


def test_another_machines_rates_are_kept_and_not_used(measured):
    foreign = {"to_device": 5e9, "to_host": 5e9, "latency_s": 1e-5, "programs": {"max": {"host": 1, "accelerator": 1}}}
    key = "tpu | Fake TPU | another host x96 | " + jax.__version__
    _rates.path().parent.mkdir(parents=True, exist_ok=True)
    _rates.path().write_text(json.dumps({"format": _rates.FORMAT, "machines": {key: foreign}}))
    assert _rates.rates_for(TPU, "max")["to_device"] == 1e9 and len(measured) == 2
    assert kept_file()["machines"][key]["to_device"] == 5e9  # a shared cache folder keeps both


@pytest.mark.parametrize(
    "bad",
    [{"to_device": -1.0}, {"to_host": "fast"}, {"latency_s": float("inf")}, {"to_device": True}],
    ids=["negative", "text", "infinite", "bool"],
)
def test_an_entry_with_unsound_rates_is_measured_again(measured, bad):
    _rates.rates_for(TPU, "max")
    kept = kept_file()
    key = _rates.key_of(_rates.machine(TPU))
    kept["machines"][key].update(bad)
    kept["machines"][key]["programs"]["products"] = {"host": 0, "accelerator": 1}  # unsound: dropped on reading
    _rates.path().write_text(json.dumps(kept))  # inf as JSON's Infinity, which Python reads back
    _rates.forget()
    _rates.rates_for(TPU, "max")
    assert [name for name, _ in measured] == ["link", "max", "link", "max"]
    assert set(kept_file()["machines"][key]["programs"]) == {"max"}


def test_an_unwritable_folder_keeps_the_rates_in_the_process(measured, tmp_path, monkeypatch):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(blocked))  # its rates.json cannot be written
    assert _rates.rates_for(TPU, "max")["to_device"] == 1e9
    assert _rates.rates_for(TPU, "max") is not None and len(measured) == 2


def test_a_failed_measurement_places_on_the_host_and_is_not_retried(measured, monkeypatch, caplog):
    def broken(device):
        measured.append(("link", device.device_kind))
        raise RuntimeError("no link")

    monkeypatch.setattr(_rates, "measure_link", broken)
    volume = np.zeros((64, 64, 64), np.uint8)
    assert _rates.place(TPU, "max_mipmap", (volume,)) == "host"
    assert _rates.place(TPU, "max_mipmap", (volume,)) == "host"
    assert measured == [("link", "Fake TPU")] and "could not measure" in caplog.text
    assert not _rates.path().exists()


def test_measure_again_forgets_the_kept_rates(measured):
    _rates.rates_for(TPU, "max")
    _rates.measure_again(TPU)
    assert kept_file()["machines"] == {}
    _rates.rates_for(TPU, "max")
    assert [name for name, _ in measured] == ["link", "max", "link", "max"]


# -- memory_bound_place with the rates ----------------------------------------------------------------------


VOLUME = np.zeros((256, 256, 256), np.uint8)


@pytest.fixture
def accelerator(measured, monkeypatch):
    """A (fake) accelerator machine: memory_bound_place sees an accelerator and a host, and measures its rates
    through ``measured``'s counters, whose rates the test sets (``set(...)``)."""
    monkeypatch.setattr(strategy, "_on_accelerator", lambda: True)
    monkeypatch.setattr(strategy, "_target_device", lambda: TPU)
    chosen = {}

    def link(device):
        measured.append(("link", device.device_kind))
        return chosen["link"]

    def program(name, device):
        measured.append((name, device.device_kind))
        return chosen[name]

    monkeypatch.setattr(_rates, "measure_link", link)
    monkeypatch.setattr(_rates, "measure_program", program)

    def choose(*, link, host, chip):
        _rates.forget()
        _rates.measure_again(TPU)
        chosen["link"] = {"to_device": link * GIGA, "to_host": link * GIGA, "latency_s": 1e-4}
        for name in _rates.PROGRAM_NAMES:
            chosen[name] = {"host": host * GIGA, "accelerator": chip * GIGA}

    return choose


def on_the_host(scope) -> bool:
    return not isinstance(scope, contextlib.nullcontext)


def test_the_rates_place_the_call(accelerator, measured, monkeypatch):
    from napari_gridmip.core.runtime import choice

    accelerator(link=0.5, host=5.0, chip=300.0)  # a slow link: the host
    with choice.recording() as record, choice.calling("napari_gridmip.max_mipmap", platform="tpu"):
        assert on_the_host(strategy.memory_bound_place(VOLUME, kernel="max_mipmap"))
    assert record["calls"][0]["moved_to_host"] == ["memory_bound_place"]
    assert [name for name, _ in measured] == ["link", "max"]
    accelerator(link=2.0, host=0.3, chip=300.0)  # a fast link, a slow host: the chip
    with choice.recording() as record, choice.calling("napari_gridmip.max_mipmap", platform="tpu"):
        assert not on_the_host(strategy.memory_bound_place(VOLUME, kernel="max_mipmap"))
    assert "moved_to_host" not in record["calls"][0]
    # a uint16 movie crosses as held: the chip; were it widened to float32 before it crosses, the host
    accelerator(link=2.0, host=1.8, chip=300.0)
    movie = VOLUME.astype(np.uint16)
    assert not on_the_host(strategy.memory_bound_place(movie, kernel="local_correlation_image"))
    widened = dataclasses.replace(_rates.KERNELS["local_correlation_image"], sent_itemsize=4)
    monkeypatch.setitem(_rates.KERNELS, "local_correlation_image", widened)
    assert on_the_host(strategy.memory_bound_place(movie, kernel="local_correlation_image"))


def test_the_setting_and_device_arrays_need_no_rates(accelerator, measured, monkeypatch):
    accelerator(link=2.0, host=0.3, chip=300.0)
    with gm.compute_on("host"):
        assert on_the_host(strategy.memory_bound_place(VOLUME))
    with gm.compute_on("accelerator"):
        assert not on_the_host(strategy.memory_bound_place(VOLUME.astype(np.float64)))
    assert not on_the_host(strategy.memory_bound_place(jax.numpy.zeros(8)))  # a device array stays on its device
    assert measured == []


# -- nothing measured without an accelerator -----------------------------------------------------------------


@pytest.fixture
def no_measuring(tmp_path, monkeypatch):
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    _rates.forget()

    def refuse(*args, **kwargs):
        raise AssertionError("measured on a machine without an accelerator")

    monkeypatch.setattr(_rates, "measure_link", refuse)
    monkeypatch.setattr(_rates, "measure_program", refuse)
    monkeypatch.setattr(_rates, "_measured", refuse)
    yield
    assert not _rates.path().exists()
    _rates.forget()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a machine without an accelerator")
def test_nothing_is_measured_without_an_accelerator(no_measuring):
    import dask.array as da

    volume = np.random.default_rng(0).random((8, 12, 6)).astype(np.float32)
    for x in (volume, da.from_array(volume, chunks=4)):
        assert isinstance(strategy.memory_bound_place(x, kernel="occupancy_mipmap"), contextlib.nullcontext)
    assert _rates.rates_for(jax.devices()[0], "max") is None
    gm.occupancy_mipmap(volume, threshold=0.5)
    gm.max_mipmap(volume)
    gm.local_correlation_image(volume)


def test_a_pretended_tpu_whose_device_is_the_cpu_measures_nothing(no_measuring, monkeypatch):
    """The suite's pretended TPU (tests/core/test_compute_on.py): the platform says TPU, the device is this CPU;
    no rates can be had there, and host inputs go to the host, as the rule before the rates did."""
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert on_the_host(strategy.memory_bound_place(VOLUME, kernel="max_mipmap"))


# -- the real probes, on the CPU (a test asks) ---------------------------------------------------------------


def test_the_link_probe_runs():
    cpu = jax.devices("cpu")[0]
    link = _rates.measure_link(cpu, nbytes=2**20)
    assert all(np.isfinite(v) and v > 0 for v in link.values()) and set(link) == {"to_device", "to_host", "latency_s"}


@pytest.mark.parametrize(
    "program", ["any", "max", pytest.param("products", marks=pytest.mark.slow)]
)  # products compiles for 0.3 to 0.5 s here
def test_the_programs_run_on_both_sides(program):
    cpu = jax.devices("cpu")[0]
    measured = _rates.measure_program(program, cpu, host=cpu, scale=0.1)
    assert set(measured) == set(_rates.SIDES) and all(np.isfinite(v) and v > 0 for v in measured.values())
