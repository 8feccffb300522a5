"""Kernels: torch references for every layout (``reference``); Triton GEMMs build on them."""


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for the host code around launches: ``triton.cdiv`` is a JIT function whose Python call unwraps
    constexprs, several microseconds a call, paid on every launch outside a CUDA graph (vLLM's lm_head)."""
    return -(-a // b)
