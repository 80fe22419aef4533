"""The digital volume correlation (DVC) job: the displacement of a grid of points of a reference volume in a
deformed one (:func:`~napari_gridmip.correlate_volumes`), its quality and its strain
(:func:`~napari_gridmip.volume_strain`). One plan (:func:`volume_plan`) serves the widget's job and
``napari-gridmip correlate-volumes``.

The inputs are two 3D layers, or one 4D layer ``(T, Z, Y, X)``, a time lapse whose grid of points on time point 0
is followed through every later one (:func:`~napari_gridmip.correlate_volume_series`, with its reference policy:
``"accumulated"``, ``"incremental"`` or ``"auto"``). The results sit on the grid's points: images ``(P, R, C)``
(``(T, P, R, C)`` for a 4D layer, time point 0's field all zeros) placed with the reference layer's transform, one
grid step per element and the first point as their origin, and the arrows as napari vectors ``(N, 2, 3)``
(``(N, 2, 4)``, time first) in the reference's voxels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip._jobs import Job, JobResult, LayerDataTuple, Output, ProgressCallback, layer_tuples, staged
from napari_gridmip._jobs.correlation import STATUS_COLOURS, auto_vector_length, contrast_limits
from napari_gridmip._jobs.plan import Call, Plan, Ref, Source
from napari_gridmip._jobs.world import Frame, derived_placement
from napari_gridmip.core.correlation.status import Status  # a leaf: no JAX

WIDGET = "volumes"
SHAPES = ("affine", "translation")  # correlate_volumes' warps
REFERENCES = ("accumulated", "incremental", "auto")  # a 4D layer's reference policies (correlate_volume_series')
STRAIN_METHODS = ("subsets", "smoothed")  # volume_strain's methods
STRAIN_KINDS = ("small", "green-lagrange")  # which tensor's 6 components become layers
COMPONENTS = ("zz", "yy", "xx", "zy", "zx", "yx")  # volume_strain's order (tensor shears)
# every array a plan gives, in the command line's channel order: the field, its quality, its strain
FIELDS = ("dz", "dy", "dx", "zncc", "status", "sigma_dz", "sigma_dy", "sigma_dx", "volumetric", "deviatoric",
          *(f"e_{c}" for c in COMPONENTS))  # fmt: skip
SIGMAS = ("sigma_dz", "sigma_dy", "sigma_dx")  # a pair's only: correlate_volume_series predicts no uncertainty


@dataclass(frozen=True)
class VolumeRequest:
    """Two volumes (or one 4D series), the region of interest and :func:`~napari_gridmip.correlate_volumes`' and
    :func:`~napari_gridmip.volume_strain`'s options, captured on the GUI thread."""

    name: str  # the reference layer (Z, Y, X), or the series (T, Z, Y, X); the results' names start with it
    data: Any
    frame: Frame  # its transform: the results are placed on its voxels
    deformed_name: str | None = None  # the deformed layer (Z, Y, X); None for a series
    deformed_data: Any = None
    reference: str = "accumulated"  # a series' policy, of REFERENCES
    roi: Source | None = None  # how the script binds the region of interest (variable "roi")
    roi_data: Any = None  # its value, a copy taken with the request
    subset: int = 21
    step: int = 10
    shape: str = "affine"
    strain_method: str = "subsets"
    strain_kind: str = "small"
    smoothing: float = 1.0  # grid steps, for strain_method "smoothed"
    vector_scale: float = 0.0  # drawn length = displacement x this; 0: the median spans 80% of a grid step

    @property
    def series(self) -> bool:
        """Whether the input is one 4D layer, time first."""
        return self.deformed_name is None

    @property
    def fields(self) -> tuple[str, ...]:
        """The arrays the plan gives: :data:`FIELDS`, less the uncertainty for a series."""
        return tuple(name for name in FIELDS if not (self.series and name in SIGMAS))


