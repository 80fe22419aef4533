"""Digital volume correlation: correlate_volumes against spam and pyALDVC on a real CT texture under known fields.

python -m benchmarks run volumes [--quick] [--only ours|peers] [--sizes 100,200,256,512]
    [--cases affine,sines,rotation] [--peers spam,aldvc-local,aldvc] [--texture snow|synthetic|FILE]
    [--spam-python PY] [--aldvc-python PY] [--peer-budget 600] [--repeats 1] [--stages]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _harness import note, record, start_run, table
from scipy import ndimage

HERE = Path(__file__).resolve().parent
HELPER = HERE / "_peer_volumes.py"
SUBSET, STEP = 21, 10
PEERS = {  # tool -> (row name, the environment variable naming its interpreter, the module it needs)
    "spam": ("spam ldic", "NAPARI_GRIDMIP_SPAM_PYTHON", "spam"),
    "spam-cubic": ("spam ldic, cubic", "NAPARI_GRIDMIP_SPAM_PYTHON", "spam"),
    "aldvc-local": ("pyALDVC local IC-GN", "NAPARI_GRIDMIP_ALDVC_PYTHON", "al_dvc"),
    "aldvc": ("pyALDVC AL (ADMM)", "NAPARI_GRIDMIP_ALDVC_PYTHON", "al_dvc"),
}
OURS = "correlate_volumes"
CASES = ("affine", "sines", "rotation")
# The smooth non-uniform field: per component, three plane sines of these amplitudes (voxels) and wavelengths
# (voxels) along fixed directions, plus the translation; the sum of 2 pi a / wavelength bounds every gradient
# component below 2%.
SINE_AMPLITUDES = (0.5, 0.35, 0.25)
SINE_WAVELENGTHS = (420.0, 360.0, 300.0)
TRANSLATION = (0.4, -0.3, 0.25)

DETAILS = f"""\
Texture: a real micro-CT, spam's 100^3 x-ray tomography of snow (``spam/data/snow/snow.tif``, found through the
spam environment; ``--texture FILE`` for any other .npy/.tif volume), scaled to [0, 1] between its 0.1 and 99.9
percentiles and mirrored to the size asked (so 200^3 and up repeat it, mirrored); ``--texture synthetic``: the
smoothed random blobs of ``napari_gridmip._sample_data.dvc`` (the figures before the real texture).

