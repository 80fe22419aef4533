"""One plan per job: the widget's job and the command line's subcommand run the same plan on the same input and
options, give equal arrays, and the script each records reproduces them."""

from types import SimpleNamespace

import numpy as np
import pytest

from napari_gridmip._jobs.correlation import CorrelationRequest, make_correlation_job
from napari_gridmip._jobs.plan import KEY, Call, Plan, Source, script_from_layers
from napari_gridmip.cli import main as cli
from napari_gridmip.io import read_array
from tests.jobs.test_jobs import Steps, plain_frame


def by_role(result):
    return {meta["metadata"][KEY]["role"]: data for data, meta, _ in result.layers}


def replay_layers(result, layers: dict, monkeypatch) -> dict:
    """Run the Copy as Python script of a job's layers, with ``viewer.layers[name].data`` from ``layers``;
    return its ``results`` by layer role."""
    import napari

    shown = [
        SimpleNamespace(name=meta["metadata"][KEY]["role"], metadata=meta["metadata"]) for _, meta, _ in result.layers
    ]
    viewer = SimpleNamespace(layers={name: SimpleNamespace(data=data) for name, data in layers.items()})
    monkeypatch.setattr(napari, "current_viewer", lambda: viewer)
    namespace: dict = {}
    exec(compile(script_from_layers(shown), "<copy as python>", "exec"), namespace)
    return namespace["results"]


def replay_file(record: dict) -> dict:
    """Run the script a command line output carries; return its ``results``."""
    namespace: dict = {}
    exec(compile(record["python"], "<provenance>", "exec"), namespace)
    return namespace["results"]


def zarr_record(path):
    import zarr

    return zarr.open(str(path), mode="r").attrs[KEY]


def test_a_call_runs_what_it_records():
    """The values a Call evaluates with are the ones its code prints (lists back to tuples), and its result's
    names are bound as the script binds them."""
    call = Call("mipmap_shapes", (), ([9, 5, 3],), {}, result="shapes")
    assert call.code() == "shapes = gm.mipmap_shapes((9, 5, 3))"
    assert call.evaluate({}) == {"shapes": [(9, 5, 3), (5, 3, 2), (3, 2, 1), (2, 1, 1), (1, 1, 1)]}
    unpacked = Call("occupied_bbox", ("levels",), result="box")
    plan = Plan([Source("levels", expression="gm.occupancy_mipmap(np.eye(4)[None].repeat(4, 0) > 0)")],
                [unpacked], {"lo": "box.lo"})  # fmt: skip
    assert plan.run({}) == {"lo": (0, 0, 0)}
    with pytest.raises(ValueError, match="no value given for the input 'v'"):
        Plan([Source("v", layer="volume")], [], {}).run({})


def test_merge(tmp_path, monkeypatch):
    from napari_gridmip import extract_patches
    from napari_gridmip._jobs.patches import MergeRequest, make_merge_job

    rng = np.random.default_rng(0)
    patches = np.asarray(extract_patches(rng.random((40, 44), dtype=np.float32), (16, 16), (12, 12)))
    np.save(tmp_path / "p.npy", patches)
    cli(["merge", str(tmp_path / "p.npy"), str(tmp_path / "m.zarr"), "--stride", "12", "12", "--image-shape",
         "40", "44", "--blend", "hann", "--quiet"])  # fmt: skip
    from_cli = read_array(tmp_path / "m.zarr").compute()
    result = make_merge_job(MergeRequest("p", patches, (40, 44), (12, 12), "hann", plain_frame(4), (2, 3))).run(Steps())
    np.testing.assert_array_equal(by_role(result)["merged"], from_cli)
    np.testing.assert_array_equal(np.asarray(replay_file(zarr_record(tmp_path / "m.zarr"))["merged"]), from_cli)
    np.testing.assert_array_equal(np.asarray(replay_layers(result, {"p": patches}, monkeypatch)["merged"]), from_cli)


@pytest.fixture(scope="module")
def stretched(tmp_path_factory):
    """A DIC pair whose surface is stretched uniformly by 1% along x (exx = 0.010, eyy = exy = 0)."""
    import tifffile

    from napari_gridmip._sample_data.dic import make_dic_pair

    shape = (96, 128)
    dx = 0.01 * (np.arange(shape[1], dtype=float) - shape[1] / 2)[None, :].repeat(shape[0], 0)
    reference, deformed, _ = make_dic_pair(shape, field={"dy": 0.0, "dx": dx}, seed=2)
    folder = tmp_path_factory.mktemp("stretch")
    tifffile.imwrite(folder / "ref.tif", reference)
    tifffile.imwrite(folder / "def.tif", deformed)
    return folder, reference, deformed