def check_request(request: VolumeRequest) -> None:
    """Refuse, before any work, what the kernels would refuse late (or the layers cannot show)."""
    if request.shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}; got {request.shape!r}")
    if request.series and request.reference not in REFERENCES:
        raise ValueError(f"a series' reference must be one of {REFERENCES}; got {request.reference!r}")
    if request.strain_method not in STRAIN_METHODS or request.strain_kind not in STRAIN_KINDS:
        raise ValueError(f"strain method must be one of {STRAIN_METHODS} and kind one of {STRAIN_KINDS}; got "
                         f"{request.strain_method!r} and {request.strain_kind!r}")  # fmt: skip
    if request.shape == "translation" and request.strain_method == "subsets":
        raise ValueError("the strain from the subsets' own gradients needs affine subsets: choose the shape affine, "
                         "or the strain method smoothed")  # fmt: skip
    if request.subset % 2 == 0 or request.subset < 5:
        raise ValueError(f"the subset must be odd and at least 5 voxels; got {request.subset}")
    shape = tuple(int(n) for n in request.data.shape)
    if request.series:
        if len(shape) != 4 or shape[0] < 2:
            raise ValueError(f"a series must be 4D (T, Z, Y, X) with at least 2 time points; {request.name!r} has "
                             f"shape {shape}")  # fmt: skip
        volume = shape[1:]
    else:
        volume = shape
        other = tuple(int(n) for n in request.deformed_data.shape)
        if len(shape) != 3 or other != shape:
            raise ValueError(f"the reference and deformed volumes must be 3D (Z, Y, X) of one shape; got {shape} "
                             f"({request.name!r}) and {other} ({request.deformed_name!r})")  # fmt: skip
    if request.subset > min(volume):
        raise ValueError(f"the subset ({request.subset} voxels) is larger than the volume's smallest side {volume}")


def volume_plan(request: VolumeRequest, *, sources: list[Source] | None = None, display: bool = True) -> Plan:
    """``correlate_volumes`` (a series: ``correlate_volume_series``) and ``volume_strain``; outputs the request's
    :attr:`~VolumeRequest.fields` (each ``(P, R, C)``, or ``(T, P, R, C)`` for a series), and with ``display`` the
    arrows (``"vectors"``, napari's ``(N, 2, 3)`` in the reference's voxels, time first for a series:
    ``(N, 2, 4)``).

    ``sources`` bind ``reference`` and ``deformed`` (or ``volumes``), and ``roi`` where there is one; by default the
    request's layers.
    """
    check_request(request)
    if sources is None:
        if request.series:
            sources = [Source("volumes", layer=request.name)]
        else:
            sources = [Source("reference", layer=request.name), Source("deformed", layer=request.deformed_name)]
        if request.roi is not None:
            sources.append(request.roi)
    options: dict[str, Any] = {"subset": int(request.subset), "step": int(request.step), "shape": request.shape}
    if any(source.variable == "roi" for source in sources):
        options["roi"] = Ref("roi")
    strain_options: dict[str, Any] = {"method": request.strain_method}
    if request.strain_method == "smoothed":
        strain_options["smoothing"] = float(request.smoothing)
    if request.series:
        options["reference"] = request.reference
        # the volumes whole (one time point read at a time): the time lapse follows each point from the last one
        calls = [Call("correlate_volume_series", ("volumes",), (), options, result="dvc")]
    else:
        calls = [Call("correlate_volumes", ("reference", "deformed"), (), options, result="dvc")]
    # the subsets' gradients of every time point at once (a series' leading axis is elementwise there)
    calls.append(Call("volume_strain", ("dvc",), (), strain_options, result="strain"))
    tensor = "small" if request.strain_kind == "small" else "green_lagrange"
    parts = {
        "dz": "dvc.dz", "dy": "dvc.dy", "dx": "dvc.dx", "zncc": "dvc.zncc", "status": "dvc.status",
        "sigma_dz": "dvc.sigma[..., 0]", "sigma_dy": "dvc.sigma[..., 1]", "sigma_dx": "dvc.sigma[..., 2]",
        "volumetric": "strain.volumetric", "deviatoric": "strain.deviatoric",
        **{f"e_{c}": f"strain.{tensor}[..., {i}]" for i, c in enumerate(COMPONENTS)},
    }  # fmt: skip
    outputs = {name: parts[name] for name in request.fields}
    if display:
        arrows = (
            "np.concatenate([np.stack(np.meshgrid(dvc.z, dvc.y, dvc.x, indexing='ij'), -1)[..., None, :], "
            "np.stack([dvc.dz{t}, dvc.dy{t}, dvc.dx{t}], -1)[..., None, :]], -2).reshape(-1, 2, 3)"
            "[np.isfinite(dvc.dz{t}).ravel()]"
        )
        if request.series:  # each time point's arrows, the time point first: its position, no motion along it
            timed = f"np.insert({arrows.format(t='[t]')}, 0, (t, 0), axis=2)"
            outputs["vectors"] = f"np.concatenate([{timed} for t in range(len(dvc.dz))])"
        else:
            outputs["vectors"] = arrows.format(t="")
    return Plan(sources, calls, outputs)


