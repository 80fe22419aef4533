"""``napari-gridmip --prepare``: its bad combinations, its marker (once per machine, again with
--force, another device or version not counting), the background start, and one real preparation end to end
(slow) after which a new process's first DIC Run compiles nothing large."""

import json
import subprocess
import sys
import textwrap

import pytest

from napari_gridmip import cli
from napari_gridmip._jobs import Job
from napari_gridmip._sample_data import prepare as _prepare
from napari_gridmip.core.runtime import compile_cache
from tests.helpers import run_cli


def _one_error_line(done, message: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and message in lines[0], done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--background"], "--background goes with --prepare"),
        (["--force"], "--force goes with --prepare"),
        (["--compute-on", "host"], "--compute-on before a subcommand goes with --prepare"),
        (["--prepare", "corrimage", "m.npy", "c.npy"], "--prepare takes no subcommand"),
    ],
)
def test_bad_combinations_are_one_line(args, message, tmp_path):
    _one_error_line(run_cli(*args, cwd=tmp_path), message)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("NAPARI_GRIDMIP_COMPILE_CACHE", "0", "NAPARI_GRIDMIP_COMPILE_CACHE=0 switches off"),
        ("JAX_COMPILATION_CACHE_DIR", "elsewhere", "JAX_COMPILATION_CACHE_DIR chooses your own"),
    ],
)
@pytest.mark.parametrize("background", [False, True])
def test_a_cache_that_keeps_nothing_is_one_line(variable, value, message, background, tmp_path, monkeypatch):
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path / "cache"))
    done = run_cli("--prepare", *(["--background"] if background else []), cwd=tmp_path)
    _one_error_line(done, message)
    assert not (tmp_path / "cache").exists()  # nothing started, nothing written


# -- the marker, with jobs that compile nothing ------------------------------------------------------------------


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """This process prepares into ``tmp_path`` with two jobs that only count their runs, on a machine whose key
    the test sets (``state["key"]``)."""

    for name in ("NAPARI_GRIDMIP_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR", "NAPARI_GRIDMIP_COMPUTE_ON"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path))
    # JAX's persistent cache was set once for this test process (conftest's folder): the marker is what is tested
    monkeypatch.setattr(compile_cache, "enable", lambda: tmp_path / "jax")
    monkeypatch.setattr(compile_cache, "is_ours", lambda: True)
    state = {"runs": [], "key": {"platform": "cpu", "device_kind": "cpu", "compute_on": "auto", "jax": "1"}}
    monkeypatch.setattr(_prepare, "machine_key", lambda where: {**state["key"], "compute_on": where})

    def job(name, fail=False):
        def run(progress):
            state["runs"].append(name)
            if fail:
                raise RuntimeError("out of memory\non the device")

        return _prepare.SampleJob(name, "Widget", f"{name} sample", lambda cache: None, lambda request: Job("", run))

    state["job"] = job
    monkeypatch.setattr(_prepare, "JOBS", (job("one"), job("two")))
    return state


def _main(capsys, *args):
    with pytest.raises(SystemExit) as leaving:
        cli.main(["--prepare", *args])
    out = capsys.readouterr()
    return leaving.value.code, out.out, out.err


def test_prepared_once_per_machine_and_again_with_force(fake_machine, capsys, tmp_path):
    code, out, _ = _main(capsys)
    assert code == 0 and fake_machine["runs"] == ["one", "two"]
    lines = out.splitlines()  # a heading, one line per job (name, seconds), the total
    for line, name in zip(lines[1:3], ("one", "two")):
        parts = line.split()
        assert parts[0] == name and float(parts[1]) >= 0 and parts[2] == "s", line
    assert len(lines) == 4 and "prepared 2 jobs" in lines[-1]
    (entry,) = json.loads((tmp_path / _prepare.MARKER_NAME).read_text())["prepared"]
    assert entry["key"]["compute_on"] == "auto" and set(entry["jobs"]) == {"one", "two"}

    code, out, _ = _main(capsys)  # the same machine: at once, nothing run
    assert code == 0 and fake_machine["runs"] == ["one", "two"]
    assert "already prepared" in out and "--force" in out and len(out.splitlines()) == 1

    code, out, _ = _main(capsys, "--force")
    assert code == 0 and fake_machine["runs"] == ["one", "two"] * 2
    assert len(json.loads((tmp_path / _prepare.MARKER_NAME).read_text())["prepared"]) == 1  # replaced, not added


@pytest.mark.parametrize(
    "change", [{"device_kind": "TPU v5 lite"}, {"platform": "tpu"}, {"jax": "2"}, {"napari_gridmip": "9.9"}]
)
def test_a_marker_of_another_device_or_version_does_not_count(change, fake_machine, capsys, tmp_path):
    assert _main(capsys)[0] == 0
    fake_machine["key"] = {**fake_machine["key"], **change}
    code, out, _ = _main(capsys)
    assert code == 0 and fake_machine["runs"] == ["one", "two"] * 2 and "already" not in out
    entries = json.loads((tmp_path / _prepare.MARKER_NAME).read_text())["prepared"]
    assert len(entries) == 2  # both machines' (a cache folder may be shared)
    code, out, _ = _main(capsys)
    assert code == 0 and "already prepared" in out and fake_machine["runs"] == ["one", "two"] * 2


def test_another_compute_on_setting_is_prepared_apart(fake_machine, capsys):
    assert _main(capsys)[0] == 0
    code, out, _ = _main(capsys, "--compute-on", "host")
    assert code == 0 and fake_machine["runs"] == ["one", "two"] * 2 and "compute_on 'host'" in out


