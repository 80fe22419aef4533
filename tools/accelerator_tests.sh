#!/usr/bin/env bash
# Run a named part of the test suite on an accelerator host (the TPU machine of docs/accelerator.md): one process,
# since one program at a time holds the chip; no Qt, napari or xdist there, so the core's tests only.
#
#   tools/accelerator_tests.sh PART [pytest arguments]
#     PART: occupancy | patches | subsets | maps | affine | correlation | rest | all, or one test file or folder
#           (its log and JUnit file are named after it). Each named part but all runs within 10 minutes there
#           (the longest at 6ad5623: affine, 30 tests in 183 + 270 s over two runs, and subsets, 61 in about
#           375 s); correlation is tests/core/correlation without the subsets', maps' and affine files; rest is
#           tests/core's own files and tests/test_api.py. A part split over calls: pytest's -k after PART
#
# The wheels the core needs beyond the machine's own JAX, NumPy and SciPy come from
# ../shared/tools/offline-wheels.sh into .wheels-offline (git-ignored), which the call must carry.
# A test log and a JUnit file go to $OUT (or ./accelerator-out) as PART.log and PART.xml, each failure as it
# happens to PART.failures.log.
set -u
part=${1:?usage: tools/accelerator_tests.sh PART [pytest arguments]}
shift
out=${OUT:-accelerator-out}
mkdir -p "$out"
if [ -d .wheels-offline ] && [ ! -d /tmp/site/zarr ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .wheels-offline/*.whl || exit 2
fi
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH=${PYTHONPATH:-}:/tmp/site:$PWD ;; esac  # appended: the machine's own JAX first
case $part in
  occupancy) paths=(tests/core/occupancy) ;;
  patches) paths=(tests/core/patches) ;;
  subsets) paths=(tests/core/correlation/test_subsets.py) ;;
  maps) paths=(tests/core/correlation/test_maps.py) ;;
  affine) paths=(tests/core/correlation/test_affine.py) ;;
  correlation) paths=(tests/core/correlation --ignore=tests/core/correlation/test_subsets.py
                      --ignore=tests/core/correlation/test_maps.py --ignore=tests/core/correlation/test_affine.py) ;;
  rest) paths=(tests/core/test_chunked.py tests/core/test_dtypes.py tests/core/test_executables.py tests/test_api.py) ;;
  all) paths=(tests/core tests/test_api.py) ;;
  *) if [ -e "$part" ]; then paths=("$part"); part=$(basename "$part" .py)  # one file or folder of tests
     else echo "unknown part: $part" >&2; exit 2; fi ;;
esac
python3 -c 'import jax; print("JAX", jax.__version__, jax.devices())'
# a per-test timeout when pytest-timeout is there (`pip download --no-deps -d .wheels-offline pytest-timeout`:
# the shared wheel script leaves it out); without it a stuck test holds the run until the outer `timeout`
timeout_args=()
if python3 -c 'import pytest_timeout' 2>/dev/null; then timeout_args=(--timeout 120)
else echo "pytest-timeout not installed: no per-test timeout" >&2; fi
# JAX's persistent compile cache in an ignored folder of the checkout, which the machine keeps between calls
# while it stays warm: a part run again (a rerun after a fix, a part split by -k) loads the programs its
# first run compiled (on this 2-core CPU, programs over 0.2 s kept, test_subsets and test_affine took 136 s against 395 s the first
# time; not measured on the chip, whose compiles are 3 to 15x the host's). Programs over 1 s only
# (ACCELERATOR_CACHE_MIN_SECONDS). The executables are XLA's own for the same program, so the answers are
# those of a fresh compile. ACCELERATOR_COMPILE_CACHE=0 compiles everything afresh; another value is the folder
cache=${ACCELERATOR_COMPILE_CACHE:-$PWD/.accelerator-cache}
if [ "$cache" != 0 ]; then
  export JAX_COMPILATION_CACHE_DIR=$cache
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${ACCELERATOR_CACHE_MIN_SECONDS:-1}
  echo "compile cache: $cache ($( [ -d "$cache" ] && du -sh "$cache" | cut -f1 || echo new))"
fi
# each failure written to $out/PART.failures.log as it happens (tools/pytest_failures_now.py): a run that the
# outer timeout stops keeps them, where pytest's own summary comes only at the end
export PYTEST_FAILURES_NOW="$out/$part.failures.log"
case ":$PYTHONPATH:" in *:$PWD/tools:*) ;; *) export PYTHONPATH=$PYTHONPATH:$PWD/tools ;; esac
# exec, into a file rather than a pipe: a `timeout` around this script then stops pytest itself, which would
# otherwise keep the chip from the next program
exec python3 -m pytest -o addopts="" -p no:cacheprovider -p pytest_failures_now -m 'not slow' --strict-markers \
  -q -rfE "${timeout_args[@]}" --junitxml "$out/$part.xml" "${paths[@]}" "$@" >"$out/$part.log" 2>&1
