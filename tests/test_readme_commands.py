"""Every shell command of README.md runs as written.

Each ```bash (or ```sh, ```shell, ```console) block of the README is parsed, whatever the blocks are: its commands
(``a && b`` is two, a trailing backslash continues a line, ``$`` prompts and comments are dropped) run in order in a
fresh folder of their block, each as a test of its own. ``napari-gridmip`` subcommands run for real, in a new
process as a user runs them; an input file they name that the block did not make is made first, small
(:func:`make_input`). Checked differently, each with its reason: ``pip install`` lines are skipped (they change the
environment the suite runs in); ``napari-gridmip`` with no subcommand opens a window, so its options are parsed and
``napari-gridmip --help`` runs instead; ``napari-gridmip --prepare`` compiles every widget's programs (minutes; its
own tests are tests/cli/test_prepare.py), so its options are parsed; ``python -m pytest`` is this suite itself.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SHELLS = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


def shell_blocks(text: str) -> list[list[list[str]]]:
    """The commands (each its words) of each shell block of a Markdown text, in order."""
    blocks, lines, closing = [], None, None
    for line in text.splitlines():
        fence = FENCE.match(line)
        if closing is None:
            if fence:  # an opening fence: a shell block is kept, any other skipped to its closing fence
                closing, lines = fence.group(1), [] if fence.group(2).lower() in SHELLS else None
            continue
        if fence and fence.group(1).startswith(closing) and not fence.group(2):
            if lines is not None:
                blocks.append(commands_of(lines))
            closing, lines = None, None
        elif lines is not None:
            lines.append(line)
    return blocks


def commands_of(lines: list[str]) -> list[list[str]]:
    """A block's commands: continuation lines joined, prompts and comments dropped, ``&&`` split."""
    joined, current = [], ""
    for line in lines:
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        text = re.sub(r"^\s*\$\s+", "", current).strip()
        current = ""
        if text and not text.startswith("#"):
            joined.append(text)
    commands = []
    for text in joined:
        lexer = shlex.shlex(text, posix=True, punctuation_chars="&")
        lexer.whitespace_split = True
        words, part = list(lexer), []
        for word in [*words, "&&"]:
            if word == "&&":
                if part:
                    commands.append(part)
                part = []
            else:
                part.append(word)
    return commands


BLOCKS = shell_blocks(README.read_text(encoding="utf-8"))
CASES = [(b, c, words) for b, block in enumerate(BLOCKS) for c, words in enumerate(block)]


