"""MoE decode (120b shapes: 128 experts, top-4, H = I = 2880 padded to 2944) at T = 1, 2, 4, 8 tokens: the
GEMV path's tiles, fp32 math (``asm``) vs packed fp16 (``f16x2``, gate_up on prepared activations), timed
in a CUDA graph; bytes = the touched experts' packed weights and scales; error of each T's best vs fp32.
Usage: python benchmarks/experiments/moe_decode_sweep.py [OUT.json]"""

import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import DEV, bench_decode, copy_roofline, moe_decode_inputs, moe_expert_bytes, moe_reference, moe_weights  # noqa: E402

from mxrepack.kernels.gemv_mxfp4 import GemvConfig  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe_gemv_config  # noqa: E402


def main() -> None:
    E, k = 128, 4
    bw = copy_roofline()
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    configs = [GemvConfig(bn, bk, w, 1, "asm") for bn, bk, w in itertools.product((8, 16), (256, 512), (2, 4))]
    configs += [
        GemvConfig(bn, bk, w, 1, "f16x2", prefetch=ahead)
        for bn, bk, w, ahead in itertools.product((4, 8, 16, 32), (256, 512), (1, 2, 4), (1, 2))
        if bn * bk // 32 >= 32 * w
    ]
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12, "shipped": "pick_moe_gemv_config(T * k)"}]
    torch.manual_seed(0)
    for T in (1, 2, 4, 8):
        x, ids, wts = moe_decode_inputs(T, E, k)
        touched = ids.unique().numel() * per_expert
        ref = moe_reference(x, ids, wts, W)
        out = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        res = []
        for cfg in configs:
            try:
                ms = bench_decode(lambda: moe_mxfp4(x, ids, wts, W, config=cfg, out=out), rep=50)
            except Exception as e:  # out of resources
                print(f"T={T} {cfg.name()}: {type(e).__name__}", flush=True)
                continue
            res.append(
                {
                    "T": T,
                    "config": cfg.name(),
                    "ms": ms,
                    "roofline_frac": touched / (ms * 1e-3) / bw,
                    "experts_touched": ids.unique().numel(),
                }
            )
        res.sort(key=lambda r: r["ms"])
        best = next(c for c in configs if c.name() == res[0]["config"])
        y = moe_mxfp4(x, ids, wts, W, config=best)
        res[0]["rel_err"] = float((y.float() - ref).norm() / ref.norm())
        shipped_cfg = pick_moe_gemv_config(T * k)
        shipped = next((r for r in res if r["config"] == shipped_cfg.name()), None)
        for r in res[:5]:
            print(f"T={T} {r['config']:24s} {r['ms']:.4f} ms {100 * r['roofline_frac']:.0f}% roofline", flush=True)
        print(
            f"T={T} best err {res[0]['rel_err']:.1e}; shipped {shipped_cfg.name()}: "
            f"{shipped['ms'] if shipped else float('nan'):.4f} ms",
            flush=True,
        )
        rows += res
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
