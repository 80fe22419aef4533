"""The command line's parser: every subcommand and flag it had before it was split into one module per subcommand
is still there, with the same arguments; ``rates`` is a subcommand; a new subcommand is a module and one line."""

import argparse
import sys
import types

import pytest

from napari_gridmip import cli

# Every option and positional of the parser before the split, by subcommand ("" the top level): dest, nargs,
# choices, required, type and default.
BEFORE = {
    "": {
        "--sample": (
            "sample",
            None,
            (
                "occupancy",
                "sparse-volume",
                "tiles",
                "mosaic",
                "speckle",
                "speckle-contrast",
                "dic",
                "dic-series",
                "calcium",
                "dvc",
            ),
            False,
            None,
            "occupancy",
        ),
        "--no-sample": ("no_sample", 0, None, False, None, False),
        "--prepare": ("prepare", 0, None, False, None, False),
        "--force": ("force", 0, None, False, None, False),
        "--background": ("background", 0, None, False, None, False),
        "--compute-on": ("prepare_compute_on", None, ("auto", "accelerator", "host"), False, None, None),
    },
    "mipmap": {
        "input": ("input", None, None, True, None, None),
        "output": ("output", None, None, True, None, None),
        "--threshold": ("threshold", None, None, False, "float", 0.0),
        "--scale": ("scale", 3, None, False, "float", None),
        "--packed": ("packed", 0, None, False, None, False),
        "--packed-order": ("packed_order", None, ("morton", "c"), False, None, "morton"),
        "--bbox": ("bbox", 0, None, False, None, False),
        "--scheduler": ("scheduler", None, None, False, None, None),
        "--overwrite": ("overwrite", 0, None, False, None, False),
        "--quiet": ("quiet", 0, None, False, None, False),
        "--compute-on": ("compute_on", None, ("auto", "accelerator", "host"), False, None, None),
    },
    "merge": {
        "input": ("input", None, None, True, None, None),
        "output": ("output", None, None, True, None, None),
        "--stride": ("stride", "+", None, True, "int", None),
        "--image-shape": ("image_shape", "+", None, False, "int", None),
        "--blend": ("blend", None, None, False, None, "mean"),
        "--scheduler": ("scheduler", None, None, False, None, None),
        "--overwrite": ("overwrite", 0, None, False, None, False),
        "--quiet": ("quiet", 0, None, False, None, False),
        "--compute-on": ("compute_on", None, ("auto", "accelerator", "host"), False, None, None),
    },
    "correlate": {
        "img1": ("img1", None, None, True, None, None),
        "img2": ("img2", None, None, True, None, None),
        "output": ("output", None, None, True, None, None),
        "--window": ("window", 2, None, True, "int", None),
        "--subset": ("subset", 2, None, False, "int", (1, 1)),
        "--step": ("step", None, None, False, "int", 1),
        "--subpixel": ("subpixel", None, None, False, None, "hessian"),
        "--shape": ("shape", None, ("translation", "affine"), False, None, "translation"),
        "--outputs": ("outputs", None, None, False, None, ""),
        "--strain-window": ("strain_window", None, None, False, "int", 11),
        "--dtype": ("dtype", None, ("float32", "float64"), False, None, "float32"),
        "--scheduler": ("scheduler", None, None, False, None, None),
        "--overwrite": ("overwrite", 0, None, False, None, False),
        "--quiet": ("quiet", 0, None, False, None, False),
        "--compute-on": ("compute_on", None, ("auto", "accelerator", "host"), False, None, None),
    },
    "stitch": {
        "tiles": ("tiles", None, None, True, None, None),
        "output": ("output", None, None, True, None, None),
        "--grid": ("grid", "+", None, False, "int", None),
        "--overlap": ("overlap", None, None, False, "float", None),
        "--order": ("order", None, None, False, None, None),
        "--max-shift": ("max_shift", None, None, False, "_max_shift", "auto"),
        "--pattern": ("pattern", None, None, False, None, None),
        "--blend": ("blend", None, None, False, None, "linear"),
        "--channel": ("channel", None, None, False, "int", None),
        "--flat-field": ("flat_field", 0, None, False, None, False),
        "--tile-configuration": ("tile_configuration", 0, None, False, None, False),
        "--scheduler": ("scheduler", None, None, False, None, None),
        "--overwrite": ("overwrite", 0, None, False, None, False),
        "--quiet": ("quiet", 0, None, False, None, False),
        "--compute-on": ("compute_on", None, ("auto", "accelerator", "host"), False, None, None),
    },
    "corrimage": {
        "movie": ("movie", None, None, True, None, None),
        "output": ("output", None, None, True, None, None),
        "--neighbours": ("neighbours", None, (8, 4), False, "int", 8),
        "--dtype": ("dtype", None, ("float32", "float64"), False, None, "float32"),
        "--chunk-frames": ("chunk_frames", None, None, False, "int", None),
        "--scheduler": ("scheduler", None, None, False, None, None),
        "--overwrite": ("overwrite", 0, None, False, None, False),
        "--quiet": ("quiet", 0, None, False, None, False),
        "--compute-on": ("compute_on", None, ("auto", "accelerator", "host"), False, None, None),
    },
    "correlate-series": {
        "frames": ("frames", None, None, True, None, None),
        "--out": ("out", None, None, True, None, None),
        "--subset": ("subset", "+", None, False, "int", (31,)),
        "--step": ("step", None, None, False, "int", 8),
        "--roi": ("roi", None, None, False, None, None),
        "--reference": ("reference", None, ("accumulated", "incremental", "auto"), False, None, "accumulated"),
        "--strain": ("strain", None, ("green-lagrange", "small"), False, None, "green-lagrange"),
        "--shape": ("shape", None, ("affine", "rigid"), False, None, "affine"),
        "--max-sigma": ("max_sigma", None, None, False, "float", 0.1),
        "--refresh-zncc": ("refresh_zncc", None, None, False, "float", 0.95),
        "--overwrite": ("overwrite", 0, None, False, None, False),
        "--quiet": ("quiet", 0, None, False, None, False),
        "--compute-on": ("compute_on", None, ("auto", "accelerator", "host"), False, None, None),
    },
}


