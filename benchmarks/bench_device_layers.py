"""A widget's second Run on the same layer, its copy kept on the device, against the same Run on the host CPU.

Peers: the same jobs in a child process with ``JAX_PLATFORMS=cpu`` (nothing kept); cases mipmap, maps and dic;
the first Run (a miss), the second Run (a hit) and the process's first Run (compiles).

    python -m benchmarks run device_layers [--quick] [--cases mipmap,dic --repeats 5 --table runs.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from _harness import record, start_run  # noqa: E402

CASES = ("mipmap", "maps", "dic")


# The method in full: ``--help`` prints it after the options.
DETAILS = """\
``napari_gridmip/_jobs/device_layers.py``: a widget's input layer is sent to the accelerator once and
kept there while it is unchanged; its target is a second Run at least 10x the host CPU's time for the same Run.

The jobs are those the widgets run (``napari_gridmip._jobs``), made from requests built as the widgets build them,
each input layer's data with a ``DeviceInput`` as the widget's ``LayerWatch`` makes it, and run as the runner runs
them (inside ``placed("auto")``, the layers' data NumPy at the end); no napari, no Qt. Per case:

- *cold*: the process's first Run of the case, on another array of the layer's shape and dtype (compiling, or
  reading the programs from the library's persistent compile cache as a napari session does, and sending that
  array); then the second Run's options on it, so that both Runs' programs are compiled before the timed ones (a
  new window or subset is a new program);
- *first Run*: options A on the layer, its copy dropped before (a miss: the layer's data sent to the device);
- *second Run*: options B (a new threshold, window or subset) on the same layer: a hit, nothing sent;

the first and second Run repeated ``--repeats`` times (the best of each kept). The same sequence then runs in a
child process with ``JAX_PLATFORMS=cpu``: the host CPU, where nothing is kept (as in napari on a machine without an
accelerator). The table gives both, the ratios host / device, the cache's outcomes from the runs' provenance
(``ran_on["device_inputs"]``) and how far the second Runs' outputs differ between the two.

Cases (options A -> B): ``mipmap``, the occupancy mipmap of a float32 volume (threshold 0.999 -> 0.9999);
``maps``, the correlation widget's stacks mode on a K=10 speckle pair (window 15 -> 13, hessian); ``dic``, its
single-pair mode on the 8-bit DIC sample as the layers hold it (uint8; window 11, subset 31 -> 29, step 4, refine).
"""


@dataclasses.dataclass
class Case:
    """One widget's two Runs on one layer (or pair): how to make the inputs, and the job for each options set."""

    name: str
    title: str
    inputs: Callable[[bool, int], dict[str, np.ndarray]]  # (quick, seed) -> {name: the layer's data}
    job: Callable[[dict[str, np.ndarray], dict[str, Any], str], Any]  # (layers, handles, options "A"/"B") -> Job
    roles: tuple[str, ...]  # the outputs compared between the device and the host


def _mipmap_inputs(quick: bool, seed: int) -> dict[str, np.ndarray]:
    n = 64 if quick else 512
    return {"volume": np.random.default_rng(seed).random((n, n, n), dtype=np.float32)}


def _mipmap_job(layers: dict, handles: dict, options: str) -> Any:
    from napari_gridmip._jobs.mipmap import MipmapRequest, make_mipmap_job
    from napari_gridmip._jobs.world import Frame

    threshold = {"A": 0.999, "B": 0.9999}[options]
    volume = layers["volume"]
    return make_mipmap_job(MipmapRequest("volume", volume, Frame.unit(3), threshold, device=handles["volume"]))


def _maps_inputs(quick: bool, seed: int) -> dict[str, np.ndarray]:
    from napari_gridmip._sample_data import make_speckle_pair

    n = 128 if quick else 1024
    sample, reference, _ = make_speckle_pair(frames=10, shape=(n, n), seed=seed)
    return {"img1": sample, "img2": reference}


def _pair_job(layers: dict, handles: dict, **options: Any) -> Any:
    from napari_gridmip._jobs.correlation import CorrelationRequest, make_correlation_job
    from napari_gridmip._jobs.world import Frame

    img1, img2 = layers["img1"], layers["img2"]
    request = CorrelationRequest(
        "img1", "img2", img1, img2, Frame.unit(img2.ndim), frame1=Frame.unit(img1.ndim),
        devices=(handles["img1"], handles["img2"]), **options,
    )  # fmt: skip
    return make_correlation_job(request)


def _maps_job(layers: dict, handles: dict, options: str) -> Any:
    window = {"A": (15, 15), "B": (13, 13)}[options]
    return _pair_job(layers, handles, window=window, subpixel="hessian")


def _dic_inputs(quick: bool, seed: int) -> dict[str, np.ndarray]:
    from napari_gridmip._sample_data.dic import make_dic_pair

    n = 256 if quick else 2048
    reference, deformed, _ = make_dic_pair((n, n), seed=seed)
    return {"img1": deformed, "img2": reference}  # DIC's convention: img1 the deformed image


def _dic_job(layers: dict, handles: dict, options: str) -> Any:
    subset = {"A": (31, 31), "B": (29, 29)}[options]
    return _pair_job(
        layers, handles, window=(11, 11), subset=subset, step=4, subpixel="refine", index="[None]"
    )  # the widget's single-pair mode on two images: one frame each


ALL = {
    "mipmap": Case("mipmap", "occupancy mipmap, float32 volume, threshold 0.999 -> 0.9999", _mipmap_inputs,
                   _mipmap_job, ("occupancy",)),
    "maps": Case("maps", "correlation stacks, K=10 speckle pair float32, window 15 -> 13", _maps_inputs, _maps_job,
                 ("dy", "dx")),
    "dic": Case("dic", "correlation single pair (DIC), uint8, window 11, subset 31 -> 29, step 4, refine",
                _dic_inputs, _dic_job, ("dy", "dx")),
}  # fmt: skip


def _size(case: str, quick: bool) -> str:
    sizes = {"mipmap": ("64^3", "512^3"), "maps": ("128^2", "1024^2"), "dic": ("256^2", "2048^2")}
    return sizes[case][0 if quick else 1]


# -- a process's runs (the device's, or the host CPU's in the child) --------------------------------------------------


def _run(job: Any) -> tuple[float, Any]:
    """Run ``job`` as the widgets' runner does; the seconds and its result."""
    from napari_gridmip._jobs import placed

    start = time.perf_counter()
    with placed("auto"):
        result = job.run(lambda done, total: None)
    return time.perf_counter() - start, result


def _outcomes(result: Any) -> str:
    """The cache's outcome for each input, from the run's provenance ("-" where nothing was consulted)."""
    from napari_gridmip._jobs.plan import KEY

    entries = result.layers[-1][1]["metadata"][KEY]["ran_on"].get("device_inputs") or []
    return ",".join(entry["cache"] for entry in entries) or "-"


def _outputs(result: Any, roles: tuple[str, ...]) -> dict[str, np.ndarray]:
    from napari_gridmip._jobs.plan import KEY

    by_role = {meta["metadata"][KEY]["role"]: data for data, meta, _ in result.layers}
    return {role: np.asarray(by_role[role]) for role in roles}


def measure(names: list[str], *, quick: bool, repeats: int, keep_on_cpu: bool, out: Path) -> dict[str, Any]:
    """Every case's cold, first and second Runs in this process; the second Runs' outputs saved beside ``out``."""
    import jax

    from napari_gridmip._jobs.device_layers import DeviceInput, device_cache

    cache = device_cache()
    cache.keep_on_cpu = keep_on_cpu
    device = jax.devices()[0]
    report: dict[str, Any] = {
        "device": f"{device.platform} ({device.device_kind})",
        "jax": jax.__version__,
        "keep_on_cpu": keep_on_cpu,
        "cases": {},
    }
    for name in names:
        case = ALL[name]
        warm, layers = case.inputs(quick, 1), case.inputs(quick, 0)

        def handles(arrays: dict[str, np.ndarray], key: str) -> dict[str, Any]:
            return {n: DeviceInput((key, n), 1, a, n) for n, a in arrays.items()}

        cold, result = _run(case.job(warm, handles(warm, f"{name} warm-up"), "A"))
        _run(case.job(warm, handles(warm, f"{name} warm-up"), "B"))
        cache.drop_layer(f"{name} warm-up")
        firsts, seconds, outcomes = [], [], []
        for _ in range(repeats):
            cache.drop_layer(name)  # each first Run a miss: the layer's data sent again
            for options, times in (("A", firsts), ("B", seconds)):
                keyed = {n: DeviceInput((name, n), 1, a, n) for n, a in layers.items()}
                seconds_taken, result = _run(case.job(layers, keyed, options))
                times.append(seconds_taken)
                outcomes.append(_outcomes(result))
        np.savez(out.with_suffix(f".{name}.npz"), **_outputs(result, case.roles))
        report["cases"][name] = {
            "cold": cold,
            "first": min(firsts),
            "second": min(seconds),
            "firsts": firsts,
            "seconds": seconds,
            "outcomes": outcomes[:2],
            "bytes": int(sum(a.nbytes for a in layers.values())),
        }
        cache.drop_layer(name)
        print(f"{report['device']} {name}: cold {cold:.3f} s, first {min(firsts):.3f} s, second {min(seconds):.3f} "
              f"s ({' / '.join(outcomes[:2])})", file=sys.stderr, flush=True)  # fmt: skip
    out.write_text(json.dumps(report, indent=1))
    return report


# -- the table ----------------------------------------------------------------------------------------------------


def difference(a: np.ndarray, b: np.ndarray) -> str:
    """How far two outputs differ: bools by the count of differing elements, floats by the largest difference (and
    the elements NaN in one only)."""
    if a.shape != b.shape:
        return f"shapes {a.shape} / {b.shape}"
    if a.dtype.kind in "biu":
        return f"{int(np.count_nonzero(a != b))} of {a.size} differ"
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    both = ~nan_a & ~nan_b
    gaps = np.abs(a[both] - b[both])
    largest = float(np.max(gaps)) if both.any() else 0.0
    # the largest alone reads like a general disagreement where a few ambiguous peaks flip: the 99.9th percentile
    typical = f", p99.9 {float(np.quantile(gaps, 0.999)):.2g}" if both.any() else ""
    apart = int(np.count_nonzero(nan_a != nan_b))
    return f"{largest:.2g}{typical}" + (f" ({apart} NaN apart)" if apart else "")


def table(device: dict[str, Any], host: dict[str, Any], quick: bool, folder: Path) -> str:
    lines = [
        f"Device: {device['device']}; host CPU: {host['device']} (JAX_PLATFORMS=cpu); JAX {device['jax']}; "
        f"{datetime.date.today()}{'; --quick' if quick else ''}"
        f"{'; copies kept on the CPU (--keep-on-cpu: a check, not a speed)' if device['keep_on_cpu'] else ''}.",
        "Best of the repeats, seconds; each Run the widget's job, NumPy in and out; compiling left out of the first "
        "and second Runs (cold: the first Run of the process).",
        "",
        "| case | size | layer data | device cold | device first Run | device second Run | host first Run | "
        "host second Run | second Run host / device | first Run host / device | cache (first, second) | "
        "outputs device vs host |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, d in device["cases"].items():
        h = host["cases"].get(name)
        if h is None:
            continue
        ours, theirs = np.load(folder / f"device.{name}.npz"), np.load(folder / f"host.{name}.npz")
        diffs = "; ".join(f"{role} {difference(ours[role], theirs[role])}" for role in ours.files)
        lines.append(
            f"| {name} | {_size(name, quick)} | {d['bytes'] / 2**20:.1f} MiB | {d['cold']:.3f} | {d['first']:.3f} | "
            f"**{d['second']:.4f}** | {h['first']:.3f} | {h['second']:.3f} | **{h['second'] / d['second']:.1f}x** | "
            f"{h['first'] / d['first']:.1f}x | {' / '.join(d['outcomes'])} | {diffs} |"
        )
    lines += ["", "Cases:"] + [f"- {name}: {ALL[name].title}" for name in device["cases"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a check of the script")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--repeats", type=int, default=3, help="first and second Runs per process (best kept)")
    parser.add_argument("--table", help="write the Markdown table here too")
    parser.add_argument("--workdir", help="where the records and outputs go (default: a temporary folder)")
    parser.add_argument(
        "--keep-on-cpu", action="store_true",
        help="keep the copies even where JAX's default device is the CPU: the hits checked on a machine without an "
        "accelerator (no speed-up to expect)",
    )  # fmt: skip
    parser.add_argument("--worker", choices=("device", "host"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="bench-device-layers-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.worker is not None:  # the host CPU's child
        measure(names, quick=args.quick, repeats=args.repeats, keep_on_cpu=False, out=folder / f"{args.worker}.json")
        return 0
    start_run("device_layers", args)
    device = measure(
        names, quick=args.quick, repeats=args.repeats, keep_on_cpu=args.keep_on_cpu, out=folder / "device.json"
    )
    command = [sys.executable, __file__, "--worker", "host", "--cases", ",".join(names), "--repeats",
               str(args.repeats), "--workdir", str(folder)] + (["--quick"] if args.quick else [])  # fmt: skip
    done = subprocess.run(command, env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=False)
    if done.returncode != 0:
        print(f"the host CPU's run failed ({done.returncode})", file=sys.stderr)
        return done.returncode
    host = json.loads((folder / "host.json").read_text())
    for name, d in device["cases"].items():  # the second Run is the timed case; the process's first Run, first_s
        for where, r in (("device", d), ("host", host["cases"].get(name))):
            if r is not None:
                record(f"{name}, {where}", first_s=r["cold"], times_s=r["seconds"], group=name,
                       reference=f"{name}, device", note="times: second Runs; first_s: the process's first Run",
                       first_runs_s=r["firsts"], cache=r["outcomes"], layer_bytes=r["bytes"])  # fmt: skip
    text = table(device, host, args.quick, folder)
    print(text)
    if args.table:
        Path(args.table).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
