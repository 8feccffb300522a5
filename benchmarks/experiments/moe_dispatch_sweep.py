"""Which MoE path and tile shape for which batch: the per-assignment decode GEMV (one program per (token,
slot) and row tile) against the scheduled tiles (tokens sorted by expert, row blocks of ``block_m``) in a few
shapes, 120b shapes (128 experts, top-4, H = I = 2880 padded to 2944), uniform random routing. Everything
is timed in CUDA graphs (the schedule has no host sync). Bytes = the touched experts' packed weights and
scales; error vs fp32 up to T = 256. ``moe_mxfp4.GEMV_MAX_ASSIGNMENTS`` and ``pick_moe_config`` are set from this.
Usage: python benchmarks/experiments/moe_dispatch_sweep.py [OUT.json [T,T,...]]"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import (  # noqa: E402
    DEV,
    bench_decode,
    copy_roofline,
    moe_decode_inputs,
    moe_expert_bytes,
    moe_prefill_inputs,
    moe_reference,
    moe_weights,
)

from mxrepack.kernels.moe_mxfp4 import MoeConfig, moe_mxfp4, pick_moe_config, pick_moe_gemv_config  # noqa: E402

TILES = [
    MoeConfig(16, 64, 128, 4, 4),
    MoeConfig(32, 64, 128, 4, 4),
    MoeConfig(64, 128, 128, 4, 3),
    MoeConfig(64, 128, 128, 8, 3),
    MoeConfig(128, 128, 128, 8, 3),
    MoeConfig(128, 64, 128, 4, 3),
    MoeConfig(128, 128, 128, 8, 4),
]
GEMV_UP_TO = 128  # tokens


def main() -> None:
    E, k = 128, 4
    bw = copy_roofline()
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12, "gemv": "pick_moe_gemv_config(T * k)"}]
    torch.manual_seed(0)
    for T in (
        [int(t) for t in sys.argv[2].split(",")]
        if len(sys.argv) > 2
        else (64, 80, 96, 128, 256, 512, 1024, 2048, 4096, 8192)
    ):
        x, ids, wts = (moe_decode_inputs if T <= E // k * 8 else moe_prefill_inputs)(T, E, k)
        n_touched = ids.unique().numel()
        ref = moe_reference(x, ids, wts, W) if T <= 256 else None
        out = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        shipped = pick_moe_config(T, k, E)
        configs = ([pick_moe_gemv_config(T * k)] if T <= GEMV_UP_TO else []) + TILES
        for cfg in configs:
            ms = bench_decode(lambda: moe_mxfp4(x, ids, wts, W, config=cfg, out=out), rep=100)
            rec = {
                "T": T,
                "config": cfg.name(),
                "shipped_tiles": cfg == shipped,
                "ms": ms,
                "experts_touched": n_touched,
                "roofline_frac": n_touched * per_expert / (ms * 1e-3) / bw,
            }
            if ref is not None:
                y = moe_mxfp4(x, ids, wts, W, config=cfg)
                rec["rel_err"] = float((y.float() - ref).norm() / ref.norm())
            print(
                f"T={T} ({n_touched} experts) {cfg.name():22s}{' (shipped tiles)' if cfg == shipped else ''} "
                f"{ms:.4f} ms {100 * rec['roofline_frac']:.0f}% roofline"
                + (f" err {rec['rel_err']:.1e}" if ref is not None else ""),
                flush=True,
            )
            rows.append(rec)
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
