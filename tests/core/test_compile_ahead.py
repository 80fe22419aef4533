"""Compiling ahead in a thread: once per program, under the caller's x64 setting, never killed at exit."""

import subprocess
import sys
import textwrap

import jax
import numpy as np

from napari_gridmip.core._compile_ahead import compile_ahead
from tests.helpers import count_traces


def test_one_thread_per_key_under_the_callers_x64_setting():
    seen = []

    def build():
        seen.append(bool(jax.config.jax_enable_x64))

    key = ("test", object())
    with jax.enable_x64(True):
        wide = compile_ahead(key, build)
        wide.join()
    narrow = compile_ahead(key, build)
    narrow.join()
    assert seen == [True, False] and wide is not narrow and not wide.daemon
    again = compile_ahead(key, build)  # the same program again: the same (finished) thread, nothing rebuilt
    assert again is narrow and seen == [True, False]


def test_a_failing_build_is_dropped_and_the_call_compiles_itself():
    def build():
        raise RuntimeError("no")

    thread = compile_ahead(("failing", object()), build)
    thread.join()
    assert not thread.is_alive()


def test_the_call_finds_the_program_compiled_ahead():
    @jax.jit
    def double(x):
        return x * 2

    shape = jax.ShapeDtypeStruct((7, 3), np.float32)
    compile_ahead(("double", shape.shape), lambda: double.lower(shape).compile()).join()
    with count_traces() as traced:
        out = double(jax.device_put(np.ones((7, 3), np.float32)))
    assert traced.count == 0 and float(out[0, 0]) == 2.0


def test_a_program_still_compiling_at_exit_is_finished_not_killed():
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from napari_gridmip.core._compile_ahead import compile_ahead

        @jax.jit
        def f(x):
            for k in range(60):
                x = jnp.sin(x) * (k + 1) + jnp.cos(x @ x.T)
            return x

        shape = jax.ShapeDtypeStruct((64, 64), np.float32)
        compile_ahead("f", lambda: f.lower(shape).compile())
        print("leaving")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaving" in done.stdout
