"""The benchmarks, probes and soaks behind docs/benchmarks.md and docs/accelerator.md, one script each.

From the repository root, ``python -m benchmarks`` lists them with the first line of each docstring, and
``python -m benchmarks NAME [args...]`` runs ``benchmarks/bench_NAME.py`` (or ``benchmarks/NAME.py``) with those
arguments, as ``python benchmarks/bench_NAME.py [args...]`` does. ``_harness.py`` is their shared harness
(warm-up, best of N, peak memory, ratio tables); files whose names start with ``_`` are helpers, not listed.
"""