def test_the_readme_has_commands_to_run():
    """The parser finds the README's shell blocks (a README without any would leave this file testing nothing)."""
    assert CASES, f"no shell block in {README}"
    text = "```python\nx = 1\n```\n```bash\n$ a 'b c' \\\n  d && e\n# note\n```"
    assert shell_blocks(text) == [[["a", "b c", "d"], ["e"]]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each block's own folder, shared by its commands (a later command reads what an earlier one wrote)."""
    made: dict[int, Path] = {}

    def folder(block: int) -> Path:
        if block not in made:
            made[block] = tmp_path_factory.mktemp(f"readme-block-{block}")
        return made[block]

    return folder


@pytest.mark.parametrize(("block", "index", "words"), CASES, ids=[f"{b}.{c}:{' '.join(w[:2])}" for b, c, w in CASES])
def test_readme_command(block, index, words, folders):
    command, program = " ".join(words), words[0]
    folder = folders(block)
    if program in ("pip", "pip3") or (program.startswith("python") and words[1:3] == ["-m", "pip"]):
        pytest.skip(f"not run: {command!r} installs packages into the environment the suite runs in")
    if program.startswith("python") and words[1:3] == ["-m", "pytest"]:
        pytest.skip(f"not run: {command!r} is this test suite itself")
    if program == "napari-gridmip":
        _napari_gridmip(words[1:], folder)
        return
    # python as this suite's; any other shell command (mkdir, ls ...) through the shell as written
    argv = [sys.executable, *words[1:]] if program.startswith("python") else ["bash", "-c", shlex.join(words)]
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"


def _napari_gridmip(args: list[str], folder: Path) -> None:
    """A ``napari-gridmip`` command line: a subcommand runs (its missing inputs made small first); the viewer and
    ``--prepare`` are parsed, and the viewer's ``--help`` runs."""
    from napari_gridmip.cli import build_parser

    parsed = build_parser().parse_args(args)  # exits (failing the test) on an option the parser does not take
    run = [sys.executable, "-m", "napari_gridmip"]
    if parsed.command is None:
        done = subprocess.run([*run, "--help"], cwd=folder, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "napari-gridmip" in done.stdout, done.stderr
        if parsed.prepare:
            pytest.skip("parsed only: napari-gridmip --prepare compiles every widget's programs (minutes)")
        return
    for name in INPUTS.get(parsed.command, ()):
        path = getattr(parsed, name, None)
        if path is not None and not (folder / path).exists():
            make_input(parsed, name, folder / path)
    done = subprocess.run([*run, *args], cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"napari-gridmip {shlex.join(args)}\n{done.stderr}"


# the input arguments of each subcommand, which make_input can make
INPUTS = {
    "mipmap": ("input",),
    "merge": ("input",),
    "correlate": ("img1", "img2"),
    "stitch": ("tiles",),
    "corrimage": ("movie",),
    "correlate-series": ("frames", "roi"),
    "correlate-volumes": ("reference", "deformed", "roi"),
}


def make_input(args, name: str, path: Path) -> None:
    """A small input for argument ``name`` of the parsed subcommand ``args``, at ``path``, fitting its options."""
    from napari_gridmip import extract_patches

    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    command = args.command
    if command == "mipmap":
        _write(rng.random((32, 32, 32), dtype=np.float32) ** 8, path)
    elif command == "merge":
        shape = tuple(args.image_shape or (3, 128, 128))
        stride = tuple(args.stride)
        _write(np.asarray(extract_patches(rng.random(shape, dtype=np.float32), stride, stride)), path)
    elif command == "correlate":
        single = args.subset is not None or args.shape == "affine"  # DIC: two images; else two stacks
        shape = (96, 96) if single else (4, 96, 96)
        image = np.random.default_rng(1).random(shape, dtype=np.float32)
        _write(image if name == "img2" else np.roll(image, 2, axis=-1), path)
    elif command == "corrimage":
        from napari_gridmip._sample_data.calcium import make_calcium_movie

        _write(make_calcium_movie(frames=40, shape=(32, 40), cells=4).movie, path)
    elif command == "correlate-series" and name == "frames":
        from napari_gridmip._sample_data.dic_series import make_dic_series

        _write(np.asarray(make_dic_series("translation", frames=3, shape=(96, 96))[0]), path)
    elif command == "correlate-series":
        _write(np.ones((96, 96), np.uint8), path)
    elif command == "correlate-volumes" and name != "roi":
        from napari_gridmip._sample_data.dvc import make_dvc_pair

        reference, deformed, _ = make_dvc_pair((48, 48, 48))
        _write(reference if name == "reference" else deformed, path)
    elif command == "correlate-volumes":
        _write(np.ones((48, 48, 48), np.uint8), path)
    elif command == "stitch":
        _make_tiles(args, path)
    else:
        pytest.fail(f"no small input for {command} {name} {path.name}: teach make_input")


def _make_tiles(args, path: Path) -> None:
    """Tiles of one random picture on a grid (``--grid``, else 2 x 2; ``--overlap``, else 0.5): a folder named by
    ``--pattern``, a stack file, or a Fiji TileConfiguration.txt with its tiles beside it."""
    import tifffile

    from napari_gridmip.io import write_tile_configuration

    grid = tuple(args.grid or (2, 2))
    size, overlap = 64, args.overlap if args.overlap is not None else 0.5
    step = int(round(size * (1 - overlap)))
    picture = np.random.default_rng(2).random(tuple(step * (g - 1) + size for g in grid), dtype=np.float32)
    indices = list(np.ndindex(*grid))
    tiles = [picture[tuple(slice(i * step, i * step + size) for i in index)] for index in indices]
    if args.pattern:
        path.mkdir(parents=True, exist_ok=True)
        fields = ("plane", "row", "col")[3 - len(grid) :]
        for t, (index, tile) in enumerate(zip(indices, tiles)):
            tifffile.imwrite(path / args.pattern.format(index=t, **dict(zip(fields, index))), tile)
    elif path.name.lower().endswith(".txt"):
        names = [f"tile_{t:03d}.tif" for t in range(len(tiles))]
        for name, tile in zip(names, tiles):
            tifffile.imwrite(path.parent / name, tile)
        positions = np.array([[i * step for i in index] for index in indices], dtype=float)
        write_tile_configuration(names, positions + np.random.default_rng(3).normal(0, 1, positions.shape), path)
    elif path.suffix.lower() in (".npy", ".tif", ".tiff", ".zarr"):
        _write(np.stack(tiles), path)
    else:
        pytest.fail(f"no small tiles for {path.name}: teach _make_tiles")


def _write(array: np.ndarray, path: Path) -> None:
    """``array`` as the file ``path`` names: .npy, .tif/.tiff, .ome.zarr or .zarr."""
    from napari_gridmip.io import write_array, write_ome_zarr

    if path.name.lower().endswith(".ome.zarr"):
        write_ome_zarr(array, path)
    else:
        write_array(array, path)
