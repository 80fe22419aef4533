"""Where work runs: the runtime under every kernel, JAX-free to import.

Its modules are the core's internal API (the kernels, the jobs and the command line use them by name):

- :mod:`.devices`: :func:`~napari_gridmip.compute_on`, the user's override, the public face of this package;
- :mod:`.choice`: that setting as the kernels read it, and the log of where a job's calls ran;
- :mod:`.strategy`: the one place that asks which backend runs, naming the strategy each algorithm takes there;
- :mod:`.rates`: this machine's link and compute rates, measured once, from which memory-bound calls are placed;
- :mod:`.sharding`: band programs spread over every local device;
- :mod:`.executables` and :mod:`.compile_cache`: compiled programs kept for later processes;
- :mod:`.precision` (scoped float64) and :mod:`.transfer` (host-to-device copies without waste);
- :mod:`.files`: the one atomic file write.
"""
