"""Probe of the swapped-operand MoE tiles' sporadic non-finite output (H100, Triton 3.6: once at T = 64 with 4
stages in the sweep of 0492766, once at T = 128 with the shipped 3 stages in the peers run of 3436672). Runs the
shipped tile config and its 1/2-stage twins many times on fixed inputs, counts non-finite and differing outputs,
and dumps the gate_up kernel's TTGIR/PTX as this machine's Triton compiles it. Not a test.

    python benchmarks/experiments/swap_ab_probe.py OUT_DIR
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import moe_decode_inputs, moe_reference, moe_weights  # noqa: E402

from mxrepack.kernels import check  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe_config  # noqa: E402

out = Path(sys.argv[1])
E, H, I, HP, IP, K = 128, 2880, 2880, 2944, 2944, 4
rows = []
torch.manual_seed(0)
W = moe_weights(E, H, I, HP, IP)
for T in (64, 128, 512):
    torch.manual_seed(T)
    x, ids, wts = moe_decode_inputs(T, E, K, H)
    ref = moe_reference(x, ids, wts, W, H, HP, IP)
    base = pick_moe_config(T, K, E)
    for st in (3, 2, 1):
        cfg = dataclasses.replace(base, num_stages=st)
        first, bad, differ = None, 0, 0
        for _ in range(30):
            y = moe_mxfp4(x, ids, wts, W, config=cfg)
            torch.cuda.synchronize()
            if not torch.isfinite(y).all():
                bad += 1
            if first is None:
                first = y.clone()
            elif not torch.equal(y, first):
                differ += 1
        err = float((first.float() - ref).norm() / ref.norm())
        rec = {
            "T": T,
            "config": cfg.name(),
            "runs": 30,
            "nonfinite_runs": bad,
            "runs_differing_from_first": differ,
            "first_rel_err": err,
        }
        rows.append(rec)
        print(json.dumps(rec), flush=True)
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