def _correlate(folder, out, *options):
    cli(["correlate", str(folder / "def.tif"), str(folder / "ref.tif"), str(out), "--window", "7", "7", *options,
         "--quiet"])  # fmt: skip
    import zarr

    return zarr.open_group(str(out), mode="r")


def test_correlation_pair_with_step_phase_and_strain(stretched, tmp_path, monkeypatch):
    folder, reference, deformed = stretched
    options = ["--subset", "15", "15", "--step", "4", "--subpixel", "refine", "--outputs", "phase,strain"]
    field = _correlate(folder, tmp_path / "d.zarr", *options)
    request = CorrelationRequest("def", "ref", deformed, reference, plain_frame(2), (7, 7), subpixel="refine",
                                 subset=(15, 15), step=4, outputs=("phase", "strain"), index="[None]")  # fmt: skip
    result = make_correlation_job(request).run(Steps())
    layers = by_role(result)
    names = ("dy", "dx", "peak", "phase", "exx", "eyy", "exy")
    assert sorted(field.array_keys()) == sorted(names)
    replayed_file = replay_file(field.attrs[KEY])
    replayed_layers = replay_layers(result, {"def": deformed, "ref": reference}, monkeypatch)
    for name in names:
        np.testing.assert_array_equal(layers[name], field[name][:], err_msg=name)
        np.testing.assert_array_equal(np.asarray(replayed_file[name]), field[name][:], err_msg=name)
        np.testing.assert_array_equal(np.asarray(replayed_layers[name]), field[name][:], err_msg=name)


def test_affine_subsets_with_strain_from_their_gradients(stretched, tmp_path, monkeypatch):
    """shape='affine' in the widget's job and `correlate --shape affine` run one plan: equal arrays, the strain from
    the subsets' own gradients (a 1% stretch: exx 0.010 without a plane fit), and both scripts reproduce them."""
    folder, reference, deformed = stretched
    options = ["--subset", "21", "21", "--step", "4", "--subpixel", "refine", "--shape", "affine", "--outputs",
               "strain"]  # fmt: skip
    field = _correlate(folder, tmp_path / "a.zarr", *options)
    request = CorrelationRequest("def", "ref", deformed, reference, plain_frame(2), (7, 7), subpixel="refine",
                                 subset=(21, 21), step=4, outputs=("strain",), index="[None]",
                                 shape="affine")  # fmt: skip
    result = make_correlation_job(request).run(Steps())
    layers = by_role(result)
    assert abs(np.nanmedian(field["exx"][:]) - 0.010) < 0.0005
    script = field.attrs[KEY]["python"]
    assert 'shape="affine"' in script.replace("'", '"') and "gradients=(field.dy_y" in script
    replayed_file = replay_file(field.attrs[KEY])
    replayed_layers = replay_layers(result, {"def": deformed, "ref": reference}, monkeypatch)
    for name in ("dy", "dx", "peak", "exx", "eyy", "exy"):
        np.testing.assert_array_equal(layers[name], field[name][:], err_msg=name)
        np.testing.assert_array_equal(np.asarray(replayed_file[name]), field[name][:], err_msg=name)
        np.testing.assert_array_equal(np.asarray(replayed_layers[name]), field[name][:], err_msg=name)
    with pytest.raises(ValueError, match="whose subsets translate only"):
        make_correlation_job(
            CorrelationRequest(
                "def",
                "ref",
                deformed,
                reference,
                plain_frame(2),
                (7, 7),
                subpixel="refine",
                subset=(21, 21),
                outputs=("uncertainty",),
                index="[None]",
                shape="affine",
            )  # fmt: skip
        )


def test_dic_uncertainty_keeps_the_prefiltered_field(stretched):
    """Ticking uncertainty makes the field track_speckles' (on img1's grid), with the prefilter find_displacement
    applies by default: it is find_displacement's field of the swapped pair, negated; with a dark-field output the
    prefilter stays off (it would change the dark-field)."""
    from napari_gridmip import find_displacement
    from napari_gridmip._jobs.correlation import search_options

    folder, reference, deformed = stretched
    common = {"subpixel": "refine", "subset": (21, 21), "step": 4, "index": "[None]"}
    tracked = make_correlation_job(
        CorrelationRequest(
            "def", "ref", deformed, reference, plain_frame(2), (7, 7), outputs=("uncertainty",), **common
        )  # fmt: skip
    ).run(Steps())
    swapped = find_displacement(reference[None], deformed[None], (7, 7), subset=(21, 21), step=4, subpixel="refine")
    np.testing.assert_allclose(by_role(tracked)["dx"], -np.asarray(swapped.dx), atol=1e-5)
    dark = CorrelationRequest("def", "ref", deformed, reference, plain_frame(2), (7, 7), outputs=("dark_field",),
                              **common)  # fmt: skip
    assert "prefilter" not in search_options(dark)


