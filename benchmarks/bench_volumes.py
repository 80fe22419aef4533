"""Digital volume correlation: correlate_volumes on a micro-CT-like pair under a known affine map.

python -m benchmarks run volumes [--quick] [--repeats 3] [--size 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _harness import PeakMemory, block, machine, note, record, start_run, table

DETAILS = """\
A 200^3 volume (``--quick``: 96^3) of smoothed random blobs quantised to uint8
(``napari_gridmip._sample_data.dvc.make_dvc_pair``), and the same texture carried
by x -> A (x - c) + c + t: 1% normal strain along z (-0.5% along y, 0.5% along x),
0.4% engineering shear, t = (0.4, -0.3, 0.25) voxel; 1% Gaussian noise added to
each volume before quantising. correlate_volumes with subset 21, step 10 and its
defaults (search 4 voxels, affine warp, no Gaussian prefilter, float32).

Rows: the first call in this process (compiles included) apart from the warm
calls (best and median of ``--repeats``), and the peak extra memory of one warm
call. Info: the RMS of the displacement error over the points found (voxels, the
3D vector's length), the share of points found, the statuses, the mean IC-GN
steps, and the wall time of each stage in one warm call.

Peers (when ``al_dvc`` imports): pyALDVC's ``run_aldvc`` on the same pair,
winsize 20, winstepsize 10 (its subsets are even-sided), 2 threads, no strain:
``admm_max_iter=1`` (the local IC-GN only) and its default 4 (the global
augmented-Lagrangian steps too); each timed first and warm, its RMS over its
nodes against the same field.
"""


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
        start = time.perf_counter()
        volumes.correlate_volumes(reference, deformed, **options)
        spent["total"] = time.perf_counter() - start
    finally:
        for (module, name), original in saved.items():
            setattr(module, name, original)
    return {name: round(seconds, 3) for name, seconds in spent.items()}


def peers(reference: np.ndarray, deformed: np.ndarray, truth: dict, *, repeats: int) -> list:
    """pyALDVC's local IC-GN and its augmented-Lagrangian method on the pair, where ``al_dvc`` imports."""
    try:
        import al_dvc
    except ImportError:
        note("peers", "al_dvc is not installed (pip install al-dvc)")
        return []
    from napari_gridmip._sample_data.dvc import true_displacement

    rows = []
    for label, admm in (("pyALDVC local IC-GN", 1), ("pyALDVC AL (ADMM)", 4)):
        para = al_dvc.dvcpara_default(winsize=20, winstepsize=10, admm_max_iter=admm, n_threads=2)

        def run(para=para):
            return al_dvc.run_aldvc(para, [reference, deformed], compute_strain=False, progress_fn=lambda f, m: None)

        start = time.perf_counter()
        result = run()
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = run()
            times.append(time.perf_counter() - start)
        with PeakMemory() as memory:
            result = run()
        mesh, frame = result.dvc_mesh, result.result_disp[0]
        x0, y0, z0 = mesh.x0, mesh.y0, mesh.z0
        field = true_displacement(truth, z0, y0, x0)  # (3, nz, ny, nx), the nodes' order: x fastest
        expected = np.moveaxis(field, 0, -1).reshape(-1, 3)[:, ::-1]  # (N, 3) as (ux, uy, uz)
        found = np.all(np.isfinite(frame.U), 1)
        errors = np.linalg.norm(frame.U - expected, axis=1)
        rms = float(np.sqrt(np.mean(errors[found] ** 2)))
        rows.append(record(label, times_s=times, first_s=first, peak_mb=memory.extra_mb, rms_voxel=rms,
                           valid=float(found.mean()), note=f"winsize 20, step 10, admm_max_iter={admm}"))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="96^3")
    parser.add_argument("--size", type=int, default=200, help="the volumes' side (default 200)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="leave pyALDVC out")
    args = parser.parse_args()
    start_run("volumes", args)
    size = 96 if args.quick else args.size
    print(machine())

    from napari_gridmip import correlate_volumes
    from napari_gridmip._sample_data.dvc import make_dvc_pair, true_displacement

    reference, deformed, truth = make_dvc_pair((size,) * 3, dtype=np.uint8, seed=0)
    options = dict(subset=21, step=10)

    def ours():
        return correlate_volumes(reference, deformed, **options)

    start = time.perf_counter()
    result = block(ours())
    first = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = block(ours())
        times.append(time.perf_counter() - start)
    with PeakMemory() as memory:
        result = block(ours())
    truth_field = true_displacement(truth, result.z, result.y, result.x)
    errors = np.sqrt(np.sum((np.stack([result.dz, result.dy, result.dx]) - truth_field) ** 2, 0))
    ok = result.status == 0
    rms = float(np.sqrt(np.mean(errors[ok] ** 2)))
    row = record(f"correlate_volumes {size}^3", times_s=times, first_s=first, peak_mb=memory.extra_mb,
                 rms_voxel=rms, valid=float(ok.mean()))  # fmt: skip
    rows = [row]
    if not args.no_peers:
        rows += peers(reference, deformed, truth, repeats=args.repeats)
    print(table(f"DVC of a {size}^3 affine pair, subset 21, step 10", rows, row.name))
    for r in rows:
        print(f"{r.name}: RMS {r.extra['rms_voxel']:.4f} voxel, {100 * r.extra['valid']:.1f}% of points")
    note("rms_voxel", rms)
    note("valid_share", float(ok.mean()))
    note("points", int(ok.size))
    note("statuses", np.bincount(result.status.ravel(), minlength=6).tolist())
    note("mean_steps", float(result.iterations[ok].mean()))
    note("stages_s", stages(reference, deformed, options))
    print(f"RMS {rms:.4f} voxel over {ok.sum()} of {ok.size} points ({100 * ok.mean():.1f}% found); "
          f"mean IC-GN steps {result.iterations[ok].mean():.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
