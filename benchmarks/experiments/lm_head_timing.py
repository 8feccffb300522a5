"""lm_head at M = 1 timed the ways the two GPU scripts time it, interleaved, in one run: ``gemv_mxfp4``
without a bias (``decode_pick.py``), with a bias, and through ``linear_mxfp4`` with a bias (``gpu_check.py``),
with cuBLAS BF16 beside; each REPEATS times in a shuffled order, median reported. Weights rotate through > 400 MB.
Usage: python benchmarks/experiments/lm_head_timing.py [OUT.json]"""

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import DEV, copy_roofline, interleaved_ms, lm_head_m1  # noqa: E402

from mxrepack.kernels.gemv_mxfp4 import WIDE, gemv_mxfp4  # noqa: E402
from mxrepack.kernels.linear_mxfp4 import linear_mxfp4  # noqa: E402

REPEATS = 7


def main() -> None:
    bw = copy_roofline()
    wbytes, nxt, nxt_b, x, out = lm_head_m1()
    bias = torch.randn(out.shape[1], device=DEV).to(torch.bfloat16)
    ways = {
        "cublas_bf16": lambda: x @ nxt_b().T,
        "gemv_mxfp4, no bias": lambda: gemv_mxfp4(x, *nxt(), None, out, WIDE),
        "gemv_mxfp4, bias": lambda: gemv_mxfp4(x, *nxt(), bias, out, WIDE),
        "linear_mxfp4, bias": lambda: linear_mxfp4(x, *nxt(), bias, "w4a16"),
    }
    times = interleaved_ms(ways, REPEATS, shuffle=True)
    ms_c = statistics.median(times["cublas_bf16"])
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12, "repeats": REPEATS, "config": WIDE.name()}]
    for name, t in times.items():
        ms = statistics.median(t)
        rows.append(
            {
                "way": name,
                "ms_median": ms,
                "ms_all": t,
                "vs_cublas": ms_c / ms,
                "roofline_frac": wbytes / (ms * 1e-3) / bw,
            }
        )
        print(
            f"{name:22s} {ms:.4f} ms (min {min(t):.4f} max {max(t):.4f}) x{ms_c / ms:.2f} cuBLAS "
            f"{100 * wbytes / (ms * 1e-3) / bw:.1f}% roofline",
            flush=True,
        )
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
