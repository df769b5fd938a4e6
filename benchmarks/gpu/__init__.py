"""The checks ``make gpu-check`` runs on a GPU machine (``benchmarks/gpu_check.py``).

Each ``check_<name>.py`` module here follows the contract in :mod:`benchmarks.gpu.context` and is
run by ``benchmarks/gpu_check.py`` in a child process of its own (``benchmarks/gpu/child.py``).
Nothing here is imported by the package or by ``make test`` except through that script.
"""