def make_volume_job(request: VolumeRequest) -> Job:
    plan = volume_plan(request)

    def run(progress: ProgressCallback) -> JobResult:
        if request.series:
            inputs = {"volumes": request.data}  # read one time point at a time
        else:
            inputs = {"reference": request.data, "deformed": request.deformed_data}
        if request.roi is not None:
            inputs["roi"] = request.roi_data
        # the correlation takes the time; a progress step (and a chance to cancel) before each call, and within
        # it after each chunk of points (a pair) or each time point (a series), staged passing it its share
        correlation = 20 if not request.series else max(20, int(request.data.shape[0]))
        weights = {call.result: correlation if call.function.startswith("correlate") else 1 for call in plan.calls}
        values = plan.run(inputs, **staged(plan, progress, weights))
        if request.series:
            summary = series_summary(*(np.asarray(values[name]) for name in ("status", "dz", "dy", "dx", "zncc")))
            details = {"sigma": None}
        else:
            summary = volume_summary(values["status"], values["dz"], values["dy"], values["dx"], values["zncc"])
            details = {"sigma": np.stack([np.asarray(values[name]) for name in SIGMAS], -1)}
        return JobResult(volume_layers(request, values, plan), summary, details)

    if request.series:
        what = f"{request.name!r}, {int(request.data.shape[0])} time points"
    else:
        what = f"{request.name!r} with {request.deformed_name!r}"
    return Job(f"Correlating volumes: {what}", run)


def volume_summary(status: Any, dz: Any, dy: Any, dx: Any, zncc: Any) -> str:
    """E.g. ``'512 points, 98% found (8 not_significant); median |d| 0.61 vox, median ZNCC 0.994'``."""
    status = np.asarray(status)
    found = status == Status.ok
    lost = {s.name: int((status == s).sum()) for s in Status if s != Status.ok}
    why = ", ".join(f"{n} {name}" for name, n in lost.items() if n)
    magnitude = np.sqrt(np.asarray(dz, float) ** 2 + np.asarray(dy, float) ** 2 + np.asarray(dx, float) ** 2)
    median = float(np.nanmedian(magnitude)) if np.isfinite(magnitude).any() else float("nan")
    correlation = float(np.nanmedian(zncc)) if np.isfinite(zncc).any() else float("nan")
    return (
        f"{status.size} points, {100 * found.mean():.0f}% found" + (f" ({why})" if why else "")
        + f"; median |d| {median:.3g} vox, median ZNCC {correlation:.3f}"
    )  # fmt: skip


def series_summary(status: Any, dz: Any, dy: Any, dx: Any, zncc: Any) -> str:
    """E.g. ``'5 time points; the last: 512 points, 98% found (8 not_significant); median |d| 1.2 vox, median ZNCC
    0.991; the fewest found: 97% (time point 3)'``. Time point 0 is the reference itself: not counted."""
    status = np.asarray(status)
    last = volume_summary(status[-1], dz[-1], dy[-1], dx[-1], zncc[-1])
    found = (status[1:] == Status.ok).reshape(len(status) - 1, -1).mean(1)
    fewest = int(np.argmin(found))
    return (
        f"{len(status)} time points; the last: {last}; the fewest found: {100 * found[fewest]:.0f}% (time point "
        f"{fewest + 1})"
    )


