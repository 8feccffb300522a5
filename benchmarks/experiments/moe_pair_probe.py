"""Probe: the MoE decode's gate_up and down kernels with different GEMV configs (until stop 11 one config
served both). 120b shapes, rotating routing and interleaved repeats as in decode_pick.py.

``sweep`` (default): one sweep per kernel around the shipped pair, the other kernel held at it; gate_up
always runs 32 intermediate rows per program (the record of this sweep, taken before gate_up's block_n was
honoured, names gate_up configs with the row count they were given, which was ignored).
``pairs``: the candidate pairs for the shipped configs, at T = 1..64.
The ``--gate-rows`` mode (gate_up with 8 or 16 intermediate rows per program, sharing a group's packing)
ran at commit 9597ffa; the kernel no longer takes fewer than 32 rows, so the mode is gone.
Usage: python benchmarks/experiments/moe_pair_probe.py [--pairs] [OUT.json]"""

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import copy_roofline, moe_candidates, moe_expert_bytes, moe_weights  # noqa: E402

from mxrepack.kernels.gemv_mxfp4 import GemvConfig  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import MoeGemvConfig, pick_moe_gemv_config  # noqa: E402

REPEATS = 3
SHAPES = [
    (16, 512, 4, 1),
    (32, 256, 8, 1),
    (16, 1024, 8, 1),
    (16, 1024, 4, 1),
    (8, 1024, 4, 1),
    (16, 512, 4, 2),
    (8, 512, 4, 2),
    (16, 256, 4, 2),
    (32, 512, 8, 1),
    (8, 512, 2, 1),
    (16, 256, 4, 1),
]


def f16x2(n: int, k: int, warps: int, ahead: int = 1) -> GemvConfig:
    return GemvConfig(n, k, warps, 1, "f16x2", prefetch=ahead, pdl=1)


def sweep_candidates(T: int) -> dict:
    shipped = pick_moe_gemv_config(4 * T)
    cands = {f"gate_up {f16x2(32, *s[1:]).name()}": MoeGemvConfig(f16x2(32, *s[1:]), shipped.down) for s in SHAPES}
    cands |= {f"down {f16x2(*s).name()}": MoeGemvConfig(shipped.gate_up, f16x2(*s)) for s in SHAPES}
    return cands


PAIRS = [
    MoeGemvConfig(f16x2(32, 256, 8), f16x2(16, 512, 4)),
    MoeGemvConfig(f16x2(32, 256, 8), f16x2(32, 256, 8)),
    MoeGemvConfig(f16x2(32, 256, 8), f16x2(16, 512, 4, 2)),
    MoeGemvConfig(f16x2(32, 256, 8), f16x2(16, 256, 4)),
    MoeGemvConfig(f16x2(64, 256, 8), f16x2(16, 512, 4)),
    MoeGemvConfig(f16x2(32, 512, 8), f16x2(16, 512, 4)),
    MoeGemvConfig(f16x2(64, 128, 8), f16x2(16, 512, 4)),
    MoeGemvConfig(f16x2(32, 128, 4), f16x2(16, 512, 4)),
    MoeGemvConfig(f16x2(32, 256, 8, 2), f16x2(16, 512, 4)),
    MoeGemvConfig(f16x2(32, 256, 8, 2), f16x2(16, 512, 4, 2)),
]


def main() -> None:
    pairs = "--pairs" in sys.argv
    out = [a for a in sys.argv[1:] if not a.startswith("--")]
    bw = copy_roofline()
    rows = [
        {
            "device": torch.cuda.get_device_name(),
            "copy_TBps": bw / 1e12,
            "repeats": REPEATS,
            "mode": "pairs" if pairs else "sweep",
        }
    ]
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    torch.manual_seed(0)
    for T in (1, 2, 4, 8, 16, 32, 64) if pairs else (1, 2, 4, 8, 64):
        cands = {c.name(): c for c in PAIRS} if pairs else sweep_candidates(T)
        touched, err, times = moe_candidates(W, per_expert, T, cands, REPEATS)
        for key, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            ms = statistics.median(t)
            rows.append(
                {
                    "T": T,
                    "varied": key,
                    "config": cands[key].name(),
                    "ms_median": ms,
                    "ms_all": t,
                    "roofline_frac": touched / (ms * 1e-3) / bw,
                    "rel_err": err[key],
                }
            )
            print(
                f"T={T:2d} {cands[key].name():70s} {ms:.4f} ms {100 * touched / (ms * 1e-3) / bw:.1f}% "
                f"err {err[key]:.1e}",
                flush=True,
            )
    if out:
        json.dump(rows, open(out[0], "w"), indent=1)


if __name__ == "__main__":
    main()
