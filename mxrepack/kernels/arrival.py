"""Arrival counters: the last program of a group to finish combines the group's partial results, inside the
kernel that made them (no zeroed buffer before the launch, no reduction kernel after it).

Each program stores its partial, then arrives at the group's counter (:func:`last_to_arrive`); the one whose
arrival completes the group reads every partial back in a fixed order, so the result does not depend on which
program finished last, writes it, and sets the counter back to zero for the next call (:func:`reset_counter`).
Used by the MoE decode's combine of a token's k slots and by the dense kernel's split-K.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def last_to_arrive(counter, arrivals):
    """True in the one program whose arrival at ``counter`` completes ``arrivals``: every thread's stores are
    made before the arrival is published (release), and the others' are visible after it (acquire)."""
    tl.debug_barrier()
    return tl.atomic_add(counter, 1, sem="acq_rel") == arrivals - 1


@triton.jit
def reset_counter(counter):
    """Set a completed group's ``counter`` back to zero for the next launch: a plain store. Every program of the
    group has arrived, so nothing else touches it in this launch, and the next launch sees the zero once this one has
    completed, as it sees the outputs. A fenced atomic here (``tl.atomic_xchg``'s default) made the group's last
    program, the kernel's tail, first wait for its own output stores to complete, then for the atomic's round trip
    (Nsight Compute, dense split-K on an H200: about 6% of the stall samples, docs/PERF_LOG.md stop 40).

    The rule this relies on, for every kernel using these counters: a kernel launched with programmatic dependent
    launch (``launch_pdl``) must ``gdc_wait`` before its first :func:`last_to_arrive` (the MoE down GEMVs do, and
    trigger no dependents of their own), so that the grid before it, and its reset, has completed."""
    tl.store(counter, 0)


_COUNTERS: dict[tuple[torch.device, str], torch.Tensor] = {}
# buffers outgrown by a larger call: kept alive, since a CUDA graph captured earlier still uses them
_OUTGROWN: list[torch.Tensor] = []


def arrival_counters(device: torch.device, n: int, owner: str) -> torch.Tensor:
    """At least ``n`` int32 counters on ``device`` for ``owner`` (a kernel family), all zero between calls (each
    group's last program resets its own). One buffer per (device, owner): two calls of one owner running
    concurrently on two streams of a device are not supported.

    Allocated (zeroed) on first use, which must not be inside a CUDA graph capture: a capture records the zeroing
    without running it, and a counter left nonzero would keep its group's output from ever being written. Reserve
    them before capturing by calling this with the largest ``n`` (the vLLM plugin does at load)."""
    buf = _COUNTERS.get((device, owner))
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"mxrepack: {n} arrival counters for {owner!r} on {device} are not reserved and cannot be allocated "
                "during CUDA graph capture; run the layer once before capturing, or call "
                "mxrepack.kernels.arrival.arrival_counters(device, n, owner) first"
            )
        if buf is not None:
            _OUTGROWN.append(buf)
        buf = _COUNTERS[(device, owner)] = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
    return buf


def keep_with(module: torch.nn.Module, counters: torch.Tensor) -> None:
    """Register ``counters`` (:func:`arrival_counters`' buffer) on ``module`` as a non-persistent buffer: not in its
    state dict, but among the buffers that a server saves and restores around discarding the model's memory. vLLM's
    sleep mode at level 2 frees the memory pool the model was loaded into, weights and these counters with it, and
    on waking restores the model's buffers only (``vllm/v1/worker/gpu_worker.py``); counters left as module state
    would come back holding whatever the new memory held, and a group whose counter is not zero never writes its
    output, or writes it from incomplete partials. One buffer may be registered on many modules (a model's
    ``named_buffers`` lists it once)."""
    module.register_buffer("mxrepack_arrival_counters", counters, persistent=False)
