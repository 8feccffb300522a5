"""Grouped MoE decode (one program per expert and row tile, ``tokens`` rows per decoded weight tile) against
the per-assignment GEMV and the scheduled tiles, 120b shapes (128 experts, top-4, H = I = 2880 padded to
2944), T = 4..64 tokens with uniform random routing. GEMV paths are timed in a CUDA graph; the scheduled
path (host sync in its schedule) with ``do_bench``. Bytes = the touched experts' packed weights and scales.
Usage: python benchmarks/moe_grouped_sweep.py [OUT.json]"""

import itertools
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import DEV, bench_decode, copy_roofline, moe_reference, moe_weights  # noqa: E402

from mxrepack.kernels.gemv_mxfp4 import GemvConfig  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import MOE_GEMV, MOE_GROUPED, moe_mxfp4, pick_moe_config  # noqa: E402


def main() -> None:
    E, k = 128, 4
    bw = copy_roofline()
    W = moe_weights()
    per_expert = sum(W[n][0].numel() for n in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"))
    grouped = [GemvConfig(bn, bk, 4, 1, "f16x2", tokens=m) for m, bn, bk in itertools.product((2, 4), (16, 32), (256, 512))]
    grouped += [GemvConfig(16, 256, w, 1, "f16x2", tokens=2) for w in (2, 8)]
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12, "shipped_grouped": MOE_GROUPED.name(),
             "shipped_per_assignment": MOE_GEMV.name()}]
    torch.manual_seed(0)
    for T in (4, 8, 16, 32, 64):
        x = torch.randn(T, 2880, device=DEV).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, device=DEV)[:k] for _ in range(T)])
        wts = torch.softmax(torch.randn(T, k, device=DEV), -1)
        n_touched = ids.unique().numel()
        touched = n_touched * per_expert
        ref = moe_reference(x, ids, wts, W)
        out = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        res = []

        def record(path, name, ms):
            res.append({"T": T, "path": path, "config": name, "ms": ms, "roofline_frac": touched / (ms * 1e-3) / bw,
                        "experts_touched": n_touched})

        record("per-assignment", MOE_GEMV.name(),
               bench_decode(lambda: moe_mxfp4(x, ids, wts, W, config=MOE_GEMV, out=out), rep=50))
        sched = pick_moe_config(T, k, E)
        record("scheduled (do_bench, no graph)", sched.name(),
               do_bench(lambda: moe_mxfp4(x, ids, wts, W, config=sched), warmup=10, rep=50))
        for cfg in grouped:
            try:
                ms = bench_decode(lambda: moe_mxfp4(x, ids, wts, W, config=cfg, out=out), rep=50)
            except Exception as e:  # out of resources
                print(f"T={T} {cfg.name()}: {type(e).__name__}", flush=True)
                continue
            record("grouped", cfg.name(), ms)
        res.sort(key=lambda r: r["ms"])
        for cfg in [MOE_GROUPED] + [c for c in grouped if c.name() == res[0]["config"]]:
            y = moe_mxfp4(x, ids, wts, W, config=cfg)
            err = float((y.float() - ref).norm() / ref.norm())
            same = bool(torch.equal(y, moe_mxfp4(x, ids, wts, W, config=cfg)))
            for r in res:
                if r["config"] == cfg.name():
                    r["rel_err"], r["repeatable"] = err, same
        for r in res[:6] + [r for r in res if r["path"] != "grouped" or r["config"] == MOE_GROUPED.name()]:
            print(f"T={T} ({n_touched} experts) {r['path']:32s} {r['config']:24s} {r['ms']:.4f} ms "
                  f"{100 * r['roofline_frac']:.0f}% roofline err {r.get('rel_err', float('nan')):.1e}", flush=True)
        rows += res
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
