"""The local correlation image against CaImAn's own functions, on a movie made from CaImAn's demo recording.

    git clone https://github.com/flatironinstitute/CaImAn /tmp/CaImAn     # or any checkout of it
    python benchmarks/probes/caiman_check.py /tmp/CaImAn

CaImAn's example movie (``example_movies/demoMovie.tif``) is not in its repository (fetched on install), but its
test suite keeps that recording's decomposition: ``caiman/tests/comparison/groundtruth_demoMovie.npz``, the 16
neurons' spatial footprints (``A_full``, 60 x 80 pixels) and their calcium traces over the 2000 frames
(``C_full``), found by CaImAn's CNMF. This makes the movie back from them, as a camera would record it: a
vignetted baseline, the neurons' fluorescence, Poisson noise and 16-bit quantisation. Then it compares, on that
movie:

- ``napari_gridmip.local_correlation_image`` against CaImAn's own ``local_correlations`` and
  ``local_correlations_fft`` (its ``opencv=False`` branch, the same sums without OpenCV), run from the
  checkout's ``caiman/summary_images.py`` itself (its CaImAn imports stubbed, and OpenCV's where it is not
  installed: neither function calls them on this branch);
- how well each image tells the neurons' pixels (footprint over 20% of its peak) from the rest: the area under
  the ROC curve, and the median correlation inside and outside;
- the same with 4 neighbours, and where the images put one pair of diagonal neighbours that share a signal.

Nothing of CaImAn is copied here: the checkout is read at run time.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import numpy as np


def caiman_summary_images(checkout: Path) -> types.ModuleType:
    """CaImAn's ``caiman/summary_images.py`` from ``checkout``, its package imports stubbed (and OpenCV's, where
    it is not installed: ``local_correlations_fft(..., opencv=True)`` then needs it)."""
    try:
        import cv2  # noqa: F401 - the real one, for local_correlations_fft's OpenCV branch
    except ImportError:
        cv2_stub = {"cv2": types.ModuleType("cv2")}
    else:
        cv2_stub = {}
    stubs = {
        **cv2_stub,
        "caiman": types.ModuleType("caiman"),
        "caiman.base": types.ModuleType("caiman.base"),
        "caiman.base.movies": types.ModuleType("caiman.base.movies"),
        "caiman.source_extraction": types.ModuleType("caiman.source_extraction"),
        "caiman.source_extraction.cnmf": types.ModuleType("caiman.source_extraction.cnmf"),
        "caiman.source_extraction.cnmf.pre_processing": types.ModuleType("pre_processing"),
    }
    stubs["caiman.source_extraction.cnmf.pre_processing"].get_noise_fft = None
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        module = types.ModuleType("caiman_summary_images")
        path = checkout / "caiman" / "summary_images.py"
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - the user's checkout
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module


def demo_movie(checkout: Path, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The movie ``(2000, 60, 80)`` uint16 made from the recording's decomposition, and the neurons' pixels."""
    data = np.load(checkout / "caiman/tests/comparison/groundtruth_demoMovie.npz", allow_pickle=True,
                   encoding="latin1")  # fmt: skip
    footprints, traces = data["A_full"].item().toarray(), data["C_full"]  # (4800, 16), (16, 2000)
    shape = (60, 80)  # CaImAn's d1 x d2, pixels in Fortran order
    signal = (footprints @ traces).T.reshape((-1, *shape[::-1])).transpose(0, 2, 1)  # (T, 60, 80)
    yy, xx = np.meshgrid(np.linspace(-1, 1, shape[0]), np.linspace(-1, 1, shape[1]), indexing="ij")
    baseline = 300.0 * (1 - 0.3 * (yy**2 + xx**2) / 2)  # photons a frame, vignetted
    # the footprints times the traces are in the recording's own units (99th percentile 862, largest 13149):
    # scaled so that the 99th percentile adds as many photons as the baseline
    gain = 300.0 / np.percentile(signal, 99)
    rng = np.random.default_rng(seed)
    photons = rng.poisson(baseline + gain * np.maximum(signal, 0))
    movie = np.minimum(photons, 65535).astype(np.uint16)
    peaks = footprints.max(axis=0, keepdims=True)
    neurons = (footprints > 0.2 * peaks).any(axis=1).reshape(shape[::-1]).T
    return movie, neurons


def roc_auc(score: np.ndarray, positive: np.ndarray) -> float:
    """The probability that a positive pixel scores above a negative one (ties count half)."""
    from scipy.stats import rankdata

    ranks = rankdata(score.ravel())
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    return float((ranks[positive.ravel()].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("caiman", type=Path, help="a checkout of github.com/flatironinstitute/CaImAn")
    args = parser.parse_args()
    caiman = caiman_summary_images(args.caiman)
    movie, neurons = demo_movie(args.caiman)
    import napari_gridmip as gm

    images = {"napari_gridmip.local_correlation_image": np.asarray(gm.local_correlation_image(movie), np.float64)}
    for name, call in (
        ("caiman local_correlations", lambda: caiman.local_correlations(movie.astype(np.float32), swap_dim=False)),
        ("caiman local_correlations_fft", lambda: caiman.local_correlations_fft(movie, swap_dim=False,
                                                                                 opencv=False)),
    ):  # fmt: skip
        images[name] = np.asarray(call(), np.float64)
    four = np.asarray(gm.local_correlation_image(movie, neighbours=4), np.float64)
    four_caiman = caiman.local_correlations(movie.astype(np.float32), eight_neighbours=False, swap_dim=False)
    ours = images["napari_gridmip.local_correlation_image"]
    print(f"movie {movie.shape} {movie.dtype}, {int(neurons.sum())} neuron pixels of {neurons.size}")
    print("| image | largest difference from ours | ROC AUC, neuron pixels | median inside / outside |")
    print("|---|---:|---:|---|")
    for name, image in images.items():
        diff = float(np.max(np.abs(image - ours)))
        print(
            f"| {name} | {diff:.1e} | {roc_auc(image, neurons):.4f} | {np.median(image[neurons]):.3f} / "
            f"{np.median(image[~neurons]):.3f} |"
        )
    print(f"4 neighbours: caiman local_correlations within {np.max(np.abs(four_caiman - four)):.1e} of ours")
    # where local_correlations differs with 8: one anti-diagonal pair of pixels sharing a signal, noise elsewhere
    rng = np.random.default_rng(1)
    pair = rng.standard_normal((4000, 6, 6)).astype(np.float32)
    shared = 3 * rng.standard_normal(4000).astype(np.float32)
    pair[:, 2, 3] += shared
    pair[:, 3, 2] += shared
    for name, image in (("ours", np.asarray(gm.local_correlation_image(pair))),
                        ("caiman local_correlations", caiman.local_correlations(pair, swap_dim=False))):  # fmt: skip
        high = sorted(zip(*np.nonzero(np.abs(image) > 0.05)))
        print(f"pixels (2, 3) and (3, 2) correlated: {name} gives over 0.05 at {[tuple(map(int, p)) for p in high]}")


if __name__ == "__main__":
    main()
