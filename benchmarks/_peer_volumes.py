"""One DVC tool on one volume pair, in the process of whichever environment holds the tool: ours, spam or pyALDVC.

Run by ``bench_volumes.py`` as ``PYTHON benchmarks/_peer_volumes.py TOOL PAIR_DIR OUT.npz [options]``, so that
each peer lives in its own virtual environment (pyALDVC brings PySide6, spam its own NumPy and SciPy) and every
tool is measured alike: the pair read from ``PAIR_DIR/reference.npy`` and ``deformed.npy`` (uint8), the points
from ``PAIR_DIR/points.npy`` (``(N, 3)`` z, y, x voxels, our grid), the call timed first (compiles, pools and
caches included) and then warm, and the process's resident-memory high-water mark (``getrusage``: this
process's, and its children's for spam's worker pool) written with the displacements.

TOOL: ``ours`` (``napari_gridmip.correlate_volumes``, affine warp), ``spam`` (``spam.DIC.ldic``: the local
Gauss-Newton of each subset from a zero start, or from ``spam.DIC.registerMultiscale``'s whole-volume map with
``--guess register``; ``spam-cubic``: its cubic interpolation, about ten times slower than its default linear
one), ``aldvc-local`` (pyALDVC's ``run_aldvc``, ``admm_max_iter=1``: its local IC-GN) and
``aldvc`` (its default augmented Lagrangian, 4 ADMM steps).

The file written holds ``displacement`` ``(N, 3)`` (dz, dy, dx; NaN where the tool gives nothing),
``valid`` ``(N,)`` (the tool's own verdict), ``points`` (where each row was measured), ``first_s``,
``times_s``, ``maxrss_mb``, ``children_maxrss_mb`` and ``version``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np


def ours(reference: np.ndarray, deformed: np.ndarray, points: np.ndarray, args: argparse.Namespace):
    from napari_gridmip import correlate_volumes

    def call():
        import jax

        result = correlate_volumes(reference, deformed, subset=args.subset, step=args.step, search=args.search)
        return jax.block_until_ready(result)

    def read(result):
        grid = np.stack(np.meshgrid(result.z, result.y, result.x, indexing="ij"), -1).reshape(-1, 3)
        if grid.shape != points.shape or not np.array_equal(grid, points):
            raise SystemExit("ours: the grid differs from the points given")
        shift = np.stack([result.dz, result.dy, result.dx], -1).reshape(-1, 3)
        return shift.astype(np.float64), result.status.ravel() == 0, grid

    return call, read, metadata.version("napari-gridmip")


def spam(reference: np.ndarray, deformed: np.ndarray, points: np.ndarray, args: argparse.Namespace):
    import importlib.resources  # noqa: F401 - spam.datasets uses it without importing it

    import spam.DIC

    half = np.full(3, args.subset // 2)  # its half-window per axis
    im1, im2 = reference.astype(np.float32), deformed.astype(np.float32)
    nodes = points.astype(int)

    def call():
        guess = None
        if args.guess == "register":  # spam's own pipeline: a whole-volume registration, then its local DIC
            whole = spam.DIC.registerMultiscale(im1, im2, 4, verbose=False)
            centre = (np.asarray(im1.shape, np.float64) - 1) / 2  # spam's Phi turns about the volume's centre
            guess = spam.DIC.applyRegistrationToPoints(whole["Phi"], centre, nodes, nProcesses=args.threads)
        with open(os.devnull, "w") as quiet:  # its progress bar and summary table
            saved = sys.stdout
            sys.stdout = quiet
            try:
                return spam.DIC.ldic(im1, im2, nodes, half, processes=args.threads, PhiField=guess,
                                     interpolationOrder=args.order, maxIterations=50, deltaPhiMin=1e-3)  # fmt: skip
            finally:
                sys.stdout = saved

    def read(result):
        phi, status = result[0], result[1]
        shift = np.array(phi[:, :3, 3], np.float64)
        valid = status == 2  # converged (spam's own filter for a trusted point)
        shift[~np.isfinite(shift).all(1)] = np.nan
        return shift, valid, points

    return call, read, metadata.version("spam")


def aldvc(reference: np.ndarray, deformed: np.ndarray, points: np.ndarray, args: argparse.Namespace, admm: int):
    import al_dvc

    # pyALDVC places its nodes (winsize // 2 + 5 voxels from the border at least) centred in its volume of
    # interest: a VOI from 10 voxels in puts them on our grid from its second point, up to the last point of ours
    # it can reach
    size = reference.shape
    axes = [np.unique(points[:, k]) for k in range(3)]  # z, y, x
    voi = {}
    for name, axis, n in zip("zyx", axes, size):
        last = axis[axis <= n - 1 - 5 - args.winsize // 2].max()
        voi[name] = (int(axis[1] - args.winsize // 2), int(last + args.winsize // 2))
    para = al_dvc.dvcpara_default(winsize=args.winsize, winstepsize=args.step, admm_max_iter=admm,
                                  n_threads=args.threads, voi=voi, verbose=False)  # fmt: skip

    def call():
        return al_dvc.run_aldvc(para, [reference, deformed], compute_strain=False, progress_fn=lambda f, m: None)

    def read(result):
        mesh, frame = result.dvc_mesh, result.result_disp[0]
        z, y, x = np.meshgrid(mesh.z0, mesh.y0, mesh.x0, indexing="ij")  # its nodes' order: x fastest
        nodes = np.stack([z.ravel(), y.ravel(), x.ravel()], 1)
        shift = np.asarray(frame.U, np.float64)[:, ::-1]  # (ux, uy, uz) -> (dz, dy, dx)
        return shift, np.isfinite(shift).all(1), nodes

    return call, read, metadata.version("al-dvc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tool", choices=["ours", "spam", "spam-cubic", "aldvc-local", "aldvc"])
    parser.add_argument("pair", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--subset", type=int, default=21)
    parser.add_argument("--step", type=int, default=10)
    parser.add_argument("--search", type=int, default=4, help="ours: the coarse search's reach")
    parser.add_argument("--winsize", type=int, default=20, help="pyALDVC: its (even) subset side")
    parser.add_argument("--order", type=int, default=1, help="spam: its interpolation order (its default 1)")
    parser.add_argument("--guess", choices=["zero", "register"], default="zero", help="spam: its start")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="warm calls after the first")
    parser.add_argument("--slabs", action="store_true", help="ours: Dask volumes over the memory-mapped files "
                        "(its slab path, never the whole volume in memory)")  # fmt: skip
    args = parser.parse_args()
    if args.slabs:
        import dask.array as da

        reference, deformed = (da.from_array(np.load(args.pair / name, mmap_mode="r"), chunks=(32, -1, -1))
                               for name in ("reference.npy", "deformed.npy"))  # fmt: skip
    else:
        reference = np.load(args.pair / "reference.npy")
        deformed = np.load(args.pair / "deformed.npy")
    points = np.load(args.pair / "points.npy")
    if args.tool == "ours":
        call, read, version = ours(reference, deformed, points, args)
    elif args.tool in ("spam", "spam-cubic"):
        args.order = 3 if args.tool == "spam-cubic" else args.order
        call, read, version = spam(reference, deformed, points, args)
    else:
        call, read, version = aldvc(reference, deformed, points, args, 1 if args.tool == "aldvc-local" else 4)
    start = time.perf_counter()
    result = call()
    first = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        del result
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    shift, valid, where = read(result)
    kib = 1024.0  # ru_maxrss is in KiB on Linux
    np.savez(
        args.out,
        displacement=shift,
        valid=valid,
        points=np.asarray(where, np.float64),
        first_s=first,
        times_s=np.asarray(times),
        maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / kib,
        children_maxrss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / kib,
        version=version,
    )


if __name__ == "__main__":
    main()