def test_strain_and_phase_with_a_step_are_per_pixel(stretched, tmp_path):
    """A uniform 1% stretch sampled every 4th pixel: strain 0.010 (the samples are 4 px apart), not 0.040; and the
    phase's gradient per pixel is the displacement, not a quarter of it."""
    folder = stretched[0]
    options = ["--subset", "21", "21", "--step", "4", "--subpixel", "refine", "--outputs", "strain,phase"]
    field = _correlate(folder, tmp_path / "s.zarr", *options)
    inner = (slice(3, -3), slice(3, -3))
    exx = field["exx"][:][inner]
    assert abs(np.nanmedian(exx) - 0.010) < 0.001, np.nanmedian(exx)
    assert abs(np.nanmedian(field["eyy"][:][inner])) < 0.001
    dx, phase = field["dx"][:], field["phase"][:]
    slope = np.gradient(phase, 4.0, axis=1)[inner]  # d(phase)/dx per pixel, the samples 4 px apart
    assert abs(np.nanmedian(slope / dx[inner]) - 1) < 0.05  # 0.25 when the phase took the samples as 1 px apart


def test_tracking_outputs(tmp_path, monkeypatch):
    import tifffile

    from napari_gridmip._sample_data import make_speckle_pair

    a, b, _ = make_speckle_pair(shape=(48, 48))
    tifffile.imwrite(tmp_path / "a.tif", a)
    tifffile.imwrite(tmp_path / "b.tif", b)
    cli(["correlate", str(tmp_path / "a.tif"), str(tmp_path / "b.tif"), str(tmp_path / "t.zarr"), "--window", "7",
         "7", "--subset", "3", "3", "--outputs", "transmission,uncertainty", "--quiet"])  # fmt: skip
    import zarr

    field = zarr.open_group(str(tmp_path / "t.zarr"), mode="r")
    request = CorrelationRequest("a", "b", a, b, plain_frame(3), (7, 7), subset=(3, 3),
                                 outputs=("transmission", "uncertainty"), frame1=plain_frame(3))  # fmt: skip
    result = make_correlation_job(request).run(Steps())
    layers = by_role(result)
    replayed = replay_layers(result, {"a": a, "b": b}, monkeypatch)
    for name in ("dy", "dx", "peak", "transmission", "sigma_dy", "sigma_dx"):
        np.testing.assert_array_equal(layers[name], field[name][:], err_msg=name)
        np.testing.assert_array_equal(np.asarray(replayed[name]), field[name][:], err_msg=name)
        np.testing.assert_array_equal(np.asarray(replay_file(field.attrs[KEY])[name]), field[name][:], err_msg=name)


def test_timeseries(tmp_path, monkeypatch):
    import tifffile

    from napari_gridmip._jobs.timeseries import TimeSeriesRequest, make_timeseries_job
    from napari_gridmip._sample_data.calcium import make_calcium_movie

    movie = make_calcium_movie(frames=40, shape=(24, 28), cells=4).movie
    tifffile.imwrite(tmp_path / "movie.tif", movie)
    cli(["corrimage", str(tmp_path / "movie.tif"), str(tmp_path / "cn.zarr"), "--neighbours", "4", "--quiet"])
    from_cli = read_array(tmp_path / "cn.zarr").compute()
    result = make_timeseries_job(TimeSeriesRequest("movie", movie, plain_frame(3), neighbours=4)).run(Steps())
    np.testing.assert_array_equal(by_role(result)["correlation image"], from_cli)
    replayed = replay_file(zarr_record(tmp_path / "cn.zarr"))["correlation image"]
    np.testing.assert_array_equal(np.asarray(replayed), from_cli)
    replayed = replay_layers(result, {"movie": movie}, monkeypatch)["correlation image"]
    np.testing.assert_array_equal(np.asarray(replayed), from_cli)


