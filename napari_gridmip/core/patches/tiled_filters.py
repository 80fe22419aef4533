"""Named filters to run with ``apply_tiled``, each with its parameters and the halo that makes tiling exact.

JAX-free (SciPy's ``ndimage`` is imported when a filter is built), so that a
widget can list them, build its controls from ``parameters`` and pass
``spec.build(d, **values)`` on to ``apply_tiled``::

    fn, options = TILED_FILTERS["gaussian"].build(2, sigma=3.0)
    out = apply_tiled(fn, image, (512, 512), **options)

Every filter works on the last ``d`` axes only; leading axes (channels, time)
are filtered one index at a time (zero sigma, size 1 or no connectivity along
them). Halos follow SciPy's own footprints: a Gaussian of ``sigma`` truncated
at ``truncate`` reaches ``int(truncate * sigma + 0.5)`` pixels, a size-``s``
rank or uniform filter ``s // 2``, a grey opening or closing ``s - 1`` (two
passes, the second mirrored). With that halo the tiled output equals the
untiled one bit for bit for every boundary mode in :data:`FILTER_MODES`
("wrap" is left out: it reads the opposite border, which a tile does not
see), except ``"uniform"`` on float64 data, whose running sum SciPy
accumulates from the start of each line, so a tile's sums round differently
(within a few ulps; float32 rounds SciPy's double sums and came out exact in
every test).

``"connected_components"`` labels ``x > threshold`` (run with ``labels=True``
and ``overlap=1``, which ``build`` returns) and equals the untiled partition.
It has no smoothing of its own on purpose: a labeller that filters first
would connect pixels through its halo, where the filter is not exact, and
could merge objects; smooth in a first tiled run, then label.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["filter_tiled"]

FILTER_MODES = ("reflect", "nearest", "mirror", "constant")
"""SciPy boundary modes that a tiled run reproduces exactly (``"reflect"`` first, SciPy's default)."""


@dataclass(frozen=True)
class Parameter:
    """One control: ``kind`` is ``float``, ``int``, ``str`` (one of ``choices``)."""

    name: str
    default: Any
    kind: type
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    tooltip: str = ""

    def check(self, value: Any) -> Any:
        if self.kind is str:
            if value not in self.choices:
                raise ValueError(f"{self.name} must be one of {', '.join(map(repr, self.choices))}; got {value!r}")
            return value
        if isinstance(value, (bool, np.bool_, str)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"{self.name} must be a number; got {value!r}")
        if self.kind is int and not float(value).is_integer():
            raise ValueError(f"{self.name} must be a whole number; got {value!r}")
        value = self.kind(value)
        if not np.isfinite(value) or (self.minimum is not None and value < self.minimum):
            raise ValueError(f"{self.name} must be finite and >= {self.minimum}; got {value!r}")
        return value


@dataclass(frozen=True)
class TiledFilter:
    """A filter for tiles of ``(*leading, *tile)``: its controls, how to build it and its halo rule."""

    name: str
    description: str
    parameters: tuple[Parameter, ...]
    make: Callable[..., Callable[[np.ndarray], np.ndarray]]  # make(d, **values) -> fn
    halo: Callable[..., int]  # halo(**values) -> pixels
    labels: bool = False  # returns label images (run with labels=True and overlap >= 1)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.parameters}

    def values(self, **values: Any) -> dict[str, Any]:
        """The defaults updated with ``values``, each checked."""
        unknown = set(values) - {p.name for p in self.parameters}
        if unknown:
            raise ValueError(f"{self.name} has no parameter {', '.join(sorted(unknown))}; it has {self.defaults()}")
        merged = {**self.defaults(), **values}
        return {p.name: p.check(merged[p.name]) for p in self.parameters}

    def build(self, d: int, **values: Any) -> tuple[Callable[[np.ndarray], np.ndarray], dict[str, Any]]:
        """``(fn, options)`` for ``apply_tiled(fn, image, tile, **options)`` on the last ``d`` axes."""
        if d not in (1, 2, 3):
            raise ValueError(f"d (the tiled axes) must be 1, 2 or 3; got {d!r}")
        values = self.values(**values)
        options: dict[str, Any] = {"halo": int(self.halo(**values))}
        if self.labels:
            options.update(labels=True, overlap=1)
        return self.make(d, **values), options


def gaussian_radius(sigma: float, truncate: float) -> int:
    """How far SciPy's ``gaussian_filter`` reaches: ``int(truncate * sigma + 0.5)``."""
    return int(truncate * sigma + 0.5)


def _per_axis(x: np.ndarray, d: int, lead_value: Any, value: Any) -> tuple:
    return (lead_value,) * (x.ndim - d) + (value,) * d


def _ndimage():
    from scipy import ndimage

    return ndimage


def _gaussian(d: int, sigma: float, truncate: float, mode: str) -> Callable:
    def fn(x):
        return _ndimage().gaussian_filter(x, _per_axis(x, d, 0.0, sigma), mode=mode, truncate=truncate)

    return fn


def _derivatives(x: np.ndarray, d: int, sigma: float, truncate: float, mode: str, order: int) -> list[np.ndarray]:
    """Gaussian derivatives of ``order`` along each tiled axis (smoothing along the others)."""
    ndimage = _ndimage()
    x = np.asarray(x, np.result_type(x.dtype, np.float32))
    sigmas = _per_axis(x, d, 0.0, sigma)
    out = []
    for axis in range(x.ndim - d, x.ndim):
        orders = [0] * x.ndim
        orders[axis] = order
        out.append(ndimage.gaussian_filter(x, sigmas, order=orders, mode=mode, truncate=truncate))
    return out


def _laplace(d: int, sigma: float, truncate: float, mode: str) -> Callable:
    def fn(x):
        return sum(_derivatives(x, d, sigma, truncate, mode, 2))

    return fn


def _gradient(d: int, sigma: float, truncate: float, mode: str) -> Callable:
    def fn(x):
        return np.sqrt(sum(g * g for g in _derivatives(x, d, sigma, truncate, mode, 1)))

    return fn


def _dog(d: int, sigma_low: float, sigma_high: float, truncate: float, mode: str) -> Callable:
    def fn(x):
        x = np.asarray(x, np.result_type(x.dtype, np.float32))
        low = _ndimage().gaussian_filter(x, _per_axis(x, d, 0.0, sigma_low), mode=mode, truncate=truncate)
        high = _ndimage().gaussian_filter(x, _per_axis(x, d, 0.0, sigma_high), mode=mode, truncate=truncate)
        return low - high

    return fn


def _sized(function: str) -> Callable:
    def make(d: int, size: int, mode: str) -> Callable:
        def fn(x):
            return getattr(_ndimage(), function)(x, size=_per_axis(x, d, 1, size), mode=mode)

        return fn

    return make


def _components(d: int, threshold: float, connectivity: str) -> Callable:
    def fn(x):
        ndimage = _ndimage()
        structure = np.zeros((3,) * x.ndim, bool)
        inner = ndimage.generate_binary_structure(d, d if connectivity == "full" else 1)
        structure[(1,) * (x.ndim - d) + (slice(None),) * d] = inner  # nothing links across leading axes
        labels, _ = ndimage.label(x > threshold, structure)
        return labels

    return fn


_MODE = Parameter("mode", "reflect", str, choices=FILTER_MODES, tooltip="How the filter extends the image border")
_SIGMA = Parameter("sigma", 2.0, float, minimum=0.0, tooltip="Gaussian sigma, pixels")
_TRUNCATE = Parameter("truncate", 4.0, float, minimum=0.0, tooltip="Gaussian cut off at this many sigmas")
_SIZE = Parameter("size", 3, int, minimum=1, tooltip="Footprint side, pixels")


def _gaussian_halo(sigma: float, truncate: float, **_: Any) -> int:
    return gaussian_radius(sigma, truncate)


def _size_halo(size: int, **_: Any) -> int:
    return size // 2


def _opening_halo(size: int, **_: Any) -> int:
    return size - 1


TILED_FILTERS: dict[str, TiledFilter] = {
    f.name: f
    for f in (
        TiledFilter("gaussian", "Gaussian smoothing", (_SIGMA, _TRUNCATE, _MODE), _gaussian, _gaussian_halo),
        TiledFilter("median", "Median of a size^d box", (_SIZE, _MODE), _sized("median_filter"), _size_halo),
        TiledFilter("uniform", "Mean of a size^d box", (_SIZE, _MODE), _sized("uniform_filter"), _size_halo),
        TiledFilter("minimum", "Minimum of a size^d box", (_SIZE, _MODE), _sized("minimum_filter"), _size_halo),
        TiledFilter("maximum", "Maximum of a size^d box", (_SIZE, _MODE), _sized("maximum_filter"), _size_halo),
        TiledFilter(
            "white_tophat", "Image minus its grey opening", (_SIZE, _MODE), _sized("white_tophat"), _opening_halo
        ),
        TiledFilter(
            "black_tophat", "Grey closing minus the image", (_SIZE, _MODE), _sized("black_tophat"), _opening_halo
        ),
        TiledFilter(
            "gaussian_gradient_magnitude",
            "Gradient magnitude of Gaussian derivatives",
            (_SIGMA, _TRUNCATE, _MODE),
            _gradient,
            _gaussian_halo,
        ),
        TiledFilter("gaussian_laplace", "Laplacian of Gaussian", (_SIGMA, _TRUNCATE, _MODE), _laplace, _gaussian_halo),
        TiledFilter(
            "difference_of_gaussians",
            "Gaussian(sigma_low) minus Gaussian(sigma_high): a band-pass",
            (
                Parameter("sigma_low", 1.0, float, minimum=0.0, tooltip="The finer Gaussian, pixels"),
                Parameter("sigma_high", 4.0, float, minimum=0.0, tooltip="The coarser Gaussian, pixels"),
                _TRUNCATE,
                _MODE,
            ),
            _dog,
            lambda sigma_low, sigma_high, truncate, **_: gaussian_radius(max(sigma_low, sigma_high), truncate),
        ),
        TiledFilter(
            "connected_components",
            "Labels of the connected pixels above a threshold (smooth first with a separate gaussian run)",
            (
                Parameter("threshold", 0.5, float, tooltip="Pixels above this are foreground"),
                Parameter("connectivity", "face", str, choices=("face", "full"), tooltip="Face or full neighbours"),
            ),
            _components,
            lambda **_: 0,
            labels=True,
        ),
    )
}
"""name -> :class:`TiledFilter`, in the order a menu shows them."""

TILED_FILTER_NAMES = tuple(TILED_FILTERS)


def load_callable(path: str) -> Callable:
    """The function named by an import path: ``"package.module:function"`` or ``"package.module.function"``.

    Raises ValueError (with the reason) when the module or name cannot be
    found or the object is not callable.
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"an import path such as 'scipy.ndimage:median_filter' is needed; got {path!r}")
    path = path.strip()
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not module:function or module.function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import {module_name!r} (from {path!r}): {error}") from None
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no {attribute!r} (from {path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{path!r} is a {type(obj).__name__}, not a function")
    return obj


def filter_tiled(
    image: Any,
    tile: Any,
    *,
    name: str = "gaussian",
    overlap: int | float = 0,
    blend: str = "gaussian",
    progress: Callable[[int, int], Any] | None = None,
    **parameters: Any,
) -> Any:
    """Apply one of the named filters of :data:`TILED_FILTERS` to ``image`` in tiles, exactly.

    The filter's halo comes from its parameters (a Gaussian's radius, a box's half-size, ...), so the
    tiled result equals the filter run on the whole image, border included (see the module's notes
    for the one exception, ``"uniform"`` on float64).

    Parameters
    ----------
    image
        ``(*leading, n_1, ..., n_d)``, NumPy or dask (then the result is lazy), as for
        :func:`~napari_gridmip.apply_tiled`; the last ``d = len(tile)`` axes are filtered.
    tile
        ``(t_1, ..., t_d)``, the tile shape, ``1 <= d <= 3``.
    name
        The filter: one of :data:`TILED_FILTER_NAMES` (``"gaussian"``, ``"median"``, ``"white_tophat"``,
        ``"connected_components"``, ...).
    overlap, blend, progress
        As for :func:`~napari_gridmip.apply_tiled` (``connected_components`` always overlaps by 1).
    **parameters
        The filter's parameters (``sigma=2.0``, ``size=5``, ``mode="nearest"``, ...); the others keep
        their defaults. ``TILED_FILTERS[name].parameters`` lists them.

    Returns
    -------
    numpy.ndarray, or dask.array.Array for a dask image
        The filtered image, in ``apply_tiled``'s dtype rule; for ``connected_components`` labels
        ``1..K`` (0 background).

    Raises
    ------
    ValueError
        For an unknown filter or parameter, a parameter out of range, or what
        :func:`~napari_gridmip.apply_tiled` refuses.
    TypeError
        For a parameter of the wrong type (text for a number).

    Examples
    --------
    >>> import numpy as np
    >>> image = np.random.default_rng(0).random((300, 200))
    >>> smooth = filter_tiled(image, (128, 128), name="gaussian", sigma=3.0)
    >>> from scipy import ndimage
    >>> bool(np.array_equal(smooth, ndimage.gaussian_filter(image, 3.0)))
    True
    """
    from napari_gridmip.core.patches.tiled import apply_tiled

    if name not in TILED_FILTERS:
        raise ValueError(f"name must be one of {', '.join(map(repr, TILED_FILTER_NAMES))}; got {name!r}")
    d = len(tile) if isinstance(tile, (tuple, list)) else 0
    fn, options = TILED_FILTERS[name].build(d, **parameters)
    if not TILED_FILTERS[name].labels:
        options.update(overlap=overlap, blend=blend)
    return apply_tiled(fn, image, tile, backend="numpy", progress=progress, **options)
