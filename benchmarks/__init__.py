"""The benchmarks (``bench_*.py``, one harness: ``_harness.py``) and, in ``probes/``, the probes, soaks and
reproducers behind docs/benchmarks.md and docs/accelerator.md.

``python -m benchmarks`` lists them, runs benchmarks (``run NAME... [--quick]``: one JSON result file each, in
``$NAPARI_GRIDMIP_BENCH_RESULTS`` or ``benchmarks/results/``) and compares result files (``compare``). Files whose
names start with ``_`` are helpers, not listed.
"""
