"""Probe: MoE decode GEMV configs on the K-tiled strided layout (issue 4, stop 12).

Until stop 12 the strided layout stored each weight row's Kp/2 bytes contiguously, so one K step of a gate_up
program (64 rows x 128 bytes) touched 64 rows 1472 bytes apart. The layout now stores row tiles K-tiled
(``mxrepack.layouts.strided``): a program's K step is one contiguous block. The first run of this probe
compared the two layouts with the same kernels (record ``moe_tiled_probe_h100_2026-11-22.json``: it ran
before the kernels lost their row-major MoE addressing, so that mode is gone); its ``--sweep`` record
(``moe_tiled_sweep_h100_2026-11-22.json``) varied one kernel's config at a time, each with the tile rows of its
own config. This script now sweeps configs on the shipped layout (w13 tiles of 32 + 32 rows, w2 tiles of 16
rows); a config with other row counts reads parts of tiles or several.

Usage: python benchmarks/experiments/moe_tiled_probe.py [OUT.json]      (CUDA; 120b shapes, rotating routing)
"""

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import copy_roofline, moe_candidates, moe_expert_bytes, moe_weights  # noqa: E402

from mxrepack.kernels.gemv_mxfp4 import GemvConfig  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import MOE_GEMV, MoeGemvConfig  # noqa: E402

SWEEP_GATE_UP = [(32, 256, 8), (32, 512, 8), (32, 128, 4), (32, 256, 4), (64, 256, 8), (64, 128, 8)]
SWEEP_DOWN = [(16, 512, 4), (16, 256, 4), (32, 256, 8), (32, 512, 8), (16, 1024, 8), (8, 512, 4), (32, 256, 4)]


def f16x2(n: int, k: int, warps: int) -> GemvConfig:
    return GemvConfig(n, k, warps, 1, "f16x2", pdl=1)


def main() -> None:
    out = [a for a in sys.argv[1:] if not a.startswith("--")]
    bw = copy_roofline()
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12, "mode": "sweep, shipped k-tiled layout"}]
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    cands = {f"gate_up {f16x2(*g).name()}": MoeGemvConfig(f16x2(*g), MOE_GEMV.down) for g in SWEEP_GATE_UP}
    cands |= {f"down {f16x2(*d).name()}": MoeGemvConfig(MOE_GEMV.gate_up, f16x2(*d)) for d in SWEEP_DOWN[1:]}
    torch.manual_seed(0)
    for T in (1, 4, 8, 16, 64):
        touched, err, times = moe_candidates(W, per_expert, T, cands, 3, shuffle=True)
        for key, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            ms = statistics.median(t)
            rows.append(
                {
                    "T": T,
                    "varied": key,
                    "ms_median": ms,
                    "ms_all": t,
                    "roofline_frac": touched / (ms * 1e-3) / bw,
                    "rel_err": err[key],
                }
            )
            print(
                f"T={T:2d} {key:50s} {ms:.4f} ms {100 * touched / (ms * 1e-3) / bw:.1f}% err {err[key]:.1e}", flush=True
            )
    if out:
        json.dump(rows, open(out[0], "w"), indent=1)


if __name__ == "__main__":
    main()
