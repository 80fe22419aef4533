"""``napari-gridmip rates [--again]`` (or ``python -m napari_gridmip.cli.rates``): this machine's rates for placing
the memory-bound kernels (:mod:`napari_gridmip.core.runtime.rates`), what measuring them cost, and where the
memory-bound cases of ``benchmarks/bench_accelerator.py`` would run under ``"auto"``.

Apart from the core: it imports the kernels' modules, which register their probe programs with the rates module
(which imports none of them, since they import it through ``core._backend``); only when it runs, so that
``napari-gridmip --help`` imports no JAX.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import numpy as np

NAME = "rates"
HELP = (
    "Print this machine's measured rates for placing the memory-bound kernels (host or accelerator), measuring "
    "them once if they are not kept, and where typical cases would run under --compute-on auto."
)
EXAMPLE = "napari-gridmip rates --again"
BATCH = False  # no files, no dask: none of the batch options

#: benchmarks/bench_accelerator.py's memory-bound cases (its ``--cases`` names): kernel, shape, dtype, and where
#: given the bytes an element takes on the link (None: as the kernel's profile says).
CASES = (
    ("occupancy_mipmap", "occupancy_mipmap", (1024, 1024, 1024), np.float32, None),
    ("max_mipmap", "max_mipmap", (512, 512, 512), np.float32, None),
    ("max_mipmap_uint8", "max_mipmap", (1024, 1024, 1024), np.uint8, None),
    ("local_correlation_image", "local_correlation_image", (2000, 512, 512), np.float32, None),
    # crosses as held, 2 bytes a pixel (timeseries.sent_as_held)
    ("local_correlation_image_uint16", "local_correlation_image", (2000, 512, 512), np.uint16, None),
)


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--again", action="store_true", help="measure anew, replacing what is kept")


def run(args: argparse.Namespace, compute: Any = None) -> int:
    """Print the report; the exit status (1 where the measurement failed)."""
    return _report(args.again)


def _report(again: bool) -> int:
    import jax

    from napari_gridmip.core.correlation import timeseries  # noqa: F401 - registers the "products" probe
    from napari_gridmip.core.occupancy import pyramid  # noqa: F401 - registers the "any" and "max" probes
    from napari_gridmip.core.runtime import rates as _rates

    device = jax.devices()[0]  # JAX's default device in a new process
    if device.platform == "cpu":
        print(f"JAX's default device is the CPU ({device.device_kind}): every kernel runs there, nothing to measure")
        return 0
    print(f"{_rates.key_of(_rates.machine(device))}\nkept in {_rates.path()}")
    if again:
        _rates.measure_again(device)
    start = time.perf_counter()
    rates = {}
    for name in _rates.PROGRAM_NAMES:  # each registered by its kernel's module, imported above
        rates = _rates.rates_for(device, name)
        if rates is None:
            print("the measurement failed (the log above says why)")
            return 1
    print(f"this call {time.perf_counter() - start:.2f} s; the measurement's own cost, s: {rates['cost_s']}")
    print(
        f"link: to the device {rates['to_device'] / 1e9:.2f} GB/s, back {rates['to_host'] / 1e9:.2f} GB/s, "
        f"round trip of {_rates.LATENCY_BYTES} bytes {rates['latency_s'] * 1e3:.3f} ms"
    )
    for name, program in rates["programs"].items():
        host, there = program["host"] / 1e9, program["accelerator"] / 1e9
        print(f"{name:9s} host {host:8.2f} GB/s   {device.platform} {there:8.2f} GB/s")
    print(f"where NumPy inputs run under 'auto' (the accelerator where its estimate is {_rates.MARGIN}x smaller):")
    for case, kernel, shape, dtype, sent in CASES:
        n = math.prod(shape)
        held = n * np.dtype(dtype).itemsize
        host, there = _rates.estimate(rates, _rates.KERNELS[kernel], elements=n, held_bytes=held, sent_itemsize=sent)
        what = f"{case} ({' x '.join(map(str, shape))} {np.dtype(dtype).name})"
        print(f"  {what}: host {host:.3f} s, {device.platform} {there:.3f} s -> {_rates.choose(host, there)}")
    print(f"JAX {jax.__version__}")
    return 0


if __name__ == "__main__":
    from napari_gridmip.cli._shared import Parser

    parser = Parser(prog="python -m napari_gridmip.cli.rates", description=HELP)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