def test_a_failed_job_is_one_line_and_the_others_still_run(fake_machine, capsys, tmp_path, monkeypatch):
    job = fake_machine["job"]
    monkeypatch.setattr(_prepare, "JOBS", (job("bad", fail=True), job("one"), job("worse", fail=True), job("two")))
    code, out, _ = _main(capsys)
    assert code == 1 and fake_machine["runs"] == ["bad", "one", "worse", "two"]  # every job tried, in order
    failures = [line for line in out.splitlines() if line.startswith(f"{_prepare.PROG}: failed: ")]
    assert failures == [  # one line each: the job's name, its error's type and first line
        f"{_prepare.PROG}: failed: bad: RuntimeError: out of memory",
        f"{_prepare.PROG}: failed: worse: RuntimeError: out of memory",
    ]
    assert [line.split()[0] for line in out.splitlines() if line.startswith("  ")] == ["one", "two"]
    assert "prepared 2 of 4 jobs" in out.splitlines()[-1] and "2 failed (bad, worse)" in out.splitlines()[-1]
    assert not (tmp_path / _prepare.MARKER_NAME).exists()  # not every job prepared: the next call tries them all


def test_a_job_that_cannot_import_its_dependency_leaves_the_others_prepared(fake_machine, capsys, monkeypatch):
    """As on a machine without scikit-image: the patches sample's job fails before it runs, the rest do."""
    job = fake_machine["job"]

    def missing(cache):
        raise ModuleNotFoundError("No module named 'skimage'")

    patches = _prepare.SampleJob("patches", "Reassemble patches", "image tiles", missing, lambda request: None)
    monkeypatch.setattr(_prepare, "JOBS", (job("one"), patches, job("two")))
    code, out, _ = _main(capsys)
    assert code == 1 and fake_machine["runs"] == ["one", "two"]
    assert f"{_prepare.PROG}: failed: patches: ModuleNotFoundError: No module named 'skimage'" in out.splitlines()


def test_a_second_prepare_at_the_same_time_leaves_it_to_the_first(fake_machine, capsys, tmp_path):
    fcntl = pytest.importorskip("fcntl")
    with open(tmp_path / _prepare.LOCK_NAME, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process preparing
        code, out, _ = _main(capsys)
    assert code == 0 and fake_machine["runs"] == [] and "another process is preparing" in out


def test_background_starts_a_detached_prepare_with_a_log(fake_machine, capsys, tmp_path, monkeypatch):
    started = []

    class Process:
        pid = 4242

        def __init__(self, command, **options):
            started.append((command, options))

    monkeypatch.setattr(_prepare.subprocess, "Popen", Process)
    code, out, err = _main(capsys, "--background", "--force", "--compute-on", "host")
    assert code == 0 and err == "" and fake_machine["runs"] == []
    log = tmp_path / _prepare.LOG_NAME
    assert out.strip() == f"{_prepare.PROG}: preparing in the background (process 4242); its log: {log}"
    ((command, options),) = started
    assert command == [sys.executable, "-m", "napari_gridmip", "--prepare", "--force", "--compute-on", "host"]
    assert options["start_new_session"] and options["stdout"].name == str(log)
    assert "--prepare --force --compute-on host" in log.read_text()


def test_the_cli_module_stays_cheap_to_import():
    code = "import sys, napari_gridmip.cli, napari_gridmip._sample_data.prepare; print('jax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


# -- one real preparation ----------------------------------------------------------------------------------------

FIRST_RUN = textwrap.dedent(
    """
    import json, sys
    import jax, jax.monitoring
    from napari_gridmip._sample_data import prepare as _prepare
    compiled, hit = [], [False]
    def heard(event, *_, **__):
        hit[0] = hit[0] or event == "/jax/compilation_cache/cache_hits"
    def timed(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            if not hit[0]:
                compiled.append([seconds, str(kwargs.get("fun_name"))])
            hit[0] = False
    jax.monitoring.register_event_listener(heard)
    jax.monitoring.register_event_duration_secs_listener(timed)
    seconds = _prepare.run_job(next(job for job in _prepare.JOBS if job.name == sys.argv[1]), "auto")
    print(json.dumps({"seconds": seconds, "compiled": compiled}))
    """
)


@pytest.mark.slow
def test_prepare_end_to_end_then_a_first_dic_run_compiles_nothing_large(tmp_path, monkeypatch):
    for name in ("NAPARI_GRIDMIP_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR", "NAPARI_GRIDMIP_EXECUTABLE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NAPARI_GRIDMIP_CACHE_DIR", str(tmp_path / "cache"))
    done = run_cli("--prepare", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == list(_prepare.JOB_NAMES)
    (entry,) = json.loads((tmp_path / "cache" / _prepare.MARKER_NAME).read_text())["prepared"]
    assert entry["key"]["platform"] == "cpu" and set(entry["jobs"]) == set(_prepare.JOB_NAMES)
    assert list((tmp_path / "cache" / "executables").glob("*.pickle"))  # the kept executables, written whole
    again = run_cli("--prepare", cwd=tmp_path)
    assert again.returncode == 0 and "already prepared" in again.stdout

    # a new process: the DIC sample's first Run reads its programs (its cold first Run compiles 5 to 7 s of them)
    first = subprocess.run([sys.executable, "-c", FIRST_RUN, "dic"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    compiled = json.loads(first.stdout.splitlines()[-1])["compiled"]
    assert sum(seconds for seconds, _ in compiled) < 0.5, compiled
