"""``napari-gridmip correlate-volumes REF DEF OUT.ome.zarr``: digital volume correlation of two volumes by the widget's
plan (:func:`napari_gridmip._jobs.volumes.volume_plan`): the displacement, its quality and its strain on the grid's
points as the channels of one OME-Zarr image (the run's provenance in its attributes), and with ``--vtk`` the same
fields as a VTK ImageData file for ParaView. With ``--scheduler ADDRESS`` the volumes are read lazily and the grid runs
in slabs of point planes on that dask.distributed cluster, each slab a task that reads its own planes (and halo)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from napari_gridmip.cli._shared import UsageError, absolute, add_batch_options, check_new

NAME = "correlate-volumes"
HELP = (
    "Digital volume correlation: the displacement of a grid of points of a reference volume in a deformed one "
    "(correlate_volumes), its ZNCC, uncertainty and status, and its strain (volume_strain), as one OME-Zarr image "
    "whose channels are the fields (and a VTK .vti file with --vtk)."
)
EXAMPLE = "napari-gridmip correlate-volumes scan0.tif scan1.tif dvc.ome.zarr --subset 21 --step 10 --vtk dvc.vti"
BATCH = True
FIELDS_KEY = "napari_gridmip_dvc"  # the output's attribute naming its channels and grid


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("reference", metavar="REF", help="the reference volume (Z, Y, X): .npy, .tif/.tiff or Zarr")
    sub.add_argument("deformed", metavar="DEF", help="the deformed volume, of the reference's shape")
    sub.add_argument("output", metavar="OUT", help="the OME-Zarr image to write (.ome.zarr): one channel per field")
    sub.add_argument("--subset", type=int, default=21, help="the subset's side in voxels, odd (default: 21)")
    sub.add_argument("--step", type=int, default=10, help="the grid's spacing in voxels (default: 10)")
    sub.add_argument("--roi", metavar="MASK", help="a (Z, Y, X) mask of the reference, nonzero inside")
    sub.add_argument("--shape", default="affine", choices=["affine", "translation"],
                     help="the subsets' warp (default: %(default)s)")  # fmt: skip
    sub.add_argument(
        "--strain", default="subsets", choices=["subsets", "smoothed"],
        help="the strain from each subset's own gradient (subsets, affine only) or from the field smoothed over "
        "one grid step (default: %(default)s)",
    )  # fmt: skip
    sub.add_argument("--strain-kind", default="small", choices=["small", "green-lagrange"],
                     help="the tensor whose 6 components are written (default: %(default)s)")  # fmt: skip
    sub.add_argument(
        "--voxel-size", type=float, default=1.0, metavar="UM",
        help="micrometres per voxel: the outputs' grid spacing is step x this, their origin the first point "
        "(default: 1, lengths in voxels)",
    )  # fmt: skip
    sub.add_argument("--vtk", metavar="OUT.vti", help="also write the fields as a VTK ImageData file (needs pyevtk)")
    add_batch_options(sub)  # without --scheduler the volumes are read whole, in this process


def run(args: argparse.Namespace, compute: Any) -> None:
    """Read the volumes (and the ROI) whole, execute the widget's plan, write OUT (and ``--vtk``); nothing is written
    unless every output is. With ``--scheduler``, the volumes stay lazy and ``compute`` (the cluster's) runs the
    slabs of ``correlate_volumes``."""
    from napari_gridmip._jobs import prepare_jax
    from napari_gridmip._jobs.plan import Source
    from napari_gridmip._jobs.volumes import FIELDS, VolumeRequest, check_request, volume_plan
    from napari_gridmip._jobs.world import Frame
    from napari_gridmip.core.correlation.status import Status
    from napari_gridmip.core.runtime.files import atomic_path
    from napari_gridmip.io import read_array, write_ome_zarr

    outputs = [args.output] if args.vtk is None else [args.output, args.vtk]
    check_new(*outputs, overwrite=args.overwrite)  # before any work
    if args.vtk is not None:
        if not args.vtk.lower().endswith(".vti"):
            raise UsageError(f"--vtk writes a VTK ImageData file, whose name ends in .vti; got {args.vtk!r}")
        try:
            import pyevtk  # noqa: F401 - only whether it is there, before any work
        except ImportError:
            raise UsageError("--vtk needs pyevtk: pip install 'napari-gridmip[vtk]'") from None
    if not np.isfinite(args.voxel_size) or args.voxel_size <= 0:
        raise UsageError(f"--voxel-size must be positive; got {args.voxel_size}")
    if args.step < 1:
        raise UsageError(f"--step must be at least 1 voxel; got {args.step}")
    on_cluster = args.scheduler is not None

    def opened(path: str) -> Any:
        """The volume at ``path``: lazy for a cluster's tasks (each reads its slab), else read whole here."""
        return read_array(path) if on_cluster else np.asarray(read_array(path))

    reference, deformed = (opened(path) for path in (args.reference, args.deformed))
    request = VolumeRequest(args.reference, reference, Frame.unit(reference.ndim), deformed_name=args.deformed,
                            deformed_data=deformed, subset=args.subset, step=args.step, shape=args.shape,
                            strain_method=args.strain, strain_kind=args.strain_kind)  # fmt: skip
    check_request(request)  # the shapes and options, before the ROI is read
    sources = [Source("reference", path=absolute(args.reference)), Source("deformed", path=absolute(args.deformed))]
    inputs = {"reference": reference, "deformed": deformed}
    if args.roi is not None:
        sources.append(Source("roi", path=absolute(args.roi)))
        inputs["roi"] = opened(args.roi)
    plan = volume_plan(request, sources=sources, display=False)
    prepare_jax()  # compiled programs kept in the per-user cache, as the widgets do
    if not args.quiet:
        where = f" in slabs on the cluster at {args.scheduler}" if on_cluster else ""
        print(f"correlating the volumes{where}", file=sys.stderr)

    def extras(i: int, call: Any) -> dict[str, Any]:
        # on a cluster, correlate_volumes runs its slabs there (a runtime keyword: the recorded call is the same)
        return {"compute": compute} if on_cluster and call.function == "correlate_volumes" else {}

    values = plan.execute(inputs, extras=extras)
    arrays = plan.outputs_of(values)
    result = values["dvc"]
    origin = np.array([result.z[0], result.y[0], result.x[0]]) if result.dz.size else np.zeros(3)
    spacing = args.step * args.voxel_size
    channels = np.stack([np.asarray(arrays[name], np.float32) for name in FIELDS])
    attributes = {
        **plan.record(),
        FIELDS_KEY: {
            "channels": list(FIELDS),
            "z": result.z.tolist(), "y": result.y.tolist(), "x": result.x.tolist(),  # reference voxels
            "voxel_size_um": args.voxel_size,
            "status": {int(s): s.name for s in Status},
            "lengths": "dz, dy, dx and sigma in voxels; strains dimensionless",
        },
    }  # fmt: skip

    def write_zarr() -> None:
        write_ome_zarr(channels, args.output, pixel_size=spacing, origin=origin / args.step, axes="czyx",
                       name="dvc", overwrite=args.overwrite, attributes=attributes)  # fmt: skip

    if args.vtk is None:
        write_zarr()
    else:
        from napari_gridmip.io import write_vtk_image

        fields = {name: np.asarray(arrays[name]) for name in FIELDS}
        # written under a temporary name, put in place only once OUT is written too
        with atomic_path(args.vtk, overwrite=args.overwrite, suffix=".vti") as temporary:
            write_vtk_image(temporary, fields, origin=origin * args.voxel_size, spacing=spacing,
                            vectors={"displacement": ("dz", "dy", "dx")})  # fmt: skip
            write_zarr()
    if not args.quiet:
        found = int((np.asarray(arrays["status"]) == Status.ok).sum())
        written = " and ".join(repr(absolute(path)) for path in outputs)
        print(f"{found} of {result.dz.size} points found; wrote {written}", file=sys.stderr)
