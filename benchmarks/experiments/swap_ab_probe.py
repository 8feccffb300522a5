"""Probe of the swapped-operand MoE tiles' sporadic non-finite output (H100, Triton 3.6: once at T = 64 with 4
stages in the sweep of 0492766, once at T = 128 with the shipped 3 stages in the peers run of 3436672). Runs the
shipped MoE tile config and lm_head's swapped configs with 3, 2 and 1 stages, and the configs shipped before the
swap, many times on fixed inputs: counts non-finite and differing outputs, times each (CUDA graph), and dumps the
gate_up kernel's TTGIR/PTX as this machine's Triton compiles it. Not a test.

    python benchmarks/experiments/swap_ab_probe.py OUT_DIR [--mma-sync]
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
import triton
import triton.testing
from triton.backends.compiler import GPUTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import deq, moe_decode_inputs, moe_reference, moe_weights, rand_mx  # noqa: E402

from mxrepack.kernels import check  # noqa: E402
from mxrepack.kernels.linear_mxfp4 import DECODE_WIDE, PREFILL_SMALL, LinearConfig, linear_mxfp4  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import MoeConfig, moe_mxfp4, pick_moe_config  # noqa: E402

out = Path(sys.argv[1])
# --mma-sync: the swapped configs on 2 warps (mma.sync, which Triton takes when no warpgroup of 4 is there: no
# asynchronous wgmma reading registers the next step overwrites, triton-lang/triton#9433), pipelined, beside 1 stage
MMA_SYNC = "--mma-sync" in sys.argv
E, H, I, HP, IP, K = 128, 2880, 2880, 2944, 2944, 4
REPEATS = 20
rows = []


def probe(label: str, fn, ref: torch.Tensor, **rec) -> None:
    """Run ``fn`` REPEATS times: non-finite runs, runs differing from the first, its error; then its graph time."""
    first, bad, differ = None, 0, 0
    for _ in range(REPEATS):
        y = fn()
        torch.cuda.synchronize()
        bad += not bool(torch.isfinite(y).all())
        if first is None:
            first = y.clone()
        elif not torch.equal(y, first):
            differ += 1
    rec |= {
        "config": label,
        "runs": REPEATS,
        "nonfinite_runs": bad,
        "runs_differing_from_first": differ,
        "first_rel_err": float((first.float() - ref).norm() / ref.norm()),
        "ms": triton.testing.do_bench_cudagraph(fn),
    }
    rows.append(rec)
    print(json.dumps(rec), flush=True)


torch.manual_seed(0)
W = moe_weights(E, H, I, HP, IP)
# the tiles shipped before the swap (MOE_TILES at 4a2d109's parent), as the same-run baseline
BEFORE = {
    8: MoeConfig(16, 64, 128, 4, 3, manual_dequant=True),
    16: MoeConfig(32, 64, 128, 4, 3),
    32: MoeConfig(64, 128, 128, 4, 3, manual_dequant=True),
    128: MoeConfig(128, 64, 128, 4, 3),
}
for T in (64, 128, 512, 1024, 4096):
    torch.manual_seed(T)
    x, ids, wts = moe_decode_inputs(T, E, K, H)
    ref = moe_reference(x, ids, wts, W, H, HP, IP)
    base = pick_moe_config(T, K, E)
    before = next(c for bound, c in BEFORE.items() if T * K / E <= bound)
    if MMA_SYNC:  # 2 warps: Triton takes mma.sync (synchronous, no wgmma in flight), pipelined; beside 1-stage wgmma
        cands = [dataclasses.replace(base, num_warps=2, num_stages=st) for st in (3, 2)]
        cands += [
            dataclasses.replace(base, block_m=bm, num_warps=2, remainder=None) for bm in (16, 32) if bm < base.block_m
        ]
        cands += [dataclasses.replace(base, num_stages=1), before]
    else:
        cands = [dataclasses.replace(base, num_stages=st) for st in (3, 2, 1)] + [before]
    for cfg in cands:
        probe(
            cfg.name() + ("w2" if cfg.num_warps == 2 else ""),
            lambda cfg=cfg: moe_mxfp4(x, ids, wts, W, config=cfg),
            ref,
            kind="moe",
            T=T,
        )
N, Kd = 201088, 2880  # lm_head
w, ws = rand_mx(N, Kd)
wf = deq(w, ws)
for M in (4, 16, 64):
    xd = torch.randn(M, Kd, device="cuda").to(torch.bfloat16)
    ref = xd.float() @ wf.T
    base = DECODE_WIDE if M <= 16 else PREFILL_SMALL
    before = LinearConfig(16, 64, 256, 1, 4, 3, True) if M <= 16 else LinearConfig(64, 128, 128, 1, 4, 3, True)
    if MMA_SYNC:
        cands = [dataclasses.replace(base, num_warps=2, num_stages=st) for st in (3, 2)]
        cands += [dataclasses.replace(base, block_n=64, num_warps=2, num_stages=3)] if base.block_n != 64 else []
        cands += [dataclasses.replace(base, num_stages=1), before]
    else:
        cands = [dataclasses.replace(base, num_stages=st) for st in (3, 2, 1)] + [before]
    for cfg in cands:
        probe(cfg.name(), lambda cfg=cfg: linear_mxfp4(xd, w, ws, None, "w4a16", cfg), ref, kind="lm_head", M=M)
cfg = pick_moe_config(128, K, E)
for name, src in check._moe_sources("bf16", cfg).items():
    c = triton.compile(
        check.specialized(src),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
    )
    (out / f"{name}.ttgir").write_text(c.asm["ttgir"])
    (out / f"{name}.ptx").write_text(c.asm["ptx"])
(out / "swap_ab_probe.json").write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))
