"""``napari-gridmip correlate IMG1 IMG2 OUT --window WM WN``: the displacement field between two K-frame stacks, or
two single images, by the widget's correlation plan, into a Zarr group (dy, dx, peak and the ``--outputs``)."""

from __future__ import annotations

import argparse
from typing import Any

from napari_gridmip.cli._shared import UsageError, absolute, add_batch_options, check_new

NAME = "correlate"
HELP = "Displacement field (dy, dx, peak) between two K-frame stacks, or two images, into a Zarr group."
EXAMPLE = (
    "napari-gridmip correlate sample.tif reference.tif field.zarr --window 15 15 --subpixel refine\n"
    "  napari-gridmip correlate deformed.tif reference.tif dic.zarr --window 11 11 --subset 31 31 --step 5 "
    "--subpixel refine --outputs uncertainty"
)
BATCH = True

# --outputs: the correlation plan's outputs (napari_gridmip._jobs.correlation.PARTS), spelled with hyphens
OUTPUT_NAMES = ("transmission", "dark-field", "residual", "uncertainty", "phase", "strain")
# the subset two single images get without --subset: the widget's default for a pair (one pixel of one frame is a
# vector of one value, which has no correlation)
IMAGE_SUBSET = (21, 21)


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("img1", metavar="IMG1", help="the sample (or deformed) stack (..., K, M, N), or one image (M, N)")
    sub.add_argument("img2", metavar="IMG2", help="the reference stack, or image, of the same shape")
    sub.add_argument("output", metavar="OUT", help="the Zarr folder to create, with arrays dy, dx and peak")
    sub.add_argument("--window", type=int, nargs=2, required=True, metavar=("WM", "WN"), help="odd window size")
    sub.add_argument(
        "--subset", type=int, nargs=2, metavar=("SH", "SW"),
        help="odd subset: each vector spans K x SH x SW values (DIC: 21 21 to 41 41; default: 1 1 for stacks, "
        f"{IMAGE_SUBSET[0]} {IMAGE_SUBSET[1]} for two single images)",
    )  # fmt: skip
    sub.add_argument("--step", type=int, default=1, help="results on every S-th pixel only (default: 1)")
    sub.add_argument(
        "--subpixel", default="hessian",
        help="hessian, paraboloid, refine or none (default: hessian); refine with a subset smooths both images "
        "by a 0.8 px Gaussian first, against noise bias",
    )  # fmt: skip
    sub.add_argument(
        "--shape", default="translation", choices=["translation", "affine"],
        help="the subsets' shape function: affine fits each subset's displacement gradients too (IC-GN; needs "
        "--subset and --subpixel refine; strain then comes from those gradients) (default: translation)",
    )  # fmt: skip
    sub.add_argument(
        "--outputs", default="", metavar="NAMES",
        help="comma-separated extra arrays: transmission, dark-field, residual, uncertainty (sigma_dy, sigma_dx), "
        "phase (integrate_gradient of the field, px^2) and strain (strain_field: exx, eyy, exy); with --step S both "
        "take the samples as S pixels apart. With transmission, dark-field, residual or uncertainty the field is "
        "track_speckles' (IMG1 the sample, IMG2 the reference)",
    )  # fmt: skip
    sub.add_argument(
        "--strain-window", type=int, default=11, help="odd window of the strain fit, in output pixels (default: 11)"
    )
    sub.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    add_batch_options(sub)


def parse_outputs(text: str) -> list[str]:
    """The ``--outputs`` names, checked (one-line errors for unknown ones), as the correlation plan spells them."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in OUTPUT_NAMES:
            raise UsageError(f"--outputs: unknown output {name!r}; choose from {', '.join(OUTPUT_NAMES)}")
    return [name.replace("-", "_") for name in names]


def correlate_plan(args: argparse.Namespace, img1: Any, img2: Any) -> tuple[Any, dict[str, Any]]:
    """The correlation plan of ``correlate`` (the widget's, with the files as sources) and its inputs."""
    from napari_gridmip._jobs.correlation import CorrelationRequest, correlation_plan
    from napari_gridmip._jobs.plan import Source

    names = parse_outputs(args.outputs)
    images = img1.ndim == 2 and img2.ndim == 2
    index = "[None]" if images else ""  # one image each (DIC): K = 1
    subset = tuple(args.subset) if args.subset is not None else IMAGE_SUBSET if images else (1, 1)
    request = CorrelationRequest(
        args.img1, args.img2, img1, img2, None, tuple(args.window), subpixel=args.subpixel, dtype=args.dtype,
        subset=subset, step=args.step, outputs=tuple(names), index=index, strain_window=args.strain_window,
        shape=args.shape,
    )  # fmt: skip
    sources = (Source("img1", path=absolute(args.img1), index=index),
               Source("img2", path=absolute(args.img2), index=index))  # fmt: skip
    plan = correlation_plan(request, sources=sources, display=False)
    return plan, {"img1": sources[0].take(img1), "img2": sources[1].take(img2)}


def run(args: argparse.Namespace, compute: Any) -> None:
    import dask.array as da
    import zarr

    from napari_gridmip.core.runtime.files import atomic_path
    from napari_gridmip.io import read_array

    check_new(args.output, overwrite=args.overwrite)
    plan, inputs = correlate_plan(args, read_array(args.img1), read_array(args.img2))
    arrays = plan.run(inputs)  # lazy: the stacks are read band by band while OUT is written
    with atomic_path(args.output, overwrite=args.overwrite) as temporary:
        zarr.open_group(str(temporary), mode="w").attrs.update(plan.record())
        writes = [da.to_zarr(da.asarray(array), str(temporary), component=name, compute=False)
                  for name, array in arrays.items()]  # fmt: skip
        compute(writes)
