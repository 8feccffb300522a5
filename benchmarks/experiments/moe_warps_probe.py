"""Probe: MoE decode GEMV configs with 8 warps and longer K tiles against the shipped one, with rotating
routing (as decode_pick.py), and lm_head's programmatic dependent launch timed in graphs of 8, 64 and
400 unrolled calls. Usage: python benchmarks/experiments/moe_warps_probe.py [OUT.json]"""

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import (  # noqa: E402
    DEV,
    capture_graph,
    copy_roofline,
    lm_head_m1,
    moe_expert_bytes,
    moe_weights,
    replay_ms,
    rotating_moe_draws,
    without_pdl,
)

from mxrepack.kernels.gemv_mxfp4 import WIDE, GemvConfig, gemv_mxfp4  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import MOE_GEMV, moe_mxfp4  # noqa: E402


def graph_ms(fn, unroll: int) -> float:
    """Milliseconds per call of ``fn``, ``unroll`` calls captured in one CUDA graph."""
    return replay_ms(capture_graph(fn, unroll)) / unroll


def main() -> None:
    bw = copy_roofline()
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12}]
    wbytes, nxt_w, _, x, y = lm_head_m1()
    for unroll in (8, 64, 400):
        for cfg in (WIDE, dataclasses.replace(WIDE, pdl=1)):
            t = [graph_ms(lambda: gemv_mxfp4(x, *nxt_w(), None, y, cfg), unroll) for _ in range(3)]
            ms = statistics.median(t)
            rows.append(
                {
                    "kind": "lm_head_m1",
                    "config": cfg.name(),
                    "unroll": unroll,
                    "ms": ms,
                    "roofline_frac": wbytes / (ms * 1e-3) / bw,
                }
            )
            print(
                f"lm_head unroll {unroll:3d} {cfg.name():28s} {ms:.4f} ms {100 * wbytes / (ms * 1e-3) / bw:.1f}%",
                flush=True,
            )
    nxt_w = None  # frees the rotating lm_head weights
    torch.cuda.empty_cache()
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    configs = [MOE_GEMV.each(pdl=0), MOE_GEMV]
    configs += [
        GemvConfig(bn, bk, w, 1, "f16x2", pdl=p)
        for bn, bk, w, p in (
            (16, 512, 8, 0),
            (16, 512, 8, 1),
            (16, 1024, 8, 1),
            (32, 256, 8, 1),
            (8, 1024, 8, 1),
            (16, 256, 4, 1),
            (8, 512, 4, 1),
            (16, 512, 2, 1),
            (16, 512, 4, 2),
        )
    ]
    configs += [
        GemvConfig(16, 512, 4, 1, "f16x2", prefetch=2, pdl=1),
        GemvConfig(16, 512, 8, 1, "f16x2", prefetch=2, pdl=1),
    ]
    torch.manual_seed(0)
    for T in (1, 8, 64):
        nxt, draws, touched = rotating_moe_draws(T, per_expert)
        xm, ids, wts = draws[0]
        o = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        res = {}
        for _ in range(3):
            for c in configs:
                try:
                    if c.name() not in res:
                        res[c.name()] = []
                        twin = without_pdl(c)  # pdl changes when a GEMV starts, not its result
                        assert torch.equal(
                            moe_mxfp4(xm, ids, wts, W, config=c), moe_mxfp4(xm, ids, wts, W, config=twin)
                        ), c.name()
                    res[c.name()].append(graph_ms(lambda: moe_mxfp4(*nxt(), W, config=c, out=o), 64 if T < 64 else 8))
                except Exception as e:  # noqa: BLE001 - a config that does not fit is reported, not fatal
                    res[c.name()] = [float("nan")]
                    print(f"T={T} {c.name()}: {type(e).__name__}: {str(e)[:100]}")
        for name, t in sorted(res.items(), key=lambda kv: statistics.median(kv[1])):
            ms = statistics.median(t)
            rows.append(
                {"kind": "moe_decode", "T": T, "config": name, "ms": ms, "roofline_frac": touched / (ms * 1e-3) / bw}
            )
            print(f"moe T={T:2d} {name:30s} {ms:.4f} ms {100 * touched / (ms * 1e-3) / bw:.1f}%", flush=True)
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
