"""The lab: GPU experiments behind the shipped kernels (see lab/README.md).

A package so that its scripts can import each other: run them from the repository root as modules,
``python -m lab.<script> ...``, with nf4lab installed in the environment.
"""
