"""Where work runs: the runtime under every kernel (devices, the user's setting, strategies, measured rates,
sharding, kept programs, scoped precision, transfers, atomic file writes).

Its modules are the core's documented internal API: the kernels, the jobs and the command line use them by name.
The package itself imports nothing; :mod:`.choice`, :mod:`.compile_cache` and :mod:`.files` are JAX-free.
"""
