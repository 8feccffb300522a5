"""Kernels: torch references for every layout (``reference``); Triton GEMMs build on them."""
