"""Pick the shipped decode configs among a sweep's leaders: each candidate timed several times,
interleaved (so that drift hits all alike), median reported. lm_head at M = 1 and the 120b MoE at
T = 1..64 (CUDA graph; bytes = weights + scales, touched experts only for the MoE). The MoE routing
rotates through several draws whose touched experts add up to > 400 MB, as lm_head's weights rotate:
one layer's four experts at T = 1 (53 MB) would otherwise be read from H100's 50 MB L2 in part.
Each candidate's output is compared with the first candidate's (the same math must give the same bits).
Usage: python benchmarks/decode_pick.py [OUT.json]"""

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import (DEV, bench_decode, copy_roofline,  # noqa: E402
                       lm_head_m1, moe_decode_inputs, moe_expert_bytes, moe_weights, rotating)

from mxrepack.kernels.gemv_mxfp4 import WIDE, GemvConfig, gemv_mxfp4  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import MOE_GEMV_FEW, MOE_GEMV_MANY, moe_mxfp4, pick_moe_gemv_config  # noqa: E402

DENSE = [GemvConfig(16, 1024, 8, 1, "f16x2"), GemvConfig(16, 1024, 8, 1, "f16x2", pdl=1),
         GemvConfig(8, 512, 4, 1, "f16x2"), GemvConfig(8, 512, 4, 1, "f16x2", pdl=1)]
MOE = [MOE_GEMV_FEW, dataclasses.replace(MOE_GEMV_FEW, pdl=0), MOE_GEMV_MANY, dataclasses.replace(MOE_GEMV_MANY, pdl=0),
       GemvConfig(16, 256, 4, 1, "f16x2", pdl=1)]
TOKENS = (1, 2, 4, 8, 16, 64)
REPEATS = 5


def lm_head(rows: list, bw: float) -> None:
    wbytes, nxt, nxt_b, x, out = lm_head_m1()
    times = {c.name(): [] for c in DENSE}
    w0 = nxt()
    for c in DENSE:  # programmatic dependent launch changes when the GEMV starts, not what it computes
        twin = dataclasses.replace(c, pdl=0)
        assert torch.equal(gemv_mxfp4(x, *w0, None, out.clone(), c), gemv_mxfp4(x, *w0, None, out.clone(), twin))
    cublas = []
    for _ in range(REPEATS):
        cublas.append(bench_decode(lambda: x @ nxt_b().T, rep=50))
        for c in DENSE:
            times[c.name()].append(bench_decode(lambda: gemv_mxfp4(x, *nxt(), None, out, c), rep=50))
    ms_c = statistics.median(cublas)
    for name, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        ms = statistics.median(t)
        rows.append({"kind": "lm_head_m1", "config": name, "ms_median": ms, "ms_all": t, "cublas_bf16_ms": ms_c,
                     "vs_cublas": ms_c / ms, "roofline_frac": wbytes / (ms * 1e-3) / bw})
        print(f"lm_head M=1 {name:24s} {ms:.4f} ms (min {min(t):.4f} max {max(t):.4f})  x{ms_c / ms:.2f} cuBLAS "
              f"{100 * wbytes / (ms * 1e-3) / bw:.0f}% roofline", flush=True)


def main() -> None:
    bw = copy_roofline()
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12, "repeats": REPEATS,
             "shipped_dense": WIDE.name(), "shipped_moe": [MOE_GEMV_FEW.name(), MOE_GEMV_MANY.name()]}]
    lm_head(rows, bw)  # its rotating weights are freed before the MoE layer is made
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    torch.manual_seed(0)
    for T in TOKENS:
        draws = []
        nxt = rotating(lambda: draws.append(moe_decode_inputs(T)) or draws[-1], 4 * T * per_expert)
        xm, ids, wts = nxt()
        touched = statistics.mean(d[1].unique().numel() for d in draws) * per_expert
        for c in MOE:
            assert torch.equal(moe_mxfp4(xm, ids, wts, W, config=c),
                               moe_mxfp4(xm, ids, wts, W, config=dataclasses.replace(c, pdl=0))), c.name()
        o = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        times = {c.name(): [] for c in MOE}
        fixed = "fixed routing (as before this stop): " + pick_moe_gemv_config(T * 4).name()
        times[fixed] = []
        for _ in range(REPEATS):
            for c in MOE:
                times[c.name()].append(bench_decode(lambda: moe_mxfp4(*nxt(), W, config=c, out=o), rep=50))
            times[fixed].append(bench_decode(lambda: moe_mxfp4(xm, ids, wts, W, out=o), rep=50))
        for name, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            ms = statistics.median(t)
            rows.append({"kind": "moe_decode", "T": T, "config": name, "ms_median": ms, "ms_all": t, "draws": len(draws),
                         "experts_touched": touched / per_expert, "roofline_frac": touched / (ms * 1e-3) / bw})
            print(f"moe T={T} {name:24s} {ms:.4f} ms (min {min(t):.4f} max {max(t):.4f})  "
                  f"{100 * touched / (ms * 1e-3) / bw:.0f}% roofline", flush=True)
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