def test_stitch(tmp_path, monkeypatch):
    import json

    import tifffile

    from napari_gridmip._jobs.stitch import StitchRequest, make_stitch_job
    from napari_gridmip._sample_data.mosaic import make_mosaic

    sample = make_mosaic(grid_shape=(2, 2), tile_shape=(48, 48), overlap=0.25, stage_error=2, seed=1)
    tiles = np.asarray(sample.tiles, dtype=np.float32)
    np.save(tmp_path / "tiles.npy", tiles)
    cli(["stitch", str(tmp_path / "tiles.npy"), str(tmp_path / "m.tif"), "--grid", "2", "2", "--overlap", "0.25",
         "--max-shift", "4", "--order", "snake", "--quiet"])  # fmt: skip
    from_cli = tifffile.imread(tmp_path / "m.tif")
    request = StitchRequest("t", tiles, plain_frame(3), (2, 2), 0.25, order="snake", max_shift=4)
    result = make_stitch_job(request).run(Steps())
    np.testing.assert_array_equal(by_role(result)["mosaic"], from_cli)
    record = json.loads(tifffile.TiffFile(tmp_path / "m.tif").pages[0].description)[KEY]
    assert [c["function"] for c in record["calls"]] == [
        "napari_gridmip.grid_positions", "napari_gridmip.register_tiles", "napari_gridmip.fuse_tiles"
    ]  # fmt: skip
    np.testing.assert_array_equal(np.asarray(replay_file(record)["mosaic"]), from_cli)
    np.testing.assert_array_equal(np.asarray(replay_layers(result, {"t": tiles}, monkeypatch)["mosaic"]), from_cli)


def test_stitch_folder_positions_come_from_grid_positions(tmp_path):
    """Tiles named by their grid index: the stage is grid_positions' row-major grid taken in the files' order."""
    import tifffile

    from napari_gridmip import grid_positions
    from napari_gridmip._sample_data.mosaic import make_mosaic

    sample = make_mosaic(grid_shape=(2, 2), tile_shape=(48, 48), overlap=0.25, stage_error=2, seed=1)
    for t, (r, c) in enumerate(np.ndindex(2, 2)):
        tifffile.imwrite(tmp_path / f"tile_{r}_{c}.tif", np.asarray(sample.tiles[t], dtype=np.float32))
    cli(["stitch", str(tmp_path), str(tmp_path / "m.ome.zarr"), "--pattern", "tile_{row}_{col}.tif", "--overlap",
         "0.25", "--max-shift", "4", "--quiet"])  # fmt: skip
    record = zarr_record(tmp_path / "m.ome.zarr")
    stage_call = record["calls"][0]
    assert stage_call["function"] == "napari_gridmip.grid_positions" and stage_call["index"] == "[[0, 1, 2, 3]]"
    namespace: dict = {}
    exec(compile(record["python"], "<provenance>", "exec"), namespace)
    np.testing.assert_array_equal(namespace["stage"], grid_positions((2, 2), (48, 48), 0.25))
    np.testing.assert_array_equal(np.asarray(namespace["results"]["mosaic"]), read_array(tmp_path / "m.ome.zarr"))


def test_mipmap(tmp_path, monkeypatch):
    from napari_gridmip._jobs.mipmap import MipmapRequest, make_mipmap_job

    rng = np.random.default_rng(1)
    volume = (rng.random((20, 24, 28)) > 0.97).astype(np.float32)
    np.save(tmp_path / "v.npy", volume)
    cli(["mipmap", str(tmp_path / "v.npy"), str(tmp_path / "v.ome.zarr"), "--threshold", "0.5", "--quiet"])
    import zarr

    group = zarr.open_group(str(tmp_path / "v.ome.zarr"), mode="r")
    result = make_mipmap_job(MipmapRequest("v", volume, plain_frame(3), threshold=0.5, per_level=True)).run(Steps())
    roles = by_role(result)
    levels = [k for k in range(10) if f"level {k}" in roles]
    assert len(levels) > 3
    for k in levels:
        np.testing.assert_array_equal(np.asarray(roles[f"level {k}"]), group[f"s{k}"][:], err_msg=f"level {k}")
    shown = result.details["level"]
    np.testing.assert_array_equal(roles["occupancy"].astype(bool), group[f"s{shown}"][:])
    replayed = replay_layers(result, {"v": volume}, monkeypatch)
    np.testing.assert_array_equal(np.asarray(replayed["occupancy"]), group[f"s{shown}"][:])


