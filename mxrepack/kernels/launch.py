"""Launching a Triton kernel's known builds without Triton's per-call binding.

vLLM runs lm_head outside its CUDA graphs (and every layer outside them under ``--enforce-eager``), so each step pays
the host time of the dense call. Triton's launch, ``kernel[grid](...)``, binds the arguments, works out their
specialization and the cache key, and checks the kernel's globals before it calls the build's own launcher: on an
H200's host (Triton 3.6) 20-35 us a launch of the chunk tile, against 9-15 us for the build's launcher alone
(``benchmarks/experiments/host_launch_probe.py``, docs/PERF_LOG.md stop 44).

:class:`Launcher` takes Triton's path once for each distinct call and keeps the build it returned; a later call that
matches goes straight to that build's launcher (``CompiledKernel[grid]``, Triton's own). A call matches on a key finer
than any specialization Triton makes: every integer and constant by value, every tensor by dtype and its address
modulo 256 (Triton specializes pointers on divisibility by 16), the grid, warps, stages and the current device. So a
build is only reused for arguments Triton would have given that same build (the arguments: not Triton's process-wide
settings, :class:`Launcher`). Each new build can be checked before it is kept.
"""

from __future__ import annotations

import inspect

import torch
import triton


class Launcher:
    """``Launcher(kernel, check)(grid, *args, num_warps=, num_stages=, launch_pdl=False, **constants)``:
    ``kernel[grid](*args, num_warps=..., num_stages=..., **constants)`` (and ``launch_pdl=True`` when set: Triton keeps
    it in the build, whose own launcher then launches with programmatic dependent launch), the build reused without
    Triton's binding when the call matches one made before. ``args`` are the kernel's leading parameters in order,
    ``constants`` the rest by name (its ``tl.constexpr`` ones, and any plain one after them). ``check``: called with
    each new build before it is kept for reuse; a build it rejects (raises) is not kept, so every call that would run
    it raises. Under Triton's interpreter, and for CPU tensors, Triton's own launch every call.

    Reuse sees the arguments only: Triton's process-wide settings (``TRITON_DEBUG``, instrumentation) changed after a
    build was kept, and its pre-run hooks, do not reach the kept builds."""

    def __init__(self, kernel, check=None):
        self.kernel = kernel
        self.check = check
        self.compiled = isinstance(kernel, triton.runtime.JITFunction)  # False under TRITON_INTERPRET
        params = inspect.signature(kernel.fn).parameters.values() if self.compiled else ()
        if any(p.default is not inspect.Parameter.empty for p in params):
            raise ValueError(f"{kernel}: a Launcher passes every parameter, the kernel's must have no defaults")
        self.names = tuple(p.name for p in params)
        self._runs: dict[tuple, tuple] = {}

    def __call__(self, grid: tuple[int, ...], *args, num_warps: int, num_stages: int, launch_pdl=False, **constants):
        """Launch; returns the build when this call took Triton's path (a call not seen before), else None."""
        options = {"num_warps": num_warps, "num_stages": num_stages} | ({"launch_pdl": True} if launch_pdl else {})
        if not self.compiled or not args[0].is_cuda:
            return self.kernel[grid](*args, **options, **constants)
        key = (torch.cuda.current_device(), bool(launch_pdl), *call_key(grid, args, num_warps, num_stages, constants))
        run = self._runs.get(key)
        if run is not None:
            runner, tail = run
            runner(*args, *tail)
            return None
        build = self.kernel[grid](*args, **options, **constants)
        if build is None:  # a Triton cache hook declined the launch: nothing to keep
            return None
        if self.check is not None:
            self.check(build)
        tail = tuple(constants[name] for name in self.names[len(args) :])
        if len(self._runs) >= MAX_CALLS_KEPT:  # a bound on a process's calls of many shapes; refilled as they come
            self._runs.clear()
        self._runs[key] = (build[(*grid, 1, 1)[:3]], tail)  # a build's own launcher reads three grid dimensions
        return build


MAX_CALLS_KEPT = 4096


def call_key(grid: tuple, args: tuple, num_warps: int, num_stages: int, constants: dict) -> tuple:
    """What a :class:`Launcher` call matches on, the current device aside: finer than Triton's specialization (every
    integer argument by type and value, every tensor by dtype and address modulo 256, of which Triton reads the
    divisibility by 16; the constants by value, as Triton keys them), so that equal keys mean the build Triton would
    pick is the same."""
    return (
        grid,
        num_warps,
        num_stages,
        tuple(constants.items()),
        tuple((a.dtype, a.data_ptr() % 256) if isinstance(a, torch.Tensor) else (type(a), a) for a in args),
    )