def grid_placement(request: VolumeRequest) -> dict[str, Any]:
    """The results' placement: element ``(p, r, c)`` on the reference's voxel ``(h + s p, h + s r, h + s c)``
    (``h`` the subset's half, ``s`` the step: the kernel's grid); a series' element ``t`` on time point ``t``."""
    half, step = request.subset // 2, request.step
    if request.series:
        return derived_placement(request.frame, step=[1.0, step, step, step], offset=[0.0, half, half, half])
    return derived_placement(request.frame, step=step, offset=half)


# how each image layer reads: (colormap, how its contrast limits are chosen, its name's suffix)
STYLES = {
    "dz": ("coolwarm", "symmetric", "dz"),
    "dy": ("coolwarm", "symmetric", "dy"),
    "dx": ("coolwarm", "symmetric", "dx"),
    "zncc": ("viridis", "zncc", "ZNCC"),
    "volumetric": ("coolwarm", "symmetric", "volumetric strain"),
    "deviatoric": ("magma", "from zero", "deviatoric strain"),
}
LAYER_ORDER = ("zncc", *(f"e_{c}" for c in COMPONENTS), "deviatoric", "volumetric", "dx", "dy", "dz")  # bottom first


def _limits(values: np.ndarray, how: str) -> tuple[float, float]:
    low, high = contrast_limits(values, how)
    return (low, max(high, 1e-6)) if how == "from zero" else (low, high)  # a strain-free grid: a range all the same


def volume_layers(request: VolumeRequest, values: dict[str, Any], plan: Plan) -> list[LayerDataTuple]:
    """Bottom to top: the ZNCC, the strain components, the volumetric and deviatoric strains, dx, dy, dz (all
    hidden: a grid's blocks would hide the volume in 3D), the status (the lost points, coloured by why) and the
    arrows over the volume."""
    name = request.name
    placement = grid_placement(request)
    # the tensor's name before the component, short: napari's layer list elides a long name's middle, and "DVC
    # reference small strain yx" read "DVC reference...all strain yx"
    kind = "strain" if request.strain_kind == "small" else "Green-Lagrange"
    outputs = []
    for role in LAYER_ORDER:
        data = np.asarray(values[role], np.float32)
        colormap, how, suffix = STYLES.get(role, ("coolwarm", "symmetric", f"{kind} {role[2:]}"))
        meta = {"name": f"{name} {suffix}", "colormap": colormap, "contrast_limits": _limits(data, how),
                "visible": False, "rendering": "attenuated_mip" if how != "symmetric" else "mip"}  # fmt: skip
        outputs.append(Output(data, {**meta, **placement}, "image", role))
    features = {"index": np.arange(len(Status)), "status": [s.name for s in Status]}
    status_meta = {"name": f"{name} status", "colormap": STATUS_COLOURS, "features": features, **placement}
    outputs.append(Output(np.asarray(values["status"]), status_meta, "labels", "status"))
    if "vectors" in values:
        vectors = np.asarray(values["vectors"], np.float32)
        # a series' lengths from the time points after the first (time point 0's field is all zeros)
        later = slice(1, None) if request.series else slice(None)
        dz, dy, dx = (np.asarray(values[a])[later] for a in ("dz", "dy", "dx"))
        magnitude = np.sqrt(dz**2 + dy**2 + dx**2)
        median = float(np.nanmedian(magnitude)) if np.isfinite(magnitude).any() else float("nan")
        auto = auto_vector_length(dy, dx, request.step, median=median)
        length = request.vector_scale if request.vector_scale else auto
        moved = np.linalg.norm(vectors[:, 1], axis=1)
        meta = {
            "name": f"{name} displacement",
            "edge_width": max(0.15 * request.step, 0.5),
            "length": length,
            "vector_style": "arrow",
            **(
                {"features": {"magnitude": moved}, "edge_color": "magnitude", "edge_colormap": "plasma"}
                if len(vectors)
                else {"edge_color": "white"}
            ),
            "metadata": {"gridmip_auto_length": auto, "gridmip_step": request.step},
            **derived_placement(request.frame),
        }
        outputs.append(Output(vectors, meta, "vectors", "vectors"))
    return layer_tuples(outputs, widget=WIDGET, plan=plan)
