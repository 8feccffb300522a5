"""Which MoE path for which batch: the per-assignment decode GEMV (one program per (token, slot) and row
tile, timed in a CUDA graph) against the scheduled tiles (sorted row blocks per expert; its schedule syncs
with the host, so it is timed with ``do_bench``), 120b shapes (128 experts, top-4, H = I = 2880 padded to
2944), uniform random routing. Bytes = the touched experts' packed weights and scales; error vs fp32.
``moe_mxfp4.GEMV_MAX_ASSIGNMENTS`` is set from this.
Usage: python benchmarks/moe_dispatch_sweep.py [OUT.json [T,T,...]]"""

import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import (DEV, bench_decode, copy_roofline,  # noqa: E402
                       moe_reference, moe_decode_inputs, moe_expert_bytes, moe_weights)

from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe_config, pick_moe_gemv_config  # noqa: E402


def main() -> None:
    E, k = 128, 4
    bw = copy_roofline()
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12, "gemv": "pick_moe_gemv_config(T * k)"}]
    torch.manual_seed(0)
    for T in [int(t) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else (4, 16, 64, 128, 256):
        x, ids, wts = moe_decode_inputs(T, E, k)
        n_touched = ids.unique().numel()
        ref = moe_reference(x, ids, wts, W)
        out = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        sched = pick_moe_config(T, k, E)
        for path, cfg, timer in (("per-assignment GEMV (graph)", pick_moe_gemv_config(T * k), bench_decode),
                                 ("scheduled (do_bench)", sched, lambda f: do_bench(f, warmup=10, rep=50))):
            ms = timer(lambda: moe_mxfp4(x, ids, wts, W, config=cfg, out=out))
            y = moe_mxfp4(x, ids, wts, W, config=cfg)
            rec = {"T": T, "path": path, "config": cfg.name(), "ms": ms, "experts_touched": n_touched,
                   "roofline_frac": n_touched * per_expert / (ms * 1e-3) / bw,
                   "rel_err": float((y.float() - ref).norm() / ref.norm())}
            print(f"T={T} ({n_touched} experts) {path:28s} {cfg.name():22s} {ms:.4f} ms "
                  f"{100 * rec['roofline_frac']:.0f}% roofline err {rec['rel_err']:.1e}", flush=True)
            rows.append(rec)
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
