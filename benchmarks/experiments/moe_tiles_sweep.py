"""The scheduled-tile MoE path (tokens sorted by expert, ``tl.dot_scaled`` on 16..32-token blocks, each
expert's weights read once) against the per-assignment decode GEMV (which reads an expert once per token
that chose it), at T = 16..128 on the 120b shapes, both inside CUDA graphs with rotating routing; and the
prefill at T = 4096 (``do_bench``). Bytes = the touched experts' weights and scales.
Usage: python benchmarks/experiments/moe_tiles_sweep.py [OUT.json]"""

import json
import statistics
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import (  # noqa: E402
    DEV,
    copy_roofline,
    interleaved_ms,
    moe_decode_inputs,
    moe_expert_bytes,
    moe_reference,
    moe_weights,
    rotating_moe_draws,
)

from mxrepack.kernels.moe_mxfp4 import MoeConfig, moe_mxfp4, pick_moe_gemv_config  # noqa: E402

REPEATS = 3
TILES = [
    MoeConfig(*c)
    for c in (
        (16, 64, 128, 4, 4),
        (16, 32, 128, 4, 3),
        (16, 32, 256, 4, 3),
        (16, 64, 256, 4, 3),
        (16, 64, 256, 8, 3),
        (16, 128, 128, 4, 3),
        (16, 128, 256, 8, 3),
        (16, 64, 512, 4, 2),
        (16, 32, 512, 4, 2),
        (32, 64, 256, 4, 3),
    )
]
PREFILL = [
    MoeConfig(*c)
    for c in (
        (64, 128, 128, 4, 3),
        (64, 128, 256, 8, 3),
        (128, 128, 128, 8, 3),
        (64, 64, 256, 4, 3),
        (128, 128, 256, 8, 2),
    )
]


def main() -> None:
    bw = copy_roofline()
    rows = [{"device": torch.cuda.get_device_name(), "triton": triton.__version__, "copy_TBps": bw / 1e12}]
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    torch.manual_seed(0)
    for T in (16, 32, 64, 128):
        gemv = pick_moe_gemv_config(T * 4)
        configs = [gemv] + TILES
        nxt, draws, touched = rotating_moe_draws(T, per_expert)
        xm, ids, wts = nxt()
        ref = moe_reference(xm, ids, wts, W)
        err = {
            c.name(): ((moe_mxfp4(xm, ids, wts, W, config=c).float() - ref).norm() / ref.norm()).item() for c in configs
        }
        o = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        times = interleaved_ms(
            {c.name(): (lambda c=c: moe_mxfp4(*nxt(), W, config=c, out=o)) for c in configs}, REPEATS
        )
        for name, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            ms = statistics.median(t)
            rows.append(
                {
                    "kind": "moe_decode",
                    "T": T,
                    "config": name,
                    "gemv": name == gemv.name(),
                    "ms_median": ms,
                    "ms_all": t,
                    "rel_err": err[name],
                    "experts_touched": touched / per_expert,
                    "roofline_frac": touched / (ms * 1e-3) / bw,
                }
            )
            print(
                f"moe T={T} {name:24s}{' (gemv)' if name == gemv.name() else ''} {ms:.4f} ms (min {min(t):.4f}) "
                f"{100 * touched / (ms * 1e-3) / bw:.1f}% roofline err {err[name]:.1e}",
                flush=True,
            )
    T = 4096
    xm, ids, wts = moe_decode_inputs(T)
    for c in PREFILL:
        ms = do_bench(lambda: moe_mxfp4(xm, ids, wts, W, config=c), warmup=5, rep=100)
        rows.append({"kind": "moe_prefill", "T": T, "config": c.name(), "ms": ms})
        print(f"moe prefill T={T} {c.name():24s} {ms:.3f} ms", flush=True)
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