Cases, each deformed volume sampling a fifth-order spline of the texture (not the matchers' own interpolation)
at the inverse map, then 1% Gaussian noise on each volume and uint8 quantisation (as ``make_dvc_pair``):
  affine   x -> A (x - c) + c + t: 1% normal strain along z (-0.5% y, 0.5% x), 0.4% engineering shear,
           t = {TRANSLATION} voxel (make_dvc_pair's map);
  sines    x -> x + t + sum of three plane sines per component, amplitudes {SINE_AMPLITUDES} voxel, wavelengths
           {SINE_WAVELENGTHS} voxels (displacement gradients up to 1.2%, displacements up to 1.8 voxels);
  rotation a rigid 10 degree rotation about z and t (ours only: the coarse search reaches ``--rotation-search``
           voxels, default 12; 0: as far as the rotation carries a corner point, 15 voxels at 100^3 (seconds),
           27 at 200^3 (over 5 minutes: the binned ZNCC over every shift); the peers are not run on it).

Tools, each in a child process of its own environment (``_peer_volumes.py``), fed the same .npy pair and our grid
(subset 21, step 10, the first point 10 voxels in): ours (``correlate_volumes``, affine warp, its defaults; from
``--slab-size`` up, default 512^3, Dask volumes over the memory-mapped files: its slab path);
spam's ``spam.DIC.ldic`` (subset 21 = half-window 10, its default trilinear interpolation, zero start, 2
processes; ``--spam-guess register``: from its whole-volume ``registerMultiscale``, timed too; ``spam-cubic``: its
cubic interpolation, about ten times slower); pyALDVC's
``run_aldvc`` (winsize 20: its subsets are even-sided; step 10, 2 threads; its nodes are our grid's from its
second point, up to the last it reaches 15 voxels from the border), ``admm_max_iter=1`` (local IC-GN) and its
default 4 (augmented Lagrangian).

Per tool and case: the first call (compiles, pools) and the warm call(s) timed inside the child; the RMS and the
99th percentile of the displacement error (voxels, the 3D vector's length) over the points the tool keeps; the
share kept of all its points and of its interior points (the subset carried by the true field stays a voxel
inside the volume); the finite values off by more than 0.1 voxel (whatever the tool's verdict: a value it gives
as a number); the child's resident-memory high-water mark (spam: also its workers'). The load average before
each child is beside its figures. A peer whose time predicted from its last size (by its points) exceeds
``--peer-budget`` seconds is skipped, with that prediction as the reason.
"""


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def peer_python(tool: str, given: str | None) -> str | None:
    """The interpreter that runs ``tool``: the option, else its environment variable, else this one where the
    module imports here; None where there is none."""
    _, variable, module = PEERS[tool]
    python = given or os.environ.get(variable)
    if python:
        return python
    return sys.executable if importlib.util.find_spec(module) else None


def real_texture(choice: str, spam_python: str | None) -> tuple[np.ndarray | None, str]:
    """The texture volume in [0, 1] and what it is; ``None`` for the synthetic texture."""
    if choice == "synthetic":
        return None, "synthetic blobs (napari_gridmip._sample_data.dvc.micro_ct_texture)"
    if choice == "snow":
        if not spam_python:
            return None, "synthetic blobs: spam's snow CT needs the spam environment (--spam-python)"
        found = subprocess.run([spam_python, "-c", "import os, spam; print(os.path.dirname(spam.__file__))"],
                               capture_output=True, text=True)  # fmt: skip
        path = Path(found.stdout.strip()) / "data" / "snow" / "snow.tif"
        if found.returncode or not path.is_file():
            return None, f"synthetic blobs: spam's snow CT not found ({path})"
        what = "spam's snow x-ray micro-CT (100^3, uint16), mirrored"
    else:
        path, what = Path(choice), f"{choice}, mirrored"
    if path.suffix == ".npy":
        volume = np.load(path)
    else:
        import tifffile

        volume = tifffile.imread(path)
    volume = volume.astype(np.float32)
    low, high = np.percentile(volume, [0.1, 99.9])
    return np.clip((volume - low) / (high - low), 0, 1), what


def texture_of(source: np.ndarray | None, size: int) -> np.ndarray:
    if source is None:
        from napari_gridmip._sample_data.dvc import micro_ct_texture

        return micro_ct_texture((size,) * 3, seed=0)
    pad = [(0, max(0, size - n)) for n in source.shape]
    return np.pad(source, pad, mode="symmetric")[:size, :size, :size].copy()


def sine_field(points: np.ndarray) -> np.ndarray:
    """The non-uniform field's displacement ``(N, 3)`` at reference points ``(N, 3)`` (z, y, x voxels)."""
    rng = np.random.default_rng(7)
    directions = rng.standard_normal((3, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    phases = rng.uniform(0, 2 * np.pi, (3, 3))  # (component, term)
    out = np.tile(np.asarray(TRANSLATION, np.float64), (len(points), 1))
    for term, (amplitude, wavelength) in enumerate(zip(SINE_AMPLITUDES, SINE_WAVELENGTHS)):
        along = points @ directions[term] * (2 * np.pi / wavelength)
        out += amplitude * np.sin(along[:, None] + phases[:, term])
    return out


def field_of(case: str, size: int):
    """The true displacement of ``case`` as a function of reference points ``(N, 3)``, and its affine map (or
    None)."""
    if case == "sines":
        return sine_field, None
    from napari_gridmip._sample_data.dvc import affine_map

    matrix = affine_map(0.01, 0.004, 0.0) if case == "affine" else affine_map(0.0, 0.0, 10.0)
    centre = np.full(3, (size - 1) / 2)
    shift = np.asarray(TRANSLATION, np.float64)

    def field(points: np.ndarray) -> np.ndarray:
        return (points - centre) @ (matrix - np.eye(3)).T + shift

    return field, (matrix, centre, shift)


def deform(texture: np.ndarray, case: str) -> np.ndarray:
    """The deformed texture: at Y, the texture's value at X where X + u(X) = Y (order-5 spline, mirrored)."""
    size = texture.shape[0]
    field, affine = field_of(case, size)
    if affine is not None:
        matrix, centre, shift = affine
        inverse = np.linalg.inv(matrix)
        offset = centre - inverse @ (centre + shift)
        return ndimage.affine_transform(texture, inverse, offset=offset, order=5, mode="mirror", output=np.float32)
    coefficients = ndimage.spline_filter(texture, order=5, mode="mirror", output=np.float32)
    out = np.empty_like(texture)
    for z0 in range(0, size, 16):  # slabs: the coordinates of the whole volume would be 24 bytes a voxel
        grid = np.stack(np.meshgrid(np.arange(z0, min(z0 + 16, size)), np.arange(size), np.arange(size),
                                    indexing="ij"), -1).reshape(-1, 3).astype(np.float64)  # fmt: skip
        source = grid.copy()
        for _ in range(5):  # X = Y - u(X): a contraction (gradients under 2%), below 1e-8 voxel after 5 rounds
            source = grid - field(source)
        values = ndimage.map_coordinates(coefficients, source.T, order=5, mode="mirror", prefilter=False)
        out[z0 : z0 + 16] = values.reshape(-1, size, size)
    return out


def quantise(volume: np.ndarray, rng: np.random.Generator, noise: float = 0.01) -> np.ndarray:
    """1% Gaussian noise and uint8 quantisation, as ``make_dvc_pair``."""
    volume = volume + noise * rng.standard_normal(volume.shape).astype(np.float32)
    return np.clip(np.rint(255 * (0.1 + 0.8 * volume)), 0, 255).astype(np.uint8)


def our_grid(size: int) -> np.ndarray:
    axis = np.arange(SUBSET // 2, size - SUBSET // 2, STEP, dtype=np.float64)
    return np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), -1).reshape(-1, 3)


def make_pair(folder: Path, texture: np.ndarray | None, texture_name: str, case: str, size: int) -> Path:
    """The pair's folder (reference.npy, deformed.npy, points.npy), made once per texture, case and size."""
    key = hashlib.sha1(f"{texture_name}|{case}|{size}|{SINE_AMPLITUDES}|{SINE_WAVELENGTHS}|v1".encode()).hexdigest()
    pair = folder / f"{case}-{size}-{key[:10]}"
    if (pair / "points.npy").is_file():
        return pair
    pair.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    volume = texture_of(texture, size)
    deformed = deform(volume, case)
    rng = np.random.default_rng(1)
    np.save(pair / "reference.npy", quantise(volume, rng))
    np.save(pair / "deformed.npy", quantise(deformed, rng))
    np.save(pair / "points.npy", our_grid(size))
    print(f"  made the {case} {size}^3 pair in {time.perf_counter() - start:.0f} s", flush=True)
    return pair


def pair_size(pair: Path) -> int:
    return int(pair.name.split("-")[1])


def interior(points: np.ndarray, case: str, size: int) -> np.ndarray:
    """Points whose subset, carried by the true field (its eight corners), stays a voxel inside the volume."""
    field, _ = field_of(case, size)
    inside = np.ones(len(points), bool)
    for corner in np.stack(np.meshgrid(*[[-1, 1]] * 3, indexing="ij"), -1).reshape(-1, 3):
        at = points + corner * (SUBSET // 2)
        moved = at + field(at)
        inside &= np.all((moved >= 1) & (moved <= size - 2), 1)
    return inside


def run_tool(tool: str, python: str, pair: Path, args: argparse.Namespace, search: int) -> dict:
    """One tool in its child process; its file's figures, or the reason there are none."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out.npz"
        command = [python, str(HELPER), tool, str(pair), str(out), "--subset", str(SUBSET), "--step", str(STEP),
                   "--search", str(search), "--threads", str(args.threads), "--repeats", str(args.repeats),
                   "--guess", args.spam_guess]  # fmt: skip
        if tool == "ours" and pair_size(pair) >= args.slab_size:
            command.append("--slabs")
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)} if tool == "ours" else dict(os.environ)
        load = load_average()
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"over --timeout {args.timeout} s", "load": load}
        wall = time.perf_counter() - start
        if done.returncode or not out.is_file():
            return {"error": (done.stderr or done.stdout)[-600:], "load": load}
        with np.load(out) as f:
            figures = {k: f[k] for k in f.files}
    figures.update(load=load, wall_s=wall)
    return figures


def scores(figures: dict, case: str, size: int, ours: dict | None = None) -> dict:
    """Error against the truth at the tool's own points; with ``ours`` (point -> our error where we kept it), also
    our RMS at the points both kept (``ours_rms_here``: the peers' nodes are not all of ours)."""
    points, shift, valid = figures["points"], figures["displacement"], figures["valid"].astype(bool)
    field, _ = field_of(case, size)
    errors = np.linalg.norm(shift - field(points), axis=1)
    finite = np.isfinite(errors)
    kept = valid & finite
    inner = interior(points, case, size)
    both = {}
    if ours is not None:
        keys = [tuple(p) for p in np.rint(points).astype(int).tolist()]
        pairs = [(errors[i], ours[k]) for i, k in enumerate(keys) if kept[i] and k in ours]
        if pairs:
            theirs, mine = np.asarray(pairs).T
            both = {"both_kept": len(pairs), "rms_here_voxel": float(np.sqrt(np.mean(theirs**2))),
                    "ours_rms_here_voxel": float(np.sqrt(np.mean(mine**2)))}  # fmt: skip
    return {
        **both,
        "points": len(points),
        "rms_voxel": float(np.sqrt(np.mean(errors[kept] ** 2))) if kept.any() else float("nan"),
        "p99_voxel": float(np.percentile(errors[kept], 99)) if kept.any() else float("nan"),
        "valid": float(kept.mean()),
        "interior_points": int(inner.sum()),
        "interior_valid": float(kept[inner].mean()) if inner.any() else float("nan"),
        "finite_off_0.1": int(np.sum(finite & (errors > 0.1))),
        "finite": int(finite.sum()),
    }


def stages(reference: np.ndarray, deformed: np.ndarray, options: dict) -> dict[str, float]:
    """The wall time of each stage of one warm call, by timing the kernels the pipeline calls (each waited for)."""
    import jax

    from napari_gridmip.core.correlation import _volume_icgn as kernels
    from napari_gridmip.core.correlation import volumes

    spent: dict[str, float] = {}
    saved = {}
    for module, names in ((kernels, ("prepared_volumes", "prepare", "step")), (volumes, ("_coarse_search",
                          "whole_translation"))):  # fmt: skip
        for name in names:
            original = getattr(module, name)
            saved[module, name] = original

            def timed(*args, _original=original, _name=name, **kwargs):
                start = time.perf_counter()
                out = jax.block_until_ready(_original(*args, **kwargs))
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - start
                return out

            setattr(module, name, timed)
    try:
        volumes.correlate_volumes(reference, deformed, **options)  # compiles
        start = time.perf_counter()
        spent.clear()
        volumes.correlate_volumes(reference, deformed, **options)
        spent["total"] = time.perf_counter() - start
    finally:
        for (module, name), original in saved.items():
            setattr(module, name, original)
    return {name: round(seconds, 3) for name, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="96^3, the affine case")
    parser.add_argument("--sizes", default="100,200,256", help="the volumes' sides, comma-separated")
    parser.add_argument("--size", type=int, help="one side (as --sizes N)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {','.join(CASES)}")
    parser.add_argument("--only", choices=["ours", "peers"], help="ours alone, or ours beside the peers (default)")
    parser.add_argument(
        "--peers", default="spam,aldvc-local,aldvc", help=f"of {','.join(PEERS)} (default: all but spam-cubic)"
    )
    parser.add_argument("--texture", default="snow", help="snow (spam's real CT), synthetic, or a .npy/.tif file")
    parser.add_argument("--spam-python", help="the interpreter of spam's environment ($NAPARI_GRIDMIP_SPAM_PYTHON)")
    parser.add_argument("--aldvc-python", help="pyALDVC's interpreter ($NAPARI_GRIDMIP_ALDVC_PYTHON)")
    parser.add_argument("--spam-guess", choices=["zero", "register"], default="zero")
    parser.add_argument("--rotation-search", type=int, default=12,
                        help="ours' search on the rotation case (0: as far as it carries a point)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2, help="the peers' processes or threads")
    parser.add_argument("--repeats", type=int, default=1, help="warm calls after the first (in each child)")
    parser.add_argument("--peer-budget", type=float, default=600.0,
                        help="skip a peer whose predicted first + warm time exceeds this (s)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800.0, help="a child's limit (s)")
    parser.add_argument("--cache", type=Path, help="where the pairs are kept (default: RESULTS/volume-pairs)")
    parser.add_argument("--slab-size", type=int, default=512,
                        help="from this side up ours reads Dask volumes (memory-mapped): its slab path")  # fmt: skip
    parser.add_argument("--stages", action="store_true", help="ours' stage times on the first pair, in this process")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.cases = "96", "affine"
    sizes = [args.size] if args.size else [int(s) for s in args.sizes.split(",") if s.strip()]
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    chosen = [] if args.only == "ours" else [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [c for c in cases if c not in CASES] + [p for p in chosen if p not in PEERS]
    if unknown:
        raise SystemExit(f"unknown case or peer {unknown}: cases {CASES}, peers {tuple(PEERS)}")
    start_run("volumes", args)
    pythons = {"spam": peer_python("spam", args.spam_python), "aldvc": peer_python("aldvc", args.aldvc_python)}
    pythons["aldvc-local"], pythons["spam-cubic"] = pythons["aldvc"], pythons["spam"]
    texture, texture_name = real_texture(args.texture, pythons["spam"])
    note("texture", texture_name)
    print(f"texture: {texture_name}; load average {load_average():.2f} on {os.cpu_count()} cores", flush=True)
    from _harness import DEFAULT_RESULTS, RESULTS_ENV

    cache = args.cache or Path(os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS) / "volume-pairs"
    history: dict[str, tuple[int, float]] = {}  # tool -> (points, first + warm seconds) at its last size
    summary = []
    for size in sizes:
        for case in cases:
            pair = make_pair(cache, texture, texture_name, case, size)
            search = 4
            if case == "rotation":  # the rotation carries the far corners by r * 10 degrees
                search = args.rotation_search or int(np.ceil(size / 2 * np.sqrt(2) * np.deg2rad(10))) + 2
            tools = [("ours", sys.executable)] + [(p, pythons[p]) for p in chosen if case != "rotation"]
            rows, mine = [], None
            for tool, python in tools:
                name = OURS if tool == "ours" else PEERS[tool][0]
                if python is None:
                    note(
                        f"{name} {case} {size}", f"not installed ({PEERS[tool][2]}: see --{tool.split('-')[0]}-python)"
                    )
                    continue
                points = len(our_grid(size))
                if tool != "ours" and tool in history:
                    before, seconds = history[tool]
                    predicted = seconds * points / before
                    if predicted > args.peer_budget:
                        reason = f"skipped: {predicted:.0f} s predicted from {seconds:.0f} s at {before} points"
                        summary.append({"tool": name, "case": case, "size": size, "skipped": reason})
                        print(f"  {name} {case} {size}^3 {reason}", flush=True)
                        continue
                figures = run_tool(tool, python, pair, args, search)
                if "error" in figures:
                    summary.append({"tool": name, "case": case, "size": size, "error": figures["error"]})
                    print(f"  {name} {case} {size}^3 failed: {figures['error']}", flush=True)
                    continue
                times = [float(t) for t in np.atleast_1d(figures["times_s"])]
                first = float(figures["first_s"])
                history[tool] = (points, first + (min(times) if times else 0.0))
                score = scores(figures, case, size, None if tool == "ours" else mine)
                if tool == "ours":  # our error at each point we kept, for the peers' points
                    field, _ = field_of(case, size)
                    error = np.linalg.norm(figures["displacement"] - field(figures["points"]), axis=1)
                    where = np.rint(figures["points"]).astype(int).tolist()
                    mine = {tuple(p): e for p, e, k in zip(where, error, figures["valid"]) if k and np.isfinite(e)}
                rss = float(figures["maxrss_mb"])
                workers = float(figures["children_maxrss_mb"])
                row = record(name, times_s=times, first_s=first, peak_mb=rss, group=f"{case} {size}^3",
                             note=f"load {figures['load']:.1f}", load=figures["load"], workers_rss_mb=workers,
                             version=str(figures["version"]), search=search if tool == "ours" else None,
                             slabs=tool == "ours" and size >= args.slab_size,
                             **score)  # fmt: skip
                rows.append(row)
                summary.append({"tool": name, "case": case, "size": size, "first_s": first,
                                "warm_s": row.best_s, "rss_mb": rss, "workers_rss_mb": workers,
                                "load": figures["load"], **score})  # fmt: skip
                print(f"  {name:22s} {case} {size}^3: warm {row.best_s:7.2f} s first {first:7.2f} s "
                      f"RMS {score['rms_voxel']:.4f} p99 {score['p99_voxel']:.4f} kept {100 * score['valid']:.1f}% "
                      f"(interior {100 * score['interior_valid']:.1f}% of {score['interior_points']}) "
                      f">0.1: {score['finite_off_0.1']} RSS {rss:.0f} MiB (workers {workers:.0f}) "
                      f"load {figures['load']:.1f}", flush=True)  # fmt: skip
                if "ours_rms_here_voxel" in score:
                    print(f"  {'':22s} at the {score['both_kept']} points both kept: RMS {score['rms_here_voxel']:.4f}"
                          f", ours {score['ours_rms_here_voxel']:.4f}", flush=True)  # fmt: skip
            if rows and any(r.name == OURS for r in rows):
                print(table(f"DVC, {case} {size}^3, subset 21, step 10", rows, OURS), flush=True)
            if args.stages and case == cases[0] and size == sizes[0]:
                reference, deformed = np.load(pair / "reference.npy"), np.load(pair / "deformed.npy")
                note("stages_s", stages(reference, deformed, dict(subset=SUBSET, step=STEP)))
    note("summary", summary)
    print(markdown(summary), flush=True)
    note("table", markdown(summary))


def markdown(summary: list[dict]) -> str:
    lines = ["| case | size | tool | warm s | first s | RMS voxel | p99 voxel | kept | interior kept | finite > 0.1 "
             "| RSS MiB | load |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for s in summary:
        head = f"| {s['case']} | {s['size']}^3 | {s['tool']} "
        if "warm_s" not in s:
            lines.append(head + f"| {s.get('skipped') or 'failed'} |" + " |" * 8)
            continue
        workers = f" (+{s['workers_rss_mb']:.0f})" if s["workers_rss_mb"] > 1 else ""
        here = f" (ours {s['ours_rms_here_voxel']:.4f})" if "ours_rms_here_voxel" in s else ""
        lines.append(head + f"| {s['warm_s']:.2f} | {s['first_s']:.2f} | {s['rms_voxel']:.4f}{here} "
                     f"| {s['p99_voxel']:.4f} "
                     f"| {100 * s['valid']:.1f}% | {100 * s['interior_valid']:.1f}% | {s['finite_off_0.1']} "
                     f"| {s['rss_mb']:.0f}{workers} | {s['load']:.1f} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
