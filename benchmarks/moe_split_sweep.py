"""MoE decode with K split over several programs per row tile (``GemvConfig.split_k``) against the shipped
configs, at T = 1..64 on the 120b shapes; and, for scale, how fast a plain read of the same sizes streams.

A decode at T = 1 reads 55 MB (37 MB gate_up, 18 MB down); a read-only kernel reaches ~90% of the copy
roofline on 37 MB, the GEMVs half that. Their programs walk K one tile ahead, and at T = 1 there are only
~3 per SM: too few weight bytes in flight. Splitting K multiplies the programs and shortens each walk.

Every candidate is timed ``REPEATS`` times, interleaved, in CUDA graphs with rotating routing (as
``decode_pick.py``); outputs are checked against the fp32 reference and between pdl twins (same bits).
Usage: python benchmarks/moe_split_sweep.py [OUT.json]"""

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_read_probe import _flat  # noqa: E402
from gpu_check import (DEV, bench_decode, copy_roofline, moe_decode_inputs,  # noqa: E402
                       moe_expert_bytes, moe_reference, moe_weights, rotating)

from mxrepack.kernels.gemv_mxfp4 import GemvConfig  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe_gemv_config  # noqa: E402

REPEATS = 3
TILES = ((16, 512, 4), (32, 256, 8), (16, 256, 4), (32, 512, 8))
SPLITS = {1: (2, 3, 6), 2: (2, 3, 6), 4: (2, 3), 8: (2, 3), 16: (2,), 64: (2,)}


def flat_reads(rows: list, bw: float) -> None:
    """A read-only stream of n bytes (one contiguous range, 16 B per thread per load), best of a few shapes."""
    out = torch.empty(1 << 20, dtype=torch.int32, device=DEV)
    for mb in (18, 37, 55):
        n = mb << 20
        nxt = rotating(lambda: torch.randint(0, 255, (n,), dtype=torch.uint8, device=DEV), n)
        best = None
        for block, steps, warps in ((1024, 4, 4), (1024, 8, 8), (2048, 4, 8), (512, 16, 4)):
            grid = (triton.cdiv(n // 4, block * steps),)
            ms = bench_decode(lambda: _flat[grid](nxt(), out, n // 4, BLOCK=block, STEPS=steps, num_warps=warps),
                              rep=50)
            best = ms if best is None else min(best, ms)
        rows.append({"kind": "flat_read", "MB": mb, "ms": best, "roofline_frac": n / (best * 1e-3) / bw})
        print(f"flat read {mb} MB: {best:.4f} ms {100 * n / (best * 1e-3) / bw:.1f}% roofline", flush=True)


def main() -> None:
    bw = copy_roofline()
    rows = [{"device": torch.cuda.get_device_name(), "triton": triton.__version__, "copy_TBps": bw / 1e12}]
    flat_reads(rows, bw)
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    torch.manual_seed(0)
    for T, splits in SPLITS.items():
        shipped = pick_moe_gemv_config(T * 4)
        configs = [shipped] + [GemvConfig(bn, bk, w, 1, "f16x2", pdl=1, split_k=s) for bn, bk, w in TILES
                               for s in splits]
        draws = []
        nxt = rotating(lambda: draws.append(moe_decode_inputs(T)) or draws[-1], 4 * T * per_expert)
        xm, ids, wts = nxt()
        ref = moe_reference(xm, ids, wts, W)
        err = {}
        for c in configs:
            y = moe_mxfp4(xm, ids, wts, W, config=c)
            assert torch.equal(y, moe_mxfp4(xm, ids, wts, W, config=dataclasses.replace(c, pdl=0))), c.name()
            assert torch.equal(y, moe_mxfp4(xm, ids, wts, W, config=c)), c.name()
            err[c.name()] = ((y.float() - ref).norm() / ref.norm()).item()
        touched = statistics.mean(d[1].unique().numel() for d in draws) * per_expert
        o = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        times = {c.name(): [] for c in configs}
        for _ in range(REPEATS):
            for c in configs:
                times[c.name()].append(bench_decode(lambda: moe_mxfp4(*nxt(), W, config=c, out=o), rep=50))
        for name, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            ms = statistics.median(t)
            rows.append({"kind": "moe_decode", "T": T, "config": name, "shipped": name == shipped.name(),
                         "ms_median": ms, "ms_all": t, "rel_err": err[name], "experts_touched": touched / per_expert,
                         "roofline_frac": touched / (ms * 1e-3) / bw})
            print(f"moe T={T} {name:26s}{' (shipped)' if name == shipped.name() else ''} {ms:.4f} ms "
                  f"(min {min(t):.4f} max {max(t):.4f}) {100 * touched / (ms * 1e-3) / bw:.1f}% roofline "
                  f"err {err[name]:.1e}", flush=True)
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
