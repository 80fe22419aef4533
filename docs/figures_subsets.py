"""Make the pictures of docs/dic.md and docs/speckle_tracking.md (matplotlib, no display needed).

    python docs/figures_subsets.py

Writes docs/images/dic.png and docs/images/speckle_tracking.png (each under 300 KB) from the package's
samples, with the calls the pages show, and prints the figures the pages quote.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OUT = Path(__file__).parent / "images"


def _palette(path: Path) -> None:
    """256 colours (the figures' flat colour maps lose nothing visible), to keep each page image small."""
    from PIL import Image

    Image.open(path).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def dic_figure() -> None:
    import matplotlib.pyplot as plt

    from napari_gridmip import track_speckles
    from napari_gridmip._sample_data.dic import make_dic_pair

    reference, deformed, truth = make_dic_pair()
    window, subset, step = (11, 11), (31, 31), 4
    out = track_speckles(deformed[None], reference[None], window, subset=subset, step=step)
    y0 = window[0] // 2 + subset[0] // 2  # output (i, j) is pixel (y0 + i step, y0 + j step)
    grid = (slice(y0, None, step), slice(y0, None, step))
    rows, cols = out.dx.shape
    true_dx = truth["dx"][grid][:rows, :cols]
    true_dy = truth["dy"][grid][:rows, :cols]
    error = np.hypot(np.asarray(out.dx) - true_dx, np.asarray(out.dy) - true_dy)
    fig, axes = plt.subplots(2, 3, figsize=(12, 7.6), constrained_layout=True)
    panels = [
        (reference, "reference (8-bit)", "gray", None),
        (deformed, "deformed", "gray", None),
        (np.asarray(out.dx), "measured dx (px)", "RdBu_r", (true_dx.min(), true_dx.max())),
        (true_dx, "true dx (px)", "RdBu_r", (true_dx.min(), true_dx.max())),
        (error, "error |d - d_true| (px)", "magma", (0, 0.06)),
        (np.asarray(out.sigma_dx), "predicted sigma_dx (px)", "magma", (0, 0.06)),
    ]
    for ax, (image, title, cmap, limits) in zip(axes.ravel(), panels):
        shown = ax.imshow(image, cmap=cmap, vmin=None if limits is None else limits[0],
                          vmax=None if limits is None else limits[1])  # fmt: skip
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
        if limits is not None:
            fig.colorbar(shown, ax=ax, shrink=0.8)
    fig.suptitle(f"DIC sample, subset 31, step {step}, subpixel='refine'")
    fig.savefig(OUT / "dic.png", dpi=50)
    _palette(OUT / "dic.png")
    print(f"dic.png: median error {np.nanmedian(error):.4f} px, 95th percentile {np.nanpercentile(error, 95):.4f}; "
          f"median sigma_dx {np.nanmedian(np.asarray(out.sigma_dx)):.4f} px")  # fmt: skip


def speckle_figure() -> None:
    import matplotlib.pyplot as plt

    from napari_gridmip import track_speckles
    from napari_gridmip._sample_data import make_speckle_pair_with_contrast

    sample, reference, truth = make_speckle_pair_with_contrast()
    window, subset = (9, 9), (3, 3)
    out = track_speckles(sample, reference, window, subset=subset)
    margin = window[0] // 2 + subset[0] // 2
    crop = (slice(margin, margin + out.dy.shape[0]), slice(margin, margin + out.dy.shape[1]))
    fig, axes = plt.subplots(2, 4, figsize=(14, 7), constrained_layout=True)
    panels = [
        (sample[0], "sample, frame 0", "gray", None),
        (reference[0], "reference, frame 0", "gray", None),
        (np.asarray(out.dy), "dy (px)", "RdBu_r", (-1.7, 1.7)),
        (np.asarray(out.dx), "dx (px)", "RdBu_r", (-1.7, 1.7)),
        (np.asarray(out.transmission), "transmission T", "viridis", (0.45, 1.05)),
        (truth["transmission"][crop], "true T", "viridis", (0.45, 1.05)),
        (np.asarray(out.dark_field), "dark-field D", "viridis", (0.5, 1.05)),
        (truth["dark_field"][crop], "true D", "viridis", (0.5, 1.05)),
    ]
    for ax, (image, title, cmap, limits) in zip(axes.ravel(), panels):
        shown = ax.imshow(image, cmap=cmap, vmin=None if limits is None else limits[0],
                          vmax=None if limits is None else limits[1])  # fmt: skip
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
        if limits is not None:
            fig.colorbar(shown, ax=ax, shrink=0.8)
    fig.suptitle("Speckle sample with absorption and scattering: track_speckles, window 9, subset 3")
    fig.savefig(OUT / "speckle_tracking.png", dpi=60)
    _palette(OUT / "speckle_tracking.png")
    for name in ("transmission", "dark_field"):
        ratio = np.asarray(getattr(out, name)) / truth[name][crop]
        print(f"speckle_tracking.png: {name} median |ratio - 1| {np.nanmedian(np.abs(ratio - 1)):.4f}")
    error = np.hypot(np.asarray(out.dy) - truth["dy"][crop], np.asarray(out.dx) - truth["dx"][crop])
    print(f"speckle_tracking.png: median displacement error {np.nanmedian(error):.4f} px")


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    dic_figure()
    speckle_figure()
    for name in ("dic.png", "speckle_tracking.png"):
        size = (OUT / name).stat().st_size
        print(f"{name}: {size / 1e3:.0f} KB")
        assert size < 300_000, name