# What changed on purpose: two single images get a subset of their own without --subset (a one-pixel subset of one
# frame holds one value, which has no correlation), so the default is "not given".
CHANGED_DEFAULTS = {("correlate", "--subset"): None}


def describe(parser: argparse.ArgumentParser) -> dict:
    out = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        key = action.option_strings[0] if action.option_strings else action.dest
        default = tuple(action.default) if isinstance(action.default, list) else action.default
        choices = tuple(action.choices) if action.choices else None
        out[key] = (action.dest, action.nargs, choices, action.required, getattr(action.type, "__name__", None),
                    default)  # fmt: skip
    return out


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_subcommand_and_flag_is_still_there():
    parser = cli.build_parser()
    now = {"": describe(parser), **{name: describe(sub) for name, sub in subparsers(parser).items()}}
    for command, arguments in BEFORE.items():
        assert command in now, f"subcommand {command!r} is gone"
        assert list(now[command])[: len(arguments)] == list(arguments), command  # same flags, same order
        for key, before in arguments.items():
            if (command, key) in CHANGED_DEFAULTS:
                before = (*before[:-1], CHANGED_DEFAULTS[command, key])
            assert now[command][key] == before, (command, key)
    assert set(now) - set(BEFORE) == {"rates", "correlate-volumes"}  # the subcommands added since
    assert describe(subparsers(parser)["rates"]) == {"--again": ("again", 0, None, False, None, False)}


def test_rates_is_listed_in_help_and_runs(capsys):
    parser = cli.build_parser()
    assert "rates" in parser.format_help()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["rates", "--help"])
    assert exit_.value.code == 0 and "example:\n  napari-gridmip rates --again" in capsys.readouterr().out


def test_a_new_subcommand_is_a_module_and_one_line(monkeypatch, capsys):
    """What another subcommand needs: its module (NAME, HELP, EXAMPLE, BATCH, add_arguments, run) and its name in
    COMMANDS; main runs it inside the batch runner, with the shared options."""
    module = types.ModuleType("napari_gridmip.cli.echo")
    module.NAME, module.HELP, module.EXAMPLE, module.BATCH = "echo", "Print a word.", "napari-gridmip echo hi", True

    def add_arguments(sub):
        sub.add_argument("word")
        cli._shared.add_batch_options(sub)

    def run(args, compute):
        print(args.word, callable(compute), args.overwrite)

    module.add_arguments, module.run = add_arguments, run
    monkeypatch.setitem(sys.modules, "napari_gridmip.cli.echo", module)
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "echo"))
    assert "echo" in subparsers(cli.build_parser())
    cli.main(["echo", "hi", "--overwrite", "--quiet"])
    assert capsys.readouterr().out == "hi True True\n"


def test_correlate_volumes_takes_the_batch_options_with_a_scheduler():
    """``correlate-volumes`` runs its slabs on a dask.distributed cluster with ``--scheduler``, as ``mipmap`` does."""
    now = describe(subparsers(cli.build_parser())["correlate-volumes"])
    assert list(now)[-4:] == ["--scheduler", "--overwrite", "--quiet", "--compute-on"]
    assert now["--scheduler"] == BEFORE["mipmap"]["--scheduler"]
