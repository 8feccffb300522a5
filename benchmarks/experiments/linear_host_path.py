"""The host time of mxrepack's own Python in one ``linear_mxfp4`` call, the kernel launches stubbed out. CPU only.

    python benchmarks/experiments/linear_host_path.py [OUT.json]

vLLM runs lm_head outside its CUDA graphs, so each decode step pays the dense op's host path (PERF_LOG stop 30: 200 us
a step under torch.profiler on the device, against 61-71 us for Marlin's). This separates the part that is ours (shape
checks, the dispatch, the output and activation buffers) from Triton's launcher: the kernels, and the Launchers that
launch them since stops 44 / 49, are replaced by objects whose launch does nothing, and the call is timed on CPU
tensors. The CPU branch picks the portable GEMV configurations (the CUDA one also asks ``launches_dependents``, once
per shape since stop 49); the work per call is otherwise the same.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import torch

import mxrepack.kernels.dequant_mxfp4 as dequant
import mxrepack.kernels.gemv_mxfp4 as gemv
import mxrepack.kernels.linear_mxfp4 as linear
from mxrepack.kernels.linear_mxfp4 import linear_mxfp4


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main() -> None:
    gemv._gemv_f16x2_kernel = gemv._prepare_x_kernel = gemv._gemv_mxfp4_kernel = _NoLaunch()
    linear._linear_chunks_kernel = linear._linear_mxfp4_kernel = _NoLaunch()  # the tiles (one launch a call)
    # Launchers (the chunk tile's since stop 44, the rows order's kernels since stop 49): their keys not timed here
    for module, name in (
        [(linear, "_LAUNCH_CHUNKS"), (linear, "_LAUNCH_ROWS")]
        + [(gemv, n) for n in ("_LAUNCH_F16X2", "_LAUNCH_PREPARE", "_LAUNCH_GEMV")]
        + [(dequant, "_LAUNCH_SPLIT")]
    ):
        if hasattr(module, name):
            setattr(module, name, lambda grid, *args, **kwargs: None)
    shapes = {"lm_head": (201088, 2880), "qkv": (5120, 2880), "o": (2880, 4096)}
    record = {"torch": torch.__version__, "calls": 5000, "us_per_call": {}}
    for (name, (n, k)), order in itertools.product(shapes.items(), ("rows", "wgmma")):
        np_, kp = -(-n // 16) * 16, -(-k // 128) * 128
        w = (
            torch.zeros(n, k // 2, dtype=torch.uint8)
            if order == "rows"
            else torch.zeros(np_, kp // 2, dtype=torch.uint8)
        )
        s = torch.zeros(w.shape[0], w.shape[1] // 16, dtype=torch.uint8)
        x = torch.zeros(1, k, dtype=torch.bfloat16)
        out = torch.empty(1, n, dtype=torch.bfloat16)
        for _ in range(200):
            linear_mxfp4(x, w, s, None, fold_scale=True, order=order, out=out)
        t = time.perf_counter()
        for _ in range(record["calls"]):
            linear_mxfp4(x, w, s, None, fold_scale=True, order=order, out=out)
        key = name if order == "rows" else f"{name}_{order}"
        record["us_per_call"][key] = (time.perf_counter() - t) / record["calls"] * 1e6
        print(f"{key} M = 1: {record['us_per_call'][key]:.1f} us of mxrepack's Python a call", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