def test_tiled_script_reproduces_the_job(monkeypatch):
    """No subcommand runs tiles; the job's own plan, printed, gives its result again."""
    from napari_gridmip._jobs.tiled import TiledRequest, make_tiled_job

    image = np.random.default_rng(2).random((70, 66), dtype=np.float32)
    result = make_tiled_job(TiledRequest("i", image, plain_frame(2), "gaussian", (32, 32), {"sigma": 2.0})).run(Steps())
    replayed = replay_layers(result, {"i": image}, monkeypatch)["result"]
    np.testing.assert_array_equal(np.asarray(replayed), by_role(result)["result"])


def test_correlate_help_names_phase_and_strain():
    from napari_gridmip.cli import build_parser

    parser = build_parser()
    correlate = next(a for a in parser._subparsers._group_actions if a.choices).choices["correlate"]
    text = " ".join(correlate.format_help().split())
    assert "where this version has them" not in text
    assert "phase (integrate_gradient" in text and "strain (strain_field" in text and "--strain-window" in text


def test_a_plan_knows_its_layers():
    """The re-run's "is this my layer" test reads the plan: same widget, input layers and output."""
    from napari_gridmip._jobs.timeseries import TimeSeriesRequest, timeseries_plan

    plan = timeseries_plan(TimeSeriesRequest("movie", None, plain_frame(3)))
    metadata = {KEY: plan.provenance(widget="correlation", role="correlation image")}
    assert plan.matches(metadata, widget="correlation", role="correlation image")
    assert not plan.matches(metadata, widget="mipmap", role="correlation image")
    other = timeseries_plan(TimeSeriesRequest("another movie", None, plain_frame(3), neighbours=4))
    assert not other.matches(metadata, widget="correlation", role="correlation image")
    assert timeseries_plan(TimeSeriesRequest("movie", None, plain_frame(3), neighbours=4)).matches(
        metadata, widget="correlation", role="correlation image"
    )  # other options, same inputs: a re-run replaces it


def test_the_tracking_outputs_are_one_list():
    """The jobs' tracking parts are track_speckles' own fields (SpeckleTracking, in the kernel's order)."""
    import dataclasses

    from napari_gridmip._jobs.correlation import PARTS, TRACKING_OUTPUTS
    from napari_gridmip.core.correlation.tracking import TRACK_OUTPUTS, SpeckleTracking

    assert TRACK_OUTPUTS == tuple(f.name for f in dataclasses.fields(SpeckleTracking))
    assert {part for name in TRACKING_OUTPUTS for part in PARTS[name]} <= set(TRACK_OUTPUTS)


@pytest.mark.parametrize("lazy", [False, True])
def test_render(lazy, monkeypatch):
    """No subcommand renders; the Render button's job is its plan evaluated (a lazy volume: the pyramid from level
    1 and the threshold, no chunk read to make level 0), and the recorded script gives the same pictures."""
    import dask.array as da

    from napari_gridmip import occupancy_mipmap, render_volume
    from napari_gridmip._jobs.mipmap import Camera, MipmapRequest, make_mipmap_job, make_render_job, view_rays

    rng = np.random.default_rng(3)
    volume = np.where(rng.random((18, 21, 16)) > 0.93, rng.random((18, 21, 16)) * 3, 0).astype(np.float32)
    data = da.from_array(volume, chunks=6) if lazy else volume
    frame = plain_frame(3, scale=(2.0, 1.0, 1.0))
    pyramid = make_mipmap_job(MipmapRequest("v", data, frame, threshold=0.7)).run(Steps()).details["pyramid"]
    camera = Camera((18.0, 10.5, 8.0), (1.0, 0.3, -0.2), (0.0, -1.0, 0.0), True, 1.4, (36, 30))
    rays = view_rays(camera, frame, volume.shape)
    for mode in ("mip", "first_hit"):
        result = make_render_job(pyramid, 0.7, camera, mode=mode, display={}).run(Steps())
        image = by_role(result)[f"render {mode}"]
        exact = render_volume(volume, occupancy_mipmap(volume, threshold=0.7), rays.origins, rays.directions,
                              mode=mode)  # fmt: skip
        np.testing.assert_array_equal(image, exact)
        assert np.isfinite(image).sum() > 20
        record = result.layers[0][1]["metadata"][KEY]
        assert [c["function"] for c in record["calls"]] == ["napari_gridmip.occupancy_mipmap",
                                                             "napari_gridmip.render_volume"]  # fmt: skip
        assert (record["calls"][0].get("index") == "[1:]") == lazy
        replayed = replay_layers(result, {"v": data}, monkeypatch)[f"render {mode}"]
        np.testing.assert_array_equal(np.asarray(replayed), image)
